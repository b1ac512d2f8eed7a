#!/usr/bin/env python3
"""Desk check of engine patch 0022's index logic (``mul_mat_f_few``, ggml-cuda), lane by lane.

The kernel feeds 16-byte weight loads straight into ``mma.m16n8k16`` fragments and permutes the k
order inside each 32-weight block the same way for weights and activations. This replays the
kernel's loads, loops (whole rounds of k-blocks, then the rest), column tiles, clamped rows and
the fixed-order sum of the k phases with the PTX fragment layouts of A (16x16 row), B (16x8 col)
and C (16x8), and compares the result with the plain product. It checks the mapping, not the
GPU: the device stage ``mmf-few-check`` runs the real kernel against the CPU backend.

    python scripts/mmf_few_emulate.py
"""

from __future__ import annotations

import numpy as np


def a_pos(lane: int, reg: int, half: int) -> tuple[int, int]:
    g, t = lane >> 2, lane & 3
    return g + (8 if reg in (1, 3) else 0), 2 * t + half + (8 if reg in (2, 3) else 0)


def b_pos(lane: int, reg: int, half: int) -> tuple[int, int]:
    g, t = lane >> 2, lane & 3
    return 2 * t + half + (8 if reg == 1 else 0), g


def c_pos(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane & 3
    return g + (8 if i >= 2 else 0), 2 * t + (i & 1)


def mma(c, a_regs, b_regs) -> None:
    """One warp's mma.m16n8k16: per-lane registers to matrices by the PTX layouts, and back."""
    a, b = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        for reg in range(4):
            for h in range(2):
                a[a_pos(lane, reg, h)] = a_regs[lane][reg][h]
        for reg in range(2):
            for h in range(2):
                b[b_pos(lane, reg, h)] = b_regs[lane][reg][h]
    d = a @ b
    for lane in range(32):
        for i in range(4):
            c[lane][i] += d[c_pos(lane, i)]


def mul_mat_f_few(w: np.ndarray, x: np.ndarray, rt: int, kp: int) -> np.ndarray:
    m, k = w.shape
    n = x.shape[0]
    nt = 1 if n <= 8 else 2
    u = 4 // nt
    nkb = k // 32
    out = np.full((n, m), np.nan)
    for block in range((m + rt * 16 - 1) // (rt * 16)):
        part = {}
        for wy in range(rt * kp):
            r, p = wy % rt, wy // rt
            row0 = (block * rt + r) * 16
            kbs, kb0 = [], p
            while kb0 + (u - 1) * kp < nkb:
                kbs += [kb0 + i * kp for i in range(u)]
                kb0 += kp * u
            while kb0 < nkb:
                kbs.append(kb0)
                kb0 += kp
            c = [[[0.0] * 4 for _ in range(32)] for _ in range(nt)]
            for kb in kbs:
                for j in range(nt):
                    a1, a2, b1, b2 = [], [], [], []
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        k0 = kb * 32 + 8 * t
                        wa = w[min(row0 + g, m - 1), k0:k0 + 8]
                        wb = w[min(row0 + g + 8, m - 1), k0:k0 + 8]
                        y = x[8 * j + g, k0:k0 + 8] if 8 * j + g < n else np.zeros(8)
                        a1.append([wa[0:2], wb[0:2], wa[2:4], wb[2:4]])
                        a2.append([wa[4:6], wb[4:6], wa[6:8], wb[6:8]])
                        b1.append([y[0:2], y[2:4]])
                        b2.append([y[4:6], y[6:8]])
                    mma(c[j], a1, b1)
                    mma(c[j], a2, b2)
            part[p, r] = c
        for r in range(rt):
            row0 = (block * rt + r) * 16
            for j in range(nt):
                for lane in range(32):
                    for i in range(4):
                        row, col = c_pos(lane, i)
                        row, col = row + row0, col + 8 * j
                        if row < m and col < n:
                            out[col, row] = sum(part[q, r][j][lane][i] for q in range(kp))
    return out


def main() -> int:
    rng = np.random.default_rng(0)
    worst = 0.0
    # (rows, k, columns, RT, KP): the four variants, tails of rows and k-blocks, 1 and 2 column tiles
    for m, k, n, rt, kp in [(64, 256, 6, 2, 4), (40, 96, 3, 1, 8), (100, 1024, 8, 4, 2), (48, 32, 2, 2, 4),
                            (33, 640, 7, 2, 4), (64, 256, 12, 2, 4), (40, 352, 16, 1, 8), (50, 96, 9, 4, 2),
                            (48, 1024, 6, 1, 16), (40, 256, 11, 1, 16)]:
        w, x = rng.standard_normal((m, k)), rng.standard_normal((n, k))
        err = float(np.max(np.abs(mul_mat_f_few(w, x, rt, kp) - x @ w.T)))
        worst = max(worst, err)
        print(f"rows {m:4d}  k {k:5d}  columns {n:2d}  RT {rt} KP {kp}: max |error| {err:.1e}")
    if worst > 1e-9:
        print("the emulated kernel differs from the plain product")
        return 1
    print("the emulated kernel equals the plain product")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
