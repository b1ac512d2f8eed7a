"""Progress of long work (issue 14): one mechanism, a tqdm bar with rate and time left on a terminal,
plain lines every 10% with the same figures elsewhere; log records and error messages never glue
onto a bar. Real CLI runs, under a real pseudo-terminal where a terminal is needed."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap


def run_in_terminal(argv: list[str], cols: int = 120, timeout: float = 120) -> str:
    """Run ``argv`` on a pseudo-terminal of ``cols`` columns; everything it wrote, decoded."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: a terminal on stdin, stdout and stderr
        try:
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, cols, 0, 0))
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out.decode(errors="replace")[-2000:]
    return out.decode(errors="replace")


def test_convert_on_a_terminal_draws_a_bar_with_rate(small_pair, tmp_path):
    out = run_in_terminal([sys.executable, "-m", "ggufdspark", "convert", str(small_pair.drafter_dir),
                           "--target", str(small_pair.target), "-o", str(tmp_path / "d.gguf")])
    bars = [seg for seg in out.split("\r") if seg.startswith("convert:")]
    assert bars, f"no progress bar drawn:\n{out[-1500:]}"
    assert "100%" in bars[-1] and "B/s" in bars[-1], bars[-1]
    assert "\nwrote " in out.replace("\r\n", "\n"), "the summary does not start on a line of its own"


def test_convert_in_a_log_prints_plain_lines(small_pair, tmp_path):
    p = subprocess.run([sys.executable, "-m", "ggufdspark", "convert", str(small_pair.drafter_dir),
                        "--target", str(small_pair.target), "-o", str(tmp_path / "d.gguf")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("convert:")]
    assert lines and "\r" not in p.stderr and "\x1b" not in p.stderr
    assert lines[-1].startswith("convert: 100% ") and lines[-1].endswith(")"), lines[-1]  # elapsed time
    assert len(lines) <= 12, lines  # one line per 10%, not one per tensor


def test_a_log_record_or_an_error_never_glues_onto_a_bar(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import logging
        from ggufdspark.cli._common import ProgressLine, close_progress
        logging.basicConfig(level=logging.INFO, format="LOG %(message)s")
        bar = ProgressLine("job", unit="B")
        bar(0, 1000, "first")
        bar(400, 1000, "second")
        logging.getLogger("x").info("a record in the middle")
        bar(500, 1000, "third")
        close_progress()   # what the CLI does before printing an error
        print("ERROR a message after the bar")
    """))
    out = run_in_terminal([sys.executable, str(script)]).replace("\r\n", "\n")
    assert "\rjob:  50%" in out, out
    assert "\rLOG a record in the middle\n" in out, out  # the bar line was cleared first
    assert "\nERROR a message after the bar\n" in out, out
