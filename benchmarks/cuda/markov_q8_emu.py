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

ap = argparse.ArgumentParser(description="the Q8_0 Markov kernel's lane model against the CPU's dot")
ap.add_argument("--mutate", choices=["word", "quarter"], help="break the indexing (a control that must fail)")
MUTATE = ap.parse_args().mutate
rng = np.random.default_rng(7)
QK = 32
def f16(x): return np.float32(np.float16(x))
def q8_row(x):  # ggml Q8_0 bytes of a float row (x86 quantize_row_q8_0)
    out = bytearray()
    for b in range(len(x) // QK):
        blk = x[b*QK:(b+1)*QK].astype(np.float32); amax = np.float32(np.abs(blk).max())
        d = np.float32(amax / np.float32(127)); idv = np.float32(127) / amax if amax != 0 else np.float32(0)
        q = np.rint(blk * idv).astype(np.int8)  # rint: ties to even
        out += np.float16(d).tobytes() + q.tobytes()
    return bytes(out)
def ref_dot(wrow, h):  # the CPU: h quantized to Q8_0, per block int dot x d_w x d_h
    hb = q8_row(h); s = np.float32(0)
    for b in range(len(h) // QK):
        dw = np.frombuffer(wrow[b*34:b*34+2], np.float16)[0]; qw = np.frombuffer(wrow[b*34+2:b*34+34], np.int8).astype(np.int32)
        dh = np.frombuffer(hb[b*34:b*34+2], np.float16)[0];   qh = np.frombuffer(hb[b*34+2:b*34+34], np.int8).astype(np.int32)
        s += np.float32(int((qw*qh).sum())) * (np.float32(dw) * np.float32(dh))
    return s
def dp4a(a, b, c):
    A = struct.unpack("4b", struct.pack("<i", a)); B = struct.unpack("4b", struct.pack("<i", b))
    return c + sum(x*y for x, y in zip(A, B))
def pack(x, idv):
    r = 0
    for j in range(4):
        r |= (int(np.rint(np.float32(x[j]) * idv)) & 0xFF) << (8*j)
    return struct.unpack("<i", struct.pack("<I", r))[0]
def kernel_dot(wrow, h, rank):
    n_chunks = (rank + 255) // 256
    words = np.frombuffer(wrow, np.uint16)  # the row as 16-bit words (34-byte blocks: 17 words)
    total = np.float32(0)
    for c in range(n_chunks):
        xs, amax = {}, {}
        for l in range(32):
            k = (c*32 + l) * 8
            x = h[k:k+8].astype(np.float32) if k < rank else np.zeros(8, np.float32)
            xs[l] = x; amax[l] = np.float32(np.abs(x).max())
        lanes = {}
        for l in range(32):
            g = [l ^ 0, l ^ 1, l ^ 2, l ^ 3]
            a = max(amax[i] for i in g)
            idv = np.float32(127) / a if a != 0 else np.float32(0)
            hd = f16(a / np.float32(127))
            lanes[l] = (pack(xs[l][:4], idv), pack(xs[l][4:], idv), hd)
        sumi = {}
        for l in range(32):
            k = (c*32 + l) * 8; inn = k < rank
            ib = (c*32 + l) // 4; iq = ((l + (MUTATE == "quarter")) % 4) * 8
            base = ib * 17
            first = 1 - (MUTATE == "word")
            q = [int(words[base + first + iq//2 + j]) if inn else 0 for j in range(4)]
            lo = struct.unpack("<i", struct.pack("<I", q[0] | (q[1] << 16)))[0]
            hi = struct.unpack("<i", struct.pack("<I", q[2] | (q[3] << 16)))[0]
            sumi[l] = dp4a(hi, lanes[l][1], dp4a(lo, lanes[l][0], 0))
        for l in range(0, 32, 4):
            k = (c*32 + l) * 8
            if k >= rank: continue
            s = sumi[l] + sumi[l+1] + sumi[l+2] + sumi[l+3]
            dw = np.float32(np.frombuffer(words[(c*32 + l)//4*17:(c*32 + l)//4*17+1].tobytes(), np.float16)[0])
            total += np.float32(s) * (dw * lanes[l][2])
    return total
bad = 0; n = 0
for rank in (32, 64, 256, 288, 1024):
    for trial in range(6):
        h = (rng.standard_normal(rank) * rng.choice([0.01, 1, 50])).astype(np.float32)
        if trial == 0: h[:] = 0; h[rng.integers(rank)] = 1.0
        for _ in range(4):
            w = rng.standard_normal(rank).astype(np.float32) * 0.3
            wrow = q8_row(w)
            a, b = kernel_dot(wrow, h, rank), ref_dot(wrow, h)
            n += 1
            if not np.isclose(a, b, rtol=1e-5, atol=1e-6):
                bad += 1
                if bad <= 3:
                    print("rank", rank, "model", a, "CPU", b)
print(f"{n} row sums, {bad} differ from the CPU's")
sys.exit(1 if bad else 0)
