// Checks and times the engine's CUDA top-k kernels (patches 0002 and 0051,
// ggml/src/ggml-cuda/top-k-rows.cuh) outside ggml: every case against a CPU reference (best first,
// ties to the smaller id, NaN as -inf: what ggml's TOP_K gives the sampler), then the time of one
// call at a sampled verify's shapes (a 128000-token vocabulary, 1 to 64 rows), side by side: the
// one-block kernel (0002) and the chunked one (0051, warp shuffles for the short strides). Exit
// status 1 on any mismatch.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I ENGINE_SRC/ggml/src/ggml-cuda benchmarks/cuda/topk_cuda.cu -o topk_cuda
//   ./topk_cuda [--json out.json]
// (benchmarks/h200.sh topk builds it against the engine's source tree and runs it.)

#include "top-k-rows.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#define CHECK(call)                                                                              \
    do {                                                                                         \
        cudaError_t err_ = (call);                                                               \
        if (err_ != cudaSuccess) {                                                               \
            fprintf(stderr, "topk_cuda: %s: %s (line %d)\n", #call, cudaGetErrorString(err_), __LINE__); \
            exit(2);                                                                             \
        }                                                                                        \
    } while (0)

enum class Data { random, ties, special, ascending, equal };

static const char * data_name(Data d) {
    switch (d) {
        case Data::random:    return "random";
        case Data::ties:      return "ties";
        case Data::special:   return "nan+inf";
        case Data::ascending: return "ascending";
        case Data::equal:     return "all equal";
    }
    return "?";
}

static std::vector<float> make_rows(int ncols, int nrows, Data d, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> x((size_t) ncols * nrows);
    for (int r = 0; r < nrows; ++r) {
        for (int c = 0; c < ncols; ++c) {
            float & v = x[(size_t) r * ncols + c];
            switch (d) {
                case Data::random:    v = normal(rng); break;
                case Data::ties:      v = (float) (int) (normal(rng)); break;  // a few dozen levels
                case Data::ascending: v = (float) c * 1e-3f + (float) r; break;
                case Data::equal:     v = 1.5f; break;
                case Data::special: {
                    const unsigned u = rng() % 100;
                    v = u < 3 ? NAN : u < 6 ? -INFINITY : u < 7 ? INFINITY : normal(rng);
                    break;
                }
            }
        }
    }
    return x;
}

static bool before(float va, int ia, float vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

static std::vector<int> reference(const std::vector<float> & x, int ncols, int nrows, int k) {
    std::vector<int> out((size_t) nrows * k);
    std::vector<std::pair<float, int>> row(ncols);
    for (int r = 0; r < nrows; ++r) {
        for (int c = 0; c < ncols; ++c) {
            float v = x[(size_t) r * ncols + c];
            row[c] = { v != v ? -INFINITY : v, c };
        }
        std::partial_sort(row.begin(), row.begin() + k, row.end(),
                          [](const auto & a, const auto & b) { return before(a.first, a.second, b.first, b.second); });
        for (int j = 0; j < k; ++j) {
            out[(size_t) r * k + j] = row[j].second;
        }
    }
    return out;
}

struct Device {
    float * src   = nullptr;
    int *   dst   = nullptr;
    float * tmp_v = nullptr;
    int *   tmp_i = nullptr;

    Device(const std::vector<float> & x, int ncols, int nrows, int k) {
        const size_t half = (size_t) nrows * top_k_chunked_candidates(ncols, k);
        CHECK(cudaMalloc(&src, x.size() * sizeof(float)));
        CHECK(cudaMalloc(&dst, (size_t) nrows * k * sizeof(int)));
        CHECK(cudaMalloc(&tmp_v, 2 * half * sizeof(float)));
        CHECK(cudaMalloc(&tmp_i, 2 * half * sizeof(int)));
        CHECK(cudaMemcpy(src, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    }

    ~Device() {
        cudaFree(src);
        cudaFree(dst);
        cudaFree(tmp_v);
        cudaFree(tmp_i);
    }
};

enum class Kernel { one_block, chunked };
static const Kernel KERNELS[] = { Kernel::one_block, Kernel::chunked };
static const char * const KERNEL_NAMES[] = { "one-block", "chunked" };

static void launch(Kernel kern, Device & d, int ncols, int nrows, int k) {
    if (kern == Kernel::one_block) {
        top_k_small_f32_cuda(d.src, d.dst, ncols, nrows, k, 0);
    } else {
        top_k_chunked_f32_cuda(d.src, d.dst, ncols, nrows, k, d.tmp_v, d.tmp_i, 0);
    }
}

static std::vector<int> run(Kernel kern, Device & d, int ncols, int nrows, int k) {
    // poison the output: an id the kernel does not write shows as a mismatch
    CHECK(cudaMemset(d.dst, 0xff, (size_t) nrows * k * sizeof(int)));
    launch(kern, d, ncols, nrows, k);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<int> out((size_t) nrows * k);
    CHECK(cudaMemcpy(out.data(), d.dst, out.size() * sizeof(int), cudaMemcpyDeviceToHost));
    return out;
}

static double time_us(Kernel kern, Device & d, int ncols, int nrows, int k, int iters) {
    for (int i = 0; i < 10; ++i) {
        launch(kern, d, ncols, nrows, k);
    }
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) {
        launch(kern, d, ncols, nrows, k);
    }
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return 1000.0 * ms / iters;
}

int main(int argc, char ** argv) {
    const char * json_path = nullptr;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            json_path = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--json out.json]\n", argv[0]);
            return 2;
        }
    }
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d multiprocessors\n\n", prop.name, prop.multiProcessorCount);

    struct Case { int ncols, nrows, k; Data data; };
    const Case cases[] = {
        { 128000, 1, 40, Data::random },   { 128000, 8, 64, Data::random },  { 128000, 64, 40, Data::random },
        { 128000, 8, 64, Data::ties },     { 128000, 8, 40, Data::special }, { 128000, 2, 64, Data::ascending },
        { 128000, 2, 64, Data::equal },    { 65536, 3, 10, Data::random },   { 5000, 3, 64, Data::special },
        { 1025, 2, 64, Data::ties },       { 2048, 2, 1, Data::random },     { 3000, 2, 512, Data::random },
        { 200000, 2, 300, Data::ties },
    };
    int failures = 0;
    std::string json = "{\"device\": \"" + std::string(prop.name) + "\", \"checks\": [";
    printf("%-7s %-5s %-4s %-10s %-10s %-10s\n", "ncols", "rows", "k", "data", "one-block", "chunked");
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ++ci) {
        const Case & c = cases[ci];
        const std::vector<float> x = make_rows(c.ncols, c.nrows, c.data, 1234 + (unsigned) ci);
        const std::vector<int> ref = reference(x, c.ncols, c.nrows, c.k);
        Device d(x, c.ncols, c.nrows, c.k);
        std::string verdict[2];
        for (Kernel kern : KERNELS) {
            const int slot = (int) kern;
            if (kern == Kernel::one_block && c.k > TOP_K_SMALL_MAX) {
                verdict[slot] = "-";
                continue;
            }
            if (kern != Kernel::one_block && !top_k_chunked_fits(c.k)) {
                verdict[slot] = "-";
                continue;
            }
            const std::vector<int> got = run(kern, d, c.ncols, c.nrows, c.k);
            size_t bad = 0, first = 0;
            for (size_t i = 0; i < got.size(); ++i) {
                if (got[i] != ref[i] && bad++ == 0) {
                    first = i;
                }
            }
            if (bad) {
                ++failures;
                fprintf(stderr, "topk_cuda: MISMATCH %s kernel, ncols %d rows %d k %d %s: %zu of %zu ids differ, first at row %zu "
                        "position %zu: %d, expected %d\n", KERNEL_NAMES[slot], c.ncols, c.nrows, c.k,
                        data_name(c.data), bad, got.size(), first / c.k, first % c.k, got[first], ref[first]);
            }
            verdict[slot] = bad ? "MISMATCH" : "ok";
        }
        printf("%-7d %-5d %-4d %-10s %-10s %-10s\n", c.ncols, c.nrows, c.k, data_name(c.data), verdict[0].c_str(),
               verdict[1].c_str());
        char buf[320];
        snprintf(buf, sizeof buf, "%s{\"ncols\": %d, \"rows\": %d, \"k\": %d, \"data\": \"%s\", \"one_block\": \"%s\", "
                 "\"chunked\": \"%s\"}", ci ? ", " : "", c.ncols, c.nrows, c.k,
                 data_name(c.data), verdict[0].c_str(), verdict[1].c_str());
        json += buf;
    }
    json += "], \"timings_us\": [";

    printf("\none call, microseconds (mean of 200 back-to-back calls), 128000-token rows, random logits\n");
    printf("%-5s %-4s %-10s %-10s %-8s\n", "rows", "k", "one-block", "chunked", "chunked/one");
    const int rows_list[] = { 1, 8, 16, 64 };
    const int k_list[] = { 40, 64 };
    bool first = true;
    for (int k : k_list) {
        for (int nrows : rows_list) {
            const std::vector<float> x = make_rows(128000, nrows, Data::random, 99);
            Device d(x, 128000, nrows, k);
            const double one = time_us(Kernel::one_block, d, 128000, nrows, k, 200);
            const double chk = time_us(Kernel::chunked, d, 128000, nrows, k, 200);
            printf("%-5d %-4d %-10.1f %-10.1f %.3fx\n", nrows, k, one, chk, chk / one);
            char buf[240];
            snprintf(buf, sizeof buf, "%s{\"rows\": %d, \"k\": %d, \"one_block\": %.2f, \"chunked\": %.2f}",
                     first ? "" : ", ", nrows, k, one, chk);
            json += buf;
            first = false;
        }
    }
    json += "], \"failures\": " + std::to_string(failures) + "}\n";
    if (json_path != nullptr) {
        FILE * f = fopen(json_path, "w");
        if (f == nullptr) {
            fprintf(stderr, "topk_cuda: cannot write %s\n", json_path);
            return 2;
        }
        fputs(json.c_str(), f);
        fclose(f);
    }
    printf("\n%s\n", failures ? "FAILED: some kernel differs from the reference" : "every kernel equals the reference");
    return failures ? 1 : 0;
}
