/* stamps.cuh - a timeline of the forward pass's kernels, CTA by CTA, from inside them: the stamps
 * build (meson configure -Dstamps=true, which defines RW_STAMPS). Without it every macro below
 * expands to nothing and the device code is that of an ordinary build (tools/gpu/ptx-same.sh).
 *
 * What a stamped kernel records, from thread 0 of each CTA: when the CTA entered, when its launch
 * wait returned (rw_pdl_begin, launch.cuh), one mid point of the kernel's choosing (0 if none)
 * and when it ended, each read from %globaltimer (ns, one clock for the whole GPU). The records
 * go to a ring of RW_STAMPS_RING in device memory, one ring a translation unit that stamps (a
 * __device__ variable is its unit's own without separate device compilation), and each unit's
 * ring is printed to stderr at exit, one line a record:
 *
 *   RW_STAMP <kernel> cta <c> entry <ns> wait <ns> mid <ns> end <ns>
 *
 * tools/bench/stamps.py turns those lines into launches, the gaps between them and a layer's
 * timeline. Nothing is printed from a kernel: printf in the kernels slowed the launches it
 * stamped (docs/BENCHMARKS.md, thirty-fifth session). The stamps themselves cost a little (an
 * atomic and a 40-byte store a CTA: on an H100 a b1 x 1k step of 3.30 ms takes 3.47 in this
 * build, thirty-sixth session), so a stamped build says where a step's time goes and in what
 * order, not how long an ordinary build takes; rw-bench's lines of a stamps build are not
 * measurements of record (the build says so on stderr).
 *
 * In a unit:
 *   RW_STAMPS_UNIT(tag, "name0", "name1", ...)  once, at file scope: the ring and its kernel names
 *   RW_STAMP(v)             in a kernel: declares v = now (RW_STAMP_DECL(v) = 0, then
 *                           RW_STAMP_SET(v) where the time is taken in an inner scope)
 *   RW_STAMP_PUT(tag, kind, cta, entry, wait, mid)  thread 0 writes the CTA's record, end = now
 *                           (cta: RW_STAMP_CTA, the CTA's linear index, or the kernel's own)
 *   RW_STAMPS_REGISTER(tag) in the host launcher, before the launch: the ring printed at exit */
#ifndef RW_CORE_STAMPS_CUH
#define RW_CORE_STAMPS_CUH

/* a CTA's linear index in its grid (only ever an argument of RW_STAMP_PUT) */
#define RW_STAMP_CTA (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z))

/* the GPU's clock, ns (%globaltimer): the stamps' time, and any kernel's in every build */
static __device__ __forceinline__ unsigned long long rw_stamp_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#ifdef RW_STAMPS
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define RW_STAMPS_RING (1u << 17) /* records a unit keeps: the last ones of a run */
struct rw_stamp_rec {
    unsigned long long kind_cta, entry, wait, mid, end;
};
/* Once a process (each unit's first launch asks): what this build is, so that no one reads its
 * times as an ordinary build's. */
inline void rw_stamps_notice(void) { /* inline: one flag for the whole program */
    static bool said = false;
    if (!said) {
        said = true;
        fprintf(stderr, "rw: stamps build (-Dstamps=true): the kernels record their CTAs' times, "
                        "printed at exit as RW_STAMP lines; its timings are not an ordinary "
                        "build's\n");
    }
}
/* the unit's ring, its record function, and its printing at exit (registered once) */
#define RW_STAMPS_UNIT(tag, ...)                                                                   \
    __device__ rw_stamp_rec tag##_stamp_ring[RW_STAMPS_RING];                                      \
    __device__ unsigned tag##_stamp_n;                                                             \
    static __device__ __forceinline__ void tag##_stamp_put(                                        \
        unsigned kind, unsigned cta, unsigned long long e, unsigned long long w,                   \
        unsigned long long m) {                                                                    \
        const unsigned i = atomicAdd(&tag##_stamp_n, 1u) & (RW_STAMPS_RING - 1);                   \
        tag##_stamp_ring[i] =                                                                      \
            rw_stamp_rec{((unsigned long long)kind << 32) | cta, e, w, m, rw_stamp_now()};         \
    }                                                                                              \
    static void tag##_stamp_dump(void) {                                                           \
        static const char *const names[] = {__VA_ARGS__};                                          \
        const unsigned nnames = sizeof names / sizeof names[0];                                    \
        unsigned n = 0;                                                                            \
        cudaDeviceSynchronize();                                                                   \
        if (cudaMemcpyFromSymbol(&n, tag##_stamp_n, sizeof n) != cudaSuccess) return;              \
        rw_stamp_rec *r = (rw_stamp_rec *)malloc(sizeof(rw_stamp_rec) * RW_STAMPS_RING);           \
        if (!r || cudaMemcpyFromSymbol(r, tag##_stamp_ring,                                        \
                                       sizeof(rw_stamp_rec) * RW_STAMPS_RING) != cudaSuccess) {    \
            free(r);                                                                               \
            return;                                                                                \
        }                                                                                          \
        const unsigned cnt = n < RW_STAMPS_RING ? n : RW_STAMPS_RING;                              \
        const unsigned first = n < RW_STAMPS_RING ? 0 : n;                                         \
        for (unsigned j = 0; j < cnt; j++) {                                                       \
            const rw_stamp_rec &q = r[(first + j) & (RW_STAMPS_RING - 1)];                         \
            const unsigned kind = (unsigned)(q.kind_cta >> 32);                                    \
            fprintf(stderr, "RW_STAMP %s cta %u entry %llu wait %llu mid %llu end %llu\n",         \
                    kind < nnames ? names[kind] : "?", (unsigned)q.kind_cta, q.entry, q.wait,      \
                    q.mid, q.end);                                                                 \
        }                                                                                          \
        free(r);                                                                                   \
    }                                                                                              \
    static void tag##_stamp_register(void) {                                                       \
        static bool done = false;                                                                  \
        if (!done) {                                                                               \
            done = true;                                                                           \
            rw_stamps_notice();                                                                    \
            atexit(tag##_stamp_dump);                                                              \
        }                                                                                          \
    }
#define RW_STAMP(v) const unsigned long long v = rw_stamp_now()
#define RW_STAMP_DECL(v) unsigned long long v = 0
#define RW_STAMP_SET(v) (v = rw_stamp_now())
#define RW_STAMP_PUT(tag, kind, cta, e, w, m)                                                      \
    do {                                                                                           \
        if (threadIdx.x == 0) tag##_stamp_put((kind), (cta), (e), (w), (m));                       \
    } while (0)
#define RW_STAMPS_REGISTER(tag) tag##_stamp_register()
#else
#define RW_STAMPS_UNIT(tag, ...)
#define RW_STAMP(v)
#define RW_STAMP_DECL(v)
#define RW_STAMP_SET(v) ((void)0)
#define RW_STAMP_PUT(tag, kind, cta, e, w, m) ((void)0)
#define RW_STAMPS_REGISTER(tag) ((void)0)
#endif

#endif
