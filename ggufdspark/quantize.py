"""``quantize``: a float GGUF target or DSpark draft to a quantized one, with the pinned engine's own
``llama-quantize`` (built next to ``llama-server`` by ``ggufdspark build-engine --with-tools``).

    quantize("tiny-F16.gguf", "Q4_K_M")                  # -> tiny-Q4_K_M.gguf beside it
    quantize("dspark-tiny-F16.gguf", "Q8_0", output=p)   # a draft: its Markov head stays F16

What a draft may take and which of its tensors stay in float are facts of ``ggufdspark.quants``.
The input is checked first (a GGUF, a target or a DSpark draft, in a float type: requantizing is
refused), the output is written to a temporary file in its directory, checked (its header reads,
its file type is the one asked for, a draft's Markov head is still float) and only then renamed
into place; on any failure nothing is left behind.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ggufdspark import engine, interrupts
from ggufdspark.convert.common import check_output
from ggufdspark.errors import (EngineError, GgufdsparkError, InputNotFoundError, InvalidArgumentError,
                               OutputExistsError, UnsafeOutputError, UnsupportedModelError, no_space_error)
from ggufdspark.gguffile.constants import TensorType
from ggufdspark.gguffile.reader import read_gguf
from ggufdspark.inspect import classify
from ggufdspark.quants import (DRAFT_KEEP_FLOAT, DRAFT_TYPES, FLOAT_TYPES, FTYPE_LABELS, QUANT_TYPES,
                               float_type, precision)
from ggufdspark.runners import lifeline
from ggufdspark.runners.server import exit_cause

log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]
QUANTIZE_EXE = "llama-quantize"
# llama-quantize prints one line per tensor: "[  12/  56] blk.1.ffn_up.weight - [...]"
_TENSOR_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")


@dataclass
class QuantizeResult:
    path: Path
    source: Path
    kind: str  # "target" or "draft"
    type: str  # the label asked for (Q4_K_M)
    source_type: str  # the input's label (F16)
    nbytes: int
    sha256: str
    seconds: float
    kept_float: dict[str, str] = field(default_factory=dict)  # draft tensor -> its type, kept as it came
    tensor_types: dict[str, int] = field(default_factory=dict)  # type name -> tensor count in the output

    def to_dict(self) -> dict:
        return {"path": str(self.path), "source": str(self.source), "kind": self.kind, "type": self.type,
                "source_type": self.source_type, "bytes": self.nbytes, "sha256": self.sha256,
                "seconds": round(self.seconds, 3), "kept_float": self.kept_float,
                "tensor_types": self.tensor_types}


def find_quantize(server: str | os.PathLike | None = None) -> Path:
    """The ``llama-quantize`` built with the engine ``find_engine`` resolves to (same directory).

    Raises:
        EngineError: no engine, or no ``llama-quantize`` beside it (the message says how to build it).
    """
    info = engine.find_engine(server)
    exe = Path(info.path).parent / QUANTIZE_EXE
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        raise EngineError(f"{exe}: no {QUANTIZE_EXE} beside the engine {info.path}: run "
                          f"'ggufdspark build-engine --with-tools' (same cache, only the tools are compiled)")
    return exe


def normalize_type(qtype: str) -> str:
    """``q4_k_m`` -> ``Q4_K_M``; refuses a type ``llama-quantize`` is not offered for.

    Raises:
        InvalidArgumentError: unknown type (the message lists the known ones).
    """
    name = qtype.strip().upper()
    if name not in QUANT_TYPES:
        raise InvalidArgumentError(f"--type {qtype}: not a quant type ggufdspark offers; expected one of "
                                   f"{', '.join(QUANT_TYPES)}")
    return name


def default_output(source: Path, qtype: str, kind: str) -> Path:
    """The Hub name beside the source: ``NAME-F16.gguf`` -> ``NAME-Q4_K_M.gguf``; a draft keeps (or gets)
    the ``dspark-`` prefix llama.cpp's ``-hfd`` looks for (``dspark-NAME-Q8_0.gguf``)."""
    stem = source.name[:-5] if source.name.lower().endswith(".gguf") else source.name
    m = re.fullmatch(r"(.+)[-.]([A-Za-z0-9_]+)", stem)
    if m and m.group(2).upper() in set(FTYPE_LABELS.values()):
        stem = m.group(1)
    if kind == "draft" and not stem.startswith("dspark-"):
        stem = "dspark-" + stem
    return source.with_name(f"{stem}-{qtype}.gguf")


def quantize(source: str | Path, qtype: str, *, output: str | Path | None = None,
             imatrix: str | Path | None = None, force: bool = False, server: str | os.PathLike | None = None,
             threads: int | None = None, progress: Progress | None = None) -> QuantizeResult:
    """Quantize a float GGUF target or DSpark draft with the pinned engine's ``llama-quantize``.

    Args:
        source: a target (``lfm2``) or a DSpark draft (``dflash``) GGUF in F32, F16 or BF16.
        qtype: a type of ``quants.QUANT_TYPES`` (a draft: of ``quants.DRAFT_TYPES``), any case.
        output: the file to write; default ``default_output``. Never the source.
        imatrix: an importance matrix (``llama-imatrix``) for a target, passed through.
        force: replace an existing output.
        server: the engine whose ``llama-quantize`` is used (default: ``find_engine``'s).
        progress: called as ``progress(done, total, tensor_name)``.

    Returns:
        QuantizeResult: the output's path, size, sha256 and tensor types.

    Raises:
        InputNotFoundError, CorruptFileError: the source or the imatrix is missing or not GGUF.
        InvalidArgumentError: an unknown type, a type a draft cannot take, an imatrix for a draft.
        UnsupportedModelError: the source is not a target or a draft, or is already quantized.
        OutputExistsError, UnsafeOutputError: the output exists (no ``force``), is the source, or its
            directory cannot be written.
        EngineError: no ``llama-quantize``, or it failed (its last line quoted).
    """
    src = Path(source)
    name = normalize_type(qtype)
    g = read_gguf(src)  # InputNotFoundError / CorruptFileError with the path
    kind = {"target": "target", "dspark-draft": "draft"}.get(classify(g))
    if kind is None:
        raise UnsupportedModelError(f"{src}: a {classify(g)} (arch {g.arch!r}); quantize takes an LFM2 target "
                                    f"or a DSpark draft")
    src_type = precision(g)
    src_float = float_type(g)
    if src_float is None:
        raise UnsupportedModelError(f"{src}: already quantized ({src_type}); quantize from the F16, BF16 or "
                                    f"F32 file (requantizing loses quality)")
    if kind == "draft":
        if name not in DRAFT_TYPES:
            q = QUANT_TYPES[name]
            why = "needs an importance matrix" if q.imatrix else f"about {q.bits:g} bits per weight"
            raise InvalidArgumentError(
                f"--type {name}: {src} is a DSpark draft, which cannot take {name} ({why}; llama-imatrix "
                f"cannot run a draft without its target); draft types: {', '.join(DRAFT_TYPES)}")
        if imatrix is not None:
            raise InvalidArgumentError(f"--imatrix {imatrix}: {src} is a DSpark draft; an importance matrix "
                                       f"is made for one model on its own, and a draft runs only beside its target")
    elif QUANT_TYPES[name].imatrix and imatrix is None:
        raise InvalidArgumentError(f"--type {name}: llama-quantize needs --imatrix FILE for it ({src})")
    if imatrix is not None and not Path(imatrix).is_file():
        raise InputNotFoundError(f"--imatrix {imatrix}: no such file")

    out = Path(output) if output is not None else default_output(src, name, kind)
    if out.is_dir():
        out = out / default_output(src, name, kind).name
    if out.is_symlink():
        raise UnsafeOutputError(f"{out}: is a symbolic link; refusing to write through it")
    check_output(out, src, *([Path(imatrix)] if imatrix else []))
    if out.exists() and not force:
        raise OutputExistsError(f"{out}: already exists (use --force to overwrite)")
    exe = find_quantize(server)

    keep: dict[str, str] = {}
    args = [str(exe)]
    if kind == "draft" and QUANT_TYPES[name].name not in ("F32", "F16", "BF16"):
        for t in DRAFT_KEEP_FLOAT:
            info = g.tensors.get(t)
            if info is not None:
                ftype = FLOAT_TYPES.get(TensorType(info.type), src_float)
                keep[t] = ftype.upper()
                args += ["--tensor-type", f"^{re.escape(t)}$={ftype}"]
    if imatrix is not None:
        args += ["--imatrix", str(imatrix)]

    t0 = time.monotonic()
    tmp: Path | None = None
    try:
        with interrupts.held():  # a stop signal between creating the .partial and owning it: raised after
            fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
            tmp = Path(tmp_name)
        os.close(fd)
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)  # mkstemp makes it private; the result is an ordinary file
        args += [str(src), str(tmp), name, str(threads or os.cpu_count() or 1)]
        _run(args, src, name, progress, out)
        result = _verify(tmp, out, src, kind, name, src_type, keep)
        if force:
            os.replace(tmp, out)
        else:
            os.link(tmp, out)  # fails if the output appeared meanwhile: nothing existing is replaced
            tmp.unlink()
    except FileExistsError:
        raise OutputExistsError(f"{out}: appeared while quantizing (use --force to overwrite)") from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    result.seconds = time.monotonic() - t0
    result.path = out
    return result


def _run(args: list[str], src: Path, name: str, progress: Progress | None, out: Path) -> None:
    log.debug("%s", " ".join(args))
    proc: subprocess.Popen | None = None
    line = None
    tail: list[str] = []
    try:
        # SIGTERM / SIGHUP held while starting it: raised in the fork, or before Popen returns, it
        # would leave llama-quantize running unseen, writing the .partial file after its removal
        with interrupts.held():
            proc, line = lifeline.spawn(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, errors="replace")
        assert proc.stdout is not None
        for text in proc.stdout:
            text = text.rstrip("\n")
            tail = (tail + [text])[-40:]
            m = _TENSOR_LINE.match(text)
            if m and progress:
                progress(int(m.group(1)), int(m.group(2)), m.group(3))
        rc = proc.wait()
    except BaseException:
        if proc is not None:
            lifeline.killpg(proc.pid)
            proc.wait()
        raise
    finally:
        if line is not None:
            line.release()
    if rc == -signal.SIGXFSZ or (rc != 0 and any(_NO_ROOM.search(t) for t in tail)):
        # the file-size limit kills the tool (SIGXFSZ); a full disk makes its write fail
        code = errno.EFBIG if rc == -signal.SIGXFSZ else errno.ENOSPC
        raise no_space_error(OSError(code, os.strerror(code)), out)
    if rc != 0:
        how = f"exit {rc}" if rc > 0 else exit_cause(rc)
        raise EngineError(f"{src}: llama-quantize to {name} failed ({how}): {failure_reason(tail)[:400]}")


# What llama-quantize prints about why it failed (ggml/src/ggml-quants.c ggml_validate_row_data,
# src/llama-quant.cpp "failed to quantize: ..."), often on the line of the tensor being converted;
# its last line, "main: failed to quantize model from 'X'", says only that it failed.
_CAUSE = re.compile(r"\b\w+: (?:found |invalid |failed to quantize: |error)[^\n]*|\berror: [^\n]*", re.I)
_NO_ROOM = re.compile(r"no space left|file too large|disk quota", re.I)
_SUMMARY = re.compile(r"failed to quantize model from", re.I)


def failure_reason(tail: list[str]) -> str:
    """The cause of a failed llama-quantize run from its last output lines: the tensor it was on and
    each distinct cause line (``found nan value at block 3``), else its last error-looking line."""
    causes: list[str] = []
    tensor = None
    for text in tail:
        if m := _TENSOR_LINE.match(text):
            tensor = m.group(3)
        for c in _CAUSE.findall(text):
            if not _SUMMARY.search(c) and c.strip() not in causes:
                causes.append(c.strip())
    if causes:
        return (f"at tensor {tensor}: " if tensor else "") + "; ".join(causes)
    return next((t.strip() for t in reversed(tail) if re.search(r"error|failed|invalid|cannot", t, re.I)),
                tail[-1].strip() if tail else "no output")


def _verify(tmp: Path, out: Path, src: Path, kind: str, name: str, src_type: str,
            keep: dict[str, str]) -> QuantizeResult:
    """The written file reads as GGUF, says the type asked for, and kept the draft's float tensors."""
    try:
        g = read_gguf(tmp)
    except GgufdsparkError as e:
        raise EngineError(f"{src}: llama-quantize wrote an unreadable file ({e})") from None
    got = precision(g)
    if got != name:
        raise EngineError(f"{src}: llama-quantize wrote a {got} file, not {name}")
    for t, want in keep.items():
        have = g.tensors[t].type_name if t in g.tensors else "missing"
        if have != want:
            raise EngineError(f"{src}: {t} came out {have}, not {want}: the draft's Markov head must stay float")
    counts: dict[str, int] = {}
    for info in g.tensors.values():
        counts[info.type_name] = counts.get(info.type_name, 0) + 1
    return QuantizeResult(out, src, kind, name, src_type, tmp.stat().st_size, engine.sha256_file(tmp), 0.0, keep,
                          dict(sorted(counts.items())))
