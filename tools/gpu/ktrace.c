/* ktrace.c - every kernel's start and end on the GPU, recorded by CUPTI's activity API from inside
 * the traced program (LD_PRELOAD), kernels of CUDA graphs included. What a step's kernels take in
 * the graph, programmatic launches overlapping, which Nsight Compute cannot show: it runs one
 * kernel at a time. tools/gpu/kernel-trace.sh builds and runs it; tools/bench/kernel_trace.py
 * reads what it writes.
 *
 * RW_KTRACE_OUT names the CSV (nothing is traced without it): one line a kernel with its start
 * and end (ns, the GPU's clock), stream, graph id and graph node id (0 outside graphs), grid,
 * block and mangled name. CUPTI hands the records over in buffers, as they fill, every
 * FLUSH_MS and at exit. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

#define BUF_BYTES (16u << 20)
#define FLUSH_MS 200

static FILE *out;

static void warn(const char *what, CUptiResult r) {
    const char *s = NULL;
    cuptiGetResultString(r, &s);
    fprintf(stderr, "ktrace: %s: %s\n", what, s ? s : "unknown CUPTI error");
}

static void CUPTIAPI buf_request(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, BUF_BYTES);
    *size = *buf ? BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buf_complete(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                  size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(out, "%llu,%llu,%u,%u,%llu,%d,%d,%d,%d,%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->streamId, k->graphId,
                (unsigned long long)k->graphNodeId, k->gridX, k->gridY, k->gridZ, k->blockX,
                k->name ? k->name : "?");
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(NULL, stream, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(stderr, "ktrace: %zu records dropped\n", dropped);
    free(buf);
}

static void finish(void) {
    if (!out) return;
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    fclose(out);
    out = NULL;
}

__attribute__((constructor)) static void start(void) {
    const char *path = getenv("RW_KTRACE_OUT");
    if (!path || !*path) return;
    out = fopen(path, "w");
    if (!out) {
        perror(path);
        return;
    }
    CUptiResult r = cuptiActivityRegisterCallbacks(buf_request, buf_complete);
    if (r == CUPTI_SUCCESS) r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (r != CUPTI_SUCCESS) { /* no GPU, or a driver CUPTI cannot use: the program runs untraced */
        warn("cannot trace kernels", r);
        fclose(out);
        out = NULL;
        remove(path);
        return;
    }
    fprintf(out, "start_ns,end_ns,stream,graph,node,grid_x,grid_y,grid_z,block_x,name\n");
    cuptiActivityFlushPeriod(FLUSH_MS);
    atexit(finish);
}
