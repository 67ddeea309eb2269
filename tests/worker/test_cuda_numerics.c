/* test_cuda_numerics.c - the CUDA backend's rounding points emulated on the CPU
 * (tests/common/cuda_emul.h: rw_cuda_emul_score) on a transformers fixture (the tiny one in the
 * cpu suite, the head_dim-128 one in the slow suite):
 * - with no rounding the emulation is the fp32 model: it equals the CPU backend (1e-4) and the
 *   reference (F1's 1e-3);
 * - the error each bf16 rounding point would cause against the reference, alone and all
 *   together, and the MoE routing decisions it changes: the fixture's router has top-k
 *   near-ties (the k-th and (k+1)-th router logits a few 1e-4 apart), which one bf16 rounding of
 *   an activation upstream flips, and a flipped expert moves that token's logits by O(1). That
 *   is why the CUDA backend keeps q in fp32 and feeds every GEMM but the down projection and
 *   the lm_head a hi + lo bf16 pair (with one bf16 expert input instead, the logits still meet
 *   F2 under double accumulation, but one routing decision moves under fp32 accumulation: the
 *   margin would rest on the order). silu(g)*u, the down projection's input, is one bf16: alone
 *   it moves no routing decision on either fixture, under either accumulation
 *   (test_order_sensitivity runs the backend's rounding points in fp32). The lm_head's input is
 *   one bf16 too: it comes after every routing decision, and F2 holds without its lo half;
 * - what dropping one more pair would cost on top of the backend's rounding points (the q/k/v
 *   GEMM input, the o_proj input), and what keeping silu(g)*u, the lm_head input, the softmax
 *   weights or the K and V cache entries a pair would give, printed for docs/BENCHMARKS.md, each
 *   with how far it moves the router logits from the fp32 model's;
 * - the CUDA backend's own rounding points (RW_EMUL_CUDA: K and V cache bf16, the softmax weights
 *   one bf16 each in P.V, the rest near fp32) meet F2 (RW_TOL_CUDA_REF, >= 95% greedy) with no
 *   routing decision changed but the fixture's known ones (the head_dim-128 fixture allows one:
 *   the GPU flips a near-tie there, and F2's logit bound is then not asserted: the GPU test of
 *   that fixture is the known failure), also under another GEMM summation order (fp32 vs double
 *   accumulation: what tensor cores, TP or another kernel do);
 * - those rounding points move the router logits by about 1e-2, far more than the fixtures'
 *   smallest top-k gaps (1.7e-4, 3.3e-4): which near-tie flips is where the errors happen to
 *   fall. With the K and V cache entries, the softmax weights and silu(g)*u as pairs too (PAIRS)
 *   they move by less than a quarter of the smallest gap and no routing decision moves: F2 by a
 *   margin, on both fixtures (asserted);
 * - the attention's operands in fp16 (q' = q log2(e) / sqrt(hd) one fp16 as the kernel would
 *   round it, the K and V cache entries and the softmax weights fp16 instead of bf16: the same
 *   cache bytes and half the q.K products) are reported, not asserted: they keep the
 *   head_dim-128 fixture's routing and flip the tiny fixture's closest tie, as the fp16 kernel
 *   did on the GPU (docs/BENCHMARKS.md, fifty-first session). Each line also gives what became
 *   of the fixture's closest tie (its exact gap, then the same two experts' logit difference:
 *   negative, flipped), which says how near a scheme came to moving it. */
#include <math.h>

#include "cuda_emul.h"
#include "worker_util.h"

/* The fixture: the tiny one by default; worker_cuda_numerics_hd128 (slow suite) builds this file
 * for the head_dim-128 one, where the backend's rounding points may flip one router near-tie
 * (KNOWN_REROUTES: the GPU does; docs/BENCHMARKS.md, F2). */
#ifndef RW_NUMERICS_FIXTURE
#define RW_NUMERICS_FIXTURE RW_TEST_FIXTURE
#define NPROMPT 4
#define KNOWN_REROUTES 0
#endif
#define NGEN 24

/* The fixture and the CPU backend's model of its checkpoint (the emulation's host weights). */
typedef struct fx {
    rw_reference *ref;
    const rw_config *cfg; /* ref->cfg */
    rw_model *cpu;
} fx;

static int setup(void **state) {
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    rw_reference_setup((void **)&f->ref, RW_NUMERICS_FIXTURE, NPROMPT, NGEN);
    f->cfg = &f->ref->cfg;
    f->cpu = rw_test_load_model(&f->ref->cfg, RW_BACKEND_CPU, f->ref->dir);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    rw_model_destroy(f->cpu);
    rw_reference_free(f->ref);
    free(f);
    return 0;
}

/* One emulated run over every prompt followed by its 24 reference greedy tokens. */
typedef struct run {
    float *logits[NPROMPT]; /* [L + NGEN, V] */
    int32_t *ids[NPROMPT];  /* [layers, L + NGEN, k] */
    float *rl[NPROMPT];     /* [layers, L + NGEN, E] */
    int n[NPROMPT], plen[NPROMPT];
} run;

static void emulate(const fx *f, unsigned flags, run *r) {
    const int V = f->cfg->vocab_size, E = f->cfg->num_experts, K = f->cfg->top_k;
    const int NL = f->cfg->num_layers;
    for (int i = 0; i < NPROMPT; i++) {
        const int L = f->ref->plen[i], n = L + NGEN;
        int32_t *seq = malloc(sizeof(int32_t) * (size_t)n);
        memcpy(seq, f->ref->prompt[i], sizeof(int32_t) * (size_t)L);
        memcpy(seq + L, f->ref->greedy[i], sizeof(int32_t) * NGEN);
        r->n[i] = n;
        r->plen[i] = L;
        r->logits[i] = malloc(sizeof(float) * (size_t)n * V);
        r->ids[i] = malloc(sizeof(int32_t) * (size_t)NL * n * K);
        r->rl[i] = malloc(sizeof(float) * (size_t)NL * n * E);
        rw_err err = {0};
        RW_ASSERT_OK(rw_cuda_emul_score(rw_model_wset(f->cpu), seq, n, flags, r->logits[i],
                                        r->ids[i], r->rl[i], &err),
                     &err);
        free(seq);
    }
}

static void run_free(run *r) {
    for (int i = 0; i < NPROMPT; i++) {
        free(r->logits[i]);
        free(r->ids[i]);
        free(r->rl[i]);
    }
}

/* The experts ranked k-th (*a) and (k+1)-th (*b) by one token's router logits (k < E). */
static void kth_pair(const float *l, int E, int k, int *a, int *b) {
    int idx[1024];
    for (int e = 0; e < E; e++)
        idx[e] = e;
    for (int x = 0; x <= k && x < E; x++)
        for (int y = x + 1; y < E; y++)
            if (l[idx[y]] > l[idx[x]]) {
                const int t = idx[x];
                idx[x] = idx[y];
                idx[y] = t;
            }
    *a = idx[k - 1];
    *b = idx[k];
}

/* Gap between the k-th and (k+1)-th largest router logits of one token: how far the top-k set is
 * from changing. */
static double topk_gap(const float *l, int E, int k) {
    if (k >= E) return INFINITY;
    int a, b;
    kth_pair(l, E, k, &a, &b);
    return (double)l[a] - l[b];
}

static bool same_set(const int32_t *a, const int32_t *b, int k) {
    for (int i = 0; i < k; i++) {
        bool found = false;
        for (int j = 0; j < k; j++)
            found |= a[i] == b[j];
        if (!found) return false;
    }
    return true;
}

typedef struct cmp {
    double worst_ref;   /* max |logit - reference| over the prompt positions */
    int greedy, total;  /* teacher-forced greedy tokens equal to the reference */
    int reroutes;       /* token-layers (prompt positions) whose expert set differs from `base` */
    double reroute_gap; /* smallest top-k gap of `base` among them */
    double worst_base;  /* max |logit - base logit| over all positions */
    double drift;       /* max |router logit - base router logit| over prompt token-layers */
    /* at the token-layer of `base`'s smallest top-k gap (the closest tie): that gap, and the
     * same two experts' logit difference in this run (negative: the tie flipped) */
    double tie_gap, tie_margin;
} cmp;

static cmp compare(const fx *f, const run *r, const run *base) {
    const int V = f->cfg->vocab_size, E = f->cfg->num_experts, K = f->cfg->top_k;
    cmp c = {0, 0, 0, 0, INFINITY, 0, 0, INFINITY, 0};
    for (int i = 0; i < NPROMPT; i++) {
        const int L = r->plen[i], n = r->n[i];
        const float *rl = f->ref->logits[i];
        const int32_t *gr = f->ref->greedy[i];
        for (int64_t j = 0; j < (int64_t)L * V; j++)
            c.worst_ref = fmax(c.worst_ref, fabs(r->logits[i][j] - rl[j]));
        for (int64_t j = 0; j < (int64_t)n * V; j++)
            c.worst_base = fmax(c.worst_base, fabs(r->logits[i][j] - base->logits[i][j]));
        for (int j = 0; j < NGEN; j++) {
            const float *row = r->logits[i] + (int64_t)(L - 1 + j) * V;
            int arg = 0;
            for (int v = 1; v < V; v++)
                if (row[v] > row[arg]) arg = v;
            c.greedy += arg == gr[j];
            c.total++;
        }
        for (int l = 0; l < f->cfg->num_layers; l++)
            for (int t = 0; t < L; t++) {
                const size_t o = ((size_t)l * n + t);
                for (int e = 0; e < E; e++)
                    c.drift = fmax(c.drift, fabs(r->rl[i][o * E + e] - base->rl[i][o * E + e]));
                const float *bl = base->rl[i] + o * E, *cur = r->rl[i] + o * E;
                const double g = topk_gap(bl, E, K);
                if (g < c.tie_gap) {
                    int ea, eb;
                    kth_pair(bl, E, K, &ea, &eb);
                    c.tie_gap = g;
                    c.tie_margin = (double)cur[ea] - cur[eb];
                }
                if (!same_set(r->ids[i] + o * K, base->ids[i] + o * K, K)) {
                    c.reroutes++;
                    c.reroute_gap = fmin(c.reroute_gap, g);
                }
            }
    }
    return c;
}

/* The smallest top-k gap of the router over the prompt token-layers of run r; *below receives
 * how many are under 1e-2 and *all how many there are. */
static double smallest_gap(const fx *f, const run *r, int *below, int *all) {
    const int E = f->cfg->num_experts, K = f->cfg->top_k;
    double gmin = INFINITY;
    *below = *all = 0;
    for (int i = 0; i < NPROMPT; i++)
        for (int l = 0; l < f->cfg->num_layers; l++)
            for (int t = 0; t < r->plen[i]; t++) {
                const double g = topk_gap(r->rl[i] + ((size_t)l * r->n[i] + t) * E, E, K);
                gmin = fmin(gmin, g);
                *below += g < 1e-2;
                (*all)++;
            }
    return gmin;
}

/* No rounding: the emulation is the fp32 model of the CPU backend and of transformers. */
static void test_exact(void **state) {
    fx *f = *state;
    const int V = f->cfg->vocab_size;
    run r;
    emulate(f, 0, &r);
    double worst_cpu = 0;
    for (int i = 0; i < NPROMPT; i++) {
        const int n = r.n[i];
        int32_t *seq = malloc(sizeof(int32_t) * (size_t)n);
        memcpy(seq, f->ref->prompt[i], sizeof(int32_t) * (size_t)r.plen[i]);
        memcpy(seq + r.plen[i], f->ref->greedy[i], sizeof(int32_t) * NGEN);
        float *lg = malloc(sizeof(float) * (size_t)n * V);
        rw_err err = {0};
        RW_ASSERT_OK(rw_model_score(f->cpu, seq, n, lg, &err), &err);
        for (int64_t j = 0; j < (int64_t)n * V; j++)
            worst_cpu = fmax(worst_cpu, fabs(lg[j] - r.logits[i][j]));
        free(lg);
        free(seq);
    }
    const cmp c = compare(f, &r, &r);
    print_message("emulation without rounding: max |logit - CPU backend| %.3g, max |logit - "
                  "reference| %.3g, greedy %d/%d\n",
                  worst_cpu, c.worst_ref, c.greedy, c.total);
    assert_true(worst_cpu <= 1e-4);
    assert_true(c.worst_ref <= 1e-3);
    assert_int_equal(c.greedy, c.total);
    /* the fixture's sensitivity: the smallest top-k gap of the router over the prompt positions */
    int below, all;
    const double gmin = smallest_gap(f, &r, &below, &all);
    print_message("fixture router: smallest top-%d gap %.3g; %d of %d token-layers below 1e-2\n",
                  f->cfg->top_k, gmin, below, all);
    run_free(&r);
}

/* The backend's rounding points with every activation upstream of a router kept near fp32: K and
 * V cache entries, the softmax weights and silu(g)*u as hi + lo pairs too (the high-precision
 * mode). */
#define PAIRS RW_EMUL_CUDA_HIGH

/* The backend's rounding points with the attention's operands in fp16: q one fp16 (half the
 * q.K products of the hi + lo pair), the K and V cache entries and the softmax weights fp16
 * instead of bf16 (the same cache bytes). */
#define F16_ATT (RW_EMUL_CUDA | RW_EMUL_F16_KVP | RW_EMUL_F16_Q)

/* Each rounding point of the CUDA backend alone and all together, against the reference. */
static void test_rounding_points(void **state) {
    fx *f = *state;
    static const struct {
        unsigned flags;
        const char *what;
    } cases[] = {
        {RW_EMUL_ROUND_QKV_IN, "bf16 q/k/v GEMM input"},
        {RW_EMUL_ROUND_Q, "bf16 q (after norm + RoPE)"},
        {RW_EMUL_ROUND_K, "bf16 K cache"},
        {RW_EMUL_ROUND_V, "bf16 V cache"},
        {RW_EMUL_ROUND_ATT, "bf16 attention output"},
        {RW_EMUL_ROUND_MOE_IN, "bf16 expert input"},
        {RW_EMUL_ROUND_ACT, "bf16 silu(g)*u"},
        {RW_EMUL_ROUND_LM_IN, "bf16 lm_head input"},
        {RW_EMUL_ROUND_ALL, "all, one bf16 each"},
        {RW_EMUL_ROUND_K | RW_EMUL_ROUND_V | RW_EMUL_ROUND_ACT, "bf16 K, V and silu(g)*u"},
        {RW_EMUL_CUDA & ~RW_EMUL_SPLIT_MOE, "one bf16 expert input and silu(g)*u"},
        {RW_EMUL_CUDA & ~RW_EMUL_ONE_ACT, "silu(g)*u a pair too"},
        {RW_EMUL_CUDA | RW_EMUL_ONE_QKV, "one bf16 q/k/v input"},
        {RW_EMUL_CUDA | RW_EMUL_ONE_QKV | RW_EMUL_F32_ACCUM, "one bf16 q/k/v input, fp32 acc"},
        {RW_EMUL_CUDA | RW_EMUL_ONE_ATT, "one bf16 o_proj input"},
        {RW_EMUL_CUDA | RW_EMUL_ONE_ATT | RW_EMUL_F32_ACCUM, "one bf16 o_proj input, fp32 acc"},
        {RW_EMUL_CUDA & ~RW_EMUL_ONE_LM, "lm_head input a pair too"},
        {RW_EMUL_CUDA & ~RW_EMUL_ROUND_P, "softmax weights a pair too"},
        {RW_EMUL_CUDA | RW_EMUL_SPLIT_V, "V cache pairs"},
        {RW_EMUL_CUDA | RW_EMUL_SPLIT_KV, "K and V cache pairs"},
        {(RW_EMUL_CUDA & ~RW_EMUL_ROUND_P) | RW_EMUL_SPLIT_K, "K and P pairs"},
        {(RW_EMUL_CUDA & ~RW_EMUL_ROUND_P) | RW_EMUL_SPLIT_V, "V and P pairs"},
        {(RW_EMUL_CUDA & ~RW_EMUL_ROUND_P) | RW_EMUL_SPLIT_KV, "K, V and P pairs"},
        {(RW_EMUL_CUDA & ~RW_EMUL_ROUND_P) | RW_EMUL_SPLIT_KV | RW_EMUL_F32_ACCUM,
         "K, V and P pairs, fp32 acc"},
        {PAIRS, "K, V, P and silu(g)*u pairs"},
        {RW_EMUL_CUDA | RW_EMUL_F16_KVP, "fp16 K, V and P"},
        {F16_ATT, "fp16 q, K, V and P"},
        {F16_ATT | RW_EMUL_F32_ACCUM, "fp16 q, K, V and P, fp32 acc"},
        {RW_EMUL_CUDA, "the CUDA backend"},
    };
    cmp cuda = {0}, pairs = {0};
    run exact;
    emulate(f, 0, &exact);
    int below, all;
    const double gmin = smallest_gap(f, &exact, &below, &all);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        run r;
        emulate(f, cases[ci].flags, &r);
        const cmp c = compare(f, &r, &exact);
        print_message("%-28s max |logit - reference| %.3g, greedy %d/%d, router logits moved "
                      "up to %.3g, rerouted token-layers %d (smallest exact top-k gap among "
                      "them %.3g); the closest tie's %.3g now %.3g\n",
                      cases[ci].what, c.worst_ref, c.greedy, c.total, c.drift, c.reroutes,
                      c.reroutes ? c.reroute_gap : 0.0, c.tie_gap, c.tie_margin);
        if (cases[ci].flags == RW_EMUL_CUDA) cuda = c;
        if (cases[ci].flags == PAIRS) pairs = c;
        run_free(&r);
    }
    run_free(&exact);
    /* F2 as the CUDA backend's rounding points imply it: logits within 5e-2 of the reference and
     * >= 95% of the greedy tokens, with no routing decision changed but the fixture's known ones
     * (a rerouted token moves by O(1), so F2's logit bound holds only without them) */
    assert_true(cuda.greedy * 100 >= cuda.total * 95);
    assert_true(cuda.reroutes <= KNOWN_REROUTES);
    if (cuda.reroutes == 0) assert_true(cuda.worst_ref <= 5e-2);
    /* with the pairs, routing is the fp32 model's by a margin rather than by luck: the router
     * logits move less than a quarter of the fixture's smallest top-k gap (the backend's own
     * rounding points move them by more than the gap: which near-tie flips is then a matter of
     * where the errors fall) */
    print_message("router logits moved up to %.3g by the backend's rounding points, %.3g with the "
                  "pairs; the smallest top-k gap is %.3g\n",
                  cuda.drift, pairs.drift, gmin);
    assert_int_equal(pairs.reroutes, 0);
    assert_true(pairs.drift < gmin / 4);
    assert_true(pairs.worst_ref <= 5e-2);
    assert_true(pairs.greedy == pairs.total);
}

/* The CUDA backend's rounding points under another GEMM summation order (fp32 in index order
 * instead of double: what tensor cores, TP or another kernel do): routing must not move and the
 * logits must stay within F2's budget, or the margin above is luck. */
static void test_order_sensitivity(void **state) {
    fx *f = *state;
    run a, b;
    emulate(f, RW_EMUL_CUDA, &a);
    emulate(f, RW_EMUL_CUDA | RW_EMUL_F32_ACCUM, &b);
    const cmp c = compare(f, &b, &a);
    print_message("CUDA rounding points, fp32 vs double GEMM accumulation: rerouted token-layers "
                  "%d, max |logit diff| %.3g, max |logit - reference| %.3g\n",
                  c.reroutes, c.worst_base, c.worst_ref);
    assert_int_equal(c.reroutes, 0);
    if (KNOWN_REROUTES == 0) assert_true(c.worst_ref <= 5e-2);
    run_free(&a);
    run_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact),
        cmocka_unit_test(test_rounding_points),
        cmocka_unit_test(test_order_sensitivity),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
