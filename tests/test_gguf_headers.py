"""Crafted and mutated GGUF headers (issue #17, class 4): ``inspect``, ``check`` and ``serve`` read
headers of files downloaded from the Hub, so every malformed one must be a single error line naming
the file and the key, never a traceback; the reader is fuzzed with random mutations of a real header."""

from __future__ import annotations

import json
import random
import struct
import time
from pathlib import Path

import pytest

from ggufdspark.check import check_pair
from ggufdspark.errors import GgufdsparkError
from ggufdspark.gguffile.constants import GGUF_MAGIC, TensorType, ValueType
from ggufdspark.gguffile.reader import read_gguf
from ggufdspark.gguffile.writer import GGUFWriter, tensor_nbytes
from ggufdspark.inspect import inspect_gguf

S, U32, I32, F32, ARR = ValueType.STRING, ValueType.UINT32, ValueType.INT32, ValueType.FLOAT32, ValueType.ARRAY


def craft(src: Path, dst: Path, *, meta: dict | None = None, shapes: dict | None = None) -> Path:
    """Rewrite the real GGUF ``src`` as ``dst`` with the project's writer, with some metadata values
    replaced (``key: (value, vtype, item_type)``) and some tensor shapes changed (zero data)."""
    g = read_gguf(src)
    w = GGUFWriter(dst)
    for key, value in g.metadata.items():
        vtype, itype = g.value_types[key]
        w.add(key, value, vtype, itype)
    for key, (value, vtype, itype) in (meta or {}).items():
        w.add(key, value, vtype, itype)
    for name, t in g.tensors.items():
        w.add_tensor(name, (shapes or {}).get(name, t.shape), TensorType(t.type))
    sizes = {name: tensor_nbytes(tuple((shapes or {}).get(name, t.shape)), TensorType(t.type))
             for name, t in g.tensors.items()}
    w.write(lambda name: [b"\0" * sizes[name]], force=True)
    return dst


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def tiny_nested(dst: Path, depth: int = 100_000) -> Path:
    """A tiny file whose one key is an array of an array of ... ``depth`` levels."""
    body = struct.pack("<II", ARR, ARR) + struct.pack("<Q", 1)  # value type, item type, count
    body += (struct.pack("<IQ", ARR, 1)) * depth
    dst.write_bytes(GGUF_MAGIC + struct.pack("<IQQ", 3, 0, 1) + _string("tokenizer.ggml.tokens") + body)
    return dst


def tiny_huge_count(dst: Path) -> Path:
    """A 60-byte file whose token list claims 2**40 strings."""
    dst.write_bytes(GGUF_MAGIC + struct.pack("<IQQ", 3, 0, 1) + _string("tokenizer.ggml.tokens")
                    + struct.pack("<IIQ", ARR, S, 1 << 40))
    return dst


# (id, role of the crafted file, key named in the error, how to craft it)
VARIANTS = [
    ("alignment-zero", "draft", "general.alignment", {"meta": {"general.alignment": (0, U32, None)}}),
    ("alignment-string", "draft", "general.alignment", {"meta": {"general.alignment": ("32", S, None)}}),
    ("target-layers-scalar", "draft", "dflash.target_layers", {"meta": {"dflash.target_layers": (4, U32, None)}}),
    ("target-layers-strings", "draft", "dflash.target_layers",
     {"meta": {"dflash.target_layers": (["2", "4", "5"], ARR, S)}}),
    ("tokens-integers", "draft", "tokenizer.ggml.tokens",
     {"meta": {"tokenizer.ggml.tokens": (list(range(1024)), ARR, I32)}}),
    ("tokens-string", "target", "tokenizer.ggml.tokens", {"meta": {"tokenizer.ggml.tokens": ("<|pad|>", S, None)}}),
    ("token-type-strings", "draft", "tokenizer.ggml.token_type",
     {"meta": {"tokenizer.ggml.token_type": (["normal"] * 1024, ARR, S)}}),
    ("merges-integers", "target", "tokenizer.ggml.merges",
     {"meta": {"tokenizer.ggml.merges": ([1, 2, 3], ARR, I32)}}),
    ("vocab-size-string", "target", "lfm2.vocab_size", {"meta": {"lfm2.vocab_size": ("1024", S, None)}}),
    ("block-count-string", "target", "lfm2.block_count", {"meta": {"lfm2.block_count": ("six", S, None)}}),
    ("block-size-float", "draft", "dflash.block_size", {"meta": {"dflash.block_size": (6.5, F32, None)}}),
    ("mask-id-string", "draft", "tokenizer.ggml.mask_token_id",
     {"meta": {"tokenizer.ggml.mask_token_id": ("17", S, None)}}),
    ("mask-id-array", "draft", "tokenizer.ggml.mask_token_id",
     {"meta": {"tokenizer.ggml.mask_token_id": ([17], ARR, I32)}}),
    ("hidden-size-string", "draft", "dflash.embedding_length",
     {"meta": {"dflash.embedding_length": ("64", S, None)}}),
    ("fc-weight-1d", "draft", "fc.weight", {"shapes": {"fc.weight": (64 * 192,)}}),
    ("markov-w1-0d", "draft", "markov_w1.weight", {"shapes": {"markov_w1.weight": ()}}),
    ("nested-arrays-tiny", "draft", "tokenizer.ggml.tokens", {"raw": tiny_nested}),
    ("huge-count-tiny", "draft", "tokenizer.ggml.tokens", {"raw": tiny_huge_count}),
]


def _make(small_pair, tmp_path, role, how) -> tuple[Path, Path, Path]:
    """(crafted file, target to check, draft to check)."""
    dst = tmp_path / f"crafted-{role}.gguf"
    if "raw" in how:
        how["raw"](dst)
    else:
        craft(small_pair.target if role == "target" else small_pair.draft, dst,
              meta=how.get("meta"), shapes=how.get("shapes"))
    if role == "target":
        return dst, dst, small_pair.draft
    return dst, small_pair.target, dst


def _assert_one_error_line(proc, path: Path, key: str) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(path) in lines[0] and key in lines[0], lines[0]


@pytest.mark.parametrize("role,key,how", [v[1:] for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_malformed_header_is_one_error_line(small_pair, tmp_path, ggufdspark_cli, role, key, how):
    crafted, target, draft = _make(small_pair, tmp_path, role, how)
    _assert_one_error_line(ggufdspark_cli("inspect", str(crafted)), crafted, key)
    _assert_one_error_line(ggufdspark_cli("check", str(target), str(draft)), crafted, key)
    proc = ggufdspark_cli("check", "--json", str(target), str(draft))
    _assert_one_error_line(proc, crafted, key)
    report = json.loads(proc.stdout)
    assert report["ok"] is False and key in report["error"] and str(crafted) in report["error"]


@pytest.mark.engine
def test_malformed_header_stops_serve_before_the_engine(small_pair, tmp_path, ggufdspark_cli):
    crafted, target, draft = _make(small_pair, tmp_path, "draft", VARIANTS[2][3])
    proc = ggufdspark_cli("serve", "-m", str(target), "-md", str(draft), "--port", "0", timeout=120)
    _assert_one_error_line(proc, crafted, "dflash.target_layers")


def test_values_in_messages_are_escaped(small_pair, tmp_path, ggufdspark_cli):
    crafted = craft(small_pair.draft, tmp_path / "esc.gguf",
                    meta={"dflash.block_size": ("\x1b]0;pwned\x07\x1b[2J", S, None)})
    proc = ggufdspark_cli("check", str(small_pair.target), str(crafted))
    _assert_one_error_line(proc, crafted, "dflash.block_size")
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr


def _random_value(rng: random.Random) -> tuple:
    """A metadata value of a random type and shape, as ``(value, vtype, item_type)``."""
    return rng.choice((
        (rng.choice((0, 1, 3, 7, 17, 1 << 31)), U32, None), (-1, I32, None), (rng.choice((0.5, float("nan"))), F32, None),
        (True, ValueType.BOOL, None), ("x\x1b[2J", S, None), ([], ARR, I32), ([0, 1, 99], ARR, I32),
        (["1", "2"], ARR, S), ([1.5, 2.5], ARR, F32), ([True], ARR, ValueType.BOOL), ((1 << 40), ValueType.UINT64, None),
    ))


def _mutate_bytes(rng: random.Random, data: bytearray, after_keys: list[int], header_end: int) -> bytearray:
    for _ in range(rng.choice((1, 1, 2, 4, 16))):
        # half land just after a key's name (its type, length, count or value): a random position
        # alone mostly lands in token strings
        pos = rng.randrange(header_end) if rng.random() < 0.5 else rng.choice(after_keys) + rng.randrange(16)
        kind = rng.random()
        if kind < 0.6:
            data[pos] = rng.randrange(256)
        elif kind < 0.8:  # a length or count becomes huge, or small
            data[pos:pos + 8] = struct.pack("<Q", rng.choice((0, 1, 255, 1 << 31, 1 << 40, (1 << 64) - 1)))
        else:  # a value type becomes another one (string, array, float, bool, unknown)
            data[pos:pos + 4] = struct.pack("<I", rng.choice((0, 4, 6, 7, 8, 9, 10, 13, 99)))
    if rng.random() < 0.1:
        data = data[:rng.randrange(24, header_end)]
    return data


def test_fuzzed_headers_raise_only_domain_errors(small_pair, tmp_path):
    """300 seeded random mutations of the real draft's header, half byte-level (flips, huge
    counts, retyped values, truncation) and half typed (a key or tensor given a value of another type
    or shape through the writer): the reader, ``inspect`` and ``check`` either accept the file or
    raise one of the project's errors, nothing else, and quickly."""
    original = small_pair.draft.read_bytes()
    g = read_gguf(small_pair.draft)
    header_end = g.data_offset
    after_keys = [original.index(_string(k)) + len(_string(k)) for k in g.metadata]
    keys = [*g.metadata, "general.alignment"]
    matrices = ["fc.weight", "markov_w1.weight", "markov_w2.weight"]
    rng = random.Random(17)
    outcomes = {"ok": 0, "refused": 0}
    start = time.monotonic()
    for i in range(300):
        path = tmp_path / f"fuzz{i % 2}.gguf"
        if i % 2:
            path.write_bytes(bytes(_mutate_bytes(rng, bytearray(original), after_keys, header_end)))
        else:
            meta = {k: _random_value(rng) for k in rng.sample(keys, rng.choice((1, 1, 2, 3)))}
            shapes = {}
            if rng.random() < 0.3:
                shapes[rng.choice(matrices)] = tuple(rng.randrange(1, 300) for _ in range(rng.choice((0, 1, 3))))
            craft(small_pair.draft, path, meta=meta, shapes=shapes)
        try:
            inspect_gguf(path)
            check_pair(small_pair.target, path).to_dict()
            check_pair(path, small_pair.draft).to_dict()
            outcomes["ok"] += 1
        except GgufdsparkError:
            outcomes["refused"] += 1
        except Exception as e:  # noqa: BLE001 - the point of the test
            pytest.fail(f"mutation {i}: {type(e).__name__}: {e}")
    assert outcomes["refused"] > 100 and outcomes["ok"] > 10, outcomes
    assert time.monotonic() - start < 30
