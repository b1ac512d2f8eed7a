#!/usr/bin/env python3
"""A lane-by-lane model of developer patch 0082's CUDA kernel (``dspark_markov_step_q8_0`` in
``ggml-cuda/dspark-markov.cu``) against the CPU's Q8_0 dot product, run on the host where no GPU is.

The kernel's indexing is what a GPU run would otherwise be the first to test: lane l of a warp holds
values 8l .. 8l + 7 of each 256 of the conditioning row, quantized per 32-value block (the block's
four lanes share its amax by shuffles), and reads the same quarter of a markov_w2 row's Q8_0 block as
four 16-bit words (block ib = (256 c + 8 l) / 32 at 17 words a block, its quants from word 1, its d in
word 0), two dp4a, the four lanes' sums added and scaled by the two blocks' d by the block's first
lane. This model does the same steps on numpy integers and compares each row's sum with the CPU's
(the row quantized to Q8_0 as ggml-cpu's quantize_row_q8_0 does on x86, then per block the integer
dot times d_w times d_h) at ranks 32-1024, a one-hot row among them.

    python benchmarks/cuda/markov_q8_emu.py [--mutate word|quarter]

``--mutate`` breaks the model's indexing on purpose (one word early; the next lane's quarter): it must
then disagree. Exit status 0 when every sum agrees, 1 otherwise.
"""
import argparse
import struct
import sys

import numpy as np

QK = 32                # values a Q8_0 block
BLOCK_BYTES = 2 + QK   # its d in F16, then its quants
WORDS = BLOCK_BYTES // 2
LANES = 32


def f16(x) -> np.float32:
    return np.float32(np.float16(x))


def q8_row(x: np.ndarray) -> bytes:
    """ggml's Q8_0 bytes of a float row, as ggml-cpu's quantize_row_q8_0 makes them on x86: a block's
    d = amax / 127 (F16), its quants x * 127 / amax rounded to even."""
    out = bytearray()
    for b in range(len(x) // QK):
        blk = x[b * QK:(b + 1) * QK].astype(np.float32)
        amax = np.float32(np.abs(blk).max())
        d = np.float32(amax / np.float32(127))
        inv = np.float32(127) / amax if amax != 0 else np.float32(0)
        out += np.float16(d).tobytes() + np.rint(blk * inv).astype(np.int8).tobytes()
    return bytes(out)


def block(row: bytes, b: int) -> tuple[np.float32, np.ndarray]:
    """Block b of a Q8_0 row: (d, the quants as int32)."""
    at = b * BLOCK_BYTES
    d = np.float32(np.frombuffer(row[at:at + 2], np.float16)[0])
    return d, np.frombuffer(row[at + 2:at + BLOCK_BYTES], np.int8).astype(np.int32)


def cpu_dot(wrow: bytes, h: np.ndarray) -> np.float32:
    """The CPU's product: h quantized to Q8_0, then per block the integer dot times d_w times d_h."""
    hrow, s = q8_row(h), np.float32(0)
    for b in range(len(h) // QK):
        (dw, qw), (dh, qh) = block(wrow, b), block(hrow, b)
        s += np.float32(int((qw * qh).sum())) * (dw * dh)
    return s


def as_int(u: int) -> int:
    return struct.unpack("<i", struct.pack("<I", u & 0xFFFFFFFF))[0]


def dp4a(a: int, b: int, c: int) -> int:
    return c + sum(x * y for x, y in zip(struct.unpack("4b", struct.pack("<i", a)), struct.unpack("4b", struct.pack("<i", b))))


def pack(x: np.ndarray, inv: np.float32) -> int:
    """Four values quantized and packed in an int, as markov_q8_pack."""
    return as_int(sum((int(np.rint(np.float32(v) * inv)) & 0xFF) << (8 * j) for j, v in enumerate(x)))


def kernel_dot(wrow: bytes, h: np.ndarray, rank: int, mutate: str | None = None) -> np.float32:
    """One row's sum as dspark_markov_step_q8_0 computes it, lane by lane (``mutate``: break the indexing)."""
    words = np.frombuffer(wrow, np.uint16)
    total = np.float32(0)
    for c in range((rank + 255) // 256):
        xs = [h[k:k + 8].astype(np.float32) if (k := (c * LANES + lane) * 8) < rank else np.zeros(8, np.float32)
              for lane in range(LANES)]
        sumi = []
        for lane in range(LANES):
            group = range(lane - lane % 4, lane - lane % 4 + 4)  # the four lanes of a 32-value block (shuffles 1, 2)
            amax = max(np.float32(np.abs(xs[g]).max()) for g in group)
            inv = np.float32(127) / amax if amax != 0 else np.float32(0)
            if (c * LANES + lane) * 8 >= rank:
                sumi.append(0)
                continue
            ib = (c * LANES + lane) // 4                      # the row's block
            iq = ((lane + (mutate == "quarter")) % 4) * 8    # this lane's first quant in it
            first = ib * WORDS + 1 - (mutate == "word")      # word 0 of a block is its d
            q = [int(words[first + iq // 2 + j]) for j in range(4)]
            lo, hi = as_int(q[0] | q[1] << 16), as_int(q[2] | q[3] << 16)
            sumi.append(dp4a(hi, pack(xs[lane][4:], inv), dp4a(lo, pack(xs[lane][:4], inv), 0)))
            if lane % 4 == 3:  # the block's first lane adds the four lanes' sum, scaled by both d
                dh = f16(amax / np.float32(127))
                dw = np.float32(np.frombuffer(words[ib * WORDS:ib * WORDS + 1].tobytes(), np.float16)[0])
                total += np.float32(sum(sumi[-4:])) * (dw * dh)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description="the Q8_0 Markov kernel's lane model against the CPU's dot")
    ap.add_argument("--mutate", choices=["word", "quarter"], help="break the indexing (a control that must fail)")
    mutate = ap.parse_args().mutate
    rng = np.random.default_rng(7)
    bad = n = 0
    for rank in (32, 64, 256, 288, 1024):
        for trial in range(6):
            h = (rng.standard_normal(rank) * rng.choice([0.01, 1, 50])).astype(np.float32)
            if trial == 0:  # a one-hot row, as the test cases' w1
                h[:] = 0
                h[rng.integers(rank)] = 1.0
            for _ in range(4):
                wrow = q8_row(rng.standard_normal(rank).astype(np.float32) * 0.3)
                a, b = kernel_dot(wrow, h, rank, mutate), cpu_dot(wrow, h)
                n += 1
                if not np.isclose(a, b, rtol=1e-5, atol=1e-6):
                    bad += 1
                    if bad <= 3:
                        print("rank", rank, "model", a, "CPU", b)
    print(f"{n} row sums, {bad} differ from the CPU's")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
