// How one decode of several sequences splits into ubatches without a unified KV cache (patch 0046).
// Built against the engine's own libllama by tests/test_engine_patches.py.
//
// A context of 8 sequences, each with a KV stream of its own (kv_unified off, as llama-server's
// slots), 7 rollback snapshots (a verify of 8 rows, so n_keep_tail 8). Every token is an output, so
// the graph's "result_norm" (read through cb_eval once a ubatch is computed) has one column a row of
// the ubatch: the program prints the ubatch sizes of two decodes laid out as llama-server lays a step
// out, generating slots first, prompts after:
//
//   tail:   slots 0-6 verify 8 rows each, slot 7 holds a prompt's last 4 tokens
//   middle: slots 0, 1, 3, 4 verify 8 rows each, slot 2 (listed last) holds 40 prompt tokens
//
// as "<case>: <size> <size> ...", and then "<case>: max |diff| <d> of max |logit| <m>" for the last
// row of every sequence against the same sequence decoded alone in a fresh context. Exits 0 when it ran.
#include "llama_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static std::vector<int> g_sizes;

static bool count_ubatches(struct ggml_tensor * t, bool ask, void *) {
    const bool wanted = strcmp(t->name, "result_norm") == 0;
    if (!ask && wanted) {
        g_sizes.push_back((int) t->ne[1]);
    }
    return ask ? wanted : true;
}

static llama_context * new_context(llama_model * model, int n_seq) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx      = 256 * n_seq;
    cp.n_batch    = 512;
    cp.n_ubatch   = 512;
    cp.n_seq_max  = n_seq;
    cp.n_rs_seq   = 7;
    cp.kv_unified = false;
    cp.n_threads  = cp.n_threads_batch = 2;
    cp.cb_eval    = count_ubatches;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "no context\n");
        exit(2);
    }
    return ctx;
}

struct seq_rows {
    llama_seq_id seq;
    std::vector<llama_token> toks;
};

// decodes ``rows`` (in this order) in one batch of a fresh context, every token an output; returns
// each sequence's last logits row, in the order of ``rows``, and leaves the ubatch sizes in g_sizes
static std::vector<std::vector<float>> decode(llama_model * model, const std::vector<seq_rows> & rows, int n_seq) {
    llama_context * ctx = new_context(model, n_seq);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    int n = 0;
    for (const auto & r : rows) {
        n += (int) r.toks.size();
    }
    batch_builder bb(n);
    std::vector<int> last;
    for (const auto & r : rows) {
        for (size_t i = 0; i < r.toks.size(); ++i) {
            bb.add(r.toks[i], (llama_pos) i, r.seq, true);
        }
        last.push_back(bb.b.n_tokens - 1);
    }
    g_sizes.clear();
    if (llama_decode(ctx, bb.b) != 0) {
        fprintf(stderr, "decode failed\n");
        exit(2);
    }
    std::vector<std::vector<float>> out;
    for (int i : last) {
        const float * l = llama_get_logits_ith(ctx, i);
        out.emplace_back(l, l + n_vocab);
    }
    llama_free(ctx);
    return out;
}

static void run_case(llama_model * model, const char * name, const std::vector<seq_rows> & rows) {
    const int n_seq = 8;
    const auto together = decode(model, rows, n_seq);
    std::string sizes;
    for (int s : g_sizes) {
        sizes += " " + std::to_string(s);
    }
    printf("%s:%s\n", name, sizes.c_str());
    float diff = 0.0f, mag = 0.0f;
    for (size_t k = 0; k < rows.size(); ++k) {
        const auto alone = decode(model, {rows[k]}, n_seq);
        for (size_t j = 0; j < alone[0].size(); ++j) {
            diff = std::max(diff, std::fabs(alone[0][j] - together[k][j]));
            mag  = std::max(mag, std::fabs(alone[0][j]));
        }
    }
    printf("%s: max |diff| %.6f of max |logit| %.6f\n", name, diff, mag);
}

int main(int argc, char ** argv) {
    llama_model * model = load_test_model_from_args(argc, argv);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    std::vector<seq_rows> tail;
    for (llama_seq_id s = 0; s < 7; ++s) {
        tail.push_back({s, tokens(8, 100 + s, n_vocab)});
    }
    tail.push_back({7, tokens(4, 200, n_vocab)});
    run_case(model, "tail", tail);

    std::vector<seq_rows> middle;
    for (llama_seq_id s : {0, 1, 3, 4}) {
        middle.push_back({s, tokens(8, 300 + s, n_vocab)});
    }
    middle.push_back({2, tokens(40, 400, n_vocab)});
    run_case(model, "middle", middle);

    llama_model_free(model);
    llama_backend_free();
    return 0;
}
