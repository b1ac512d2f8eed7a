// The target graph's argmax and the logits rows left on the device (patch 0023), against a context
// without them (LLAMA_OUTPUT_ARGMAX=0: every row copied to the host after the decode). Built against
// the engine's own libllama by tests/test_engine_patches.py.
//
// Two contexts of one model see the same decodes: three prompts of different lengths at once, then a single sequence's 7-token
// verify (one ubatch: its rows stay on the device), then a batch that interleaves the three sequences
// (the recurrent memory splits it by sequence, so its output rows come back in another order than the
// batch's). After each decode, for every output row in a scrambled order, the context under test must
// give the first maximum of the reference's row as its argmax, and the same logits row (read one row
// at a time, then the whole buffer at once); the reference must give no argmax.
//
// With a second argument "0" the context under test has no argmax either (every argmax then mismatches).
//
// Prints "<rows> rows, <a> argmax mismatches, <l> logits mismatches, <n> reference ids" and exits 0
// when it ran.
#include "llama_test_util.h"
#include "llama-ext.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static llama_context * new_context(llama_model * model, const char * output_argmax) {
    setenv("LLAMA_OUTPUT_ARGMAX", output_argmax, 1);  // read when the context is made
    return new_test_context(model, 3, 2048);
}

int main(int argc, char ** argv) {
    llama_model * model = load_test_model_from_args(argc, argv, " [0: the context under test without the argmax too]");
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_context * ctx = new_context(model, argc > 2 ? argv[2] : "1");
    llama_context * ref = new_context(model, "0");

    // three prompts of different lengths in one batch, the first with its last two rows out, the
    // others with none (as a server batches a prompt's end with others' beginnings): the split makes
    // several ubatches, and those after the one with the outputs compute again
    const int n_prompt = 20;
    std::vector<batch_builder *> batches;
    {
        auto * bb = new batch_builder(3*n_prompt);
        for (int s = 0; s < 3; ++s) {
            const int n = n_prompt - 6 + 6*s;
            const auto p = tokens(n, 11 + s, n_vocab);
            for (int i = 0; i < n; ++i) bb->add(p[i], i, s, s == 0 && i >= n - 2);
        }
        batches.push_back(bb);
    }
    {
        // one sequence's verify: 7 rows in one ubatch
        auto * bb = new batch_builder(7);
        const auto v = tokens(7, 44, n_vocab);
        for (int i = 0; i < 7; ++i) bb->add(v[i], n_prompt - 6 + i, 0, true);
        batches.push_back(bb);
    }
    {
        // the three sequences interleaved, 4 rows each: the split orders them by sequence
        auto * bb = new batch_builder(12);
        const auto w = tokens(12, 55, n_vocab);
        for (int i = 0; i < 4; ++i) {
            for (int s : {2, 1, 0}) {
                bb->add(w[i*3 + s], (s == 0 ? n_prompt - 6 + 7 : n_prompt - 6 + 6*s) + i, s, true);
            }
        }
        batches.push_back(bb);
    }

    long rows = 0, bad_argmax = 0, bad_logits = 0, ref_ids = 0;
    for (auto * bb : batches) {
        if (llama_decode(ctx, bb->b) != 0 || llama_decode(ref, bb->b) != 0) {
            fprintf(stderr, "decode failed\n");
            return 2;
        }
        std::vector<int> outs;
        for (int i = 0; i < bb->b.n_tokens; ++i) {
            if (bb->b.logits[i]) outs.push_back(i);
        }
        // a scrambled order: odd batch positions from the back, then the even ones
        std::vector<int> order;
        for (auto it = outs.rbegin(); it != outs.rend(); ++it) if (*it % 2) order.push_back(*it);
        for (int i : outs) if (i % 2 == 0) order.push_back(i);
        for (int i : order) {
            const float * want = llama_get_logits_ith(ref, i);
            const long first_max = std::max_element(want, want + n_vocab) - want;
            ref_ids += llama_get_argmax_ith(ref, i) != LLAMA_TOKEN_NULL;
            bad_argmax += llama_get_argmax_ith(ctx, i) != (llama_token) first_max;
            // the first half of the rows one at a time, the rest through the whole buffer
            const bool one_row = rows % 2 == 0;
            const float * got = one_row ? llama_get_logits_ith(ctx, i) : nullptr;
            if (!one_row) {
                // row i of the whole buffer: the same place llama_get_logits_ith points to
                float * all = llama_get_logits(ctx);
                got = all == nullptr ? nullptr : llama_get_logits_ith(ctx, i);
            }
            bad_logits += got == nullptr || std::memcmp(got, want, n_vocab*sizeof(float)) != 0;
            ++rows;
        }
    }
    printf("%ld rows, %ld argmax mismatches, %ld logits mismatches, %ld reference ids\n",
           rows, bad_argmax, bad_logits, ref_ids);

    for (auto * bb : batches) delete bb;
    llama_free(ref);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
