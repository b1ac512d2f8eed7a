// Host emulation of patch 0071's mul_mat_vec_q4_K_mma, _q5_K_mma, _q6_K_mma and _q8_0_mma
// (Q4_K, Q5_K, Q6_K by default; Q8_0 with GGML_CUDA_MMVQ_MMA=1): the kernels' per-lane loads and scaling written out lane by lane, an mma.m16n8k32 (s8) emulated from the fragment
// layout the PTX ISA gives (A rows g, g + 8 at ints t, t + 4; B column g at ints t, t + 4; C rows g,
// g + 8 x columns 2t, 2t + 1, lane = 4 g + t), the activations quantized to q8_1 as ggml-cuda's
// quantize_q8_1 does; the result against the float product of ggml's own dequantized weights.
// Checks the kernel's arithmetic on a CPU before device time; the GPU's own check is test-backend-ops
// (benchmarks/h200.sh mma). Built against the engine's ggml: benchmarks/h200.sh mma, or
//   g++ -O2 -std=c++17 -I TREE/ggml/include mmvq_mma_emu.cpp -L LIBDIR -lggml-base -lggml -o emu
// Exit 0 when every shape's NMSE is below 5e-4 (test-backend-ops' MUL_MAT bound), 1 otherwise.
#include "ggml.h"
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#define QK_K 256
#define QK8_1 32
struct block_q4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K/2]; };
struct block_q5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K/8]; uint8_t qs[QK_K/2]; };
struct block_q8_1 { uint16_t d, s; int8_t qs[QK8_1]; };
struct block_q8_0 { uint16_t d; int8_t qs[32]; };
struct block_q6_K { uint8_t ql[QK_K/2]; uint8_t qh[QK_K/4]; int8_t scales[QK_K/16]; uint16_t d; };
static_assert(sizeof(block_q4_K) == 144, "q4_K");
static_assert(sizeof(block_q5_K) == 176, "q5_K");
static_assert(sizeof(block_q8_1) == 36, "q8_1");
static_assert(sizeof(block_q8_0) == 34, "q8_0");
static_assert(sizeof(block_q6_K) == 210, "q6_K");

// CUDA's __vsubss4 for what the kernel subtracts: 4 bytes of 0..63 less 32 each, as signed bytes
static int vsub32(int v) {
    int out = 0;
    for (int i = 0; i < 4; ++i) out |= ((int) (uint8_t) (int8_t) (((v >> (8*i)) & 0xFF) - 32)) << (8*i);
    return out;
}

static void scales(const uint8_t * q, float dmx, float dmy, float * d, float * m) {  // the kernel's mmvq_mma_q4_K_scales
    for (int j = 0; j < 8; ++j) {
        const int sc = j < 4 ? q[j] & 63 : (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        const int mn = j < 4 ? q[j + 4] & 63 : (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        d[j] = dmx * sc;
        m[j] = dmy * mn;
    }
}

static int8_t byte_of(int v, int i) { return (int8_t) ((uint32_t) v >> (8*i)); }

// the kernel's get_int_b2: int i of a 2-byte-aligned array, from two 16-bit loads
static int get_int_b2(const void * x, int i32) {
    const uint16_t * x16 = (const uint16_t *) x;
    return (int) ((uint32_t) x16[2*i32] | ((uint32_t) x16[2*i32 + 1] << 16));
}

// mma.m16n8k32 (s8): the warp's fragments assembled into A (16 x 32) and B (32 x 8) as the PTX ISA lays
// them out, C = A B, returned per lane as the kernel reads it (rows g, g + 8 x columns 2t, 2t + 1)
static void mma_emulated(const int a[32][4], const int b[32][2], int dot[32][4]) {
    int A[16][32], B[32][8], C[16][8] = {};
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane/4, t = lane%4;
        for (int i = 0; i < 4; ++i) {
            A[g][4*t + i] = byte_of(a[lane][0], i);      A[g + 8][4*t + i] = byte_of(a[lane][1], i);
            A[g][16 + 4*t + i] = byte_of(a[lane][2], i); A[g + 8][16 + 4*t + i] = byte_of(a[lane][3], i);
            B[4*t + i][g] = byte_of(b[lane][0], i);      B[16 + 4*t + i][g] = byte_of(b[lane][1], i);
        }
    }
    for (int r = 0; r < 16; ++r) for (int c = 0; c < 8; ++c) for (int k = 0; k < 32; ++k) C[r][c] += A[r][k]*B[k][c];
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane/4, t = lane%4;
        dot[lane][0] = C[g][2*t]; dot[lane][1] = C[g][2*t + 1]; dot[lane][2] = C[g + 8][2*t]; dot[lane][3] = C[g + 8][2*t + 1];
    }
}

static void scales_i(const int * sc, float dmx, float dmy, float * d, float * m) {  // the kernel's mmvq_mma_q4_K_scales_i
    uint8_t q[12];
    for (int i = 0; i < 12; ++i) q[i] = (uint8_t) ((sc[i / 4] >> (8*(i % 4))) & 0xFF);
    scales(q, dmx, dmy, d, m);
}

int main() {
    std::mt19937 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int fails = 0;
    for (const ggml_type type : {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0})
    for (int M : {16, 40, 64}) for (int K : {256, 768}) for (int N : {2, 3, 5, 8}) for (int nwarps : {1, 4}) {
        const bool q5 = type == GGML_TYPE_Q5_K, q4 = type == GGML_TYPE_Q4_K || q5, q6 = type == GGML_TYPE_Q6_K;  // q4: Q4_K's path (Q5_K too)
        const int qk = q4 || q6 ? QK_K : 32, nb = K / qk;
        std::vector<float> W((size_t) M*K), X((size_t) N*K);
        for (auto & v : W) v = nd(rng);
        for (auto & v : X) v = nd(rng);
        std::vector<uint8_t> xq(ggml_row_size(type, K) * M);
        ggml_quantize_chunk(type, W.data(), xq.data(), 0, M, K, nullptr);
        std::vector<float> Wd((size_t) M*K);
        ggml_get_type_traits(type)->to_float(xq.data(), Wd.data(), (int64_t) M*K);
        const block_q4_K * x4 = (const block_q4_K *) xq.data();
        const block_q5_K * x5 = (const block_q5_K *) xq.data();
        const block_q8_0 * x8 = (const block_q8_0 *) xq.data();
        const block_q6_K * x6 = (const block_q6_K *) xq.data();
        // q8_1 as quantize_q8_1 (CUDA) makes it: d = amax/127, q = round(x/d), ds = (d, sum x)
        const int stride_col_y = K / QK8_1;
        std::vector<block_q8_1> y((size_t) N*stride_col_y);
        for (int c = 0; c < N; ++c) for (int b = 0; b < stride_col_y; ++b) {
            const float * xs = &X[(size_t) c*K + b*QK8_1];
            float amax = 0, sum = 0;
            for (int i = 0; i < QK8_1; ++i) { amax = std::max(amax, std::fabs(xs[i])); sum += xs[i]; }
            const float d = amax / 127.0f;
            block_q8_1 & o = y[(size_t) c*stride_col_y + b];
            for (int i = 0; i < QK8_1; ++i) o.qs[i] = amax == 0 ? 0 : (int8_t) std::round(xs[i] / d);
            o.d = ggml_fp32_to_fp16(d); o.s = ggml_fp32_to_fp16(sum);
        }
        // block_q8_1_x8 as quantize_q8_1_x8 writes it: a sub-block's 8 columns' (d, sum) halves, then their 32 quants
        // each; the same values as the q8_1 blocks above, columns past N zero
        std::vector<uint8_t> yx8((size_t) stride_col_y * 288, 0);
        for (int b = 0; b < stride_col_y; ++b) for (int c = 0; c < N; ++c) {
            const block_q8_1 & o = y[(size_t) c*stride_col_y + b];
            std::memcpy(&yx8[(size_t) b*288 + 4*c], &o.d, 2);
            std::memcpy(&yx8[(size_t) b*288 + 4*c + 2], &o.s, 2);
            std::memcpy(&yx8[(size_t) b*288 + 32 + 32*c], o.qs, 32);
        }
        std::vector<float> dst_plain;  // Q4_K / Q5_K: the outputs without developer 0077's wide loads, which must match
        for (const int loads : {0, 1, 2}) {  // 0077: 1 the weights' wide loads, 2 and the columns in block_q8_1_x8
        if (loads && !q4) break;
        const bool wl = loads != 0;
        std::vector<float> dst((size_t) N*M, NAN);
        const int stride_row_x = nb, stride_col_dst = M, ncols_dst = N;
        for (int tile = 0; tile < (M + 15)/16; ++tile) {
            static float accs[8][32][4];
            std::memset(accs, 0, sizeof(accs));
            for (int w = 0; w < nwarps; ++w) {
                for (int kb = w; kb < nb; kb += nwarps) {
                    for (int s = 0; s < (q4 || q6 ? 8 : 1); ++s) {  // Q4_K: sub-block s = 2 j + nib; Q6_K: half s / 4,
                        const int j = s / 2, nib = s % 2, kby = q4 || q6 ? 8*kb + s : kb;  // part s % 4; Q8_0: the block
                        const int n = s / 4, pp = s % 4;
                        int a[32][4], b[32][2], dot[32][4], dot_hi[32][4];
                        for (int lane = 0; lane < 32; ++lane) {  // the kernel's loads, lane by lane
                            const int g = lane/4, t = lane%4, row0 = 16*tile + g, row1 = row0 + 8;
                            const bool ok0 = row0 < M, ok1 = row1 < M, okb = g < ncols_dst;
                            const size_t i0 = (size_t) (ok0 ? row0 : 0)*stride_row_x + kb;
                            const size_t i1 = (size_t) (ok1 ? row1 : 0)*stride_row_x + kb;
                            // developer 0077 (wl): ints 2t, 2t + 1 (values 8t..8t+7) instead of t, t + 4, the columns' too
                            const int ta = wl ? 2*t : t, tb = wl ? 2*t + 1 : t + 4;
                            if (q5) {  // Q4_K's nibbles with the fifth bit: bit s of qh's ints ta, tb
                                const int * q0 = (const int *) x5[i0].qs + 8*j;
                                const int * q1 = (const int *) x5[i1].qs + 8*j;
                                const int * h0 = (const int *) x5[i0].qh;
                                const int * h1 = (const int *) x5[i1].qh;
                                a[lane][0] = ((q0[ta] >> (4*nib)) & 0x0F0F0F0F) | (((h0[ta] >> s) & 0x01010101) << 4);
                                a[lane][1] = ((q1[ta] >> (4*nib)) & 0x0F0F0F0F) | (((h1[ta] >> s) & 0x01010101) << 4);
                                a[lane][2] = ((q0[tb] >> (4*nib)) & 0x0F0F0F0F) | (((h0[tb] >> s) & 0x01010101) << 4);
                                a[lane][3] = ((q1[tb] >> (4*nib)) & 0x0F0F0F0F) | (((h1[tb] >> s) & 0x01010101) << 4);
                            } else if (q4) {
                                const int * q0 = (const int *) x4[i0].qs + 8*j;
                                const int * q1 = (const int *) x4[i1].qs + 8*j;
                                a[lane][0] = (q0[ta] >> (4*nib)) & 0x0F0F0F0F;
                                a[lane][1] = (q1[ta] >> (4*nib)) & 0x0F0F0F0F;
                                a[lane][2] = (q0[tb] >> (4*nib)) & 0x0F0F0F0F;
                                a[lane][3] = (q1[tb] >> (4*nib)) & 0x0F0F0F0F;
                            } else if (q6) {
                                for (int r = 0; r < 2; ++r) for (int h = 0; h < 2; ++h) {
                                    const block_q6_K & bx = x6[r ? i1 : i0];
                                    const int lo = (get_int_b2(bx.ql, 16*n + 8*(pp & 1) + 4*h + t) >> (4*(pp >> 1))) & 0x0F0F0F0F;
                                    const int hi = (get_int_b2(bx.qh, 8*n + 4*h + t) >> (2*pp)) & 0x03030303;
                                    a[lane][2*h + r] = vsub32(lo | (hi << 4));  // regs: row g / g + 8 at k half h
                                }
                            } else {
                                a[lane][0] = get_int_b2(x8[i0].qs, t);
                                a[lane][1] = get_int_b2(x8[i1].qs, t);
                                a[lane][2] = get_int_b2(x8[i0].qs, t + 4);
                                a[lane][3] = get_int_b2(x8[i1].qs, t + 4);
                            }
                            b[lane][0] = b[lane][1] = 0;
                            if (loads == 2) {  // one 8-byte load at 32 + 8 lane of the sub-block's block_q8_1_x8
                                std::memcpy(b[lane], &yx8[(size_t) kby*288 + 32 + 8*lane], 8);
                            } else if (okb) {
                                const int * yq = (const int *) y[(size_t) g*stride_col_y + kby].qs;
                                b[lane][0] = yq[ta]; b[lane][1] = yq[tb];
                            }
                        }
                        if (q6) {  // two mmas: the first 16 values (regs 0, 1), then the last 16 (regs 2, 3)
                            int alo[32][4], ahi[32][4];
                            for (int lane = 0; lane < 32; ++lane) {
                                alo[lane][0] = a[lane][0]; alo[lane][1] = a[lane][1]; alo[lane][2] = alo[lane][3] = 0;
                                ahi[lane][0] = ahi[lane][1] = 0; ahi[lane][2] = a[lane][2]; ahi[lane][3] = a[lane][3];
                            }
                            mma_emulated(alo, b, dot);
                            mma_emulated(ahi, b, dot_hi);
                        } else {
                            mma_emulated(a, b, dot);
                        }
                        for (int lane = 0; lane < 32; ++lane) {  // the kernel's scaling, lane by lane
                            const int g = lane/4, t = lane%4, row0 = 16*tile + g, row1 = row0 + 8;
                            const bool ok0 = row0 < M, ok1 = row1 < M;
                            const int c0 = 2*t, c1 = 2*t + 1;
                            const size_t i0 = (size_t) (ok0 ? row0 : 0)*stride_row_x + kb;
                            const size_t i1 = (size_t) (ok1 ? row1 : 0)*stride_row_x + kb;
                            float ds0x = 0, ds0y = 0, ds1x = 0, ds1y = 0;
                            if (loads == 2) {  // columns 2t, 2t + 1's (d, sum) as one 8-byte load at 8t
                                uint16_t h[4];
                                std::memcpy(h, &yx8[(size_t) kby*288 + 8*t], 8);
                                ds0x = ggml_fp16_to_fp32(h[0]); ds0y = ggml_fp16_to_fp32(h[1]);
                                ds1x = ggml_fp16_to_fp32(h[2]); ds1y = ggml_fp16_to_fp32(h[3]);
                            } else {
                            if (c0 < ncols_dst) { ds0x = ggml_fp16_to_fp32(y[(size_t) c0*stride_col_y + kby].d); ds0y = ggml_fp16_to_fp32(y[(size_t) c0*stride_col_y + kby].s); }
                            if (c1 < ncols_dst) { ds1x = ggml_fp16_to_fp32(y[(size_t) c1*stride_col_y + kby].d); ds1y = ggml_fp16_to_fp32(y[(size_t) c1*stride_col_y + kby].s); }
                            }
                            float * acc = accs[w][lane];
                            if (q4) {  // Q4_K and Q5_K: the same scales, mins and sums
                                float d0[8], m0[8], d1[8], m1[8];
                                const uint8_t * sc0 = q5 ? x5[i0].scales : x4[i0].scales;
                                const uint8_t * sc1 = q5 ? x5[i1].scales : x4[i1].scales;
                                const uint16_t dd0 = q5 ? x5[i0].d : x4[i0].d, dm0 = q5 ? x5[i0].dmin : x4[i0].dmin;
                                const uint16_t dd1 = q5 ? x5[i1].d : x4[i1].d, dm1 = q5 ? x5[i1].dmin : x4[i1].dmin;
                                if (wl) {  // the block's first 16 bytes as 4 ints: d and dmin, then the scales
                                    int head0[4], head1[4];
                                    std::memcpy(head0, q5 ? (const void *) &x5[i0] : (const void *) &x4[i0], 16);
                                    std::memcpy(head1, q5 ? (const void *) &x5[i1] : (const void *) &x4[i1], 16);
                                    scales_i(head0 + 1, ok0 ? ggml_fp16_to_fp32(dd0) : 0, ok0 ? ggml_fp16_to_fp32(dm0) : 0, d0, m0);
                                    scales_i(head1 + 1, ok1 ? ggml_fp16_to_fp32(dd1) : 0, ok1 ? ggml_fp16_to_fp32(dm1) : 0, d1, m1);
                                } else {
                                    scales(sc0, ok0 ? ggml_fp16_to_fp32(dd0) : 0, ok0 ? ggml_fp16_to_fp32(dm0) : 0, d0, m0);
                                    scales(sc1, ok1 ? ggml_fp16_to_fp32(dd1) : 0, ok1 ? ggml_fp16_to_fp32(dm1) : 0, d1, m1);
                                }
                                acc[0] += d0[s]*ds0x*dot[lane][0] - m0[s]*ds0y;
                                acc[1] += d0[s]*ds1x*dot[lane][1] - m0[s]*ds1y;
                                acc[2] += d1[s]*ds0x*dot[lane][2] - m1[s]*ds0y;
                                acc[3] += d1[s]*ds1x*dot[lane][3] - m1[s]*ds1y;
                            } else if (q6) {
                                const float dr[2] = {ok0 ? ggml_fp16_to_fp32(x6[i0].d) : 0, ok1 ? ggml_fp16_to_fp32(x6[i1].d) : 0};
                                for (int l = 0; l < 4; ++l) {
                                    const block_q6_K & bx = x6[l / 2 ? i1 : i0];
                                    const float sl = dr[l / 2] * bx.scales[8*n + 2*pp], sh = dr[l / 2] * bx.scales[8*n + 2*pp + 1];
                                    acc[l] += (l % 2 ? ds1x : ds0x) * (sl*dot[lane][l] + sh*dot_hi[lane][l]);
                                }
                            } else {
                                const float d0 = ok0 ? ggml_fp16_to_fp32(x8[i0].d) : 0, d1 = ok1 ? ggml_fp16_to_fp32(x8[i1].d) : 0;
                                acc[0] += d0*ds0x*dot[lane][0];
                                acc[1] += d0*ds1x*dot[lane][1];
                                acc[2] += d1*ds0x*dot[lane][2];
                                acc[3] += d1*ds1x*dot[lane][3];
                            }
                        }
                    }
                }
            }
            for (int lane = 0; lane < 32; ++lane) {  // mmvq_mma_store: the warps' sums meet, each output written once
                const int row0 = 16*tile + lane/4, c0 = 2*(lane % 4);
                for (int l = 0; l < 4; ++l) {
                    float acc = 0;
                    for (int w = 0; w < nwarps; ++w) acc += accs[w][lane][l];
                    const int row = row0 + 8*(l / 2), col = c0 + l % 2;
                    if (row < M && col < ncols_dst) dst[(size_t) col*stride_col_dst + row] = acc;
                }
            }
        }
        // against the float product of ggml's dequantized weights and the activations
        double err2 = 0, ref2 = 0; int nan = 0;
        for (int c = 0; c < N; ++c) for (int r = 0; r < M; ++r) {
            double ref = 0;
            for (int k = 0; k < K; ++k) ref += (double) Wd[(size_t) r*K + k] * X[(size_t) c*K + k];
            const float got = dst[(size_t) c*M + r];
            if (std::isnan(got)) { ++nan; continue; }
            err2 += (got - ref)*(got - ref); ref2 += ref*ref;
        }
        const double nmse = err2 / ref2;
        const bool same = !wl || dst == dst_plain;  // the permuted k leaves every int32 dot, so every output, as it was
        const bool ok = nan == 0 && nmse < 5e-4 && same;
        fails += !ok;
        printf("%s M=%d K=%d N=%d nwarps=%d%s: nmse %.2e%s%s %s\n", ggml_type_name(type), M, K, N, nwarps,
               loads == 2 ? " wide loads, x8 columns" : wl ? " wide loads" : "",
               nmse, nan ? " (unwritten outputs)" : "", same ? "" : " (differs from the kernel without wide loads)", ok ? "OK" : "FAIL");
        if (!wl) dst_plain = dst;
        }
    }
    printf("%s\n", fails ? "FAILED" : "all OK");
    return fails != 0;
}
