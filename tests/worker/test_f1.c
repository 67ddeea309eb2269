/* test_f1.c - F1 (spec/targets.md): the CPU backend reproduces the transformers reference of
 * tests/fixtures/qwen3-moe-tiny: teacher-forced logits of every prompt within 1e-3 (max abs), the
 * 24 greedy tokens exactly and their logprobs within 1e-3; alone, batched together, and at TP2
 * (two ranks on threads with the in-process communicator). */
#include <math.h>
#include <pthread.h>

#include "rw_reference.h"
#include "rw_worker.h"

#define F1_LOGIT_TOL 1e-3
#define F1_LOGPROB_TOL 1e-3
#define NPROMPT 4
#define NGEN 24

typedef rw_reference fixture;

static int setup(void **state) {
    fixture *fx = rw_reference_load(RW_TEST_FIXTURE);
    assert_int_equal(fx->nprompt, NPROMPT);
    assert_int_equal(fx->ngen, NGEN);
    *state = fx;
    return 0;
}

static int teardown(void **state) {
    rw_reference_free(*state);
    return 0;
}

/* Everything one rank checks; returns a message on failure (NULL when all matched). Run by the
 * test thread directly (TP1) or by one thread per rank (TP2); only rank 0's verdict is used, but
 * every rank must run the same calls. */
typedef struct run_args {
    const fixture *fx;
    rw_comm *comm; /* NULL = single rank */
    int tp, rank;
    char msg[512];
    double worst_logit, worst_lp;
} run_args;

static void *run_rank(void *p) {
    run_args *a = p;
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
    /* teacher forcing */
    for (int i = 0; i < NPROMPT; i++) {
        lg = realloc(lg, sizeof(float) * (size_t)fx->plen[i] * V);
        TRY(rw_model_score(m, fx->prompt[i], fx->plen[i], lg, &err));
        for (int j = 0; j < fx->plen[i] * V; j++) {
            const double d = fabs((double)lg[j] - fx->logits[i][j]);
            if (!(d <= a->worst_logit)) a->worst_logit = d; /* NaN lands here too */
            if (!(d <= F1_LOGIT_TOL) && !a->msg[0])
                snprintf(a->msg, sizeof a->msg,
                         "prompt %d position %d token %d: logit %.6f, reference %.6f", i, j / V,
                         j % V, lg[j], fx->logits[i][j]);
        }
    }
    if (a->msg[0]) goto done;
    /* greedy decoding through the engine: each prompt alone, then all four in one batch */
    rw_engine_opts eo = rw_engine_opts_default();
    TRY(rw_engine_create(m, &eo, &e, &err));
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = NGEN;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < NPROMPT; i++) {
            TRY(rw_engine_add(e, (uint64_t)(pass * 10 + i), fx->prompt[i], fx->plen[i], &sp, &err));
            if (pass == 0) TRY(rw_engine_run(e, &err));
        }
        TRY(rw_engine_run(e, &err));
        rw_output *o;
        int got = 0;
        while ((o = rw_engine_pop_output(e))) {
            const int i = (int)(o->id % 10);
            got++;
            if (o->n != NGEN || o->finish != RW_FINISH_LENGTH) {
                snprintf(a->msg, sizeof a->msg, "pass %d prompt %d: %d tokens, finish %s", pass, i,
                         o->n, rw_finish_str(o->finish));
            }
            for (int j = 0; j < o->n && j < NGEN && !a->msg[0]; j++) {
                if (o->tokens[j] != fx->greedy[i][j])
                    snprintf(a->msg, sizeof a->msg,
                             "pass %d prompt %d: greedy token %d is %d, "
                             "reference %d",
                             pass, i, j, o->tokens[j], fx->greedy[i][j]);
                const double d = fabs((double)o->logprobs[j] - fx->greedy_lp[i][j]);
                if (!(d <= a->worst_lp)) a->worst_lp = d;
                if (!(d <= F1_LOGPROB_TOL) && !a->msg[0])
                    snprintf(a->msg, sizeof a->msg,
                             "pass %d prompt %d token %d: logprob %.6f, reference %.6f", pass, i, j,
                             o->logprobs[j], fx->greedy_lp[i][j]);
            }
            rw_output_free(o);
        }
        if (got != NPROMPT && !a->msg[0])
            snprintf(a->msg, sizeof a->msg, "pass %d: %d outputs", pass, got);
        if (a->msg[0]) goto done;
    }
#undef TRY
done:
    free(lg);
    rw_engine_destroy(e);
    rw_model_destroy(m);
    return NULL;
}

static void test_f1_tp1(void **state) {
    run_args a = {.fx = *state, .comm = NULL, .tp = 1, .rank = 0};
    run_rank(&a);
    if (a.msg[0]) fail_msg("TP1: %s", a.msg);
    print_message("TP1: max |logit error| %.6g, max |greedy logprob error| %.6g\n", a.worst_logit,
                  a.worst_lp);
}

static void test_f1_tp2_threads(void **state) {
    rw_err err = {0};
    rw_comm_group *g = NULL;
    RW_ASSERT_OK(rw_comm_group_create(2, &g, &err), &err);
    run_args a[2];
    pthread_t th[2];
    rw_comm *c[2] = {NULL, NULL};
    for (int r = 0; r < 2; r++) {
        RW_ASSERT_OK(rw_comm_create_thread(g, r, &c[r], &err), &err);
        a[r] = (run_args){.fx = *state, .comm = c[r], .tp = 2, .rank = r};
    }
    for (int r = 0; r < 2; r++)
        pthread_create(&th[r], NULL, run_rank, &a[r]);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++)
        rw_comm_destroy(c[r]);
    rw_comm_group_destroy(g);
    for (int r = 0; r < 2; r++)
        if (a[r].msg[0]) fail_msg("TP2 rank %d: %s", r, a[r].msg);
    print_message("TP2: max |logit error| %.6g, max |greedy logprob error| %.6g\n",
                  a[0].worst_logit, a[0].worst_lp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f1_tp1),
        cmocka_unit_test(test_f1_tp2_threads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
