/* test_attention_ref.c - the power of the budget test_attention_gpu.c holds the attention kernels
 * to on a KV cache of hi + lo pairs (the high-precision mode, worker/kernels/attention.h; cpu
 * suite): RW_TOL_ATTN_KV2 tells the reference from the same reference with the low halves of K,
 * of V, or of both left out, on the decode positions that test uses. A kernel that dropped a
 * plane could not pass it. */
#include <math.h>

#include "kernels/attention.h"
#include "rw_test.h"

enum { NH = 32, NKV = 4, HD = 128, BS = 16 };
static const int32_t POS[] = {0, 15, 16, 17, 100, 255, 256, 300, 639};
#define NS ((int)(sizeof POS / sizeof POS[0]))

typedef struct problem {
    uint16_t *k, *v, *kl, *vl;
    size_t ce; /* elements of each cache array */
    float *q;
    int32_t *bt;
    rw_attn_tile tiles[NS];
    int stride;
} problem;

/* One-token tiles at POS, block tables shuffled; K and V random fp32 values as pairs. */
static void make(problem *p) {
    const int stride = POS[NS - 1] / BS + 1, nblocks = 2 * stride;
    p->stride = stride;
    p->ce = (size_t)nblocks * NKV * BS * HD;
    p->k = malloc(2 * p->ce);
    p->v = malloc(2 * p->ce);
    p->kl = malloc(2 * p->ce);
    p->vl = malloc(2 * p->ce);
    float *f = malloc(4 * p->ce);
    rw_test_fill_f32(f, p->ce, 21, 1.0f);
    for (size_t i = 0; i < p->ce; i++)
        rw_k_store_split(f[i], p->k, p->kl, (int64_t)i);
    rw_test_fill_f32(f, p->ce, 22, 1.0f);
    for (size_t i = 0; i < p->ce; i++)
        rw_k_store_split(f[i], p->v, p->vl, (int64_t)i);
    free(f);
    p->q = malloc(sizeof(float) * NS * NH * HD);
    rw_test_fill_f32(p->q, (size_t)NS * NH * HD, 23, 1.0f);
    p->bt = malloc(sizeof(int32_t) * (size_t)NS * stride);
    for (int i = 0; i < NS * stride; i++)
        p->bt[i] = (int32_t)(((int64_t)i * 37 + 11) % nblocks);
    for (int i = 0; i < NS; i++)
        p->tiles[i] = (rw_attn_tile){i, i, 1, 0};
}

static void release(problem *p) {
    free(p->k);
    free(p->v);
    free(p->kl);
    free(p->vl);
    free(p->q);
    free(p->bt);
}

/* The reference's outputs as the values of their pairs (double) */
static double *run(const problem *p, rw_kv_planes kv) {
    const size_t n = (size_t)NS * NH * HD;
    uint16_t *hi = malloc(2 * n), *lo = malloc(2 * n);
    rw_k_attention_ref(p->q, kv, p->tiles, NS, POS, p->bt, p->stride, NH, NKV, HD, BS, hi, lo);
    double *out = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++)
        out[i] = (double)rw_bf16_to_f32(hi[i]) + rw_bf16_to_f32(lo[i]);
    free(hi);
    free(lo);
    return out;
}

static void test_budget_power(void **state) {
    (void)state;
    problem p;
    make(&p);
    double vmax = 0.0;
    for (size_t i = 0; i < p.ce; i++)
        vmax = fmax(vmax, fabs(rw_bf16_to_f32(p.v[i])));
    const size_t n = (size_t)NS * NH * HD;
    double *full = run(&p, (rw_kv_planes){p.k, p.v, p.kl, p.vl});
    static const struct {
        bool k, v;
        const char *what;
    } drop[] = {{true, false, "K_lo left out"}, {false, true, "V_lo left out"},
                {true, true, "both left out"}};
    for (size_t d = 0; d < sizeof drop / sizeof drop[0]; d++) {
        const rw_kv_planes kv = {p.k, p.v, drop[d].k ? NULL : p.kl, drop[d].v ? NULL : p.vl};
        double *got = run(&p, kv);
        const rw_close c = rw_close_check(got, full, n, RW_TOL_ATTN_KV2(vmax));
        print_message("%s: %zu of %zu outputs outside RW_TOL_ATTN_KV2 (max abs error %.3g)\n",
                      drop[d].what, c.bad, n, c.worst_abs);
        assert_true(c.bad > 0);
        free(got);
    }
    free(full);
    release(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_power),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
