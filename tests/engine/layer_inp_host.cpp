// The tapped layers' host rows (patch 0034): a context whose tapped layer inputs stay on the device
// (llama_set_layer_inp_device, as a DSpark target's do) keeps no host copy of them, so
// llama_get_embeddings_layer_inp returns NULL (before 0034 it returned a pinned host buffer of
// n_layers x n_embd x n_batch floats that nothing wrote); with the device path turned off again the
// host rows come back and equal those of a context that never had it. Built against the engine's own
// libllama by tests/test_engine_patches.py.
//
// One context, three decodes of the same 24-token prompt, each in a fresh sequence: (1) taps on
// layers 1 and 2 through the host, (2) the same layers kept on the device, (3) the device path off
// again. Prints "host <h> device <d> again <a> differing <n> nonzero <z>": h / d / a are 1 when
// llama_get_embeddings_layer_inp gave rows after that decode (0: NULL), n the floats of (3) that
// differ from (1), z the floats of (1) that are not 0 (the rows were written). Exits 0 when it ran.
#include "llama_test_util.h"
#include "llama-ext.h"

#include <cstdio>
#include <vector>

static const int N_PROMPT = 24;

static void decode_prompt(llama_context * ctx, const std::vector<llama_token> & p, llama_seq_id seq) {
    batch_builder bb(N_PROMPT);
    for (int i = 0; i < N_PROMPT; ++i) bb.add(p[i], i, seq, i == N_PROMPT - 1);
    if (llama_decode(ctx, bb.b) != 0) {
        fprintf(stderr, "decode failed\n");
        exit(2);
    }
    llama_synchronize(ctx);
}

// layer lid's rows of the last decode (N_PROMPT x n_embd floats), or empty when the context gives none
static std::vector<float> rows(llama_context * ctx, uint32_t lid, int n_embd) {
    const float * p = llama_get_embeddings_layer_inp(ctx, lid);
    return p ? std::vector<float>(p, p + (size_t) N_PROMPT * n_embd) : std::vector<float>();
}

int main(int argc, char ** argv) {
    llama_model * model = load_test_model_from_args(argc, argv);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const int n_embd  = llama_model_n_embd(model);
    llama_context * ctx = new_test_context(model, 3, 1024);
    const std::vector<llama_token> p = tokens(N_PROMPT, 7, n_vocab);
    const int32_t layers[2] = {1, 2};
    for (int32_t il : layers) llama_set_embeddings_layer_inp(ctx, (uint32_t) il, true);

    decode_prompt(ctx, p, 0);
    const std::vector<float> host = rows(ctx, 1, n_embd);

    if (!llama_set_layer_inp_device(ctx, layers, 2)) {
        fprintf(stderr, "llama_set_layer_inp_device refused\n");
        return 2;
    }
    decode_prompt(ctx, p, 1);
    const std::vector<float> device = rows(ctx, 1, n_embd);

    llama_set_layer_inp_device(ctx, nullptr, 0);
    decode_prompt(ctx, p, 2);
    const std::vector<float> again = rows(ctx, 1, n_embd);

    int differing = 0, nonzero = 0;
    for (size_t i = 0; i < host.size(); ++i) {
        differing += i >= again.size() || again[i] != host[i];
        nonzero += host[i] != 0.0f;
    }
    printf("host %d device %d again %d differing %d nonzero %d\n", (int) !host.empty(), (int) !device.empty(),
           (int) !again.empty(), differing, nonzero);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
