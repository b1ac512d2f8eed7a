# ggufdspark: every target does its own set-up and is idempotent.
#   make demo   convert a generated pair, serve it, send a request, print acceptance timings
#   make test   the whole test suite against the real engine
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
GGUFDSPARK := $(VENV)/bin/ggufdspark
CACHE  ?= $(HOME)/.cache/ggufdspark
SDIST  := $(CACHE)/src/llama_cpp_python-0.3.36.tar.gz
TORCH  ?= torch==2.13.0

.PHONY: all venv engine bindings demo test bench clean help

all: test

help:
	@echo "make demo | make test | make engine | make bench | make clean"

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	@touch $@

venv: $(VENV)/.installed

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

test: engine bindings
	@$(PY) -m pytest -q tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

bench: engine bindings
	$(PY) benchmarks/convert_speed.py

clean:
	rm -rf $(VENV) out .pytest_cache
