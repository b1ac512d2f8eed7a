"""Timings parser: checked on outputs captured from the real engine (tests/fixtures/timings, made
by scripts/capture_timings.py) and, live, on a fresh capture against the current engine.

The reference figures are the engine's own: each test reads the log's ``draft acceptance = R
(A accepted / G generated), mean len = L`` lines with its own regex and compares them with what
the parser made of the responses, the log and the /metrics counters of the same run.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ggufdspark import timings as tm
from ggufdspark.errors import InputNotFoundError, LogWaitTimeoutError, TimingsParseError

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "timings"
CAPTURE = REPO / "scripts" / "capture_timings.py"

# The engine's per-request speculative line, read independently of the parser.
DRAFT_LINE = re.compile(r"task (\d+) \| draft acceptance = ([\d.]+) \(\s*(\d+) accepted /\s*(\d+) generated\), "
                        r"mean len =\s*(\d+\.\d\d)")  # %5.2f: two decimals, so a half-written line does not match


def manifest(folder: Path = FIXTURES) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def engine_lines(log_path: Path) -> dict[int, tuple[str, int, int, str]]:
    """task id -> (rate text, accepted, generated, mean len text), as the engine printed them."""
    return {int(m[1]): (m[2], int(m[3]), int(m[4]), m[5]) for m in DRAFT_LINE.finditer(log_path.read_text())}


def check_run(folder: Path, run: str) -> None:
    """Responses, log and /metrics of one captured run agree with the engine's own figures."""
    info = manifest(folder)["runs"][run]
    responses = [tm.read(folder / q["file"]) for q in info["requests"]]
    for q, recs in zip(info["requests"], responses):
        assert len(recs) == 1, q["file"]
        r = recs[0]
        assert recs.format == ("sse" if q["stream"] else "json")
        assert (r.source, r.kind, r.engine) == ("stream" if q["stream"] else "response", q["name"]
                                                if q["name"] != "one-token" else "completion", "llama.cpp")
    resp = [recs[0] for recs in responses]
    log_recs = tm.read(folder / info["log"])
    metrics = tm.read(folder / info["metrics"])
    assert metrics.format == "metrics" and all(m.kind == "metrics-delta" for m in metrics)
    assert len(log_recs) == len(resp) == len(metrics) == len(info["requests"])
    printed = engine_lines(folder / info["log"])
    assert len(printed) == len(resp) - 1  # the one-token request drafted nothing
    joined = tm.join(resp, log_recs)
    for r, lg, m, j in zip(resp, log_recs, metrics, joined):
        for f in ("prompt_n", "predicted_n", "draft_n", "draft_n_accepted"):
            assert getattr(r, f) == getattr(lg, f) == getattr(m, f), (r.where, f)
        if not r.drafted:  # llama-server sends no draft fields when nothing was drafted
            assert r.predicted_n == 1 and "draft_n" not in r.extra and lg.task_id not in printed
            assert r.passes is None and lg.passes is None and m.passes is None
            continue
        rate, acc, gen, mean_len = printed[lg.task_id]
        assert (r.draft_n, r.draft_n_accepted) == (gen, acc)
        # the engine prints (float) A / G with %0.5f and 1 + A/V with %5.2f
        assert f"{np.float32(r.draft_n_accepted) / np.float32(r.draft_n):.5f}" == rate
        assert lg.passes_source == "log" and m.passes_source == "metrics" and j.passes_source == "log"
        assert lg.passes == m.passes == j.passes  # the log's mean len pins the metrics' exact count
        assert f"{j.accept_length:.2f}" == f"{lg.accept_length:.2f}" == mean_len
        assert j.mat == pytest.approx(j.accept_length - 1)
        assert j.tokens_per_pass == pytest.approx(r.predicted_n / m.passes)
        # the estimate without a log: labelled, and close (first token, last plain step)
        assert r.passes_source == "estimated" and abs(r.passes - m.passes) <= 2
        assert m.accepted_per_pos and sum(m.accepted_per_pos) == m.draft_n_accepted
        assert r.decode_tps == pytest.approx(1000 * r.predicted_n / r.predicted_ms)
        assert r.end_to_end_ms == pytest.approx(r.prompt_ms + r.predicted_ms)
        assert lg.end_to_end_ms == pytest.approx(r.end_to_end_ms, abs=0.02)
    # the concatenated captures read the same as the single files
    assert [x.predicted_n for x in tm.read(folder / info["jsonl"])] == \
        [r.predicted_n for r, q in zip(resp, info["requests"]) if not q["stream"]]
    assert [(x.predicted_n, x.draft_n) for x in tm.read(folder / info["sse"])] == \
        [(r.predicted_n, r.draft_n) for r, q in zip(resp, info["requests"]) if q["stream"]]


# ------------------------------------------------------------------ captured from the real engine


@pytest.mark.parametrize("run", ["draft", "synth"])
def test_captured_run_agrees_with_engine_log(run):
    check_run(FIXTURES, run)


def test_synthetic_run_has_varied_accept_lengths():
    """The random small drafter accepts one token per pass (mean len 2.00); the synthetic run is
    what exercises the mean-len-to-passes inversion on values other than 2."""
    lens = {v[3] for v in engine_lines(FIXTURES / "synth.log").values()}
    assert len(lens) >= 3 and "2.00" not in lens


def test_plain_run_has_no_draft_and_its_log_is_refused():
    info = manifest()["runs"]["plain"]
    resp = [tm.read(FIXTURES / q["file"])[0] for q in info["requests"]]
    assert all(r.draft_n is None and r.passes is None and r.accept_length is None for r in resp)
    s = tm.summarize(resp)
    assert (s.n_requests, s.n_drafted, s.accept_length.request_mean) == (7, 0, None)
    assert s.decode_tps.token_weighted > 0
    with pytest.raises(TimingsParseError, match=r"plain\.log: 7 request\(s\) in the log but no speculative line"):
        tm.read(FIXTURES / "plain.log")
    plain = tm.read(FIXTURES / "plain.log", allow_plain=True)
    assert [r.predicted_n for r in plain] == [r.predicted_n for r in resp]
    assert all(m.draft_n is None for m in tm.read(FIXTURES / "plain.metrics"))


@pytest.mark.parametrize("name, fmt", [
    ("draft-00-completion.json", "json"), ("draft-01-completion-stream.sse", "sse"),
    ("draft.jsonl", "jsonl"), ("draft.sse", "sse"), ("draft.log", "log"), ("draft.metrics", "metrics"),
    ("sglang-generate.json", "json"), ("sglang-generate.sse", "sse"),
])
def test_format_is_detected(name, fmt):
    assert tm.detect_format((FIXTURES / name).read_text()) == fmt
    assert tm.read(FIXTURES / name).format == fmt


def test_summary_request_mean_and_token_weighted():
    recs = [r for r in tm.read(FIXTURES / "synth.log") if r.drafted]
    s = tm.summarize(recs)
    a = np.array([r.draft_n_accepted for r in recs], float)
    g = np.array([r.draft_n for r in recs], float)
    v = np.array([r.passes for r in recs], float)
    n = np.array([r.predicted_n for r in recs], float)
    assert s.acceptance_rate.request_mean == pytest.approx(np.mean(a / g))
    assert s.acceptance_rate.token_weighted == pytest.approx(a.sum() / g.sum())
    assert s.accept_length.request_mean == pytest.approx(np.mean(1 + a / v))
    assert s.accept_length.token_weighted == pytest.approx(1 + a.sum() / v.sum())
    assert s.mat.token_weighted == pytest.approx(a.sum() / v.sum())
    assert s.tokens_per_pass.token_weighted == pytest.approx(n.sum() / v.sum())
    assert s.accept_length.request_mean != pytest.approx(s.accept_length.token_weighted)
    assert (s.n_requests, s.passes_sources) == (len(recs), {"log": len(recs)})


def test_metrics_delta_gives_exact_counts():
    scrapes = tm.parse_metrics((FIXTURES / "synth.metrics").read_text())
    assert len(scrapes) == len(manifest()["runs"]["synth"]["requests"]) + 1
    log_recs = tm.read(FIXTURES / "synth.log")
    d = tm.metrics_delta(scrapes[0], scrapes[1])
    assert (d.passes_source, d.passes, d.draft_n_accepted) == ("metrics", log_recs[0].passes,
                                                               log_recs[0].draft_n_accepted)
    total = tm.metrics_totals(scrapes[-1])
    assert total.draft_n == sum(r.draft_n or 0 for r in log_recs)
    with pytest.raises(TimingsParseError, match="went down .* the server restarted"):
        tm.metrics_delta(scrapes[2], scrapes[1])
    with pytest.raises(TimingsParseError, match="no 'llamacpp:spec_decode_num_drafts_total'"):
        tm.metrics_delta("foo_total 1\n", "foo_total 2\n")


def test_join_accepts_a_subset_in_order_and_refuses_strangers():
    jsonl = tm.read(FIXTURES / "synth.jsonl")
    joined = tm.join(jsonl, tm.read(FIXTURES / "synth.log"))
    assert [j.passes_source for j in joined] == ["log", "log", "log", None]
    with pytest.raises(TimingsParseError, match="matches no request"):
        tm.join(jsonl, tm.read(FIXTURES / "draft.log"))


def test_passes_from_mean_len():
    for accepted in range(1, 120, 7):
        for passes in range(1, 60, 3):
            mean_len = float(f"{1 + accepted / passes:.2f}")
            assert passes in tm.passes_from_mean_len(accepted, mean_len, drafted=10 * passes)
    assert tm.passes_from_mean_len(29, 4.22, 53) == [9]
    assert tm.passes_from_mean_len(1000, 3.00, 5000) == [499, 500, 501]  # 2 decimals can't tell
    assert tm.passes_from_mean_len(0, 1.00, 10) == []  # nothing accepted: no information


def test_other_build_log_format_and_malformed_lines():
    text = ("0.16.519.188 I slot print_timing: id  0 | task 42 | prompt eval time =     714.79 ms /  1091 tokens "
            "(    0.66 ms per token,  1526.35 tokens per second)\n"
            "0.16.519.188 I slot print_timing: id  0 | task 42 |        eval time =    3133.20 ms /   353 tokens "
            "(    8.88 ms per token,   112.66 tokens per second)\n"
            "0.16.519.195 I slot print_timing: id  0 | task 42 | draft acceptance = 0.66237 (  257 accepted /"
            "   388 generated), mean acceptance length =  3.65, acceptance rate per position = (0.804, 0.701, "
            "0.629, 0.515)\n")
    (r,) = tm.parse(text)
    assert (r.task_id, r.predicted_n, r.draft_n_accepted, r.draft_n) == (42, 353, 257, 388)
    assert r.accept_rate_per_pos == [0.804, 0.701, 0.629, 0.515]
    assert r.passes_source == "log" and f"{r.accept_length:.2f}" == "3.65"
    bad = text.replace("(  257 accepted", "(  257 acepted")
    with pytest.raises(TimingsParseError, match=r"line 3 \(byte \d+\): unreadable 'draft' timing line"):
        tm.parse(bad)
    lines = (FIXTURES / "synth.log").read_text().splitlines()
    i = [k for k, ln in enumerate(lines) if "draft acceptance" in ln][1]
    task = int(re.search(r"task (\d+)", lines[i])[1])
    lines[i] = lines[i].replace(" accepted /", " acepted /")
    recs = tm.parse("\n".join(lines), lenient=True)  # the damaged request is left out
    assert len(recs) == 6 and task not in [r.task_id for r in recs] and len(recs.skipped) == 1


# ------------------------------------------------------------------ SGLang (constructed fixtures)


def test_sglang_responses():
    a, b, c = tm.read(FIXTURES / "sglang-generate.json")
    assert {a.engine, a.kind, a.passes_source} == {"sglang", "sglang-generate", "reported"}
    assert (a.passes, a.draft_n, a.draft_n_accepted) == (16, 128, 47)
    assert a.accept_length == pytest.approx(1 + 47 / 16)
    assert a.tokens_per_pass == pytest.approx(a.reported_accept_length) == 4.0  # SGLang's own convention
    assert a.acceptance_rate == pytest.approx(a.reported_acceptance_rate)
    assert a.accepted_per_pos[0] == 14 and a.e2e_ms == pytest.approx(412.0)
    assert (b.draft_n_accepted, b.draft_n, b.passes) == (69, 240, 30)  # older field names
    assert (c.accept_length, c.tokens_per_pass, c.drafted) == (None, 2.5, True)  # spec_verify_ct only
    (s,) = tm.read(FIXTURES / "sglang-generate.sse")
    assert (s.source, s.passes, s.draft_n_accepted, s.predicted_n) == ("stream", 16, 47, 64)
    assert tm.parse(Path(FIXTURES / "sglang-generate.json"), format="sglang").format == "sglang"
    with pytest.raises(TimingsParseError, match="no 'meta_info'"):
        tm.parse(Path(FIXTURES / "draft-00-completion.json"), format="sglang")


# ------------------------------------------------------------------ bad input


def _cut(name: str, marker: str) -> str:
    text = (FIXTURES / name).read_text()
    return text[:text.index(marker)]


@pytest.mark.parametrize("text, message", [
    ("", "empty input"),
    ("hello, this is not timings\nat all\n", r"line 1: cannot tell what this is"),
    ('{"content": "hi", "stop": true}', r"no 'timings' \(llama-server\) or 'meta_info'"),
    ('{"error": {"code": 400, "message": "bad request"}}', "answered with an error: bad request"),
    ('{"timings": {"predicted_n": "many"}}', r"'predicted_n' is \"many\", expected a number"),
    ("data: {\"content\": \"a\"}\n\ndata: [DONE]\n", r"lines 1-1: the streamed request has no chunk with timings"),
])
def test_bad_input_messages(text, message):
    with pytest.raises(TimingsParseError, match=message):
        tm.parse(text, name="in")


def test_truncated_json_names_the_byte():
    text = _cut("draft-00-completion.json", '"draft_n_accepted"')
    with pytest.raises(TimingsParseError, match=rf"line 1, column \d+ \(byte {len(text.encode())}\): "
                                                r"invalid JSON, .*truncated\?"):
        tm.parse(text, name="cut.json")


def test_binary_garbage_names_the_byte():
    with pytest.raises(TimingsParseError, match=r"byte 4: not UTF-8 text \(0xff\)"):
        tm.parse(b'{"a"\xff\xfe\x00')


def test_sse_cut_mid_line_strict_and_lenient():
    text = _cut("draft.sse", '"draft_n_accepted":16')  # inside the second request's last chunk
    line_no = text.count("\n") + 1
    with pytest.raises(TimingsParseError, match=rf"line {line_no} \(byte \d+\): the stream is cut mid-line"):
        tm.parse(text, name="cut.sse")
    recs = tm.parse(text, name="cut.sse", lenient=True)
    assert [r.predicted_n for r in recs] == [48] and len(recs.skipped) == 1


def test_jsonl_bad_line_strict_and_lenient():
    lines = (FIXTURES / "synth.jsonl").read_text().splitlines()
    lines[1] = lines[1][:50]
    lines.insert(2, '{"no": "timings"}')
    text = "\n".join(lines) + "\n"
    with pytest.raises(TimingsParseError, match=r"in: line 2, column \d+ \(byte \d+\): invalid JSON"):
        tm.parse(text, name="in")
    recs = tm.parse(text, name="in", lenient=True)
    assert len(recs) == 3 and [s.where for s in recs.skipped] == ["in:2", "in:3"]
    assert tm.summarize(recs).skipped == 2


def test_missing_file_and_unknown_format():
    with pytest.raises(InputNotFoundError):
        tm.read(FIXTURES / "nope.json")
    with pytest.raises(TimingsParseError, match="unknown format 'xml'"):
        tm.parse("{}", format="xml")


# ------------------------------------------------------------------ the command


def test_cli_table(ggufdspark_cli):
    p = ggufdspark_cli("timings", str(FIXTURES / "synth.log"))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split()[:5] == ["#", "request", "kind", "prompt", "gen"]
    assert "7 request(s), 6 drafted; passes: 6 log" in p.stdout
    assert any(ln.startswith("accept length (1 + A/V)") for ln in lines)
    means = {v[3] for v in engine_lines(FIXTURES / "synth.log").values()}
    assert all(f" {m} " in p.stdout for m in means)


def test_cli_json_csv_stdin_and_log_join(ggufdspark_cli):
    p = ggufdspark_cli("timings", str(FIXTURES / "synth.jsonl"), "--json", "--log", str(FIXTURES / "synth.log"))
    out = json.loads(p.stdout)
    assert out["format"] == "jsonl" and len(out["records"]) == 4
    assert [r["passes_source"] for r in out["records"]][:3] == ["log"] * 3
    assert out["summary"]["accept_length"]["token_weighted"] > 1 and "accept_length" in out["formulas"]
    p = ggufdspark_cli("timings", str(FIXTURES / "draft.metrics"), "--csv")
    rows = list(csv.DictReader(io.StringIO(p.stdout)))
    assert len(rows) == 7 and rows[0]["passes_source"] == "metrics"
    p = subprocess.run([sys.executable, "-m", "ggufdspark", "timings", "-", "--format", "sse"], cwd=REPO,
                       input=(FIXTURES / "synth.sse").read_bytes(), capture_output=True)
    assert p.returncode == 0 and b"3 request(s), 3 drafted; passes: 3 estimated" in p.stdout


@pytest.mark.parametrize("args, code, message", [
    (["plain.log"], 1, "no speculative line"),
    (["draft-00-completion.json", "--format", "log"], 1, "no llama-server per-request timing lines"),
    (["nope.json"], 4, "nope.json: no such file"),  # 4, not 2: a missing input is not a usage error
    (["."], 4, "timings: is a directory, expected a file"),
    (["synth.jsonl", "--log", "nope.log"], 4, "nope.log: no such file"),
])
def test_cli_errors_are_one_line(ggufdspark_cli, args, code, message):
    p = ggufdspark_cli("timings", *[str(FIXTURES / a) if i == 0 else a for i, a in enumerate(args)])
    assert p.returncode == code and message in p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


def test_cli_no_file_on_a_terminal_is_a_usage_error():
    """With no FILE and stdin a terminal (a real pty), the command says so at once (exit 2) instead
    of waiting for input; with stdin piped, no FILE still reads it."""
    controller, terminal = pty.openpty()
    try:
        p = subprocess.run([sys.executable, "-m", "ggufdspark", "timings"], cwd=REPO, stdin=terminal,
                           capture_output=True, text=True, timeout=60)
    finally:
        os.close(terminal)
        os.close(controller)
    assert p.returncode == 2, p.stderr
    assert "no FILE given and stdin is a terminal" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, "-m", "ggufdspark", "timings"], cwd=REPO, capture_output=True,
                       input=(FIXTURES / "synth.sse").read_bytes(), timeout=60)
    assert p.returncode == 0 and b"3 request(s), 3 drafted" in p.stdout


def test_cli_lenient_reports_skipped(ggufdspark_cli, tmp_path):
    f = tmp_path / "cut.sse"
    f.write_text(_cut("draft.sse", '"draft_n_accepted":16'))
    p = ggufdspark_cli("timings", str(f))
    assert p.returncode == 1 and "cut mid-line" in p.stderr
    p = ggufdspark_cli("timings", str(f), "--lenient")
    assert p.returncode == 0 and "skipped 1 unreadable record(s)" in p.stderr
    assert "1 request(s), 1 drafted" in p.stdout


# ------------------------------------------------------------------ live, against the current engine


def test_capture_live_against_engine(dspark_engine, tmp_path):
    """Re-run the capture script against the engine built here and check it like the fixtures."""
    out = tmp_path / "capture"
    p = subprocess.run([sys.executable, str(CAPTURE), "--out", str(out), "--server", dspark_engine.path,
                        "--pair-root", str(tmp_path / "pair")], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert manifest(out)["engine"]["commit"] == manifest()["engine"]["commit"]
    for run in ("draft", "synth"):
        check_run(out, run)


def test_client_and_metrics_delta_flow(start_server, small_pair):
    """What the bench does: scrape, one request through the Client, scrape, join for exact passes."""
    srv = start_server(model=small_pair.target, draft=small_pair.draft, draft_n_max=6,
                       synth_rates=[0.9, 0.7, 0.5, 0.3, 0.2, 0.1])
    c = srv.client()
    before = c.metrics()
    out = c.complete("The quick brown fox", n_predict=40)
    delta = tm.metrics_delta(before, c.metrics())
    assert out.timings.passes_source == "estimated" and out.timings.drafted
    (exact,) = tm.join([out.timings], [delta])
    assert exact.passes_source == "metrics" and exact.passes == delta.passes
    # the engine's logger thread can write the request's lines after the response: wait for them
    srv.wait_for_log(DRAFT_LINE.pattern)
    (logged,) = [r for r in tm.parse(srv.log_text(), name="server.log") if r.drafted]
    assert logged.passes == delta.passes
    assert f"{exact.accept_length:.2f}" == f"{logged.reported_accept_length:.2f}"


def test_wait_for_log_raises_when_the_line_does_not_come(start_server, small_pair):
    """A line the engine never writes, or fewer lines than asked for, is an error naming the pattern,
    the count and the wait, never a silent short list; once the server has exited, at once."""
    srv = start_server(model=small_pair.target, draft=small_pair.draft, draft_n_max=6, ctx_size=1024)
    srv.client().complete("The quick brown fox", n_predict=16)
    (line,) = srv.wait_for_log(DRAFT_LINE.pattern)
    assert DRAFT_LINE.search(line)
    with pytest.raises(LogWaitTimeoutError, match=r"server-\d+\.log: 0 line\(s\) matching 'no such line', "
                                                  r"expected at least 1; waited 0\.5s"):
        srv.wait_for_log("no such line", timeout=0.5)
    with pytest.raises(LogWaitTimeoutError, match=r"1 line\(s\) matching 'draft acceptance', expected at least 2; "
                                                  r"waited 0\.5s"):
        srv.wait_for_log("draft acceptance", timeout=0.5, count=2)
    assert isinstance(LogWaitTimeoutError("x"), TimeoutError)
    srv.stop()
    t0 = time.monotonic()
    with pytest.raises(LogWaitTimeoutError, match=r"expected at least 2; llama-server exited \(code -?\d+\)"):
        srv.wait_for_log("draft acceptance", timeout=60, count=2)
    assert time.monotonic() - t0 < 30
    assert len(srv.wait_for_log("draft acceptance", timeout=0)) == 1


def test_a_log_window_takes_each_request_once_as_the_log_grows(tmp_path):
    """timings.live.LogWindow on the real engine's log written piece by piece, cut mid-line and
    mid-block: every request is taken once, when its block and release are complete, and the takes
    add up to the whole log's records; the running count follows launches and releases; a window
    made at a log's end takes only what comes after."""
    from ggufdspark.timings.live import LogWindow

    data = (FIXTURES / "draft.log").read_bytes()
    whole = tm.parse(FIXTURES / "draft.log")
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    window = LogWindow(log)
    takes, running = [], []
    step = max(1, len(data) // 37)  # 37 pieces: most cuts fall inside lines and timing blocks
    for at in range(0, len(data), step):
        with open(log, "ab") as f:
            f.write(data[at:at + step])
        s = window.take()
        takes.append(s)
        running.append(s.running)
    assert takes[-1].running == 0 and max(running) == 1, running
    for key in ("requests", "prompt_n", "predicted_n", "draft_n", "draft_n_accepted", "passes"):
        want = len(whole) if key == "requests" else sum(getattr(r, key) or 0 for r in whole if key != "passes" or r.drafted)
        assert sum(getattr(s, key) for s in takes) == want, key
    assert sum(s.requests for s in takes[:3]) == 0  # the engine's start: nothing finished yet

    later = LogWindow(log)  # made at the end: the requests above are not its
    assert later.take().requests == 0
    with open(log, "ab") as f:
        f.write(data)
    assert later.take().requests == len(whole)
    third = data[:len(data) // 3]
    log.write_bytes(third)  # truncated and written anew (a rotated log): read from its start
    done = third[:third.rfind(b"stop processing")]  # the blocks released in that third
    assert b"print_timing" in done
    assert later.take().requests == len(tm.parse(done.decode(), format="log", allow_plain=True))


def _stop(p: subprocess.Popen) -> tuple[str, str]:
    """End a follower whatever signal dispositions it inherited (issue 63: run where SIGINT is ignored,
    a SIGINT alone left it polling for ever): SIGINT, then SIGTERM, then SIGKILL. Returns its output."""
    import signal

    for stop in (lambda: p.send_signal(signal.SIGINT), p.terminate, p.kill):
        if p.poll() is not None:
            break
        stop()
        try:
            return p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    return p.communicate()


def test_timings_follow_prints_what_a_running_server_finishes(small_pair, start_server):
    """`ggufdspark timings --follow LOG --json` beside a real llama-server: JSON lines of what finished,
    adding up to the responses' own counts, none while idle; Ctrl-C (SIGINT) ends it with exit 0
    (SIGTERM where the suite runs with SIGINT ignored); options that do not apply to a growing log are
    refused in one line."""
    srv = start_server(model=small_pair.target, draft=small_pair.draft, draft_n_max=4, parallel=1, ctx_size=512)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "ggufdspark", "timings", "--follow", str(srv.log_path), "--every", "0.3",
                          "--json"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr is not None and p.stderr.readline().startswith("following ")  # the window is open
        c = srv.client(timeout=120)
        answers = [c.complete(f"Follow {i}", n_predict=20) for i in range(2)]
        lines = []
        while sum(x["requests"] for x in lines) < 2:
            line = p.stdout.readline()
            assert line, f"timings --follow ended early: {lines}, {p.stderr.read()}"
            lines.append(json.loads(line))
    finally:
        out, err = _stop(p)
    assert p.returncode == 0 and "Traceback" not in err, err
    assert out.strip() == "", out  # idle after the two requests: nothing more
    for key in ("predicted_n", "draft_n", "draft_n_accepted"):
        assert sum(x[key] for x in lines) == sum(getattr(a.timings, key) or 0 for a in answers), (key, lines)
    bad = subprocess.run([sys.executable, "-m", "ggufdspark", "timings", "--follow", str(srv.log_path), "--csv"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--csv does not apply" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    gone = subprocess.run([sys.executable, "-m", "ggufdspark", "timings", "--follow", str(srv.log_path) + ".nope"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert gone.returncode == 4 and "Traceback" not in gone.stderr, gone.stderr
    assert gone.stderr.strip().splitlines() == [f"ggufdspark: error: {srv.log_path}.nope: log not found"], gone.stderr
    bare = subprocess.run([sys.executable, "-m", "ggufdspark", "timings", "--follow"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert bare.returncode == 2 and "--follow needs the log's path as FILE" in bare.stderr, bare.stderr
