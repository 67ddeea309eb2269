/* stream_probe.cu - how fast can a decode expert tile's weight stream read the quantized expert
 * layout, with no arithmetic? The mxfp8 and fp8-block experts keep each weight row whole along K
 * ([E][M][K] bytes, docs/LAYOUT.md): a tile of 128 rows reads 64 bytes of each row a stage, rows
 * K bytes apart, and asks L2 for the 256 bytes around each copy (moe/expert_gemm.cu). The bf16
 * experts are K-blocked ([E][K/64][M][64 elements]): a stage is one contiguous run. This probe
 * runs the same CTA grid, stages and shared memory a CTA as the mxfp8 two-warpgroup tile, but
 * only copies, with the tile's own copy instruction (rw_cp_async16_sa_pf, core/mma.cuh): each
 * thread adds up the words it copied, and the grid's sum is checked against the host's sum of
 * the buffer (each byte read once, wherever it lies). One JSON line a case, beside a
 * device-to-device copy of the same bytes timed in the same run (read + write bytes over its
 * time, as rw-bench counts its ceiling, once its rate has settled: tools/bench/settle.h), and
 * the same as a line of text on stderr:
 *   rows64 pfN     the tile's pattern: 128 rows x 64 bytes a stage, L2 prefetch size N
 *                  (0 / 128 / 256)
 *   rows128 pf256  128 rows x 128 bytes a stage (whole lines a row)
 *   blocked        the same bytes read as if K-blocked: 8 KB contiguous a stage
 * If rows64 pf256 reads at about the rate the tile reaches and blocked well above it, the
 * row-whole pattern, not the tile's arithmetic, is what holds the tile back.
 *
 * Built with a GPU build (BUILD/tools/gpu/stream_probe), or alone:
 *   nvcc -O3 -arch=sm_90a -Icore -Itools/bench -o /tmp/stream_probe tools/gpu/stream_probe.cu
 * Options: --experts E (default 128) --rows M --k K (bytes a row; default two shapes:
 * Qwen3-30B-A3B's w13, 1536 x 2048, and w2, 2048 x 768), --smem-kb S (shared memory a CTA, default
 * 91: the split w13 tile's, two CTAs an SM), --stages N (4, 5 or 6; default 5), --reps N (default
 * 20). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "mma.cuh"
#include "settle.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "stream_probe: %s: %s\n", #x, cudaGetErrorString(e_));                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

constexpr int THREADS = 256;
constexpr int BM = 128;

/* One CTA: rows [m0, m0 + 128) of expert e over all of K, ROWB bytes of each row a stage
 * (BLOCKED: the stage's bytes as one contiguous run of the K-blocked layout instead). */
template <int ROWB, int PF, bool BLOCKED, int STAGES>
__global__ void __launch_bounds__(THREADS)
    probe(const uint8_t *w, int64_t M, int64_t K, unsigned long long *sum) {
    extern __shared__ __align__(128) uint8_t smem[];
    constexpr int STAGE = BM * ROWB;
    constexpr int CH = STAGE / 16 / THREADS; /* 16-byte chunks a thread a stage */
    constexpr int CPR = ROWB / 16;           /* chunks a row */
    const int64_t tiles_m = M / BM;
    const int64_t e = blockIdx.x / tiles_m, m0 = (blockIdx.x % tiles_m) * BM;
    const int nkb = (int)(K / ROWB);
    const int tid = threadIdx.x;
    const uint32_t s0 = rw_smem_u32(smem);
    auto src_of = [&](int kb, int i) -> const uint8_t * {
        const int q = tid + i * THREADS;
        if (BLOCKED) return w + ((e * nkb + kb) * M + m0) * ROWB + (int64_t)q * 16;
        return w + (e * M + m0 + q / CPR) * K + (int64_t)kb * ROWB + (q % CPR) * 16;
    };
    auto load = [&](int kb) {
        const uint32_t d = s0 + (kb % STAGES) * STAGE;
#pragma unroll
        for (int i = 0; i < CH; i++)
            rw_cp_async16_sa_pf<PF>(d + (tid + i * THREADS) * 16, src_of(kb, i));
    };
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nkb) load(s);
        rw_cp_async_commit();
    }
    unsigned long long acc = 0;
    for (int kb = 0; kb < nkb; kb++) {
        rw_cp_async_wait<STAGES - 2>();
        __syncthreads();
        const uint8_t *st = smem + (kb % STAGES) * STAGE;
#pragma unroll
        for (int i = 0; i < CH; i++) {
            const uint4 v = *(const uint4 *)(st + (tid + i * THREADS) * 16);
            acc += (unsigned long long)v.x + v.y + v.z + v.w;
        }
        __syncthreads(); /* the stage is read before the loads below refill the oldest one */
        const int nk = kb + STAGES - 1;
        if (nk < nkb) load(nk);
        rw_cp_async_commit();
    }
    /* one atomic a CTA: an atomic a thread (hundreds of thousands on one address) serialized in
     * L2 for about 0.4 ms, longer than the stream itself */
    __shared__ unsigned long long wsum[THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((tid & 31) == 0) wsum[tid >> 5] = acc;
    __syncthreads();
    if (tid == 0) {
        unsigned long long t = 0;
        for (int i = 0; i < THREADS / 32; i++)
            t += wsum[i];
        atomicAdd(sum, t);
    }
}

struct Shape {
    int64_t E, M, K;
};

static double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* the two events every measurement is timed between */
struct Timer {
    cudaEvent_t a, b;
};
/* milliseconds of one run of f (work issued on the default stream) */
template <class F> static float timed_ms(const Timer &tm, F &&f) {
    CK(cudaEventRecord(tm.a));
    f();
    CK(cudaEventRecord(tm.b));
    CK(cudaEventSynchronize(tm.b));
    CK(cudaGetLastError());
    float t = 0;
    CK(cudaEventElapsedTime(&t, tm.a, tm.b));
    return t;
}

/* what every case of one shape shares: its buffer, the host's sum of it, the same run's copy
 * rate, the shared memory a CTA */
struct Run {
    Shape sh;
    const uint8_t *dw;
    unsigned long long want;
    double copy_gbps, copy_settle_s;
    size_t smem;
    int reps, sms;
    Timer tm;
};

template <int ROWB, int PF, bool BLOCKED, int STAGES>
static void run_case(const char *name, const Run &run) {
    const Shape &sh = run.sh;
    const size_t smem = run.smem;
    auto k = probe<ROWB, PF, BLOCKED, STAGES>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, THREADS, smem));
    unsigned long long *dsum;
    CK(cudaMalloc(&dsum, sizeof *dsum));
    const unsigned grid = (unsigned)(sh.E * (sh.M / BM));
    std::vector<float> ms;
    bool ok = true;
    for (int r = 0; r < run.reps + 2; r++) {
        CK(cudaMemset(dsum, 0, sizeof *dsum));
        const float t =
            timed_ms(run.tm, [&] { k<<<grid, THREADS, smem>>>(run.dw, sh.M, sh.K, dsum); });
        unsigned long long got = 0;
        CK(cudaMemcpy(&got, dsum, sizeof got, cudaMemcpyDeviceToHost));
        ok = ok && got == run.want;
        if (r >= 2) ms.push_back(t);
    }
    const double t = median(ms), bytes = (double)sh.E * sh.M * sh.K;
    const double gbps = bytes / (t * 1e-3) / 1e9;
    printf("{\"what\": \"stream_probe\", \"case\": \"%s\", \"E\": %lld, \"M\": %lld, \"K\": %lld, "
           "\"stages\": %d, \"smem_kb\": %.1f, \"ctas_per_sm\": %d, \"sms\": %d, "
           "\"median_ms\": %.4f, \"read_gbps\": %.1f, \"copy_gbps\": %.1f, "
           "\"copy_settle_s\": %.3f, \"ratio\": %.3f, \"sum_ok\": %s}\n",
           name, (long long)sh.E, (long long)sh.M, (long long)sh.K, STAGES, smem / 1024.0, per_sm,
           run.sms, t, gbps, run.copy_gbps, run.copy_settle_s, gbps / run.copy_gbps,
           ok ? "true" : "false");
    fflush(stdout);
    /* the same, to read as it runs */
    fprintf(stderr,
            "%-14s %lld x %lld x %lld, %d stages, %d CTAs an SM: %.4f ms, %.1f GB/s, %.3f x "
            "copy (%.1f GB/s)\n",
            name, (long long)sh.E, (long long)sh.M, (long long)sh.K, STAGES, per_sm, t, gbps,
            gbps / run.copy_gbps, run.copy_gbps);
    CK(cudaFree(dsum));
    if (!ok) {
        fprintf(stderr, "stream_probe: %s read a sum other than the buffer's\n", name);
        exit(1);
    }
}

/* read + write bytes over the median time of copying the buffer's bytes, GB/s, timed once the
 * copy's rate has settled (settle.h: memory freed shortly before is cleared in the background and
 * slows a copy meanwhile, as the probe's previous shape's buffers are); *settle_s: how long that
 * took */
static double copy_rate(const uint8_t *src, size_t n, int reps, const Timer &tm, double *settle_s) {
    uint8_t *dst;
    CK(cudaMalloc(&dst, n));
    auto copy = [&] { CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice)); };
    auto now = [] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
    };
    rwb_settle se;
    rwb_settle_init(&se);
    for (;;) {
        const float t = timed_ms(tm, copy);
        if (rwb_settle_add(&se, now(), t > 0 ? 2.0 * n / (t * 1e-3) : 0.0)) break;
    }
    *settle_s = se.waited;
    std::vector<float> ms;
    for (int r = 0; r < reps; r++)
        ms.push_back(timed_ms(tm, copy));
    CK(cudaFree(dst));
    return 2.0 * n / (median(ms) * 1e-3) / 1e9;
}

template <int STAGES>
static void run_shape(const Shape &sh, size_t smem_kb, int reps, int sms, const Timer &tm) {
    const size_t n = (size_t)sh.E * sh.M * sh.K;
    std::vector<uint32_t> h(n / 4);
    uint64_t x = 0x9e3779b97f4a7c15ull ^ n;
    unsigned long long want = 0;
    for (auto &v : h) { /* xorshift64: a different word at every offset */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v = (uint32_t)(x >> 16);
        want += v;
    }
    uint8_t *dw;
    CK(cudaMalloc(&dw, n));
    CK(cudaMemcpy(dw, h.data(), n, cudaMemcpyHostToDevice));
    Run run = {sh, dw, want, 0.0, 0.0, 0, reps, sms, tm};
    run.copy_gbps = copy_rate(dw, n, reps, tm, &run.copy_settle_s);
    run.smem = std::max<size_t>(smem_kb * 1024, (size_t)STAGES * BM * 128);
    run_case<64, 0, false, STAGES>("rows64 pf0", run);
    run_case<64, 128, false, STAGES>("rows64 pf128", run);
    run_case<64, 256, false, STAGES>("rows64 pf256", run);
    run_case<128, 256, false, STAGES>("rows128 pf256", run);
    run_case<64, 0, true, STAGES>("blocked", run);
    CK(cudaFree(dw));
}

int main(int argc, char **argv) {
    std::vector<Shape> shapes;
    Shape one = {128, 0, 0};
    int stages = 5, reps = 20;
    size_t smem_kb = 91;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (i + 1 >= argc) {
            fprintf(stderr, "stream_probe: %s needs a value\n", o);
            return 2;
        }
        const long long v = atoll(argv[++i]);
        if (v <= 0) {
            fprintf(stderr, "stream_probe: %s must be a positive number, not %s\n", o, argv[i]);
            return 2;
        }
        if (!strcmp(o, "--experts"))
            one.E = v;
        else if (!strcmp(o, "--rows"))
            one.M = v;
        else if (!strcmp(o, "--k"))
            one.K = v;
        else if (!strcmp(o, "--smem-kb"))
            smem_kb = (size_t)v;
        else if (!strcmp(o, "--stages"))
            stages = (int)v;
        else if (!strcmp(o, "--reps"))
            reps = (int)v;
        else {
            fprintf(stderr, "stream_probe: unknown option %s\n", o);
            return 2;
        }
    }
    if (one.M || one.K) {
        if (!one.M || !one.K || one.M % BM || one.K % 128) {
            fprintf(stderr, "stream_probe: --rows and --k go together, each a multiple of 128\n");
            return 2;
        }
        shapes.push_back(one);
    } else {
        shapes.push_back({one.E, 1536, 2048}); /* w13: gate and up rows, hidden-size K */
        shapes.push_back({one.E, 2048, 768});  /* w2: hidden rows, intermediate K */
    }
    if (stages < 4 || stages > 6) {
        fprintf(stderr, "stream_probe: --stages takes 4, 5 or 6\n");
        return 2;
    }
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    Timer tm;
    CK(cudaEventCreate(&tm.a));
    CK(cudaEventCreate(&tm.b));
    for (const Shape &sh : shapes) {
        if (stages == 4)
            run_shape<4>(sh, smem_kb, reps, sms, tm);
        else if (stages == 5)
            run_shape<5>(sh, smem_kb, reps, sms, tm);
        else
            run_shape<6>(sh, smem_kb, reps, sms, tm);
    }
    return 0;
}
