"""Issue 18: the chat page, built from the pinned source, in a real browser.

``ggufdspark serve --open`` on the generated small VL pair with its DSpark draft; headless Debian
chromium (driven by chromedriver through selenium) loads the page the CLI printed and opened, sends
a text message and then a picture through the page, and waits for each answer; the server's
``/metrics`` must have counted drafted and accepted tokens for those two requests, and each answer
must show the tokens drafted, accepted and the accept length of its own response's ``timings``
(issue 30: ggufdspark/data/ui-patches), read from the stream the page received.

Nothing here is skipped: without chromium, chromedriver, selenium or a built UI the test FAILS and
says what is missing (``make test`` installs them: ``make browser`` and ``make engine``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ggufdspark import images, webui
from ggufdspark import timings as tm

REPO = Path(__file__).resolve().parent.parent
N_PREDICT = 24  # the server's default answer length (-n): the page asks for no limit of its own
ASSISTANT = '[aria-label="Assistant message with actions"]'
USER = '[aria-label="User message with actions"]'
# Where the docs' screenshot comes from: set to a path to keep a copy of the test's screenshot.
ENV_SHOT = "GGUFDSPARK_WEBUI_SCREENSHOT"


@pytest.fixture(scope="module")
def browser():
    """Paths of Debian's chromium and chromedriver, with selenium importable (else FAIL, saying what)."""
    missing = [name for name in ("chromium", "chromedriver") if not shutil.which(name)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (python package)")
    if missing:
        pytest.fail(f"the browser test needs {', '.join(missing)}: 'make browser' installs them "
                    "(Debian: apt-get install chromium chromium-driver; pip install selenium)")
    return shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="module")
def chat_ui() -> Path:
    d = webui.find_ui()
    if d is None:
        why = webui.node_problem() or "node and npm are here: run it"
        pytest.fail(f"no chat UI in {webui.ui_root()}: 'ggufdspark build-engine' builds it ({why})")
    return d


def _newline_token(target_dir: Path) -> int:
    from tokenizers import Tokenizer

    (tok,) = Tokenizer.from_file(str(target_dir / "tokenizer.json")).encode("\n", add_special_tokens=False).ids
    return tok


def _wait_for_line(path: Path, pattern: str, proc: subprocess.Popen, timeout: float) -> str:
    """The first line of ``path`` matching ``pattern``; fails when ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if m := re.search(pattern, text, re.MULTILINE):
            return m.group(0)
        if proc.poll() is not None:
            pytest.fail(f"serve exited ({proc.returncode}) before printing {pattern!r}:\n{text[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"serve printed no {pattern!r} within {timeout:g} s:\n{path.read_text(errors='replace')[-3000:]}")


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url + "metrics", timeout=30) as r:
        return r.read().decode()


def _answered(driver, n: int):
    """Until the ``n``-th answer is complete: present, with its statistics, and no Stop button."""
    def done(d):
        answers = d.find_elements("css selector", ASSISTANT)
        if len(answers) < n or d.find_elements("xpath", "//span[@class='sr-only' and text()='Stop']"):
            return False
        text = answers[n - 1].text
        return answers[n - 1] if f"{N_PREDICT} tokens" in text else False
    return done


def _answer_text(answer) -> str:
    """What an answer says: its text above the model badge and the statistics under it."""
    return answer.text.split("tiny-lfm2-vl", 1)[0].strip()


# Installed before the page's own scripts: every event stream the page fetches is read a second time
# (a clone of the response) and the last ``timings`` object in it kept, so the test sees exactly the
# timings each answer was given by the server, without touching the page's code.
RECORD_STREAM_TIMINGS = """
(() => {
  window.__streamTimings = [];
  const original = window.fetch;
  window.fetch = async (...args) => {
    const resp = await original(...args);
    if ((resp.headers.get('content-type') || '').includes('text/event-stream')) {
      resp.clone().text().then((body) => {
        let last = null;
        for (const line of body.split('\\n')) {
          if (!line.startsWith('data: ')) continue;
          try { const j = JSON.parse(line.slice(6)); if (j.timings) last = j.timings; } catch (e) {}
        }
        if (last) window.__streamTimings.push(last);
      }, () => {});
    }
    return resp;
  };
})();
"""
DRAFT_BADGES = (r"(\d[\d,]*) drafted", r"(\d[\d,]*) accepted", r"accept length (\d+\.\d\d)")


def _check_draft_badges(driver, wait, n: int, metrics_turn) -> dict:
    """Answer ``n`` shows drafted / accepted / accept length equal to its response's timings."""
    def badges(d):
        answers = d.find_elements("css selector", ASSISTANT)
        found = [re.search(p, answers[n - 1].text) for p in DRAFT_BADGES] if len(answers) >= n else []
        return found if found and all(found) else False

    drafted, accepted, length = (m.group(1) for m in wait.until(badges))
    records = wait.until(lambda d: (r := d.execute_script("return window.__streamTimings")) and len(r) >= n and r)
    assert len(records) == n, records  # one event stream per answer
    t = records[-1]
    a, g = t["draft_n_accepted"], t["predicted_n"]
    assert (int(drafted.replace(",", "")), int(accepted.replace(",", ""))) == (t["draft_n"], a), (drafted, accepted, t)
    assert length == f"{1 + a / max(1, g - a - 1):.2f}", (length, t)
    # and the stream's timings are the server's own counts for that request
    assert (t["draft_n"], a, g) == (metrics_turn.draft_n, metrics_turn.draft_n_accepted, metrics_turn.predicted_n)
    return t


def _send(driver, wait, text: str) -> None:
    box = wait.until(lambda d: d.find_element("css selector", "textarea"))
    box.send_keys(text)
    box.send_keys("\n")  # Enter sends


@pytest.mark.engine
def test_chat_page_answers_text_and_image_with_the_draft(browser, chat_ui, vl_pair, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    t0 = time.monotonic()
    chromium, chromedriver = browser
    # --open: a $BROWSER that records the URL it is given (webbrowser runs it with the URL)
    opened = tmp_path / "opened.txt"
    opener = tmp_path / "open-browser"
    opener.write_text(f'#!/bin/sh\nprintf "%s" "$1" > "{opened}"\n')
    opener.chmod(opener.stat().st_mode | stat.S_IXUSR)
    picture = next(p for p in images.random_items(tmp_path / "pictures", n_per_category=1, seed=7, size=256)
                   if p.category == "chart_vqa")
    # the generated target repeats the prompt's last token, and a chat prompt ends in a newline: its
    # answers would be blank lines. Banning that one token (an engine flag) makes them visible.
    nl = _newline_token(vl_pair["dir"])
    out = tmp_path / "serve.out"
    env = {**os.environ, "BROWSER": str(opener), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "ggufdspark", "serve", "-m", str(vl_pair["tower"]), "-md", str(vl_pair["draft"]),
           "--mmproj", str(vl_pair["mmproj"]), "--port", "0", "--draft-n-max", "3", "--no-profile",
           "--log", str(tmp_path / "server.log"), "--open", "--", "-n", str(N_PREDICT), "--logit-bias", f"{nl}-inf"]
    with open(out, "w") as outf:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=outf, stderr=subprocess.STDOUT)
    driver = None
    try:
        url = _wait_for_line(out, r"^chat: http://127\.0\.0\.1:\d+/$", proc, 180).split(" ", 1)[1]
        assert f"--path {chat_ui}" in out.read_text(), out.read_text()
        deadline = time.monotonic() + 30
        while not opened.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert opened.exists() and opened.read_text() == url, "--open did not hand the chat URL to $BROWSER"
        before = _scrape(url)

        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
                  f"--user-data-dir={tmp_path / 'chromium-profile'}"):
            opts.add_argument(a)
        driver = webdriver.Chrome(options=opts, service=Service(chromedriver))
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_STREAM_TIMINGS})
        wait = WebDriverWait(driver, 120)
        driver.get(url)
        t_page = time.monotonic()

        _send(driver, wait, "Hello, what can you do?")
        first = wait.until(_answered(driver, 1))
        assert len(driver.find_elements("css selector", USER)) == 1
        assert _answer_text(first), f"the first answer shows no text: {first.text!r}"
        text_turn = tm.metrics_delta(before, middle := _scrape(url))
        _check_draft_badges(driver, wait, 1, text_turn)

        # attach the picture through the page's file input (hidden behind its + menu), then ask
        upload = driver.find_element("css selector", "input[type=file]")
        driver.execute_script("arguments[0].classList.remove('hidden')", upload)
        upload.send_keys(str(picture.path))
        driver.execute_script("arguments[0].classList.add('hidden')", upload)
        wait.until(lambda d: d.find_elements("css selector", "form img"))  # the attachment's preview
        _send(driver, wait, picture.question)
        second = wait.until(_answered(driver, 2))
        assert driver.find_elements("css selector", f"{USER} img"), "the sent message shows no picture"
        assert _answer_text(second), f"the second answer shows no text: {second.text!r}"
        shot = tmp_path / "webui.png"
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 0
        if os.environ.get(ENV_SHOT):
            shutil.copy(shot, os.environ[ENV_SHOT])

        image_turn = tm.metrics_delta(middle, _scrape(url))
        _check_draft_badges(driver, wait, 2, image_turn)
        # the picture reached the model: 256 x 256 pixels are 64 image tokens (the LFM2 minimum)
        assert image_turn.prompt_n is not None and image_turn.prompt_n >= 64, image_turn
        for turn in (text_turn, image_turn):
            assert turn.predicted_n == N_PREDICT, turn
            assert turn.draft_n and turn.draft_n > 0 and turn.draft_n_accepted and turn.draft_n_accepted > 0, turn
        delta = tm.metrics_delta(before, _scrape(url))
        print(f"\nwebui: page loaded and two answers in {time.monotonic() - t_page:.1f} s "
              f"(test {time.monotonic() - t0:.1f} s); drafted {delta.draft_n}, accepted {delta.draft_n_accepted}; "
              f"screenshot {shot}")
    finally:
        if driver is not None:
            driver.quit()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # serve stops its engine and exits 0
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, out.read_text()[-3000:]
    # the engine's logger thread may write a step's lines after the answer went out: read its log once
    # serve has stopped it, when nothing more can reach it
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert "non-consecutive" not in log and "failed to process speculative" not in log


# ----------------------------------------------------------------------------- build-engine's UI step
#
# npm itself is stood in for here (a shell script that writes an index.html where it is told to):
# the real `npm ci` + `npm run build` take minutes; they run in `make test`'s engine step, and the
# browser test above serves what they built. These check the step's caching, locking and messages.

TINY_CMAKE = """
cmake_minimum_required(VERSION 3.14)
project(tiny C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_executable(llama-server server.c)
"""
TINY_SERVER = '#include <stdio.h>\nint main(void) { printf("version: 1 (0c1e570)\\n"); return 0; }\n'

FAKE_NPM = """#!/bin/sh
echo "$*" >> "{calls}"
case "$1" in
  ci) [ -n "{fail}" ] && {{ echo "npm error code ECONNREFUSED"; echo "npm error network request failed" >&2; exit 1; }}
      mkdir node_modules; exit 0 ;;
  run) mkdir -p "$LLAMA_UI_OUT_DIR" && echo '<!doctype html><title>llama-ui</title>' > "$LLAMA_UI_OUT_DIR/index.html" ;;
esac
"""


def _ui_tree(root: Path, *, with_ui: bool = True) -> Path:
    """A CMake project standing in for the llama.cpp tree, with a tools/ui that has a lock file."""
    root.mkdir(parents=True)
    (root / "CMakeLists.txt").write_text(TINY_CMAKE)
    (root / "server.c").write_text(TINY_SERVER)
    if with_ui:
        (root / "tools" / "ui").mkdir(parents=True)
        (root / "tools" / "ui" / "package.json").write_text('{"name": "llama-ui"}')
        (root / "tools" / "ui" / "package-lock.json").write_text("{}")
    return root


def _fake_node(bin_dir: Path, *, version: str = "v20.20.2", fail: bool = False) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    calls = bin_dir / "npm-calls.txt"
    for name, body in (("node", f'#!/bin/sh\necho "{version}"\n'),
                       ("npm", FAKE_NPM.format(calls=calls, fail="1" if fail else ""))):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    return calls


def _ui_env(tmp_path: Path, tree: Path, bin_dir: Path) -> dict[str, str]:
    # the stand-in tree has no UI sources to patch: no UI patches here (test_ui_patches_key_the_ui_build)
    return {"GGUFDSPARK_CACHE": str(tmp_path / "cache"), "GGUFDSPARK_LLAMA_SRC": str(tree),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "GGUFDSPARK_UI_PATCHES": ""}


def test_build_engine_builds_the_ui_once_then_finds_it(ggufdspark_cli, tmp_path):
    tree = _ui_tree(tmp_path / "tree")
    calls = _fake_node(tmp_path / "bin")
    env = _ui_env(tmp_path, tree, tmp_path / "bin")
    dist = tmp_path / "cache" / "ui" / "0c1e570" / "dist"
    p = ggufdspark_cli("build-engine", "--no-patches", "-j", "1", env=env)
    assert p.returncode == 0, p.stderr
    assert "UI: built from the pinned source in" in p.stderr and str(dist) in p.stderr, p.stderr
    assert (dist / "index.html").is_file() and calls.read_text().splitlines() == ["ci", "run build"]
    assert not (tree / "tools" / "ui" / "node_modules").exists(), "npm ran in the source tree, not a copy"
    assert [q.name for q in dist.parent.iterdir() if q.name.startswith("build-")] == [], "work dir left behind"
    assert json.loads((dist.parent / "ui.json").read_text())["commit"] == "0c1e570"
    p = ggufdspark_cli("build-engine", "--no-patches", "-j", "1", env=env)
    assert p.returncode == 0 and f"UI: already built: {dist}" in p.stderr, p.stderr
    p = ggufdspark_cli("build-engine", "--no-patches", "-j", "1", "--no-ui", env=env)
    assert p.returncode == 0 and "UI: skipped (--no-ui)" in p.stderr, p.stderr
    assert len(calls.read_text().splitlines()) == 2, "the cached UI was rebuilt"
    # the engine's own cache key is untouched by the UI: one engine build for the three runs
    assert len(list((tmp_path / "cache" / "engine").iterdir())) == 1


def test_second_ui_build_waits_for_the_first(tmp_path, monkeypatch):
    """While another process holds the UI's build lock, a second build waits, then finds its result."""
    from ggufdspark import engine

    tree = _ui_tree(tmp_path / "tree")
    calls = _fake_node(tmp_path / "bin")
    for k, v in _ui_env(tmp_path, tree, tmp_path / "bin").items():
        monkeypatch.setenv(k, v)
    root = webui.ui_root()
    cmd = [sys.executable, "-c", "from ggufdspark import webui; print(webui.build_ui().status)"]
    with engine.locked(root / "build.lock", "test"):  # "another build" holds the lock ...
        proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            seen = ""
            while "waiting for another" not in seen and (line := proc.stderr.readline()):
                seen += line
            assert "waiting for another build of the chat UI" in seen, seen
            assert not calls.exists(), "built while another build held the lock"
            # ... and finishes it meanwhile
            (root / "dist").mkdir()
            (root / "dist" / "index.html").write_text("<!doctype html>")
        except BaseException:
            proc.kill()
            raise
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.strip() == "cached" and not calls.exists(), err


@pytest.mark.parametrize("case, expect", [
    ("no-ui-sources", "has no tools/ui/package-lock.json"),
    ("old-node", "node v18.20.4 is too old for the pinned UI (node ^20.19 or >= 22.12)"),
])
def test_build_engine_says_why_it_skipped_the_ui(ggufdspark_cli, tmp_path, case, expect):
    tree = _ui_tree(tmp_path / "tree", with_ui=case != "no-ui-sources")
    _fake_node(tmp_path / "bin", version="v18.20.4" if case == "old-node" else "v22.12.0")
    p = ggufdspark_cli("build-engine", "--no-patches", "-j", "1", env=_ui_env(tmp_path, tree, tmp_path / "bin"))
    assert p.returncode == 0, p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if ln.startswith("UI:")]
    assert line.startswith("UI: skipped: ") and expect in line and "no chat page" in line, line


def test_node_missing_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: neither node nor npm
    assert webui.node_problem() == "node and npm not found on PATH (the UI needs node ^20.19 or >= 22.12)"


def test_failed_ui_build_is_one_line_naming_the_log(ggufdspark_cli, tmp_path):
    tree = _ui_tree(tmp_path / "tree")
    _fake_node(tmp_path / "bin", fail=True)
    p = ggufdspark_cli("build-engine", "--no-patches", "-j", "1", env=_ui_env(tmp_path, tree, tmp_path / "bin"))
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    log = tmp_path / "cache" / "ui" / "0c1e570" / "build.log"
    assert line == (f"ggufdspark: error: chat UI: 'npm ci' failed (exit 1): npm error code ECONNREFUSED; "
                    f"full log: {log}"), p.stderr
    assert not (log.parent / "dist").exists() and "npm error network request failed" in log.read_text()


# ----------------------------------------------------------------------------- serve and doctor


@pytest.fixture
def fake_ui(tmp_path) -> Path:
    d = tmp_path / "ui-dist"
    d.mkdir()
    (d / "index.html").write_text("<!doctype html><title>llama-ui</title>")
    (d / "app.js").write_text("console.log('ui');")
    return d


def _serve_args(pair) -> list[str]:
    return ["serve", "-m", str(pair.target), "-md", str(pair.draft), "--port", "0"]


def test_serve_passes_the_ui_as_path(ggufdspark_cli, small_pair, isolated, fake_ui):
    p = ggufdspark_cli(*_serve_args(small_pair), "--dry-run", env={"GGUFDSPARK_UI": str(fake_ui)})
    assert p.returncode == 0 and f"--path {fake_ui}" in p.stdout, p.stdout + p.stderr
    p = ggufdspark_cli(*_serve_args(small_pair), "--dry-run", "--no-ui", env={"GGUFDSPARK_UI": str(fake_ui)})
    assert p.returncode == 0 and "--path" not in p.stdout, p.stdout
    p = ggufdspark_cli(*_serve_args(small_pair), "--dry-run", "--", "--path", "/srv/mine",
                       env={"GGUFDSPARK_UI": str(fake_ui)})
    assert p.returncode == 0 and p.stdout.count("--path") == 1 and "--path /srv/mine" in p.stdout, p.stdout
    # no UI in this (private) cache: no --path, and the reason printed where serve starts
    p = ggufdspark_cli(*_serve_args(small_pair), "--dry-run")
    assert p.returncode == 0 and "--path" not in p.stdout, p.stdout


def test_serve_ui_argument_errors(ggufdspark_cli, small_pair, isolated, tmp_path, fake_ui):
    p = ggufdspark_cli(*_serve_args(small_pair), "--open", "--no-ui")
    assert p.returncode == 2 and "--open and --no-ui" in p.stderr.strip().splitlines()[-1], p.stderr
    p = ggufdspark_cli(*_serve_args(small_pair), "--dry-run", env={"GGUFDSPARK_UI": str(tmp_path)})
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1] == (f"ggufdspark: error: {tmp_path}: $GGUFDSPARK_UI is not a built "
                                                 "chat UI (no index.html)")
    p = ggufdspark_cli(*_serve_args(small_pair), "--open", "--api-key", "sesame-1234",
                       env={"GGUFDSPARK_UI": str(fake_ui)})
    assert p.returncode == 2 and "cannot load in a browser" in p.stderr and "sesame-1234" not in p.stderr, p.stderr


def test_serve_prints_the_chat_url_and_the_key_hint(small_pair, isolated, fake_ui, tmp_path):
    """With an API key the URL comes with a hint (never the key), and the hint says what the engine
    does: only / is served without the key, the page's other files need it."""
    out = tmp_path / "serve.out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "GGUFDSPARK_UI": str(fake_ui)}
    cmd = [sys.executable, "-m", "ggufdspark", *_serve_args(small_pair), "--api-key", "sesame-1234",
           "--log", str(tmp_path / "server.log")]
    with open(out, "w") as outf:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=outf, stderr=subprocess.STDOUT)
    try:
        line = _wait_for_line(out, r"^chat: .*$", proc, 120)
        url = re.match(r"chat: (http://127\.0\.0\.1:\d+/) \(with an API key .*only / is exempt.*\)$", line)
        assert url, line
        codes = {}
        for path in ("", "app.js"):
            try:
                with urllib.request.urlopen(url.group(1) + path, timeout=30) as r:
                    codes[path] = r.status
            except urllib.error.HTTPError as e:
                codes[path] = e.code
        assert codes == {"": 200, "app.js": 401}, codes
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode == 0 and "sesame-1234" not in out.read_text(), out.read_text()


def test_doctor_reports_the_ui(ggufdspark_cli, isolated, fake_ui):
    p = ggufdspark_cli("doctor", "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["ui"] is None and "build-engine" in rep["ui_note"], rep
    p = ggufdspark_cli("doctor", env={"GGUFDSPARK_UI": str(fake_ui)})
    assert p.returncode == 0 and f"chat UI:      {fake_ui} ($GGUFDSPARK_UI)" in p.stdout, p.stdout


PATCHING_NPM = """#!/bin/sh
case "$1" in
  ci) mkdir node_modules; exit 0 ;;
  run) mkdir -p "$LLAMA_UI_OUT_DIR" && cp hello.txt "$LLAMA_UI_OUT_DIR/" && echo '<!doctype html>' > "$LLAMA_UI_OUT_DIR/index.html" ;;
esac
"""
UI_PATCH = """Subject: a stand-in UI patch

--- a/hello.txt
+++ b/hello.txt
@@ -1 +1 @@
-hello
+hello draft
"""


def test_ui_patches_key_the_ui_build_not_the_engine(tmp_path, monkeypatch):
    """The UI's patches (ggufdspark/data/ui-patches) are applied to the copy that npm builds, key the
    UI's cache directory, and leave the engine's cache key as it is; one that does not apply is one
    error naming it."""
    from ggufdspark.engine.build import BuildSpec

    tree = _ui_tree(tmp_path / "tree")
    (tree / "tools" / "ui" / "hello.txt").write_text("hello\n")
    bin_dir = tmp_path / "bin"
    _fake_node(bin_dir)
    (bin_dir / "npm").write_text(PATCHING_NPM)
    patches = tmp_path / "ui-patches"
    patches.mkdir()
    for k, v in _ui_env(tmp_path, tree, bin_dir).items():
        monkeypatch.setenv(k, v)
    engine_key, plain_root = BuildSpec().key(), webui.ui_root()
    assert plain_root.name == "0c1e570"
    (patches / "0001-hello.patch").write_text(UI_PATCH)
    monkeypatch.setenv(webui.ENV_UI_PATCHES, str(patches))
    root = webui.ui_root()
    assert root.name.startswith("0c1e570-") and root != plain_root and BuildSpec().key() == engine_key
    b = webui.build_ui()
    assert b.status == "built" and b.path == root / "dist", b
    assert (b.path / "hello.txt").read_text() == "hello draft\n"
    assert (tree / "tools" / "ui" / "hello.txt").read_text() == "hello\n", "the source tree itself was patched"
    assert json.loads((root / "ui.json").read_text())["patches"] == ["0001-hello.patch"]
    assert webui.build_ui().status == "cached"
    # the shipped series is what the real build applies (and the pinned UI's sources take it)
    assert [p.name for p in sorted(webui.UI_PATCHES.glob("*.patch"))] and webui.UI_PATCHES.parent.name == "data"
    (patches / "0002-bad.patch").write_text(UI_PATCH.replace("-hello\n", "-goodbye\n"))
    with pytest.raises(webui.UiBuildError, match=r"chat UI: patch .*0002-bad\.patch does not apply"):
        webui.build_ui()
