/* test_tp_cpu.c - tensor parallelism on the CPU backend at TP 1, 2, 4 and 8 (one thread per rank,
 * the in-process communicator): every degree reproduces the transformers reference of
 * tests/fixtures/qwen3-moe-tp8 (8 q / 4 kv heads, moe_intermediate 256: at TP8 the kv heads are
 * replicated and each rank holds an expert shard of S = 32 rows padded to P = 128). Teacher-forced
 * logits within 1e-3, the 16 greedy tokens exactly, their logprobs within 1e-3. */
#include <math.h>
#include <pthread.h>

#include "rw_reference.h"
#include "rw_worker.h"

#define TP_LOGIT_TOL 1e-3
#define TP_LOGPROB_TOL 1e-3
#define NPROMPT 2
#define NGEN 16
#define FIXTURE "tests/fixtures/qwen3-moe-tp8"

typedef rw_reference fixture;

static int setup(void **state) {
    fixture *fx = rw_reference_load(FIXTURE);
    assert_int_equal(fx->nprompt, NPROMPT);
    assert_int_equal(fx->ngen, NGEN);
    *state = fx;
    return 0;
}

static int teardown(void **state) {
    rw_reference_free(*state);
    return 0;
}

typedef struct rank_run {
    const fixture *fx;
    rw_comm *comm; /* NULL for TP1 */
    int tp, rank;
    char msg[512];
    double worst_logit, worst_lp;
    int tokens_checked;
} rank_run;

/* One rank: load the checkpoint (each rank slices its own part), score every prompt, then greedy
 * decode both prompts in one batch. Every rank runs the same calls; each checks what it sees
 * (after the all-gather every rank holds the full logits). */
static void *run_rank(void *p) {
    rank_run *a = p;
    const fixture *fx = a->fx;
    const int V = fx->cfg.vocab_size;
    rw_err err = {0};
    rw_model *m = NULL;
    rw_engine *e = NULL;
    float *lg = NULL;
    rw_model_opts mo = {RW_BACKEND_CPU, 0, a->tp, a->rank, a->comm};
    a->msg[0] = 0;
#define TRY(x)                                                                                     \
    if ((x) != RW_OK) {                                                                            \
        snprintf(a->msg, sizeof a->msg, "%s: %s (%s)", #x, err.msg, err.where);                    \
        goto done;                                                                                 \
    }
    TRY(rw_model_create(&fx->cfg, &mo, &m, &err));
    TRY(rw_model_load_ckpt(m, fx->dir, &err));
    for (int i = 0; i < NPROMPT; i++) {
        lg = realloc(lg, sizeof(float) * (size_t)fx->plen[i] * V);
        TRY(rw_model_score(m, fx->prompt[i], fx->plen[i], lg, &err));
        for (int j = 0; j < fx->plen[i] * V; j++) {
            const double d = fabs((double)lg[j] - fx->logits[i][j]);
            if (!(d <= a->worst_logit)) a->worst_logit = d; /* NaN lands here too */
            if (!(d <= TP_LOGIT_TOL) && !a->msg[0])
                snprintf(a->msg, sizeof a->msg,
                         "prompt %d position %d token %d: logit %.6f, reference %.6f", i, j / V,
                         j % V, lg[j], fx->logits[i][j]);
        }
    }
    if (a->msg[0]) goto done;
    rw_engine_opts eo = rw_engine_opts_default();
    TRY(rw_engine_create(m, &eo, &e, &err));
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = NGEN;
    for (int i = 0; i < NPROMPT; i++)
        TRY(rw_engine_add(e, (uint64_t)i, fx->prompt[i], fx->plen[i], &sp, &err));
    TRY(rw_engine_run(e, &err));
    rw_output *o;
    int got = 0;
    while ((o = rw_engine_pop_output(e))) {
        const int i = (int)o->id;
        got++;
        if (i < 0 || i >= NPROMPT || o->n != NGEN || o->finish != RW_FINISH_LENGTH) {
            snprintf(a->msg, sizeof a->msg, "request %d: %d tokens, finish %s", i, o->n,
                     rw_finish_str(o->finish));
            rw_output_free(o);
            continue;
        }
        for (int j = 0; j < NGEN && !a->msg[0]; j++) {
            if (o->tokens[j] != fx->greedy[i][j])
                snprintf(a->msg, sizeof a->msg, "prompt %d: greedy token %d is %d, reference %d",
                         i, j, o->tokens[j], fx->greedy[i][j]);
            const double d = fabs((double)o->logprobs[j] - fx->greedy_lp[i][j]);
            if (!(d <= a->worst_lp)) a->worst_lp = d;
            if (!(d <= TP_LOGPROB_TOL) && !a->msg[0])
                snprintf(a->msg, sizeof a->msg, "prompt %d token %d: logprob %.6f, reference %.6f",
                         i, j, o->logprobs[j], fx->greedy_lp[i][j]);
            a->tokens_checked++;
        }
        rw_output_free(o);
    }
    if (got != NPROMPT && !a->msg[0]) snprintf(a->msg, sizeof a->msg, "%d outputs", got);
#undef TRY
done:
    free(lg);
    rw_engine_destroy(e);
    rw_model_destroy(m);
    return NULL;
}

static void run_tp(const fixture *fx, int tp) {
    rw_err err = {0};
    rw_comm_group *g = NULL;
    rank_run a[8];
    pthread_t th[8];
    rw_comm *c[8] = {NULL};
    assert_true(tp >= 1 && tp <= 8);
    if (tp > 1) RW_ASSERT_OK(rw_comm_group_create(tp, &g, &err), &err);
    for (int r = 0; r < tp; r++) {
        if (tp > 1) RW_ASSERT_OK(rw_comm_create_thread(g, r, &c[r], &err), &err);
        a[r] = (rank_run){.fx = fx, .comm = c[r], .tp = tp, .rank = r};
    }
    for (int r = 0; r < tp; r++)
        assert_int_equal(pthread_create(&th[r], NULL, run_rank, &a[r]), 0);
    for (int r = 0; r < tp; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < tp; r++)
        rw_comm_destroy(c[r]);
    rw_comm_group_destroy(g);
    for (int r = 0; r < tp; r++) {
        if (a[r].msg[0]) fail_msg("TP%d rank %d: %s", tp, r, a[r].msg);
        assert_int_equal(a[r].tokens_checked, NPROMPT * NGEN);
    }
    print_message("TP%d: max |logit error| %.3g, max |greedy logprob error| %.3g, %d greedy tokens "
                  "equal on every rank\n",
                  tp, a[0].worst_logit, a[0].worst_lp, a[0].tokens_checked);
}

static void test_tp1(void **state) { run_tp(*state, 1); }
static void test_tp2(void **state) { run_tp(*state, 2); }
static void test_tp4(void **state) { run_tp(*state, 4); }
static void test_tp8(void **state) { run_tp(*state, 8); }

/* The fixture really exercises what TP4/TP8 change: kv heads replicated at TP8 (T > nKV), the
 * expert shard padded (S < P), vocab rows split. */
static void test_fixture_shape(void **state) {
    const fixture *fx = *state;
    rw_err err = {0};
    rw_tp_dims d;
    RW_ASSERT_OK(rw_tp_dims_make(&fx->cfg, 8, 5, &d, &err), &err);
    assert_true(fx->cfg.num_kv_heads < 8);
    assert_int_equal(d.nkv_local, 1);
    assert_int_equal(d.kv_head0, 5 / (8 / fx->cfg.num_kv_heads));
    assert_int_equal(d.S, 32);
    assert_int_equal(d.P, 128);
    assert_int_equal(d.nh_local, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_shape), cmocka_unit_test(test_tp1),
        cmocka_unit_test(test_tp2),           cmocka_unit_test(test_tp4),
        cmocka_unit_test(test_tp8),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
