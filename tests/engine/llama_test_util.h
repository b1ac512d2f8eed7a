// Helpers shared by the engine tests that drive libllama directly (built by
// tests/test_engine_patches.py): deterministic token ids, a batch builder, contexts and the model.
#pragma once

#include "llama.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

// n token ids from a seed, above the first 16 ids (special tokens)
static std::vector<llama_token> tokens(int n, uint32_t seed, int n_vocab) {
    std::vector<llama_token> out;
    uint32_t x = seed;
    for (int i = 0; i < n; ++i) {
        x = x * 1664525u + 1013904223u;
        out.push_back((llama_token) (16 + (x >> 8) % (uint32_t) (n_vocab - 16)));
    }
    return out;
}

struct batch_builder {
    llama_batch b;
    explicit batch_builder(int n) : b(llama_batch_init(n, 0, 1)) { b.n_tokens = 0; }
    ~batch_builder() { llama_batch_free(b); }
    batch_builder(const batch_builder &) = delete;
    batch_builder & operator=(const batch_builder &) = delete;
    void add(llama_token t, llama_pos p, llama_seq_id s, bool out) {
        const int i = b.n_tokens++;
        b.token[i] = t; b.pos[i] = p; b.n_seq_id[i] = 1; b.seq_id[i][0] = s; b.logits[i] = out;
    }
};

// a CPU context of n_seq_max sequences on one unified KV cache, 2 threads; exits 2 when it fails
static llama_context * new_test_context(llama_model * model, int n_seq_max, uint32_t n_ctx, uint32_t n_rs_seq = 0) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx      = n_ctx;
    cp.n_batch    = 512;
    cp.n_ubatch   = 512;
    cp.n_seq_max  = n_seq_max;
    if (n_rs_seq > 0) {
        cp.n_rs_seq = n_rs_seq;
    }
    cp.kv_unified = true;
    cp.n_threads  = cp.n_threads_batch = 2;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "no context\n");
        exit(2);
    }
    return ctx;
}

// the backend initialised and the model at path loaded on the CPU; exits 2 when it cannot be
static llama_model * load_test_model(const char * path) {
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(path, mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", path);
        exit(2);
    }
    return model;
}

// the model named by argv[1] (load_test_model); without one, the usage line ("TARGET.gguf" and
// more_args) on stderr and exit 2
static llama_model * load_test_model_from_args(int argc, char ** argv, const char * more_args = "") {
    if (argc < 2) {
        fprintf(stderr, "usage: %s TARGET.gguf%s\n", argv[0], more_args);
        exit(2);
    }
    return load_test_model(argv[1]);
}
