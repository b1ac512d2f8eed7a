"""Shared pieces of the converters: resolving inputs, reading configs, describing targets, naming."""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggufdspark.errors import CorruptFileError, InputNotFoundError, UnsafeOutputError, UnsupportedModelError
from ggufdspark.gguffile.constants import OUTTYPE_LABEL, OUTTYPE_TENSOR, OUTTYPES, Key, TensorType
from ggufdspark.gguffile.reader import GGUFFile, read_gguf
from ggufdspark.hubtext import strip_userinfo

log = logging.getLogger(__name__)


# The files of a checkpoint the converters read (and fetch from the Hub).
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]


def check_output(out: Path, *inputs: Path) -> Path:
    """Refuse an output that would destroy an input or cannot be written; returns ``out``.

    Args:
        out: the file about to be written (renamed into place when complete).
        inputs: checkpoint directories (every file of ``CHECKPOINT_FILES`` in them counts) and
            input files (a target GGUF).

    Raises:
        UnsafeOutputError: ``out`` is one of the inputs (same path, or the same file through a
            link), or its directory is missing, not a directory, or not writable.
    """
    out = Path(out)
    files: list[Path] = []
    for src in inputs:
        src = Path(src)
        if src.is_dir():
            files += [f for pat in CHECKPOINT_FILES for f in src.glob(pat)]
        elif src.exists():
            files.append(src)
    resolved = out.resolve()
    for f in files:
        if f.resolve() == resolved or (out.exists() and os.path.samefile(out, f)):
            raise UnsafeOutputError(f"{out}: is one of the inputs ({f}); refusing to overwrite it "
                                    f"(choose another output)")
    parent = out.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise UnsafeOutputError(f"{out}: cannot write it: {parent} {what}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UnsafeOutputError(f"{out}: cannot write it: {parent} is not writable")
    return out


def resolve_checkpoint(spec: str | Path) -> Path:
    """A local directory, or a Hub repo id resolved through huggingface_hub (local cache first).

    Raises:
        InputNotFoundError: neither an existing directory nor a repo id that can be fetched.
    """
    p = Path(spec).expanduser()
    if p.exists():
        if not p.is_dir():
            raise InputNotFoundError(f"{p}: expected a checkpoint directory (config.json + *.safetensors)")
        return p
    s = str(spec)
    if re.fullmatch(r"[\w.-]+/[\w.-]+", s) and not s.startswith((".", "/")):
        org = s.split("/", 1)[0]
        if os.path.isdir(org):  # a mistyped local path: never sent to the Hub (hubref's rule)
            raise InputNotFoundError(f"{s}: no such file or directory ({org}/ is a local folder, so it is not "
                                     "read as a Hub repo)")
        try:
            from huggingface_hub import snapshot_download
            from huggingface_hub.errors import LocalEntryNotFoundError
        except ImportError:  # pragma: no cover - huggingface_hub is a dependency
            raise InputNotFoundError(f"{s}: not a local directory and huggingface_hub is not installed") from None
        patterns = CHECKPOINT_FILES
        try:
            return Path(snapshot_download(s, allow_patterns=patterns, local_files_only=True))
        except LocalEntryNotFoundError:
            pass
        except Exception as e:  # noqa: BLE001 - any hub failure is one line for the user
            log.debug("cache lookup for %s failed: %s", s, e)
        log.info("downloading %s from the Hugging Face Hub", s)
        try:
            return Path(snapshot_download(s, allow_patterns=patterns))
        except Exception as e:  # noqa: BLE001
            raise InputNotFoundError(f"{s}: not a local directory, and the Hub download failed: "
                                     f"{type(e).__name__}: {strip_userinfo(str(e).splitlines()[0] if str(e) else '')}"
                                     ) from None
    raise InputNotFoundError(f"{p}: no such file or directory")


def load_json_object(path: Path) -> dict[str, Any]:
    """A JSON file that must hold an object. Raises CorruptFileError naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CorruptFileError(f"{path}: not a JSON object")
    return data


def load_config(directory: Path) -> dict[str, Any]:
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise InputNotFoundError(f"{directory}: no config.json")
    return load_json_object(path)


@dataclass
class TargetInfo:
    """What the converters and ``check`` need to know about a target, from either form."""

    source: Path
    kind: str  # "gguf" or "hub"
    name: str
    hidden_size: int
    n_layers: int
    vocab_size: int
    arch: str
    gguf: GGUFFile | None = None
    directory: Path | None = None
    config: dict | None = None


TEXT_TARGET_ARCHS = {"Lfm2ForCausalLM", "LFM2ForCausalLM", "Lfm2MoeForCausalLM"}
VL_TARGET_ARCHS = {"Lfm2VlForConditionalGeneration"}


def text_config(cfg: dict) -> dict:
    """The language model's config (``text_config`` of a VL checkpoint, else the config itself)."""
    return cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg


def describe_target(target: str | Path) -> TargetInfo:
    """Read a target given as a GGUF file or as a Hub directory (or repo id).

    Raises:
        InputNotFoundError, CorruptFileError, UnsupportedModelError.
    """
    p = Path(target).expanduser()
    if p.is_file():
        g = read_gguf(p)
        arch = g.arch or "?"
        hidden = g.get(Key.EMBEDDING_LENGTH)
        layers = g.get(Key.BLOCK_COUNT)
        tokens = g.metadata.get(Key.TOK_TOKENS)
        vocab = g.get(Key.VOCAB_SIZE) or (len(tokens) if tokens else None)
        if hidden is None or layers is None or vocab is None:
            raise UnsupportedModelError(
                f"{p}: not a usable target GGUF (arch {arch!r}; embedding_length={hidden}, "
                f"block_count={layers}, vocabulary={vocab})")
        name = str(g.metadata.get(Key.NAME) or _stem_name(p))
        return TargetInfo(p, "gguf", name, int(hidden), int(layers), int(vocab), arch, gguf=g)
    d = resolve_checkpoint(target)
    cfg = load_config(d)
    tcfg = text_config(cfg)
    archs = cfg.get("architectures") or []
    try:
        hidden, layers, vocab = tcfg["hidden_size"], tcfg["num_hidden_layers"], tcfg["vocab_size"]
    except KeyError as e:
        raise UnsupportedModelError(f"{d / 'config.json'}: target config has no {e.args[0]}") from None
    return TargetInfo(d, "hub", d.name, int(hidden), int(layers), int(vocab), archs[0] if archs else "?",
                      directory=d, config=cfg)


def _stem_name(p: Path) -> str:
    stem = p.name.removesuffix(".gguf")
    return re.sub(r"[-.](F32|F16|BF16|Q\d\w*)$", "", stem, flags=re.IGNORECASE)


def model_basename(info: TargetInfo) -> str:
    """A file-name-safe model name for default output names (``dspark-<model>-<TYPE>.gguf``)."""
    if info.kind == "gguf":
        name = _stem_name(info.source)
    else:
        name = info.name
    name = re.sub(r"[^\w.-]+", "-", name).strip("-") or "model"
    return name


def default_draft_name(info: TargetInfo, outtype: str) -> str:
    return f"dspark-{model_basename(info)}-{OUTTYPE_LABEL[outtype]}.gguf"


def outtype_tensor(outtype: str) -> TensorType:
    if outtype not in OUTTYPE_TENSOR:
        raise UnsupportedModelError(f"unsupported --outtype {outtype!r}; expected one of {', '.join(OUTTYPES)}")
    return OUTTYPE_TENSOR[outtype]
