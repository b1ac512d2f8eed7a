// Host emulation of patch 0071's mul_mat_vec_q4_K_mma, _q5_K_mma, _q6_K_mma and _q8_0_mma, with 0079's and 0080's staging
// through shared memory (mul_mat_vec_q4_K_mma_staged, _q8_0_mma_staged, _q6_K_mma_staged; removed developer 0077's
// wide loads too, which must give the same outputs; which product takes which kernel is 0079's shape rule; and developer
// 0087's mul_mat_vec_q4_K_mma_wide, 9-64 columns, in wide_checks):
// the kernels' per-lane loads and scaling written out lane by lane, an mma.m16n8k32 (s8) emulated from the fragment
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

// 0080's mmvq_mma_q6_K_int: int i of a staged Q6_K block that starts boff bytes into its staged row, from the two
// 4-byte words of the row at boff / 4 + i and + 1, shifted right by boff % 4 bytes (__funnelshift_r)
static int q6_staged_int(const uint8_t * row, int boff, int i) {
    uint32_t lo, hi;
    std::memcpy(&lo, row + 4*(boff/4 + i), 4);
    std::memcpy(&hi, row + 4*(boff/4 + i + 1), 4);
    return (int) (uint32_t) ((((uint64_t) hi << 32) | lo) >> (8*(boff % 4)));
}

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

// developer 0079's mmvq_mma_stage, lane by lane: piece idx = 32 i + lane of the warp's nrows*nbytes/P is row
// idx / (nbytes/P), piece idx % (nbytes/P) of it; row r at base + r*stride bytes (past nread rows: row nread - 1
// again, or zeros with zero_past), written to smem + r*pitch
static void stage(uint8_t * smem, int pitch, const uint8_t * base, size_t stride, int nbytes, int nrows, int nread,
                  bool zero_past, int P) {
    const int per_row = nbytes / P, npieces = nrows*per_row, per_lane = (npieces + 31) / 32;
    const uint8_t zeros[16] = {};
    for (int i = 0; i < per_lane; ++i) for (int lane = 0; lane < 32; ++lane) {
        const int idx = 32*i + lane;
        if (idx >= npieces) continue;
        const int r = idx / per_row, p = idx % per_row;
        const uint8_t * src = zero_past && r >= nread ? zeros : base + (size_t) std::min(r, nread - 1)*stride + (size_t) p*P;
        std::memcpy(smem + (size_t) r*pitch + (size_t) p*P, src, P);
    }
}
static constexpr int STAGE_YP = 8*36 + 16;  // the kernel's MMVQ_MMA_STAGE_YP

static void scales_i(const int * sc, float dmx, float dmy, float * d, float * m) {  // the kernel's mmvq_mma_q4_K_scales_i
    uint8_t q[12];
    for (int i = 0; i < 12; ++i) q[i] = (uint8_t) ((sc[i / 4] >> (8*(i % 4))) & 0xFF);
    scales(q, dmx, dmy, d, m);
}

// q8_1 as quantize_q8_1 (CUDA) makes it: d = amax/127, q = round(x/d), ds = (d, sum x); column c's K / 32 blocks
static std::vector<block_q8_1> quantize_q8_1(const std::vector<float> & X, int N, int K) {
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
    return y;
}

// a random M x K weight matrix quantized to type (xq) and dequantized by ggml (Wd), and N random columns of K (X)
struct problem {
    std::vector<float>   X, Wd;
    std::vector<uint8_t> xq;
    problem(ggml_type type, int M, int K, int N, std::mt19937 & rng) : X((size_t) N*K), Wd((size_t) M*K), xq(ggml_row_size(type, K) * M) {
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> W((size_t) M*K);
        for (auto & v : W) v = nd(rng);
        for (auto & v : X) v = nd(rng);
        ggml_quantize_chunk(type, W.data(), xq.data(), 0, M, K, nullptr);
        ggml_get_type_traits(type)->to_float(xq.data(), Wd.data(), (int64_t) M*K);
    }
};

// the NMSE of dst (N columns of M) against the float product of the dequantized weights Wd and X; unwritten outputs
// (NaN) counted in nan
static double nmse_of(const std::vector<float> & dst, const std::vector<float> & Wd, const std::vector<float> & X, int M,
                      int N, int K, int & nan) {
    double err2 = 0, ref2 = 0;
    nan = 0;
    for (int c = 0; c < N; ++c) for (int r = 0; r < M; ++r) {
        double ref = 0;
        for (int k = 0; k < K; ++k) ref += (double) Wd[(size_t) r*K + k] * X[(size_t) c*K + k];
        const float got = dst[(size_t) c*M + r];
        if (std::isnan(got)) { ++nan; continue; }
        err2 += (got - ref)*(got - ref); ref2 += ref*ref;
    }
    return err2 / ref2;
}

// developer 0087's mul_mat_vec_q4_K_mma_wide (Q4_K, Q5_K; 9-64 columns), block by block: a block's warps take rtiles row
// tiles of 16 rows and kwarps super-blocks a step (warp w: tile w % rtiles, super-block w / rtiles); a step's columns
// (8 ngroups, past N the last column again) are staged once a block by piece index over the block's threads, each
// warp's rows by its lanes, into a stage first filled with 0xEE (so a byte the copies miss shows); the fragments and
// scaling as the kernel reads them from there, an mma a group of 8 columns; a row tile's kwarps sums added in order
// of kw. Returns the shapes that fail (NMSE at or above 5e-4, or an output left unwritten)
static int wide_checks(std::mt19937 & rng) {
    int fails = 0;
    for (const ggml_type type : {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K})
    for (int M : {40, 72}) for (int K : {768, 2048}) for (int N : {9, 16, 17, 33, 64}) for (int rtiles : {1, 2, 4}) {
        const bool q5 = type == GGML_TYPE_Q5_K;
        const int  kwarps = rtiles == 4 ? 2 : 4, nwarps = rtiles*kwarps, ngroups = N <= 16 ? 2 : N <= 32 ? 4 : 8;
        const int  ncols = 8*ngroups, nb = K / QK_K, stride_col_y = K / QK8_1;
        const size_t bsz = ggml_type_size(type);
        const int  ypieces = 8*36/16, xpieces = (int) bsz/16, ny = kwarps*ncols*ypieces, nx = 16*xpieces;
        const int  YBYTES = kwarps*ncols*STAGE_YP, XBYTES = 16*(int) bsz;
        const problem pr(type, M, K, N, rng);
        const std::vector<float> & X = pr.X, & Wd = pr.Wd;
        const std::vector<uint8_t> & xq = pr.xq;
        const std::vector<block_q8_1> y = quantize_q8_1(X, N, K);
        const uint8_t * ybase = (const uint8_t *) y.data();
        const size_t ycol = (size_t) stride_col_y*36, xrow = (size_t) nb*bsz;
        std::vector<float> dst((size_t) N*M, NAN);
        const int nblocks = (M + 16*rtiles - 1) / (16*rtiles);
        for (int blk = 0; blk < nblocks; ++blk) {
            std::vector<float> acc((size_t) nwarps*32*4*ngroups, 0.0f);  // [warp][lane][4 ngroups]
            for (int kb0 = 0; kb0 < nb; kb0 += kwarps) {
                std::vector<uint8_t> stage(YBYTES + nwarps*XBYTES, 0xEE);
                for (int idx = 0; idx < ny; ++idx) {  // the block's threads' column pieces
                    const int k = idx / (ncols*ypieces), c = (idx / ypieces) % ncols, p = idx % ypieces;
                    if (kb0 + k >= nb) continue;
                    std::memcpy(&stage[k*ncols*STAGE_YP + c*STAGE_YP + 16*p],
                                ybase + std::min(c, N - 1)*ycol + (size_t) 8*(kb0 + k)*36 + 16*p, 16);
                }
                for (int w = 0; w < nwarps; ++w) {  // each warp's rows
                    const int r = w % rtiles, kw = w / rtiles, tile = rtiles*blk + r;
                    if (16*tile >= M || kb0 + kw >= nb) continue;
                    const int nread = std::min(16, M - 16*tile);
                    for (int idx = 0; idx < nx; ++idx) {
                        const int rr = idx / xpieces, p = idx % xpieces;
                        std::memcpy(&stage[YBYTES + w*XBYTES + rr*(int) bsz + 16*p],
                                    xq.data() + (size_t) (16*tile + std::min(rr, nread - 1))*xrow + (size_t) (kb0 + kw)*bsz + 16*p, 16);
                    }
                }
                for (int w = 0; w < nwarps; ++w) {
                    const int r = w % rtiles, kw = w / rtiles, tile = rtiles*blk + r, kb = kb0 + kw;
                    if (16*tile >= M || kb >= nb) continue;
                    const uint8_t * xs = &stage[YBYTES + w*XBYTES], * ys = &stage[kw*ncols*STAGE_YP];
                    for (int s = 0; s < 8; ++s) {
                        const int j = s / 2, nib = s % 2;
                        for (int gi = 0; gi < ngroups; ++gi) {
                            int a[32][4], b[32][2], dot[32][4];
                            for (int lane = 0; lane < 32; ++lane) {
                                const int g = lane/4, t = lane%4;
                                const uint8_t * B0 = xs + g*bsz, * B1 = xs + (g + 8)*bsz;
                                const int qoff = q5 ? 48 : 16;  // qs: after d, dmin, the scales (and Q5_K's qh)
                                const int * q0 = (const int *) (B0 + qoff) + 8*j, * q1 = (const int *) (B1 + qoff) + 8*j;
                                a[lane][0] = (q0[t] >> (4*nib)) & 0x0F0F0F0F;
                                a[lane][1] = (q1[t] >> (4*nib)) & 0x0F0F0F0F;
                                a[lane][2] = (q0[t + 4] >> (4*nib)) & 0x0F0F0F0F;
                                a[lane][3] = (q1[t + 4] >> (4*nib)) & 0x0F0F0F0F;
                                if (q5) {
                                    const int * h0 = (const int *) (B0 + 16), * h1 = (const int *) (B1 + 16);
                                    a[lane][0] |= ((h0[t] >> s) & 0x01010101) << 4;
                                    a[lane][1] |= ((h1[t] >> s) & 0x01010101) << 4;
                                    a[lane][2] |= ((h0[t + 4] >> s) & 0x01010101) << 4;
                                    a[lane][3] |= ((h1[t + 4] >> s) & 0x01010101) << 4;
                                }
                                const int * yq = (const int *) ((const block_q8_1 *) (ys + (8*gi + g)*STAGE_YP) + s)->qs;
                                b[lane][0] = yq[t]; b[lane][1] = yq[t + 4];
                            }
                            mma_emulated(a, b, dot);
                            for (int lane = 0; lane < 32; ++lane) {
                                const int g = lane/4, t = lane%4, row0 = 16*tile + g;
                                const bool ok0 = row0 < M, ok1 = row0 + 8 < M;
                                int head0[4], head1[4];
                                std::memcpy(head0, xs + g*bsz, 16); std::memcpy(head1, xs + (g + 8)*bsz, 16);
                                uint16_t h[4]; std::memcpy(h, head0, 4); std::memcpy(h + 2, head1, 4);
                                float d0[8], m0[8], d1[8], m1[8];
                                scales_i(head0 + 1, ok0 ? ggml_fp16_to_fp32(h[0]) : 0, ok0 ? ggml_fp16_to_fp32(h[1]) : 0, d0, m0);
                                scales_i(head1 + 1, ok1 ? ggml_fp16_to_fp32(h[2]) : 0, ok1 ? ggml_fp16_to_fp32(h[3]) : 0, d1, m1);
                                const block_q8_1 * y0 = (const block_q8_1 *) (ys + (8*gi + 2*t)*STAGE_YP) + s;
                                const block_q8_1 * y1 = (const block_q8_1 *) (ys + (8*gi + 2*t + 1)*STAGE_YP) + s;
                                const float ds0x = ggml_fp16_to_fp32(y0->d), ds0y = ggml_fp16_to_fp32(y0->s);
                                const float ds1x = ggml_fp16_to_fp32(y1->d), ds1y = ggml_fp16_to_fp32(y1->s);
                                float * ac = &acc[((size_t) w*32 + lane)*4*ngroups + 4*gi];
                                ac[0] += d0[s]*ds0x*dot[lane][0] - m0[s]*ds0y;
                                ac[1] += d0[s]*ds1x*dot[lane][1] - m0[s]*ds1y;
                                ac[2] += d1[s]*ds0x*dot[lane][2] - m1[s]*ds0y;
                                ac[3] += d1[s]*ds1x*dot[lane][3] - m1[s]*ds1y;
                            }
                        }
                    }
                }
            }
            for (int r = 0; r < rtiles; ++r) for (int lane = 0; lane < 32; ++lane) {  // warp (r, 0) adds the others, writes
                const int tile = rtiles*blk + r, row0 = 16*tile + lane/4, c0 = 2*(lane % 4);
                if (16*tile >= M) continue;
                for (int l = 0; l < 4*ngroups; ++l) {
                    float v = acc[((size_t) r*32 + lane)*4*ngroups + l];
                    for (int k = 1; k < kwarps; ++k) v += acc[((size_t) (k*rtiles + r)*32 + lane)*4*ngroups + l];
                    const int row = row0 + 8*((l % 4) / 2), col = 8*(l / 4) + c0 + l % 2;
                    if (row < M && col < N) dst[(size_t) col*M + row] = v;
                }
            }
        }
        int nan = 0;
        const double nmse = nmse_of(dst, Wd, X, M, N, K, nan);
        const bool ok = nan == 0 && nmse < 5e-4;
        fails += !ok;
        printf("%s M=%d K=%d N=%d wide, %d row tiles and %d super-blocks a step: nmse %.2e%s %s\n", ggml_type_name(type),
               M, K, N, rtiles, kwarps, nmse, nan ? " (unwritten outputs)" : "", ok ? "OK" : "FAIL");
    }
    return fails;
}

int main() {
    std::mt19937 rng(42);
    int fails = 0;
    for (const ggml_type type : {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0})
    for (int M : {16, 40, 64}) for (int K : {256, 768, 2048}) for (int N : {2, 3, 5, 8}) for (int nwarps : {1, 4}) {
        const bool q5 = type == GGML_TYPE_Q5_K, q4 = type == GGML_TYPE_Q4_K || q5, q6 = type == GGML_TYPE_Q6_K;  // q4: Q4_K's path (Q5_K too)
        if (K == 2048 && !q6) continue;  // K 2048: for 0080's staged Q6_K (rows of a multiple of 16 bytes), every boff
        const int qk = q4 || q6 ? QK_K : 32, nb = K / qk;
        const problem pr(type, M, K, N, rng);
        const std::vector<float> & X = pr.X, & Wd = pr.Wd;
        const std::vector<uint8_t> & xq = pr.xq;
        const block_q8_0 * x8 = (const block_q8_0 *) xq.data();
        const int stride_col_y = K / QK8_1;
        const std::vector<block_q8_1> y = quantize_q8_1(X, N, K);
        // block_q8_1_x8 as quantize_q8_1_x8 writes it: a sub-block's 8 columns' (d, sum) halves, then their 32 quants
        // each; the same values as the q8_1 blocks above, columns past N zero
        std::vector<uint8_t> yx8((size_t) stride_col_y * 288, 0);
        for (int b = 0; b < stride_col_y; ++b) for (int c = 0; c < N; ++c) {
            const block_q8_1 & o = y[(size_t) c*stride_col_y + b];
            std::memcpy(&yx8[(size_t) b*288 + 4*c], &o.d, 2);
            std::memcpy(&yx8[(size_t) b*288 + 4*c + 2], &o.s, 2);
            std::memcpy(&yx8[(size_t) b*288 + 32 + 32*c], o.qs, 32);
        }
        std::vector<float> dst_plain;  // the outputs without developer 0077's wide loads or 0079's staging, which must match
        // 0077: 1 the weights' wide loads, 2 and the columns in block_q8_1_x8; 0079: 3 staged through shared memory
        for (const int loads : {0, 1, 2, 3}) {
        const bool q8 = type == GGML_TYPE_Q8_0;
        if ((loads == 1 || loads == 2) && !q4) continue;
        if (loads == 3 && !(q4 || q6 || q8)) continue;
        // 0080's Q6_K kernel takes rows of a multiple of 16 bytes (ggml_cuda_mmvq_mma_staged_ok): here K 2048
        if (loads == 3 && q6 && (ggml_row_size(type, K) % 16 != 0)) continue;
        const bool wl = loads == 1 || loads == 2, st = loads == 3;
        const size_t bsz = ggml_type_size(type);
        std::vector<float> dst((size_t) N*M, NAN);
        const int stride_row_x = nb, stride_col_dst = M, ncols_dst = N;
        for (int tile = 0; tile < (M + 15)/16; ++tile) {
            static float accs[8][32][4];
            std::memset(accs, 0, sizeof(accs));
            if (q8 && st) {  // developer 0079's Q8_0: 4 blocks a warp step, rows at 144 bytes, columns at 144
                for (int w = 0; w < nwarps; ++w) for (int kb0 = 4*w; kb0 < nb; kb0 += 4*nwarps) {
                    std::vector<uint8_t> sx(16*144), sy(8*144);
                    stage(sx.data(), 144, xq.data() + ((size_t) 16*tile*stride_row_x + kb0)*bsz, stride_row_x*bsz, 136, 16,
                          M - 16*tile, false, 8);
                    stage(sy.data(), 144, (const uint8_t *) y.data() + (size_t) kb0*36, (size_t) stride_col_y*36, 144, 8, N, true, 16);
                    for (int b = 0; b < 4; ++b) {
                        int a[32][4], bb[32][2], dot[32][4];
                        for (int lane = 0; lane < 32; ++lane) {
                            const int g = lane/4, t = lane%4;
                            const uint8_t * x0 = sx.data() + g*144 + 34*b, * x1 = x0 + 8*144;
                            for (int h = 0; h < 2; ++h) for (int r = 0; r < 2; ++r) {  // two halves for even b, one int for odd
                                const uint8_t * q = (r ? x1 : x0) + 2 + 4*(t + 4*h);
                                uint16_t lo, hi; std::memcpy(&lo, q, 2); std::memcpy(&hi, q + 2, 2);
                                a[lane][2*h + r] = (int) ((uint32_t) lo | ((uint32_t) hi << 16));
                            }
                            const uint8_t * yg = sy.data() + g*144 + 36*b + 4;
                            std::memcpy(&bb[lane][0], yg + 4*t, 4); std::memcpy(&bb[lane][1], yg + 4*(t + 4), 4);
                        }
                        mma_emulated(a, bb, dot);
                        for (int lane = 0; lane < 32; ++lane) {
                            const int g = lane/4, t = lane%4;
                            uint16_t h0, h1, e0, e1;
                            std::memcpy(&h0, sx.data() + g*144 + 34*b, 2); std::memcpy(&h1, sx.data() + (g + 8)*144 + 34*b, 2);
                            std::memcpy(&e0, sy.data() + 2*t*144 + 36*b, 2); std::memcpy(&e1, sy.data() + (2*t + 1)*144 + 36*b, 2);
                            const float d0 = ggml_fp16_to_fp32(h0), d1 = ggml_fp16_to_fp32(h1);
                            const float f0 = ggml_fp16_to_fp32(e0), f1 = ggml_fp16_to_fp32(e1);
                            float * acc = accs[w][lane];
                            acc[0] += d0*f0*dot[lane][0]; acc[1] += d0*f1*dot[lane][1];
                            acc[2] += d1*f0*dot[lane][2]; acc[3] += d1*f1*dot[lane][3];
                        }
                    }
                }
            } else
            for (int w = 0; w < nwarps; ++w) {
                for (int kb = w; kb < nb; kb += nwarps) {
                    // 0079 (st, Q4_K / Q5_K): the super-block of the tile's 16 rows (a block's bytes apart) and the
                    // 8 columns' 8 q8_1 blocks (STAGE_YP apart) staged in 16-byte pieces; the fragments read from there.
                    // 0080 (st, Q6_K): each row's 14 16-byte pieces from the 16-byte boundary at or before the block (the
                    // block w0 = 210 kb % 16 bytes into its staged row, rows 240 bytes apart; the kernel's rows are a
                    // multiple of 16 bytes), the columns as 0079's (past N: the last column again), the ints read by
                    // q6_staged_int
                    std::vector<uint8_t> sx, sy;
                    int hsum[128] = {};
                    const int xp = q6 ? 240 : (int) bsz, w0 = q6 ? (int) ((size_t) kb*bsz % 16) : 0;
                    if (st && q6) {
                        sx.assign(16*xp, 0xEE); sy.assign(8*STAGE_YP, 0xEE);
                        const size_t a = (size_t) kb*bsz & ~(size_t) 15;
                        for (int idx = 0; idx < 16*14; ++idx) {
                            const int r = idx / 14, p = idx % 14;
                            const uint8_t * row = xq.data() + (size_t) (16*tile + std::min(r, M - 16*tile - 1))*stride_row_x*bsz;
                            std::memcpy(sx.data() + r*xp + 16*p, row + a + 16*p, 16);
                        }
                        stage(sy.data(), STAGE_YP, (const uint8_t *) y.data() + (size_t) 8*kb*36, (size_t) stride_col_y*36, 288, 8, N,
                              false, 16);
                        // the kernel's half sums, lane by lane: lane's int4 at 4 lane holds column lane / 4's blocks
                        // 2 lane % 8 and + 1, halves 0 and 1 each (column c, block s, half h at 16 c + 2 s + h)
                        for (int lane = 0; lane < 32; ++lane) for (int j2 = 0; j2 < 4; ++j2) {
                            const block_q8_1 * yb = (const block_q8_1 *) (sy.data() + (lane/4)*STAGE_YP) + (2*lane) % 8 + j2/2;
                            int sum = 0;
                            for (int k = 0; k < 16; ++k) sum += yb->qs[16*(j2 % 2) + k];
                            hsum[4*lane + j2] = sum;
                        }
                    } else if (st) {
                        sx.resize(16*xp); sy.resize(8*STAGE_YP);
                        stage(sx.data(), xp, xq.data() + ((size_t) 16*tile*stride_row_x + kb)*bsz, stride_row_x*bsz, (int) bsz,
                              16, M - 16*tile, false, 16);
                        stage(sy.data(), STAGE_YP, (const uint8_t *) y.data() + (size_t) 8*kb*36, (size_t) stride_col_y*36, 288, 8, N,
                              true, 16);
                    }
                    // row g + 8 r's block (weights index i): staged, or where the weights are
                    auto block_at = [&](int g, int r, size_t i) -> const uint8_t * {
                        return st ? sx.data() + (size_t) (g + 8*r)*xp + w0 : xq.data() + i*bsz;
                    };
                    for (int s = 0; s < (q4 || q6 ? 8 : 1); ++s) {  // Q4_K: sub-block s = 2 j + nib; Q6_K: half s / 4,
                        const int j = s / 2, nib = s % 2, kby = q4 || q6 ? 8*kb + s : kb;  // part s % 4; Q8_0: the block
                        const int n = s / 4, pp = s % 4;
                        int a[32][4], b[32][2], dot[32][4], dot_hi[32][4];
                        for (int lane = 0; lane < 32; ++lane) {  // the kernel's loads, lane by lane
                            const int g = lane/4, t = lane%4, row0 = 16*tile + g, row1 = row0 + 8;
                            const bool ok0 = row0 < M, ok1 = row1 < M, okb = g < ncols_dst;
                            const size_t i0 = (size_t) (ok0 ? row0 : 0)*stride_row_x + kb;
                            const size_t i1 = (size_t) (ok1 ? row1 : 0)*stride_row_x + kb;
                            const uint8_t * B0 = block_at(g, 0, i0), * B1 = block_at(g, 1, i1);
                            const block_q4_K & X40 = *(const block_q4_K *) B0, & X41 = *(const block_q4_K *) B1;
                            const block_q5_K & X50 = *(const block_q5_K *) B0, & X51 = *(const block_q5_K *) B1;
                            // developer 0077 (wl): ints 2t, 2t + 1 (values 8t..8t+7) instead of t, t + 4, the columns' too
                            const int ta = wl ? 2*t : t, tb = wl ? 2*t + 1 : t + 4;
                            if (q5) {  // Q4_K's nibbles with the fifth bit: bit s of qh's ints ta, tb
                                const int * q0 = (const int *) X50.qs + 8*j;
                                const int * q1 = (const int *) X51.qs + 8*j;
                                const int * h0 = (const int *) X50.qh;
                                const int * h1 = (const int *) X51.qh;
                                a[lane][0] = ((q0[ta] >> (4*nib)) & 0x0F0F0F0F) | (((h0[ta] >> s) & 0x01010101) << 4);
                                a[lane][1] = ((q1[ta] >> (4*nib)) & 0x0F0F0F0F) | (((h1[ta] >> s) & 0x01010101) << 4);
                                a[lane][2] = ((q0[tb] >> (4*nib)) & 0x0F0F0F0F) | (((h0[tb] >> s) & 0x01010101) << 4);
                                a[lane][3] = ((q1[tb] >> (4*nib)) & 0x0F0F0F0F) | (((h1[tb] >> s) & 0x01010101) << 4);
                            } else if (q4) {
                                const int * q0 = (const int *) X40.qs + 8*j;
                                const int * q1 = (const int *) X41.qs + 8*j;
                                a[lane][0] = (q0[ta] >> (4*nib)) & 0x0F0F0F0F;
                                a[lane][1] = (q1[ta] >> (4*nib)) & 0x0F0F0F0F;
                                a[lane][2] = (q0[tb] >> (4*nib)) & 0x0F0F0F0F;
                                a[lane][3] = (q1[tb] >> (4*nib)) & 0x0F0F0F0F;
                            } else if (q6) {
                                for (int r = 0; r < 2; ++r) for (int h = 0; h < 2; ++h) {
                                    const block_q6_K & bx = *(const block_q6_K *) (r ? B1 : B0);
                                    const uint8_t * srow = st ? sx.data() + (size_t) (g + 8*r)*xp : nullptr;  // 0080's staged row
                                    const int iql = 16*n + 8*(pp & 1) + 4*h + t, iqh = 8*n + 4*h + t;
                                    const int lo = ((st ? q6_staged_int(srow, w0, iql) : get_int_b2(bx.ql, iql)) >> (4*(pp >> 1))) & 0x0F0F0F0F;
                                    const int hi = ((st ? q6_staged_int(srow, w0, 32 + iqh) : get_int_b2(bx.qh, iqh)) >> (2*pp)) & 0x03030303;
                                    // regs: row g / g + 8 at k half h; 0080 (st) keeps the 6-bit values (0..63) and takes 32 times
                                    // the columns' half sums off the int dots below
                                    a[lane][2*h + r] = st ? lo | (hi << 4) : vsub32(lo | (hi << 4));
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
                            } else if (st) {  // column g's staged block s (zeros past the columns)
                                const int * yq = (const int *) ((const block_q8_1 *) (sy.data() + g*STAGE_YP) + s)->qs;
                                b[lane][0] = yq[ta]; b[lane][1] = yq[tb];
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
                            const uint8_t * B0 = block_at(g, 0, i0), * B1 = block_at(g, 1, i1);
                            const block_q4_K & X40 = *(const block_q4_K *) B0, & X41 = *(const block_q4_K *) B1;
                            const block_q5_K & X50 = *(const block_q5_K *) B0, & X51 = *(const block_q5_K *) B1;
                            if (st) {  // columns 2t, 2t + 1's staged (d, sum) of block s
                                const block_q8_1 * y0 = (const block_q8_1 *) (sy.data() + c0*STAGE_YP) + s;
                                const block_q8_1 * y1 = (const block_q8_1 *) (sy.data() + c1*STAGE_YP) + s;
                                ds0x = ggml_fp16_to_fp32(y0->d); ds0y = ggml_fp16_to_fp32(y0->s);
                                ds1x = ggml_fp16_to_fp32(y1->d); ds1y = ggml_fp16_to_fp32(y1->s);
                            } else if (loads == 2) {  // columns 2t, 2t + 1's (d, sum) as one 8-byte load at 8t
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
                                const uint8_t * sc0 = q5 ? X50.scales : X40.scales;
                                const uint8_t * sc1 = q5 ? X51.scales : X41.scales;
                                const uint16_t dd0 = q5 ? X50.d : X40.d, dm0 = q5 ? X50.dmin : X40.dmin;
                                const uint16_t dd1 = q5 ? X51.d : X41.d, dm1 = q5 ? X51.dmin : X41.dmin;
                                if (wl || st) {  // the block's first 16 bytes as 4 ints: d and dmin, then the scales
                                    int head0[4], head1[4];
                                    std::memcpy(head0, q5 ? (const void *) &X50 : (const void *) &X40, 16);
                                    std::memcpy(head1, q5 ? (const void *) &X51 : (const void *) &X41, 16);
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
                                const block_q6_K & X60 = *(const block_q6_K *) B0, & X61 = *(const block_q6_K *) B1;
                                float dr[2] = {ok0 ? ggml_fp16_to_fp32(X60.d) : 0, ok1 ? ggml_fp16_to_fp32(X61.d) : 0};
                                int8_t scs[2][16];
                                for (int r = 0; r < 2; ++r) for (int j2 = 0; j2 < 16; ++j2) scs[r][j2] = (r ? X61 : X60).scales[j2];
                                if (st) {  // 0080: d from int 52's low half, the scales from ints 48-51, as the kernel reads them
                                    for (int r = 0; r < 2; ++r) {
                                        const uint8_t * srow = sx.data() + (size_t) (g + 8*r)*xp;
                                        if (r ? ok1 : ok0) dr[r] = ggml_fp16_to_fp32((uint16_t) q6_staged_int(srow, w0, 52));
                                        for (int j2 = 0; j2 < 16; ++j2) scs[r][j2] = byte_of(q6_staged_int(srow, w0, 48 + j2/4), j2 % 4);
                                    }
                                }
                                for (int l = 0; l < 4; ++l) {
                                    if (st) {  // 0080: (dot - 32 half sum) by each half's int scale, then d * e * that, one conversion
                                        const int * hs = hsum + 16*(l % 2 ? c1 : c0) + 2*s;
                                        const int v = (dot[lane][l] - 32*hs[0])*scs[l / 2][8*n + 2*pp] + (dot_hi[lane][l] - 32*hs[1])*scs[l / 2][8*n + 2*pp + 1];
                                        acc[l] += dr[l / 2] * (l % 2 ? ds1x : ds0x) * (float) v;
                                        continue;
                                    }
                                    const float sl = dr[l / 2] * scs[l / 2][8*n + 2*pp], sh = dr[l / 2] * scs[l / 2][8*n + 2*pp + 1];
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
        int nan = 0;
        const double nmse = nmse_of(dst, Wd, X, M, N, K, nan);
        // the permuted k leaves every int32 dot, so every output, as it was; so does Q4_K / Q5_K's staging (each warp the
        // same super-blocks); Q8_0's staging gives a warp 4 consecutive blocks, so its sums meet in another order, and
        // 0080's Q6_K scales its (exact) int dots before one conversion: both within 1e-5 of the unstaged outputs
        bool same = (!wl && !st) || dst == dst_plain;
        if (st && (q8 || q6) && !same) {
            double dmax = 0, pmax = 0;
            for (size_t i = 0; i < dst.size(); ++i) { dmax = std::max(dmax, (double) std::fabs(dst[i] - dst_plain[i])); pmax = std::max(pmax, (double) std::fabs(dst_plain[i])); }
            same = dmax <= 1e-5*pmax;
        }
        const bool ok = nan == 0 && nmse < 5e-4 && same;
        fails += !ok;
        printf("%s M=%d K=%d N=%d nwarps=%d%s: nmse %.2e%s%s %s\n", ggml_type_name(type), M, K, N, nwarps,
               st ? " staged" : loads == 2 ? " wide loads, x8 columns" : wl ? " wide loads" : "",
               nmse, nan ? " (unwritten outputs)" : "", same ? "" : " (differs from the kernel without wide loads)", ok ? "OK" : "FAIL");
        if (loads == 0) dst_plain = dst;
        }
    }
    fails += wide_checks(rng);
    printf("%s\n", fails ? "FAILED" : "all OK");
    return fails != 0;
}
