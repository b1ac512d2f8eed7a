# ggufdspark: every target does its own set-up and is idempotent.
#   make demo   convert a generated pair, serve it, send a request, print acceptance timings
#   make test   the whole test suite against the real engine (make test-fast: what needs no engine)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
GGUFDSPARK := $(VENV)/bin/ggufdspark
CACHE  ?= $(HOME)/.cache/ggufdspark
SDIST  := $(CACHE)/src/llama_cpp_python-0.3.36.tar.gz
TORCH  ?= torch==2.13.0

.PHONY: all venv engine bindings browser demo test test-fast bench clean help

all: test

help:
	@echo "make demo | make test | make test-fast | make engine | make browser | make bench | make clean"

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	@touch $@

venv: $(VENV)/.installed

# the engine and its chat page (built from the pinned source when node and npm are there; cached)
engine: venv
	$(GGUFDSPARK) build-engine --with-tools

# ctypes bindings from the same sdist, compiled nothing: they load the engine's own libllama.
$(VENV)/.bindings: $(VENV)/.installed
	$(GGUFDSPARK) build-engine --print-path >/dev/null
	CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" $(PY) -m pip install -q "$(SDIST)"
	@touch $@

bindings: $(VENV)/.bindings

demo: engine bindings
	$(PY) -m ggufdspark.demo

# what tests/test_webui.py drives: Debian's chromium and chromium-driver (apt, only when missing;
# as root or through passwordless sudo) and selenium in the venv. Checked on every run, cheap when present.
browser: venv
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif ! command -v apt-get >/dev/null; then \
	  echo "make browser: no apt-get here: install chromium and chromedriver yourself (tests/test_webui.py needs them)" >&2; \
	else \
	  if [ "$$(id -u)" -eq 0 ]; then as_root=""; else as_root="sudo -n"; fi; \
	  echo "make browser: installing chromium and chromium-driver (apt)"; \
	  { $$as_root apt-get update -qq && \
	    $$as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      chromium chromium-driver >/dev/null; } || \
	  echo "make browser: could not install chromium and chromium-driver (not root, no passwordless sudo?): tests/test_webui.py will fail" >&2; \
	fi
	@$(PY) -c "import selenium" 2>/dev/null || $(PY) -m pip install -q "selenium>=4.20"

# The suite runs in TEST_WORKERS pytest-xdist workers (0: in one process). Its tests wait (on servers,
# scripts, timeouts) about as much as they compute, and every llama-server they start runs one
# compute thread (tests/conftest.py), so three workers fill two cores (on the 2-core build machine,
# 2026-12-06: 513 s with two, 446 s with three; 333-346 s since the reference converter runs in one
# process a worker and numpy loads only where it is used); worksteal evens out the long ones.
TEST_WORKERS ?= 3
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

test: engine bindings browser
	@$(PYTEST) tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# the tests that start no engine and are not slow (converters, readers, parsers, the fake Hub)
test-fast: venv
	@$(PYTEST) -m "not engine and not slow" tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-fast: pytest collected no tests" >&2; exit 1; fi; exit $$rc

bench: engine bindings
	$(PY) benchmarks/convert_speed.py convert

clean:
	rm -rf $(VENV) out .pytest_cache
