/* rw_reference.h - loads a fixture directory made by tests/fixtures/make_fixture.py for tests
 * that compare against its transformers reference: config.json, and from reference.safetensors
 * every prompt.i (int32 [L]), logits.i (f32 [L, V]), greedy.i (int32 [G]) and greedy_logprob.i
 * (f32 [G]), i = 0, 1, ... until prompt.i is absent. Pointers borrow the mapped file. */
#ifndef RW_REFERENCE_H
#define RW_REFERENCE_H

#include "rw_test.h"

#define RW_REF_MAX_PROMPTS 16

typedef struct rw_reference {
    rw_config cfg;
    rw_st_file *ref;
    int nprompt;
    int ngen; /* greedy tokens per prompt (the same for every prompt) */
    const int32_t *prompt[RW_REF_MAX_PROMPTS];
    int plen[RW_REF_MAX_PROMPTS];
    const float *logits[RW_REF_MAX_PROMPTS]; /* [plen, V] */
    const int32_t *greedy[RW_REF_MAX_PROMPTS];
    const float *greedy_lp[RW_REF_MAX_PROMPTS];
    char dir[1024]; /* the fixture directory (absolute under RW_SOURCE_ROOT) */
} rw_reference;

static inline const rw_st_entry *rw_reference_entry(rw_st_file *f, const char *name, rw_dtype dt) {
    const rw_st_entry *e = rw_st_find(f, name);
    if (!e) fail_msg("reference.safetensors has no %s", name);
    if (e->dtype != dt) fail_msg("%s: dtype %s", name, rw_dtype_name(e->dtype));
    return e;
}

/* Loads `rel` (a fixture directory relative to the source root); fails the test on any problem. */
static inline rw_reference *rw_reference_load(const char *rel) {
    rw_reference *fx = calloc(1, sizeof *fx);
    char path[1200];
    rw_err err = {0};
    assert_non_null(fx);
    rw_test_path(fx->dir, sizeof fx->dir, rel);
    snprintf(path, sizeof path, "%s/config.json", fx->dir);
    RW_ASSERT_OK(rw_config_load(path, &fx->cfg, &err), &err);
    snprintf(path, sizeof path, "%s/reference.safetensors", fx->dir);
    RW_ASSERT_OK(rw_st_open(path, &fx->ref, &err), &err);
    for (int i = 0; i < RW_REF_MAX_PROMPTS; i++) {
        char n[64];
        snprintf(n, sizeof n, "prompt.%d", i);
        if (!rw_st_find(fx->ref, n)) break;
        const rw_st_entry *e = rw_reference_entry(fx->ref, n, RW_DTYPE_I32);
        fx->prompt[i] = e->data;
        fx->plen[i] = (int)e->shape[0];
        snprintf(n, sizeof n, "logits.%d", i);
        e = rw_reference_entry(fx->ref, n, RW_DTYPE_F32);
        assert_int_equal(e->shape[0], fx->plen[i]);
        assert_int_equal(e->shape[1], fx->cfg.vocab_size);
        fx->logits[i] = e->data;
        snprintf(n, sizeof n, "greedy.%d", i);
        e = rw_reference_entry(fx->ref, n, RW_DTYPE_I32);
        if (i == 0) fx->ngen = (int)e->shape[0];
        assert_int_equal(e->shape[0], fx->ngen);
        fx->greedy[i] = e->data;
        snprintf(n, sizeof n, "greedy_logprob.%d", i);
        fx->greedy_lp[i] = rw_reference_entry(fx->ref, n, RW_DTYPE_F32)->data;
        fx->nprompt = i + 1;
    }
    assert_true(fx->nprompt > 0);
    return fx;
}

static inline void rw_reference_free(rw_reference *fx) {
    if (!fx) return;
    rw_st_close(fx->ref);
    rw_config_free(&fx->cfg);
    free(fx);
}

/* cmocka group setup / teardown bodies: the fixture `rel` as *state, checked to hold nprompt
 * prompts (0: any number) of ngen greedy tokens (0: any). */
static inline int rw_reference_setup(void **state, const char *rel, int nprompt, int ngen) {
    rw_reference *fx = rw_reference_load(rel);
    if (nprompt) assert_int_equal(fx->nprompt, nprompt);
    if (ngen) assert_int_equal(fx->ngen, ngen);
    *state = fx;
    return 0;
}
static inline int rw_reference_teardown(void **state) {
    rw_reference_free(*state);
    return 0;
}

#endif
