/* worker_util.h - test helpers of the worker module (include after rw_reference.h):
 * - the CPU backend against a transformers fixture (rw_fid_*): teacher-forced logits of every
 *   prompt and greedy generation through the engine, on one rank or on tp ranks (one thread per
 *   rank, the in-process communicator), within RW_TOL_F32_REF;
 * - models loaded from a fixture, and the mixed request mix the batching tests replay alone and
 *   together (rw_req_spec). */
#ifndef RW_TEST_WORKER_UTIL_H
#define RW_TEST_WORKER_UTIL_H

#include <pthread.h>

#include "rw_reference.h"
#include "rw_worker.h"

/* The precision of the models the tests make (rw_precision): a test built with
 * -DRW_TEST_PRECISION=RW_PRECISION_HIGH runs its CUDA models in the high-precision mode. */
#ifndef RW_TEST_PRECISION
#define RW_TEST_PRECISION RW_PRECISION_STANDARD
#endif

/* A model of `cfg` on backend b (TP1, RW_TEST_PRECISION), loaded from the checkpoint directory
 * `dir`. */
static inline rw_model *rw_test_load_model(const rw_config *cfg, rw_backend b, const char *dir) {
    rw_err err = {0};
    rw_model *m = NULL;
    rw_model_opts mo = {b, 0, 1, 0, NULL, RW_TEST_PRECISION};
    RW_ASSERT_OK(rw_model_create(cfg, &mo, &m, &err), &err);
    RW_ASSERT_OK(rw_model_load_ckpt(m, dir, &err), &err);
    return m;
}

/* ------------------------------------------------------------------------------------------ */
/* The CPU backend against the transformers reference                                          */
/* ------------------------------------------------------------------------------------------ */
/* One rank's run. Everything one rank checks ends in msg (empty when all matched): run by the test
 * thread (TP1) or by one thread per rank; every rank makes the same calls, and after the
 * all-gather each holds the full logits, so each checks what it sees. */
typedef struct rw_fid_rank {
    const rw_reference *fx;
    rw_comm *comm; /* NULL = single rank */
    int tp, rank;
    int nprompt, ngen;
    bool alone_first; /* greedy: each prompt alone first, then all of them in one batch */
    char msg[512];
    double worst_logit, worst_lp;
    int tokens_checked;
} rw_fid_rank;

/* Loads the checkpoint (each rank slices its own part), scores every prompt, then decodes greedily
 * through the engine (each prompt alone when alone_first, then all in one batch). */
static inline void *rw_fid_rank_run(void *p) {
    rw_fid_rank *a = p;
    const rw_reference *fx = a->fx;
    const int V = fx->cfg.vocab_size;
    rw_err err = {0};
    rw_model *m = NULL;
    rw_engine *e = NULL;
    float *lg = NULL;
    rw_model_opts mo = {RW_BACKEND_CPU, 0, a->tp, a->rank, a->comm};
    a->msg[0] = 0;
#define RW_FID_TRY(x)                                                                              \
    if ((x) != RW_OK) {                                                                            \
        snprintf(a->msg, sizeof a->msg, "%s: %s (%s)", #x, err.msg, err.where);                    \
        goto done;                                                                                 \
    }
    RW_FID_TRY(rw_model_create(&fx->cfg, &mo, &m, &err));
    RW_FID_TRY(rw_model_load_ckpt(m, fx->dir, &err));
    /* teacher forcing */
    for (int i = 0; i < a->nprompt; i++) {
        lg = realloc(lg, sizeof(float) * (size_t)fx->plen[i] * V);
        RW_FID_TRY(rw_model_score(m, fx->prompt[i], fx->plen[i], lg, &err));
        const rw_close c =
            rw_close_check(lg, fx->logits[i], (size_t)fx->plen[i] * V, RW_TOL_F32_REF);
        if (c.worst_abs > a->worst_logit) a->worst_logit = c.worst_abs;
        if (c.bad && !a->msg[0])
            snprintf(a->msg, sizeof a->msg,
                     "prompt %d position %zu token %zu: logit %.6f, reference %.6f (%zu outside "
                     "%s, %zu NaN mismatches)",
                     i, c.first_bad / V, c.first_bad % V, c.first_actual, c.first_expected, c.bad,
                     RW_TOL_F32_REF.name, c.nan_mismatch);
    }
    if (a->msg[0]) goto done;
    rw_engine_opts eo = rw_engine_opts_default();
    RW_FID_TRY(rw_engine_create(m, &eo, &e, &err));
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = a->ngen;
    for (int pass = a->alone_first ? 0 : 1; pass < 2; pass++) {
        for (int i = 0; i < a->nprompt; i++) {
            RW_FID_TRY(
                rw_engine_add(e, (uint64_t)(pass * 10 + i), fx->prompt[i], fx->plen[i], &sp, &err));
            if (pass == 0) RW_FID_TRY(rw_engine_run(e, &err));
        }
        RW_FID_TRY(rw_engine_run(e, &err));
        rw_output *o;
        int got = 0;
        while ((o = rw_engine_pop_output(e))) {
            const int i = (int)(o->id % 10);
            got++;
            if (i >= a->nprompt || o->n != a->ngen || o->finish != RW_FINISH_LENGTH) {
                snprintf(a->msg, sizeof a->msg, "pass %d request %d: %d tokens, finish %s", pass, i,
                         o->n, rw_finish_str(o->finish));
                rw_output_free(o);
                continue;
            }
            for (int j = 0; j < a->ngen && !a->msg[0]; j++) {
                if (o->tokens[j] != fx->greedy[i][j])
                    snprintf(a->msg, sizeof a->msg,
                             "pass %d prompt %d: greedy token %d is %d, reference %d", pass, i, j,
                             o->tokens[j], fx->greedy[i][j]);
                a->tokens_checked++;
            }
            const rw_close c =
                rw_close_check(o->logprobs, fx->greedy_lp[i], (size_t)a->ngen, RW_TOL_F32_REF);
            if (c.worst_abs > a->worst_lp) a->worst_lp = c.worst_abs;
            if (c.bad && !a->msg[0])
                snprintf(a->msg, sizeof a->msg,
                         "pass %d prompt %d token %zu: logprob %.6f, reference %.6f", pass, i,
                         c.first_bad, c.first_actual, c.first_expected);
            rw_output_free(o);
        }
        if (got != a->nprompt && !a->msg[0])
            snprintf(a->msg, sizeof a->msg, "pass %d: %d outputs", pass, got);
        if (a->msg[0]) goto done;
    }
#undef RW_FID_TRY
done:
    free(lg);
    rw_engine_destroy(e);
    rw_model_destroy(m);
    return NULL;
}

/* Runs rw_fid_rank_run on tp ranks (1..8; one thread each) and fails the test on any rank's
 * message or when a rank checked fewer greedy tokens than it should; prints rank 0's errors. */
static inline void rw_fid_run_tp(const rw_reference *fx, int tp, int nprompt, int ngen,
                                 bool alone_first) {
    rw_err err = {0};
    rw_comm_group *g = NULL;
    rw_fid_rank a[8];
    pthread_t th[8];
    rw_comm *c[8] = {NULL};
    assert_true(tp >= 1 && tp <= 8);
    if (tp > 1) RW_ASSERT_OK(rw_comm_group_create(tp, &g, &err), &err);
    for (int r = 0; r < tp; r++) {
        if (tp > 1) RW_ASSERT_OK(rw_comm_create_thread(g, r, &c[r], &err), &err);
        a[r] = (rw_fid_rank){.fx = fx,
                             .comm = c[r],
                             .tp = tp,
                             .rank = r,
                             .nprompt = nprompt,
                             .ngen = ngen,
                             .alone_first = alone_first};
    }
    for (int r = 0; r < tp; r++)
        assert_int_equal(pthread_create(&th[r], NULL, rw_fid_rank_run, &a[r]), 0);
    for (int r = 0; r < tp; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < tp; r++)
        rw_comm_destroy(c[r]);
    rw_comm_group_destroy(g);
    const int passes = alone_first ? 2 : 1;
    for (int r = 0; r < tp; r++) {
        if (a[r].msg[0]) fail_msg("TP%d rank %d: %s", tp, r, a[r].msg);
        assert_int_equal(a[r].tokens_checked, passes * nprompt * ngen);
    }
    print_message("TP%d: max |logit error| %.3g, max |greedy logprob error| %.3g, %d greedy tokens "
                  "equal on every rank\n",
                  tp, a[0].worst_logit, a[0].worst_lp, a[0].tokens_checked);
}

/* ------------------------------------------------------------------------------------------ */
/* A mix of requests for the batching tests                                                     */
/* ------------------------------------------------------------------------------------------ */
typedef struct rw_req_spec {
    int32_t prompt[128];
    int n;
    rw_sampling sp;
    int arrive; /* step at which it is added */
} rw_req_spec;

/* count requests from seed: mostly short prompts, every fifth long enough to be chunked; odd ones
 * sampled (seeded, various temperature / top-p / top-k), even ones greedy; arrival steps in
 * [0, 120). With `extras`, every eighth asks for 3 top logprobs and every sixth has 4 stop ids
 * (some requests end early); the draws of the others do not depend on it otherwise. */
static inline void rw_req_specs(rw_req_spec *s, int count, int V, uint64_t seed, bool extras) {
    rw_rng r;
    rw_rng_seed(&r, seed);
    for (int i = 0; i < count; i++) {
        memset(&s[i], 0, sizeof s[i]);
        s[i].n = i % 5 == 0 ? 60 + (int)(rw_rng_u64(&r) % 60) : 1 + (int)(rw_rng_u64(&r) % 30);
        for (int j = 0; j < s[i].n; j++)
            s[i].prompt[j] = (int32_t)(rw_rng_u64(&r) % (uint64_t)V);
        s[i].sp = rw_sampling_default();
        s[i].sp.max_new_tokens = 1 + (int)(rw_rng_u64(&r) % 32);
        if (i % 2) {
            s[i].sp.temperature = 0.6f + 0.1f * (float)(i % 7);
            s[i].sp.top_p = i % 3 ? 0.9f : 1.0f;
            s[i].sp.top_k = i % 4 == 1 ? 20 : 0;
            s[i].sp.seed = 1000 + (uint64_t)i;
        }
        if (extras && i % 8 == 3) s[i].sp.top_logprobs = 3;
        if (extras && i % 6 == 5) {
            s[i].sp.n_stop = 4;
            for (int j = 0; j < 4; j++)
                s[i].sp.stop_ids[j] = (int32_t)(rw_rng_u64(&r) % 64);
        }
        s[i].arrive = (int)(rw_rng_u64(&r) % 120);
    }
}

#endif
