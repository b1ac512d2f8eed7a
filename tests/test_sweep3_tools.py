"""Issue 64 (reliability and security, third sweep), the tools rows: API keys in bench --load's
``command`` (row 12), publish --results checked against the pair (13), tune profiles validated as
--draft-n-max-by-slots is (14), concurrent profile saves (15), check verifying the draft's shapes
as the engine does (18, check half), and the "also seen" list (bench --load bounds, warm-up
timeout, publish's commit order, bench/tune temporary folders, inspect on huge headers)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ggufdspark.devices import Device, DeviceReport

CPU = DeviceReport(devices=[Device("CPU", "Tiny test CPU", "cpu", 8 << 30, 16 << 30)], backend="cpu", source="none")


# ----------------------------------------------------------------------------- row 15: concurrent saves


def test_concurrent_profile_saves_all_succeed(small_pair, tmp_path, monkeypatch):
    """Row 15: 16 threads and 6 processes save one pair's profile at once, 120 saves each way;
    before the fix they shared one ``.tmp`` name and many saves failed with FileNotFoundError."""
    from ggufdspark.measuring import profiles

    monkeypatch.setenv("GGUFDSPARK_CACHE", str(tmp_path / "cache"))
    errors: list[BaseException] = []

    def saver(k: int) -> None:
        for j in range(8):
            try:
                profiles.save_profile(CPU, small_pair.target, small_pair.draft,
                                      {"recommendation": {"draft_n_max": 1 + (k + j) % 5, "why": f"thread {k}"}})
            except BaseException as e:  # noqa: BLE001 - collected and asserted below
                errors.append(e)

    threads = [threading.Thread(target=saver, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"{len(errors)} of 128 threaded saves failed: {errors[0]!r}"
    script = ("import sys\nfrom ggufdspark.measuring import profiles\nfrom ggufdspark.devices import Device, DeviceReport\n"
              "cpu = DeviceReport(devices=[Device('CPU', 'Tiny test CPU', 'cpu', 8 << 30, 16 << 30)], backend='cpu',"
              " source='none')\n"
              "for j in range(20):\n"
              "    profiles.save_profile(cpu, sys.argv[1], sys.argv[2], {'recommendation': {'draft_n_max': 2}})\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(small_pair.target), str(small_pair.draft)],
                              env=env, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    failed = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    for p in procs:
        p.stderr.close()
    assert all(rc == 0 for rc, _ in failed), [err[-500:] for rc, err in failed if rc]
    path = profiles.profile_path(CPU, small_pair.target, small_pair.draft)
    data = json.loads(path.read_text())
    assert profiles.profile_problem(data) is None and data["recommendation"]["draft_n_max"] in range(1, 6)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left
    assert json.loads((tmp_path / "cache" / "hashes.json").read_text())  # the hash cache is whole JSON


# ----------------------------------------------------------------------------- row 14: profile load cuts


@pytest.mark.parametrize("cut, n_max, said", [
    ([[8, 3], [4, 2]], 3, "'4:2' is not N:L (N >= 0 ascending"),  # not ascending: the engine refuses it
    ([[2, 1], [2, 0]], 3, "'2:0' is not N:L (N >= 0 ascending"),  # a repeated N
    ([[2, 99]], 3, "'2:99' is not N:L"),                          # L beyond any draft length
    ([[2, 5]], 3, "2:5 cuts drafts to 5 tokens, longer than the profile's draft length 3"),
])
def test_a_hand_edited_load_cut_is_ignored_with_a_warning(cut, n_max, said, small_pair, ggufdspark_cli, isolated,
                                                          dspark_engine):
    """Row 14: a profile whose load cut --draft-n-max-by-slots would refuse (N not ascending, L out
    of range or longer than the draft length) is ignored with one warning naming the file and the
    value; before the fix it passed the profile check and went to the engine, which refused to start
    at -np 16 with a message that did not name the profile."""
    from ggufdspark.measuring import profiles
    from ggufdspark.bindings import probe_devices

    devices = probe_devices(dspark_engine.lib_dir, server=dspark_engine.path)
    rec = {"draft_enabled": True, "draft_n_max": n_max, "load_cut": cut, "max_concurrency_for_draft": 64,
           "why": "hand-edited", "measured_with": "tune --load (bench --load traffic)"}
    path = profiles.save_profile(devices, small_pair.target, small_pair.draft, {"recommendation": rec})
    assert profiles.profile_problem(json.loads(path.read_text())) is not None
    s = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run", "-np", "16",
                       env=isolated)
    assert s.returncode == 0, s.stderr
    assert "--spec-draft-n-max-by-slots" not in s.stdout and f"tune profile {path}:" not in s.stderr, (s.stdout, s.stderr)
    warning = [ln for ln in s.stderr.splitlines() if str(path) in ln]
    assert len(warning) == 1 and "ignored" in warning[0] and said in warning[0], s.stderr
    assert repr(cut) in warning[0] or str(cut) in warning[0], warning


def test_a_valid_load_cut_still_passes_the_profile_check():
    from ggufdspark.measuring import profiles

    for cut in ([[0, 2]], [[2, 5], [16, 0]], [[1, 3], [4, 2], [8, 1]]):
        assert profiles.profile_problem({"recommendation": {"draft_n_max": 5, "load_cut": cut}}) is None, cut
    assert profiles.profile_problem({"recommendation": {"load_cut": [[2, 5], [16, 0]]}}) is None


# ----------------------------------------------------------------------------- row 12: keys in results

KEY1, KEY2 = "sk-sweep3-secret-one", "sk-sweep3-secret-two"


def test_redaction_covers_every_spelling_of_an_engine_key():
    from ggufdspark.redaction import REDACTED, redact_argv, redact_command_line, redacted_command

    for argv in (["--server-arg=--api-key=" + KEY1],
                 ["--server-arg", "--api-key=" + KEY1],
                 ["--server-arg=--api-key", "--server-arg=" + KEY1],
                 ["--server-arg", "--api-key", "--server-arg", KEY1],
                 ["--server-arg=--hf-token", "--server-arg", KEY1],
                 ["--api-key", KEY1]):  # serve's own option
        line = redacted_command("ggufdspark", ["bench", "--load", *argv, "--clients", "1"])
        assert KEY1 not in line and REDACTED in line and line.endswith("--clients 1"), line
        assert KEY1 not in redact_command_line(" ".join(["ggufdspark", *argv]))
    # what is not a key stays as typed
    keep = ["bench", "--server-arg=--no-repack", "--server-arg", "-t", "--server-arg", "2", "--seed", "7"]
    assert redact_argv(keep) == keep
    assert KEY1 not in redact_command_line(f"ggufdspark bench '--server-arg=--api-key={KEY1} \"unbalanced")


def test_bench_load_json_never_holds_the_key(small_pair, ggufdspark_cli, isolated, tmp_path):
    """Row 12: an API key given as --server-arg=--api-key=K (and as --server-arg --api-key
    --server-arg K) was written in clear in the result's ``command``; the engine's command lines
    beside it were already redacted. The run itself uses the key (the engine requires it)."""
    out = tmp_path / "load.json"
    p = ggufdspark_cli("bench", "--load", "-m", str(small_pair.target), "-md", str(small_pair.draft),
                       "--clients", "1", "--answer-tokens", "4", "--requests-per-client", "1", "--draft-n-max", "2",
                       f"--server-arg=--api-key={KEY1}", "--server-arg", "--api-key", "--server-arg", KEY2,
                       "--json", str(out), "--log-dir", str(tmp_path / "logs"), env=isolated)
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    rep = json.loads(text)
    for secret in (KEY1, KEY2):
        assert secret not in text and secret not in p.stdout and secret not in p.stderr
    assert "--api-key=<redacted>" in rep["command"] and "--clients 1" in rep["command"], rep["command"]
    assert rep["arms"]["drafted"][0]["requests"] == 1  # the requests got through with the key


# ----------------------------------------------------------------------------- row 13: publish --results

from test_publish import TOKEN as HUB_TOKEN, hub, hub_env, run_publish, sha256  # noqa: E402,F401  (fixtures)


def _publish_results(cli, pair, env, *results: Path):
    return run_publish(cli, pair, env, *[a for r in results for a in ("--results", str(r))])


def test_publish_checks_bench_load_reports_against_the_pair(small_pair, other_pair, ggufdspark_cli, isolated, hub,
                                                           hub_env, tmp_path):
    """Row 13: a real bench --load report names its pair by sha256 and is rendered as a load
    report; published with another pair it is refused, as tune reports already were; a report that
    names no pair cannot be checked and is refused too. Before the fix all three went on the card
    (the load report as a generic table of its ratios)."""
    out = tmp_path / "load.json"
    b = ggufdspark_cli("bench", "--load", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--clients",
                       "1,2", "--answer-tokens", "4", "--requests-per-client", "1", "--draft-n-max", "2", "--json",
                       str(out), "--log-dir", str(tmp_path / "logs"), env=isolated)
    assert b.returncode == 0, b.stderr
    rep = json.loads(out.read_text())
    assert rep["pair"]["target_sha256"] == sha256(small_pair.target)
    assert rep["pair"]["draft_sha256"] == sha256(small_pair.draft)
    env = {**hub_env, **isolated}
    # another pair: refused before anything is sent
    p = _publish_results(ggufdspark_cli, other_pair, env, out)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"{out}: measured on another target" in p.stderr.strip().splitlines()[-1], p.stderr
    assert hub.requests == []  # the results are checked before the Hub is asked anything
    # no pair named: nothing to check it against
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({k: v for k, v in rep.items() if k != "pair"}))
    p = _publish_results(ggufdspark_cli, small_pair, env, bare)
    assert p.returncode == 1 and "names no pair.target_sha256" in p.stderr, p.stderr
    assert not hub.calls("POST", r"/commit/")
    # its own pair: on the card, as a load report
    p = _publish_results(ggufdspark_cli, small_pair, env, out)
    assert p.returncode == 0, p.stderr
    card = hub.files("org/Tiny-LFM2-GGUF")["README.md"].decode()
    assert "### ggufdspark bench --load" in card and "Under load (bench --load" in card, card
    assert "| clients | plain tok/s | with draft tok/s | vs no draft | plain TTFT p50 (s) |" in card
    rows = [ln for ln in card.splitlines() if ln.startswith("| 1 |") or ln.startswith("| 2 |")]
    assert len(rows) == 2, card
    ratio = rep["ratios"][0]["aggregate_tps"]
    assert f"| {ratio:.2f} |" in rows[0], (rows, ratio)
    assert "Measured on: cpu" in card and str(Path(rep["engine"]["path"]).parent) not in card
    assert "/tmp" not in card.split("## Measured")[1]  # no local path of the run (logs, engine)


def test_publish_refuses_a_bench_that_refused_its_own_headline(small_pair, ggufdspark_cli, isolated, tmp_path):
    """Row 13: a bench run whose two plain runs drifted beyond --max-plain-drift gives no speedup
    (exit 5) but still writes its report; publish --results put it on the card all the same."""
    from ggufdspark.errors import PublishError
    from ggufdspark.publish import plan_publish

    out = tmp_path / "bench.json"
    b = ggufdspark_cli("bench", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--limit", "1",
                       "--categories", "complex_reasoning", "-n", "8", "--no-gate", "--concurrency", "1", "--max-plain-drift", "0",
                       "--json", str(out), env=isolated)
    assert b.returncode == 5, b.stderr  # any drift at all is beyond 0
    rep = json.loads(out.read_text())
    assert rep["headline_refused"] is True and rep["pair"]["draft_sha256"] == sha256(small_pair.draft)
    with pytest.raises(PublishError, match="refused its own headline"):
        plan_publish(small_pair.target, small_pair.draft, repo="org/Tiny", results=[out])
    # the same run within the limit is published
    rep["headline_refused"] = False
    ok = tmp_path / "bench-ok.json"
    ok.write_text(json.dumps(rep))
    card = plan_publish(small_pair.target, small_pair.draft, repo="org/Tiny", results=[ok]).repos[0].card
    assert "### ggufdspark bench" in card and "| all |" in card


# ----------------------------------------------------------------------------- row 18: check the draft's shapes


def craft_draft(src: Path, dst: Path, *, meta: dict | None = None, shapes: dict | None = None,
                types: dict | None = None) -> Path:
    """The real draft ``src`` rewritten as ``dst`` by the project's GGUF writer, with some metadata
    values (``key: (value, vtype)``), tensor shapes and tensor types replaced (their data zeros)."""
    from ggufdspark.gguffile.constants import TensorType
    from ggufdspark.gguffile.reader import read_gguf
    from ggufdspark.gguffile.writer import GGUFWriter, tensor_nbytes

    g = read_gguf(src)
    w = GGUFWriter(dst)
    for key, value in g.metadata.items():
        vtype, itype = g.value_types[key]
        w.add(key, value, vtype, itype)
    for key, (value, vtype) in (meta or {}).items():
        w.add(key, value, vtype, None)
    layout = {name: (tuple((shapes or {}).get(name, t.shape)), TensorType((types or {}).get(name, t.type)))
              for name, t in g.tensors.items()}
    for name, (shape, ttype) in layout.items():
        w.add_tensor(name, shape, ttype)
    w.write(lambda name: [b"\0" * tensor_nbytes(*layout[name])], force=True)
    return dst


def _draft_cases(draft: Path) -> dict[str, tuple[dict, str]]:
    """name -> (craft_draft keywords, what check's one failed line must say)."""
    from ggufdspark.gguffile.constants import TensorType, ValueType
    from ggufdspark.gguffile.reader import read_gguf

    g = read_gguf(draft)
    vocab, rank = g.tensors["markov_w1.weight"].shape
    u32 = ValueType.UINT32
    return {
        "head_count 0": ({"meta": {"dflash.attention.head_count": (0, u32)}},
                         "draft attention heads: attention.head_count 0: expected at least 1"),
        "head_count_kv 0": ({"meta": {"dflash.attention.head_count_kv": (0, u32)}},
                            "attention.head_count_kv 0: expected at least 1"),
        "head_count_kv 3": ({"meta": {"dflash.attention.head_count_kv": (3, u32)}},
                            "attention.head_count 4 is not a multiple of attention.head_count_kv 3"),
        "key_length 12": ({"meta": {"dflash.attention.key_length": (12, u32)}},
                          "tensor blk.0.attn_q.weight is [64, 64], the hyperparameters imply [48, 64]"),
        "Markov rank 0": ({"shapes": {"markov_w1.weight": (vocab, 0), "markov_w2.weight": (vocab, 0)}},
                          f"draft Markov head rank: rank 0 (markov_w1.weight has no columns)"),
        "I32 fc.weight": ({"types": {"fc.weight": TensorType.I32}},
                          "draft tensor types: tensor fc.weight is I32"),
        "short ffn_up": ({"shapes": {"blk.1.ffn_up.weight": (g.tensors["blk.1.ffn_up.weight"].shape[0] - 32, 64)}},
                         "tensor blk.1.ffn_up.weight is ["),
    }


def test_check_refuses_drafts_the_engine_cannot_load(small_pair, ggufdspark_cli, tmp_path):
    """Row 18: each crafted draft (zero heads, KV heads that do not divide the heads, a key length
    the tensors contradict, a Markov head of rank 0, an integer fc.weight, a misshapen FFN matrix)
    fails check with the value named; before the fix check said "pair OK" to all of them."""
    wrong = []
    for name, (kw, said) in _draft_cases(small_pair.draft).items():
        d = craft_draft(small_pair.draft, tmp_path / f"dspark-{name.replace(' ', '_')}.gguf", **kw)
        p = ggufdspark_cli("check", str(small_pair.target), str(d))
        fails = [ln for ln in p.stdout.splitlines() if ln.startswith("FAIL")]
        if p.returncode == 0 or "pair OK" in p.stdout or not any(said in ln for ln in fails) or "Traceback" in p.stderr:
            wrong.append(f"{name}: exit {p.returncode}, FAIL lines {fails}, stderr {p.stderr.strip()[-300:]}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", ["head_count 0", "Markov rank 0", "I32 fc.weight", "key_length 12"])
def test_the_engine_cannot_run_what_check_refuses(name, small_pair, start_server, tmp_path):
    """The other half of row 18's proof: the real llama-server cannot run any such draft, so check's
    new failures are the engine's own: it refuses to start (wrong shapes, rank 0, no heads), or, with
    an integer fc.weight, loads it and dies at the first request (SIGSEGV in the pinned tree)."""
    from ggufdspark.errors import EngineError, ServerStartError

    kw, _ = _draft_cases(small_pair.draft)[name]
    d = craft_draft(small_pair.draft, tmp_path / "dspark-crafted.gguf", **kw)
    try:
        srv = start_server(model=small_pair.target, draft=d, draft_n_max=3)
    except ServerStartError as e:
        assert "draft" in str(e).lower() or "load" in str(e).lower(), e
        return
    with pytest.raises(EngineError):
        srv.client().complete("Hello there", n_predict=8)
    assert srv.proc.wait(timeout=60) != 0, f"{name}: the engine served a request with this draft"


def test_tune_json_never_holds_the_key(small_pair, ggufdspark_cli, isolated):
    """Row 12, tune: its settings recorded --server-arg values as given (a key among them) in its
    JSON and in the saved profile."""
    p = ggufdspark_cli("tune", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--rates", "0.8,0.6",
                       "--draft-lengths", "1", "--concurrency", "1", "-n", "4", "--requests", "1", "--json",
                       f"--server-arg=--api-key={KEY1}", env=isolated)
    assert p.returncode == 0, p.stderr
    assert KEY1 not in p.stdout and KEY1 not in p.stderr
    rep = json.loads(p.stdout)
    assert rep["settings"]["server_args"] == ["--api-key=<redacted>"]
    assert KEY1 not in Path(rep["profile_path"]).read_text()
    assert rep["pair"]["target_sha256"] == sha256(small_pair.target)  # row 13: the pair it measured


# ----------------------------------------------------------------------------- also seen: bench --load bounds


@pytest.mark.parametrize("args, said", [
    (["--clients", "100000"], "--clients 100000: at most 256"),
    (["--clients", "1,257"], "--clients 257: at most 256"),
    (["--rate", "2", "--clients", "5000"], "--clients 5000: at most 256"),
    (["--answer-tokens", "100000000"], "--answer-tokens 100000000: expected 1..32768"),
])
def test_bench_load_bounds_clients_and_answer_tokens(args, said, small_pair, ggufdspark_cli, isolated, tmp_path):
    """Also seen: --clients 100000 made the engine abort with an 18-line backtrace (llama.cpp runs at
    most 256 sequences), --answer-tokens 100000000 ran ~14 minutes an arm: both refused up front
    with one line and exit 2, no engine started (no log directory written)."""
    logs = tmp_path / "logs"
    p = ggufdspark_cli("bench", "--load", "-m", str(small_pair.target), "-md", str(small_pair.draft), *args,
                       "--log-dir", str(logs), env=isolated, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert said in p.stderr.strip().splitlines()[-1], p.stderr
    assert not logs.exists() or not any(logs.iterdir())


def test_tune_load_bounds_clients(small_pair, ggufdspark_cli, isolated):
    p = ggufdspark_cli("tune", "--load", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--clients",
                       "1,1000", "--no-save", env=isolated, timeout=60)
    assert p.returncode == 2 and "--clients 1000: at most 256" in p.stderr, p.stderr


# ----------------------------------------------------------------------------- also seen: the warm-up's timeout


def test_a_hung_warm_up_gives_up_after_its_timeout(small_pair, start_server):
    """Also seen: a warm-up request that never answered waited a fixed 300 s. Its limit is now the
    WarmUp's own (``timeout_s``: by default a minute plus the prompt at a slow CPU's rate, or as
    given): an engine stopped (SIGSTOP) during the warm-up is given up on after it, said, and
    served through once it runs again."""
    import os
    import signal
    import time

    from ggufdspark import warmup

    srv = start_server(model=small_pair.target, draft=small_pair.draft, draft_n_max=3)
    short = warmup.decide("cpu", srv.settings, True, 0)
    long = warmup.decide("cuda", srv.settings, None, None)
    assert short.on and 30 <= short.timeout_s <= 120, short
    assert long.prompt_tokens == 2048 and short.timeout_s < long.timeout_s < 300, long
    assert warmup.decide("cpu", srv.settings, True, 0, timeout=7.5).timeout_s == 7.5
    events: list[str] = []
    os.kill(srv.proc.pid, signal.SIGSTOP)  # our own engine: stopped, not ended
    try:
        t0 = time.monotonic()
        took = warmup.warmed(srv, warmup.WarmUp(True, 0, "test", timeout_s=2.0), None, events.append)
        waited = time.monotonic() - t0
    finally:
        os.kill(srv.proc.pid, signal.SIGCONT)
    assert took is None and waited < 2.0 + warmup._WARMUP_EXIT_WAIT_S + 5, (took, waited)
    assert len(events) == 1 and "warm-up request failed" in events[0] and "timed out" in events[0], events
    assert srv.alive() and srv.client().complete("Hello", n_predict=2)  # the engine serves on


# ----------------------------------------------------------------------------- also seen: publish's commit order


def test_an_interrupted_publish_never_leaves_the_target_card_without_its_draft(small_pair, hub, hub_env, isolated):
    """Also seen: Ctrl-C between publish's two commits left the target repo's card (whose serve line
    names the draft repo) committed while the draft repo had no draft. The draft repo is committed
    first now: a publish interrupted while its draft commit hangs leaves the target repo without
    the card; a re-run finishes both."""
    import os
    import signal
    import time

    hub.hang = r"^POST /api/models/org/Tiny-LFM2-DSpark-GGUF/commit/"
    env = {**os.environ, **hub_env, **isolated, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    args = [sys.executable, "-m", "ggufdspark", "publish", "--target", str(small_pair.target), "--draft",
            str(small_pair.draft), "--repo", "org/Tiny-LFM2"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not hub.hung and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # waiting for the Hub to hold the draft's commit
        assert hub.hung, f"the draft's commit never came (exit {proc.poll()})"
        proc.send_signal(signal.SIGINT)  # the process we started: Ctrl-C
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0, out
    target_files = hub.files("org/Tiny-LFM2-GGUF") if "org/Tiny-LFM2-GGUF" in hub.repos else {}
    assert "README.md" not in target_files, "the target card was committed while its draft repo had no draft"
    assert "Traceback" not in err, err
    hub.hang = None
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "dspark-Tiny-LFM2-F16.gguf" in hub.files("org/Tiny-LFM2-DSpark-GGUF")
    assert "README.md" in hub.files("org/Tiny-LFM2-GGUF")


# ----------------------------------------------------------------------------- also seen: temporary folders


def test_bench_and_tune_leave_no_temporary_folder(small_pair, ggufdspark_cli, isolated, tmp_path):
    """Also seen: every bench / tune run left a /tmp/ggufdspark-* folder of server logs nobody asked
    for. Without --log-dir they are removed when the run ends well (its report then names no logs);
    with --log-dir they are kept and named."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**isolated, "TMPDIR": str(tmp)}
    t, d = str(small_pair.target), str(small_pair.draft)
    runs = {
        "bench": ["bench", "-m", t, "-md", d, "--limit", "1", "--categories", "complex_reasoning", "-n", "8",
                  "--no-gate", "--concurrency", "1", "--max-plain-drift", "inf", "--json"],
        "bench --load": ["bench", "--load", "-m", t, "-md", d, "--clients", "1", "--answer-tokens", "4",
                         "--requests-per-client", "1", "--json"],
        "sampling check": ["bench", "--sampling-check", "-m", t, "-md", d, "--samples", "20", "-n", "2", "--json"],
        "tune": ["tune", "-m", t, "-md", d, "--rates", "0.8,0.6", "--draft-lengths", "1", "--concurrency", "1",
                 "-n", "4", "--requests", "1", "--no-save", "--json"],
    }
    for name, args in runs.items():
        p = ggufdspark_cli(*args, env=env)
        assert p.returncode in (0, 1, 3) and "Traceback" not in p.stderr, (name, p.stderr[-2000:])  # 1: inconclusive
        rep = json.loads(p.stdout)
        assert not rep["logs"], (name, rep["logs"])
        assert list(tmp.iterdir()) == [], (name, list(tmp.iterdir()))
    kept = tmp_path / "kept"
    p = ggufdspark_cli(*runs["bench --load"], "--log-dir", str(kept), env=env)
    assert p.returncode == 0, p.stderr
    logs = json.loads(p.stdout)["logs"]
    assert set(logs) == {"plain", "drafted"} and all(Path(f).is_file() for f in logs.values()), logs


# ----------------------------------------------------------------------------- also seen: huge headers


def _rss_and_time(args: list[str]) -> tuple[subprocess.CompletedProcess, int, float]:
    """Run ``ggufdspark ARGS`` under a fresh wrapper interpreter whose only child it is: the child's
    peak RSS (KiB) and wall time, besides the process."""
    import os

    code = ("import resource, subprocess, sys, time, json\n"
            "t0 = time.monotonic()\n"
            "p = subprocess.run([sys.executable, '-m', 'ggufdspark', *sys.argv[1:]], capture_output=True, text=True)\n"
            "print(json.dumps([p.returncode, p.stdout, p.stderr, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,"
            " time.monotonic() - t0]))\n")
    root = Path(__file__).resolve().parent.parent
    w = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, cwd=root,
                       env={**os.environ, "PYTHONPATH": str(root)})
    rc, out, err, rss, wall = json.loads(w.stdout)
    return subprocess.CompletedProcess(args, rc, out, err), rss, wall


def test_inspect_refuses_a_header_of_millions_of_empty_strings(small_pair, tmp_path):
    """Also seen: a 96 MB header of 12 M empty strings (a valid count: every item is 8 bytes) took
    inspect 9 s and 218 MB before it said anything. Arrays are bounded (no model's metadata holds a
    million items, the largest vocabularies a few hundred thousand): one line naming the file, the
    key and the count, at once."""
    import struct

    from ggufdspark.gguffile.constants import GGUF_MAGIC, ValueType

    path = tmp_path / "huge-header.gguf"
    n = 12_000_000
    key = b"tokenizer.ggml.tokens"
    with open(path, "wb") as f:
        f.write(GGUF_MAGIC + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                + struct.pack("<IIQ", ValueType.ARRAY, ValueType.STRING, n))
        f.write(bytes(8 * n))  # 12 M empty strings: each a zero length
    small, base_rss, _ = _rss_and_time(["inspect", str(small_pair.draft)])
    assert small.returncode == 0, small.stderr
    p, rss, wall = _rss_and_time(["inspect", str(path)])
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert str(path) in line and "'tokenizer.ggml.tokens'" in line and str(n) in line, line
    assert rss < base_rss + 40_000, f"inspect took {rss} KiB ({base_rss} KiB for a real draft)"
    assert wall < 8, f"inspect took {wall:.1f} s to refuse it"
    # a real vocabulary-sized array still reads
    from ggufdspark.gguffile.reader import read_gguf

    assert len(read_gguf(small_pair.target).metadata["tokenizer.ggml.tokens"]) == 1024


def test_bench_and_tune_refuse_an_api_prefix_for_their_servers(small_pair, ggufdspark_cli, isolated):
    """Row 10's flag on bench's and tune's side: ``--server-arg=--api-prefix=/x`` would move /health
    from where the arms are polled; refused in one line before any server starts."""
    t, d = str(small_pair.target), str(small_pair.draft)
    for args in (["bench", "-m", t, "-md", d, "--limit", "1", "-n", "4", "--server-arg=--api-prefix=/x"],
                 ["bench", "--load", "-m", t, "-md", d, "--clients", "1", "--server-arg=--api-prefix=/x"],
                 ["tune", "-m", t, "-md", d, "--no-save", "--server-arg=--api-prefix=/x"]):
        p = ggufdspark_cli(*args, env=isolated)
        assert p.returncode == 2, (args, p.returncode, p.stderr[-500:])
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "--api-prefix" in lines[0] and "Traceback" not in p.stderr, p.stderr
