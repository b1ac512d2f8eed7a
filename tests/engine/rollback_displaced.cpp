// A recurrent state's partial rollback after a decode in which a later ubatch moved the verified
// sequence's cell (patch 0019). Built against the engine's own libllama by tests/test_engine_patches.py.
//
// Three sequences of an LFM2 target share one context (unified KV, 6 rollback snapshots). Their prompts
// go in one at a time, in the order 2, 0, 1, so sequence 0 owns cell 1. Then one decode carries a 7-token
// verify of sequence 0 and 4 tokens each of sequences 1 and 2: the split puts the verify in a ubatch of
// its own, and the next ubatch gathers 1 and 2 into cells 0 and 1, which moves sequence 0 to cell 2 and
// writes 1's and 2's snapshots over the ones sequence 0's verify has just written in cell 1. Sequence 0
// then keeps 2 of its 6 drafted tokens (a rollback of 4) and decodes one more token: its logits must
// equal those of a context that never saw the rejected tokens.
//
// Prints "cell of sequence 0: <before> -> <after>" (read from the context's recurrent memory, so the
// test knows the case still moves the cell) and "max |diff| <d> of max |logit| <m>, argmax <a> vs <b>",
// and exits 0 when it ran.
#include "llama_test_util.h"
#include "llama-memory-hybrid.h"
#include "llama-memory-recurrent.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

static void decode(llama_context * ctx, const batch_builder & bb, const char * what) {
    if (llama_decode(ctx, bb.b) != 0) {
        fprintf(stderr, "decode failed: %s\n", what);
        exit(2);
    }
}

// the recurrent cell that holds sequence ``seq`` (-1: none, or not a hybrid model's memory)
static int seq_cell(llama_context * ctx, llama_seq_id seq) {
    auto * mem = dynamic_cast<llama_memory_hybrid *>(llama_get_memory(ctx));
    if (mem == nullptr) {
        return -1;
    }
    const auto & cells = mem->get_mem_recr()->cells;
    for (size_t i = 0; i < cells.size(); ++i) {
        if (cells[i].has_seq_id(seq)) {
            return (int) i;
        }
    }
    return -1;
}

static llama_context * new_context(llama_model * model, int n_seq_max) {
    return new_test_context(model, n_seq_max, 512 * n_seq_max, 6);  // 6 rollback snapshots
}

int main(int argc, char ** argv) {
    llama_model * model = load_test_model_from_args(argc, argv);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    const int n_prompt = 24;
    std::vector<std::vector<llama_token>> prompt = {
        tokens(n_prompt, 11, n_vocab), tokens(n_prompt, 22, n_vocab), tokens(n_prompt, 33, n_vocab) };
    const std::vector<llama_token> verify = tokens(7, 44, n_vocab);   // sampled token + 6 drafts
    const std::vector<llama_token> other1 = tokens(4, 55, n_vocab);
    const std::vector<llama_token> other2 = tokens(4, 66, n_vocab);
    const llama_token next = tokens(1, 77, n_vocab)[0];
    const int n_keep = 3;  // the sampled token and 2 accepted drafts

    // the context under test
    llama_context * ctx = new_context(model, 3);
    for (int s : {2, 0, 1}) {
        batch_builder bb(n_prompt);
        for (int i = 0; i < n_prompt; ++i) bb.add(prompt[s][i], i, s, i == n_prompt - 1);
        decode(ctx, bb, "prompt");
    }
    const int cell_before = seq_cell(ctx, 0);
    {
        batch_builder bb(16);
        for (int i = 0; i < 7; ++i) bb.add(verify[i], n_prompt + i, 0, true);
        for (int i = 0; i < 4; ++i) bb.add(other1[i], n_prompt + i, 1, i == 3);
        for (int i = 0; i < 4; ++i) bb.add(other2[i], n_prompt + i, 2, i == 3);
        decode(ctx, bb, "verify");
    }
    printf("cell of sequence 0: %d -> %d\n", cell_before, seq_cell(ctx, 0));
    if (!llama_memory_seq_rm(llama_get_memory(ctx), 0, n_prompt + n_keep, -1)) {
        fprintf(stderr, "partial rollback refused\n");
        return 2;
    }
    {
        batch_builder bb(1);
        bb.add(next, n_prompt + n_keep, 0, true);
        decode(ctx, bb, "after rollback");
    }
    std::vector<float> got(llama_get_logits_ith(ctx, -1), llama_get_logits_ith(ctx, -1) + n_vocab);

    // the reference: sequence 0 alone, without the rejected tokens
    llama_context * ref = new_context(model, 1);
    {
        batch_builder bb(n_prompt + n_keep + 1);
        for (int i = 0; i < n_prompt; ++i) bb.add(prompt[0][i], i, 0, false);
        for (int i = 0; i < n_keep; ++i) bb.add(verify[i], n_prompt + i, 0, false);
        bb.add(next, n_prompt + n_keep, 0, true);
        decode(ref, bb, "reference");
    }
    std::vector<float> want(llama_get_logits_ith(ref, -1), llama_get_logits_ith(ref, -1) + n_vocab);

    float diff = 0.0f, mag = 0.0f;
    for (int i = 0; i < n_vocab; ++i) {
        diff = std::max(diff, std::fabs(got[i] - want[i]));
        mag  = std::max(mag, std::fabs(want[i]));
    }
    const long a = std::max_element(got.begin(), got.end()) - got.begin();
    const long b = std::max_element(want.begin(), want.end()) - want.begin();
    printf("max |diff| %.6f of max |logit| %.6f, argmax %ld vs %ld\n", diff, mag, a, b);

    llama_free(ref);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
