"""Run llama.cpp's own reference converter (pinned tree) as the oracle for our converter.

The reference converter recognises a BPE pre-tokenizer by hashing a sample tokenization, so a
tokenizer generated here is unknown to it. The oracle is told the pre-tokenizer name ("lfm2", what
the real LFM2 tokenizer maps to) by replacing that one lookup; nothing else is changed. It runs in
a child process, with the pinned tree's own ``gguf-py`` first on ``sys.path``.

The reference converter imports torch, about half of a conversion's time here: one child process
a pytest worker (``--serve``) converts every request in turn, each with its own arguments, output
and logging, as a fresh process would, so torch is imported once a worker, not once a conversion.

Usage (script): ``python tests/oracle.py --serve TREE``: one JSON request a line on stdin (``{"pre": ..., "args":
[...]}``), one JSON answer a line on stdout (``{"returncode": ..., "stdout": ..., "stderr": ...}``).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import numpy as np

from ggufdspark import engine
from ggufdspark.gguffile.reader import read_gguf


def compare_gguf(mine: Path, ref: Path, *, general: tuple[str, ...] = (), kept_float: dict[str, str] | None = None) -> None:
    """Assert two GGUF files equal key for key (value and type) and tensor for tensor (name, shape,
    type, bytes). ``general.*`` naming keys are cosmetic and left out, except the architecture, file
    type and quantization version, and those named in ``general``. ``kept_float`` maps tensors our
    policy keeps in float where the reference quantizes them (a draft's Markov head) to the type
    they must have in ``mine``; their bytes are not compared."""
    kept_float = kept_float or {}
    a, b = read_gguf(mine), read_gguf(ref)
    kept = ("general.architecture", "general.file_type", "general.quantization_version", *general)

    def keys(g):
        return {k for k in g.metadata if not k.startswith("general.") or k in kept}

    assert keys(a) == keys(b), f"keys only mine {keys(a) - keys(b)}, only reference {keys(b) - keys(a)}"
    for k in sorted(keys(a)):
        assert a.value_types[k] == b.value_types[k], f"{k}: type {a.value_types[k]} vs {b.value_types[k]}"
        assert a.metadata[k] == b.metadata[k], f"{k}: {str(a.metadata[k])[:80]} vs {str(b.metadata[k])[:80]}"
    assert set(a.tensors) == set(b.tensors), \
        f"only mine {set(a.tensors) - set(b.tensors)}, only ref {set(b.tensors) - set(a.tensors)}"
    for n in sorted(a.tensors):
        ta, tb = a.tensors[n], b.tensors[n]
        if n in kept_float:
            assert (ta.shape, ta.type_name) == (tb.shape, kept_float[n]), f"{n}: {ta.type_name}, not {kept_float[n]}"
            continue
        assert (ta.shape, ta.type_name) == (tb.shape, tb.type_name), \
            f"{n}: {ta.shape} {ta.type_name} vs {tb.shape} {tb.type_name}"
        assert np.array_equal(a.tensor_bytes(n), b.tensor_bytes(n)), f"{n}: bytes differ"


class _Oracle:
    """This worker's reference-converter process (``--serve``), started at first use and ended, by
    its pid, when the worker exits."""

    def __init__(self, tree: Path):
        env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", str(tree)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env)
        self.answers: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        atexit.register(self.stop)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.answers.put(line)
        self.answers.put("")  # the process ended

    def convert(self, pre: str, args: list[str], timeout: float) -> dict | None:
        """The answer to one request; None if the process ended or did not answer in time (it is
        then stopped, and the next request starts another)."""
        try:
            self.proc.stdin.write(json.dumps({"pre": pre, "args": args}) + "\n")
            self.proc.stdin.flush()
            line = self.answers.get(timeout=timeout)
        except (OSError, queue.Empty):
            line = ""
        if not line:
            self.stop()
            return None
        return json.loads(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_oracles: dict[Path, _Oracle] = {}


def run_reference(args: list[str], *, pre: str = "lfm2", tree: Path | None = None,
                  timeout: float = 900) -> subprocess.CompletedProcess:
    """Run ``convert_hf_to_gguf.py args`` from the pinned tree with the pre-tokenizer forced, in this
    worker's oracle process; a process that died or hung is replaced and the request fails with
    what happened."""
    tree = tree or engine.llama_cpp_tree()
    if not (tree / "convert_hf_to_gguf.py").is_file():
        raise FileNotFoundError(f"{tree}: pinned llama.cpp tree not found; run 'ggufdspark build-engine'")
    oracle = _oracles.get(tree)
    if oracle is None or oracle.proc.poll() is not None:
        oracle = _oracles[tree] = _Oracle(tree)
    answer = oracle.convert(pre, args, timeout)
    cmd = ["convert_hf_to_gguf.py", *args]
    if answer is None:
        return subprocess.CompletedProcess(cmd, -1, "", f"the oracle process (pid {oracle.proc.pid}) ended or "
                                                        f"gave no answer within {timeout:.0f} s")
    return subprocess.CompletedProcess(cmd, answer["returncode"], answer["stdout"], answer["stderr"])


def _convert(pre: str, args: list[str]) -> dict:
    """One conversion in this process, as ``convert_hf_to_gguf.py args`` would run alone: its own
    argv, its own stdout and stderr, logging configured afresh."""
    import conversion.base as base  # noqa: E402  (from the pinned tree)
    import convert_hf_to_gguf  # noqa: E402

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    out, err = io.StringIO(), io.StringIO()
    for h in list(logging.root.handlers):  # main() calls basicConfig, which configures only once
        logging.root.removeHandler(h)
    sys.argv = ["convert_hf_to_gguf.py", *args]
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            convert_hf_to_gguf.main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:  # noqa: BLE001  (a failed conversion is an answer, not the end)
            traceback.print_exc(file=err)
            code = 1
    for h in list(logging.root.handlers):
        logging.root.removeHandler(h)
    return {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def _serve(tree: str) -> None:
    sys.path.insert(0, str(Path(tree) / "gguf-py"))
    sys.path.insert(0, tree)
    answers = os.fdopen(os.dup(1), "w")  # the requests' own output goes to their answers, not here
    os.dup2(2, 1)
    for line in sys.stdin:
        request = json.loads(line)
        answers.write(json.dumps(_convert(request["pre"], request["args"])) + "\n")
        answers.flush()


if __name__ == "__main__":
    if sys.argv[1:2] != ["--serve"] or len(sys.argv) != 3:
        sys.exit("usage: python tests/oracle.py --serve TREE")
    _serve(sys.argv[2])
