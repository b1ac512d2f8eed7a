// Engine patches 0018 and 0033 (ggufdspark): an LFM2 verify's (since 0033 any batch's) conv-state
// snapshots written by d_conv SET_ROWS a layer must leave the conv state exactly as the pinned one CPY
// a slot does. This builds both ways with the engine's own ggml (the same views as
// src/models/lfm2.cpp) on random inputs and compares the states. With --reversed the SET_ROWS side
// gets the slot order reversed, which must differ: the comparison can fail. --one writes the snapshots
// by one SET_ROWS whose rows are a window's d_conv values (developer patch 0084, LLAMA_CONV_SNAPSHOT_ONE=1:
// the source rows overlap, a row stride of one value). Prints "N cases, M mismatches"; exit 1 on a
// mismatch (0 with --reversed only when every case differs).
#include "ggml.h"
#include "ggml-cpu.h"
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

static std::vector<float> run(bool rows, bool one, bool reversed, int d_conv, int n_tok, int n_embd, int n_seqs, int K, int mem_size, int kv_head,
                              const std::vector<float> & bxv) {
    ggml_init_params ip = { 256u << 20, nullptr, false };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * bx = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d_conv + n_tok, n_embd, n_seqs);
    memcpy(bx->data, bxv.data(), ggml_nbytes(bx));
    const size_t row_size = ggml_row_size(GGML_TYPE_F32, (int64_t) d_conv * n_embd);
    ggml_tensor * conv_state = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, (int64_t) d_conv * n_embd, (int64_t) mem_size * K);
    for (int64_t i = 0; i < ggml_nelements(conv_state); ++i) ((float *) conv_state->data)[i] = -7.0f;
    ggml_cgraph * gf = ggml_new_graph(ctx);
    const int64_t n_written = std::min(n_tok, K);
    if (rows) {
        const size_t es = sizeof(float);
        ggml_tensor * slot_of_window = ggml_arange(ctx, 0.0f, (float) n_written, 1.0f);
        if (!reversed) {
            slot_of_window = ggml_scale_bias(ctx, slot_of_window, -1.0f, (float) (n_written - 1));
        }
        ggml_tensor * idx = ggml_cast(ctx, slot_of_window, GGML_TYPE_I32);
        if (one) {
            // made with one row, then given its n_written, as the patch does (ggml's view check sizes a view
            // as if its rows did not overlap)
            ggml_tensor * vals  = ggml_view_4d(ctx, bx, d_conv, 1, bx->ne[1], bx->ne[2], es, bx->nb[1], bx->nb[2],
                                               (bx->ne[0] - d_conv - (n_written - 1)) * es);
            vals->ne[1] = n_written;
            ggml_tensor * slots = ggml_view_4d(ctx, conv_state, d_conv, n_written, n_embd, n_seqs,
                                               (size_t) mem_size * row_size, (size_t) d_conv * es, row_size,
                                               (size_t) kv_head * row_size);
            ggml_build_forward_expand(gf, ggml_set_rows(ctx, slots, vals, idx));
        }
        for (int t = 0; t < d_conv && !one; ++t) {
            ggml_tensor * vals  = ggml_view_4d(ctx, bx, 1, n_written, bx->ne[1], bx->ne[2], es, bx->nb[1], bx->nb[2],
                                               (bx->ne[0] - d_conv - (n_written - 1) + t) * es);
            ggml_tensor * slots = ggml_view_4d(ctx, conv_state, 1, n_written, n_embd, n_seqs,
                                               (size_t) mem_size * row_size, (size_t) d_conv * es, row_size,
                                               (size_t) kv_head * row_size + t * es);
            ggml_build_forward_expand(gf, ggml_set_rows(ctx, slots, vals, idx));
        }
    } else {
        for (int64_t slot = 0; slot < n_written; ++slot) {
            ggml_tensor * snap = ggml_view_3d(ctx, bx, d_conv, bx->ne[1], bx->ne[2], bx->nb[1], bx->nb[2],
                                              (bx->ne[0] - d_conv - slot) * ggml_element_size(bx));
            ggml_build_forward_expand(gf, ggml_cpy(ctx, snap, ggml_view_2d(ctx, conv_state, (int64_t) d_conv * n_embd, n_seqs,
                                                   conv_state->nb[1], ((size_t) slot * mem_size + kv_head) * row_size)));
        }
    }
    ggml_graph_compute_with_ctx(ctx, gf, 2);
    std::vector<float> out((float *) conv_state->data, (float *) conv_state->data + ggml_nelements(conv_state));
    ggml_free(ctx);
    return out;
}

int main(int argc, char ** argv) {
    bool reversed = false, one = false;
    for (int i = 1; i < argc; ++i) {
        reversed |= strcmp(argv[i], "--reversed") == 0;
        one      |= strcmp(argv[i], "--one") == 0;
    }
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1, 1);
    int bad = 0, cases = 0;
    // every batch size, one token too (patch 0033: the SET_ROWS path whenever there are snapshots);
    // reversing one slot changes nothing, so --reversed leaves those cases out
    for (int d_conv : {2, 3}) for (int n_tok : {1, 2, 3, 6, 9, 64}) for (int n_seqs : {1, 3}) for (int K : {4, 7}) {
        const int n_embd = 16, mem_size = 5, kv_head = mem_size - n_seqs;
        if (reversed && std::min(n_tok, K) == 1) continue;
        std::vector<float> bxv((size_t) (d_conv + n_tok) * n_embd * n_seqs);
        for (auto & v : bxv) v = u(rng);
        auto a = run(false, false, false, d_conv, n_tok, n_embd, n_seqs, K, mem_size, kv_head, bxv);
        auto b = run(true, one, reversed, d_conv, n_tok, n_embd, n_seqs, K, mem_size, kv_head, bxv);
        ++cases;
        if (a != b) {
            ++bad;
            if (!reversed) printf("MISMATCH d_conv %d n_tok %d n_seqs %d K %d\n", d_conv, n_tok, n_seqs, K);
        }
    }
    printf("%d cases, %d mismatches\n", cases, bad);
    return reversed ? (bad != cases) : (bad != 0);
}
