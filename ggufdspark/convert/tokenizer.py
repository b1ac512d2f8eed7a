"""The target's tokenizer as GGUF metadata, from a Hub directory or from the target's GGUF.

A DSpark drafter ships no tokenizer: it uses the target's. Whatever form the target takes, the
draft must carry the target's tokenizer bit for bit:

* from a GGUF target, the ``tokenizer.*`` keys are copied with their value types unchanged;
* from a Hub directory (``tokenizer.json`` + ``tokenizer_config.json`` + ``config.json``), they are
  derived the way llama.cpp's reference converter derives a BPE ("gpt2") vocabulary: token list in
  id order with ``[PAD<i>]`` fillers, token types (added special or special-looking tokens are
  CONTROL, other added tokens USER_DEFINED, the rest NORMAL), merges, special token ids (from
  ``tokenizer_config.json`` then ``config.json``), add-bos/eos/sep flags from the post-processor and
  ``tokenizer_config.json``, and the chat template. Only byte-level BPE tokenizers are handled.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggufdspark.errors import CorruptFileError, InputNotFoundError, UnsupportedModelError
from ggufdspark.gguffile.constants import LFM2_PRE_TOKENIZER, Key, TokenType, ValueType
from ggufdspark.gguffile.reader import GGUFFile

log = logging.getLogger(__name__)

SPECIAL_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
ID_KEYS = {"bos": Key.TOK_BOS, "eos": Key.TOK_EOS, "unk": Key.TOK_UNK, "sep": Key.TOK_SEP,
           "pad": Key.TOK_PAD, "mask": Key.TOK_MASK, "cls": "tokenizer.ggml.cls_token_id",
           "eot": "tokenizer.ggml.eot_token_id", "eom": "tokenizer.ggml.eom_token_id"}
ADD_KEYS = {"bos": Key.TOK_ADD_BOS, "eos": Key.TOK_ADD_EOS, "sep": Key.TOK_ADD_SEP}


@dataclass
class KV:
    key: str
    value: Any
    vtype: ValueType
    item_type: ValueType | None = None


def from_gguf(g: GGUFFile, *, skip: tuple[str, ...] = (Key.TOK_MASK,)) -> list[KV]:
    """The ``tokenizer.*`` keys of a GGUF file, with their exact value types."""
    out = []
    for key, value in g.metadata.items():
        if key.startswith("tokenizer.") and key not in skip:
            vtype, itype = g.value_types[key]
            out.append(KV(key, value, ValueType(vtype), ValueType(itype) if itype is not None else None))
    if not any(kv.key == Key.TOK_TOKENS for kv in out):
        raise UnsupportedModelError(f"{g.path}: the target GGUF has no tokenizer (no {Key.TOK_TOKENS})")
    return out


def _looks_special(text: str) -> bool:
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>"))
            or (text.startswith("<unused") and text.endswith(">")))


def _load_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CorruptFileError(f"{path}: invalid JSON in the {what} ({e})") from None
    if not isinstance(data, dict):
        raise CorruptFileError(f"{path}: the {what} is not a JSON object")
    return data


def from_hub_dir(directory: Path, vocab_size: int | None = None, *, pre: str = LFM2_PRE_TOKENIZER) -> list[KV]:
    """Tokenizer metadata from a Hub-layout directory.

    Args:
        directory: holds ``tokenizer.json`` (required), ``tokenizer_config.json``, ``config.json``.
        vocab_size: number of token slots (the model's vocab size); default: from config.json.
        pre: the llama.cpp pre-tokenizer name (LFM2 tokenizers map to ``lfm2``).

    Raises:
        InputNotFoundError: no ``tokenizer.json``.
        UnsupportedModelError: not a byte-level BPE tokenizer, or ids beyond ``vocab_size``.
    """
    directory = Path(directory)
    tj_path = directory / "tokenizer.json"
    if not tj_path.is_file():
        raise InputNotFoundError(f"{directory}: the target has no tokenizer (tokenizer.json not found)")
    tj = _load_json(tj_path, "tokenizer")
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise UnsupportedModelError(f"{tj_path}: tokenizer model {model.get('type')!r} is not supported (expected BPE)")
    tc_path = directory / "tokenizer_config.json"
    tc = _load_json(tc_path, "tokenizer config") if tc_path.is_file() else None
    cfg_path = directory / "config.json"
    cfg = _load_json(cfg_path, "config") if cfg_path.is_file() else {}
    text_cfg = cfg.get("text_config") or {}
    if vocab_size is None:
        vocab_size = cfg.get("vocab_size") or text_cfg.get("vocab_size")
    vocab: dict[str, int] = dict(model.get("vocab") or {})
    added = {t["content"]: t for t in tj.get("added_tokens", [])}
    for content, t in added.items():
        vocab[content] = t["id"]
    if vocab_size is None:
        vocab_size = max(vocab.values()) + 1
    if vocab and max(vocab.values()) >= vocab_size:
        raise UnsupportedModelError(
            f"{tj_path}: token id {max(vocab.values())} is beyond the vocabulary size {vocab_size}")

    reverse = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        tok = reverse.get(i)
        if tok is None:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
        elif tok in added:
            if added[tok].get("special") or _looks_special(tok):
                types.append(TokenType.CONTROL)
            else:
                tok = tok.replace("\u2581", " ")
                types.append(TokenType.USER_DEFINED)
            tokens.append(tok)
        else:
            tokens.append(tok)
            types.append(TokenType.NORMAL)

    out = [KV(Key.TOK_MODEL, "gpt2", ValueType.STRING), KV(Key.TOK_PRE, pre, ValueType.STRING),
           KV(Key.TOK_TOKENS, tokens, ValueType.ARRAY, ValueType.STRING),
           KV(Key.TOK_TYPES, [int(t) for t in types], ValueType.ARRAY, ValueType.INT32)]
    merges = _merges(model.get("merges"), tj_path)
    if merges:
        out.append(KV(Key.TOK_MERGES, merges, ValueType.ARRAY, ValueType.STRING))
    ids, add_flags = _special_tokens(tj, tc, cfg, text_cfg, vocab_size)
    for typ, tid in ids.items():
        out.append(KV(ID_KEYS[typ], tid, ValueType.UINT32))
    for typ, flag in add_flags.items():
        if typ in ADD_KEYS:
            out.append(KV(ADD_KEYS[typ], flag, ValueType.BOOL))
    template = _chat_template(directory, tc)
    if template is not None:
        out.append(KV(Key.CHAT_TEMPLATE, template, ValueType.STRING))
    return out


def _merges(merges: Any, path: Path) -> list[str]:
    if not merges:
        return []
    if isinstance(merges[0], str):
        return list(merges)
    if isinstance(merges[0], list) and len(merges[0]) == 2:
        # the pair format keeps spaces inside parts; llama.cpp encodes them as U+0120
        return [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in pair)
                for pair in merges]
    raise UnsupportedModelError(f"{path}: unknown merges format")


def _special_tokens(tj: dict, tc: dict | None, cfg: dict, text_cfg: dict, n_vocab: int):
    """Special token ids and add-token flags, in the reference converter's order of precedence."""
    types = list(SPECIAL_TYPES)
    ids: dict[str, int] = {}
    add: dict[str, bool] = {}
    tc = dict(tc) if tc is not None else None
    t = tc or {}

    def content(entry):
        if isinstance(entry, str):
            return entry
        if isinstance(entry, dict) and isinstance(entry.get("content"), str):
            return entry["content"]
        return None

    bos, cls_, eos, sep = t.get("bos_token"), t.get("cls_token"), t.get("eos_token"), t.get("sep_token")
    if not bos and cls_ and tc is not None:
        tc["bos_token"] = bos = cls_
    if not eos and sep and tc is not None:
        tc["eos_token"] = eos = sep
    post = tj.get("post_processor")
    if post:
        for proc in post.get("processors", [post]):
            kind = proc.get("type")
            if kind == "ByteLevel":
                add.setdefault("bos", False)
                add.setdefault("eos", False)
            elif kind == "RobertaProcessing":
                add.update(bos=True, eos=True, sep=True)
            elif kind == "TemplateProcessing":
                bos, eos = _template_flags(proc, tc, add, types, bos, cls_, eos, sep)
    if tc is None:
        pass
    else:
        for typ in types:
            flag = tc.get(f"add_{typ}_token")
            if isinstance(flag, bool) and typ not in add:
                add[typ] = flag
            c = content(tc.get(f"{typ}_token"))
            if c is None:
                continue
            tid = next((a.get("id") for a in tj.get("added_tokens", []) if a.get("content") == c), None)
            _set(ids, typ, tid, n_vocab)
    for typ in types:
        tid = cfg.get(f"{typ}_token_id")
        if tid is None:
            tid = text_cfg.get(f"{typ}_token_id")
        _set(ids, typ, tid, n_vocab)
    return ids, add


def _set(ids: dict, typ: str, tid: Any, n_vocab: int) -> None:
    if isinstance(tid, int) and not isinstance(tid, bool) and 0 <= tid < n_vocab and typ not in ids:
        ids[typ] = tid


def _template_flags(proc, tc, add, types, bos, cls_, eos, sep):
    """Read add-bos/eos/sep from a simple TemplateProcessing (as the reference does)."""
    single, pair = proc.get("single", []), proc.get("pair", [])
    first = last = None
    if len(single) > 1:
        first = single[0].get("SpecialToken", {}).get("id")
        if first:
            if tc is None:
                bos = first
            elif first not in (bos, cls_):
                if not bos:
                    tc["bos_token"] = bos = first
                if not cls_:
                    tc["cls_token"] = cls_ = first
            add["bos"] = first in (bos, cls_)
        last = single[-1].get("SpecialToken", {}).get("id")
        if last:
            if tc is None:
                eos = last
            elif last != eos:
                for extra in ("eot", "eom"):
                    if extra not in types:
                        types.append(extra)
                        tc[f"{extra}_token"] = eos
                        break
                tc["eos_token"] = eos = last
            add["eos"] = last == eos
    if pair:
        start = 1 if first and pair[0].get("SpecialToken", {}).get("id") == first else 0
        stop = -1 if last and pair[-1].get("SpecialToken", {}).get("id") == last else None
        middle = pair[slice(start, stop)]
        if middle:
            a = middle[0].get("Sequence", {}).get("id")
            b = middle[-1].get("Sequence", {}).get("id")
            inner = middle[1:-1]
            if a == "A" and b == "B" and inner:
                add_sep = False
                entry = inner[0].get("SpecialToken", {}).get("id")
                if entry and entry in (sep, eos) and not last:
                    add_sep = True
                if len(inner) == 2:
                    entry2 = inner[1].get("SpecialToken", {}).get("id")
                    if entry2 and entry2 in (sep, eos):
                        add_sep = True
                add["sep"] = add_sep
                if add_sep and not sep and tc is not None:
                    tc["sep_token"] = eos
    return bos, eos


def _chat_template(directory: Path, tc: dict | None) -> str | list | None:
    if tc is None:
        return None
    alt = None
    jinja = directory / "chat_template.jinja"
    cj = directory / "chat_template.json"
    if jinja.is_file():
        alt = jinja.read_text(encoding="utf-8")
        extra = sorted((directory / "additional_chat_templates").glob("*.jinja"))
        if extra:
            alt = [{"name": "default", "template": alt}] + [
                {"name": p.stem, "template": p.read_text(encoding="utf-8")} for p in extra]
    elif cj.is_file():
        alt = _load_json(cj, "chat template").get("chat_template")
    template = tc.get("chat_template", alt)
    if isinstance(template, list):
        # llama.cpp stores the default under tokenizer.chat_template, the rest by name
        named = {t.get("name"): t.get("template") for t in template}
        return named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None
