// A device timeline for any CUDA process, without Nsight Systems (the H200 machine has none):
// CUDA loads this library at initialisation when CUDA_INJECTION64_PATH names it, and CUPTI's
// activity API then records every kernel, copy, memset, synchronisation and runtime API call of
// the process with its start and end (ns, one clock). The records go to GGUFDSPARK_CUPTI_OUT ("%p"
// in it: the process id) as CSV lines after one line with the process's command line, flushed every
// half second and at exit:
//
//   #,cmdline                        the traced process (arguments joined by spaces)
//   K,start,end,stream,name          a kernel
//   C,start,end,stream,kind,bytes    a copy (kind: 1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP, ...)
//   S,start,end,stream,0             a memset
//   Y,start,end,stream,type          a synchronisation (1 event sync, 2 stream wait event,
//                                    3 stream sync, 4 context sync)
//   R,start,end,thread,name          a runtime API call (host side; GGUFDSPARK_CUPTI_API=1 only:
//                                    recording each costs the host about a microsecond)
//
// `benchmarks/cuda/probes.py timeline` reads them. Built by `benchmarks/h200.sh timeline`:
//   nvcc -shared -Xcompiler -fPIC -I CUPTI/include benchmarks/cuda/cupti_trace.cpp -L CUPTI/lib -lcupti
#include <cupti.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unistd.h>

namespace {

FILE *            g_out = nullptr;
std::mutex        g_mu;
std::atomic<long> g_records{ 0 };

void CUPTIAPI buffer_requested(uint8_t ** buffer, size_t * size, size_t * max_records) {
    *size        = 16u << 20;
    *buffer      = static_cast<uint8_t *>(std::aligned_alloc(8, *size));
    *max_records = 0;
}

void write_record(const CUpti_Activity * r) {
    switch (r->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
            const auto * k = reinterpret_cast<const CUpti_ActivityKernel10 *>(r);
            std::fprintf(g_out, "K,%llu,%llu,%u,%s\n", (unsigned long long) k->start, (unsigned long long) k->end,
                         k->streamId, k->name ? k->name : "?");
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const auto * c = reinterpret_cast<const CUpti_ActivityMemcpy6 *>(r);
            std::fprintf(g_out, "C,%llu,%llu,%u,%u,%llu\n", (unsigned long long) c->start, (unsigned long long) c->end,
                         c->streamId, (unsigned) c->copyKind, (unsigned long long) c->bytes);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const auto * m = reinterpret_cast<const CUpti_ActivityMemset4 *>(r);
            std::fprintf(g_out, "S,%llu,%llu,%u,0\n", (unsigned long long) m->start, (unsigned long long) m->end,
                         m->streamId);
            break;
        }
        case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
            const auto * s = reinterpret_cast<const CUpti_ActivitySynchronization2 *>(r);
            std::fprintf(g_out, "Y,%llu,%llu,%u,%u\n", (unsigned long long) s->start, (unsigned long long) s->end,
                         s->streamId, (unsigned) s->type);
            break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME: {
            const auto * a    = reinterpret_cast<const CUpti_ActivityAPI *>(r);
            const char * name = nullptr;
            if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS || !name) {
                name = "?";
            }
            std::fprintf(g_out, "R,%llu,%llu,%u,%s\n", (unsigned long long) a->start, (unsigned long long) a->end,
                         a->threadId, name);
            break;
        }
        default:
            return;
    }
    g_records.fetch_add(1, std::memory_order_relaxed);
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t * buffer, size_t, size_t valid) {
    {
        std::lock_guard<std::mutex> lock(g_mu);
        CUpti_Activity * r = nullptr;
        while (g_out && cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
            write_record(r);
        }
        if (g_out) {
            std::fflush(g_out);
        }
    }
    std::free(buffer);
}

void at_exit() {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_out) {
        std::fprintf(stderr, "cupti_trace: %ld records\n", g_records.load());
        std::fclose(g_out);
        g_out = nullptr;
    }
}

bool check(CUptiResult rc, const char * what) {
    if (rc == CUPTI_SUCCESS) {
        return true;
    }
    const char * msg = nullptr;
    cuptiGetResultString(rc, &msg);
    std::fprintf(stderr, "cupti_trace: %s failed: %s\n", what, msg ? msg : "?");
    return false;
}

}  // namespace

extern "C" int InitializeInjection(void) {
    const char * path = std::getenv("GGUFDSPARK_CUPTI_OUT");
    if (!path || !*path) {
        std::fprintf(stderr, "cupti_trace: GGUFDSPARK_CUPTI_OUT is not set: no trace\n");
        return 1;
    }
    std::string out = path;
    if (const size_t at = out.find("%p"); at != std::string::npos) {
        out.replace(at, 2, std::to_string(getpid()));
    }
    g_out = std::fopen(out.c_str(), "w");
    if (!g_out) {
        std::fprintf(stderr, "cupti_trace: cannot write %s\n", out.c_str());
        return 1;
    }
    std::string cmdline;
    if (FILE * f = std::fopen("/proc/self/cmdline", "rb")) {
        for (int c; (c = std::fgetc(f)) != EOF;) {
            cmdline += c == 0 ? ' ' : c == '\n' || c == ',' ? ' ' : (char) c;
        }
        std::fclose(f);
    }
    std::fprintf(g_out, "#,%s\n", cmdline.c_str());
    if (!check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register")) {
        return 1;
    }
    const CUpti_ActivityKind kinds[] = {
        CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
        CUPTI_ACTIVITY_KIND_MEMCPY,
        CUPTI_ACTIVITY_KIND_MEMSET,
        CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
    };
    for (const CUpti_ActivityKind k : kinds) {
        check(cuptiActivityEnable(k), "enable");
    }
    // every runtime call recorded slows the host by about a microsecond (a prefill makes some 8000
    // calls a 512-token ubatch): only with GGUFDSPARK_CUPTI_API=1
    if (const char * api = std::getenv("GGUFDSPARK_CUPTI_API"); api && std::atoi(api) != 0) {
        check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "enable runtime");
    }
    check(cuptiActivityFlushPeriod(500), "flush period");
    std::atexit(at_exit);
    std::fprintf(stderr, "cupti_trace: recording to %s\n", out.c_str());
    return 1;
}
