/* test_prefix.c - shared prompt KV and the prefix cache on the CPU backend with the fixture model
 * (worker/kv_blocks.c, worker/engine_step.c):
 * - the block manager alone: a cached chain is found again, under its weight version only, a
 *   block whose parent left the cache is not reached, idle blocks are evicted least recently used
 *   first and held ones never;
 * - n samples of one prompt allocate the prompt's full blocks once and prefill it once (stats),
 *   and each sample's tokens and logprob bits equal its run alone without sharing (prompts with
 *   and without a partly filled last block, greedy and sampled, with top logprobs);
 * - a 5-turn conversation reuses each previous turn's blocks: the prefill tokens computed are
 *   exactly the ones past the reused blocks, outputs identical to runs alone;
 * - a weight commit (new weights, new version) between two turns: the cache empties, the second
 *   turn recomputes everything and equals its run alone on the new weights, while keeping the old
 *   version (the stale blocks reused) would change its output: so a stale block is never used;
 * - eviction under a tiny KV budget (many prompts sharing prefixes, n samples, multi-turn, small
 *   token budget: retraction, eviction, fork fallbacks) keeps every output exact. */
#include "kv_blocks.h"
#include "rollout_util.h"

typedef rw_fixture_model ctx;

/* ------------------------------------------------------------------------------------------ */
static void test_block_manager(void **state) {
    (void)state;
    rw_err err = {0};
    rw_kv_blocks p;
    const int bs = 4;
    RW_ASSERT_OK(rw_kv_blocks_init(&p, 8, bs, 6, &err), &err);
    rw_kv_blocks_reset(&p);
    int32_t toks[16];
    for (int i = 0; i < 16; i++)
        toks[i] = 100 + i;
    /* a request fills 3 blocks and registers them as a chain under version 5 */
    int32_t *tab = NULL;
    int n = 0, cap = 0;
    assert_true(rw_kv_blocks_take(&p, &tab, &n, &cap, 12));
    assert_int_equal(n, 3);
    assert_int_equal(tab[0], 0); /* handed out from 0 upwards */
    uint64_t key = 0;
    for (int i = 0; i < 3; i++)
        assert_int_equal(rw_kv_blocks_register(&p, tab[i], i ? tab[i - 1] : -1, key, 5,
                                               toks + i * bs, NULL, NULL, &key),
                         tab[i]);
    assert_int_equal(p.ncached, 3);
    int32_t found[4];
    uint64_t k2;
    assert_int_equal(rw_kv_blocks_lookup(&p, 5, toks, 4, false, false, found, &k2), 3);
    assert_int_equal(k2, key);
    assert_int_equal(found[2], tab[2]);
    assert_int_equal(rw_kv_blocks_lookup(&p, 6, toks, 4, false, false, found, &k2), 0);
    assert_int_equal(rw_kv_blocks_lookup(&p, 5, toks, 4, true, false, found, &k2), 0); /* routes */
    int32_t other[16];
    memcpy(other, toks, sizeof other);
    other[5] = 7; /* block 1 differs: only block 0 matches */
    assert_int_equal(rw_kv_blocks_lookup(&p, 5, other, 4, false, false, found, &k2), 1);
    /* an equal block registered again resolves to the cached one */
    int32_t *tab2 = NULL;
    int n2 = 0, cap2 = 0;
    assert_true(rw_kv_blocks_take(&p, &tab2, &n2, &cap2, 4));
    uint64_t kk;
    assert_int_equal(rw_kv_blocks_register(&p, tab2[0], -1, 0, 5, toks, NULL, NULL, &kk), tab[0]);
    rw_kv_blocks_give(&p, tab2, n2);
    /* released: the blocks go idle (still found); the last block is the least recently used */
    rw_kv_blocks_give(&p, tab, n);
    assert_int_equal(rw_kv_blocks_held(&p), 0);
    assert_int_equal(p.nidle, 3);
    assert_int_equal(rw_kv_blocks_avail(&p), 8);
    assert_int_equal(rw_kv_blocks_lookup(&p, 5, toks, 4, false, false, found, &k2), 3);
    /* hold the chain's last block: taking 6 blocks takes the 5 free ones and evicts the least
     * recently released idle block, chain position 1 */
    rw_kv_blocks_hold(&p, found[2]);
    int32_t *t3 = NULL;
    int n3 = 0, c3 = 0;
    assert_false(rw_kv_blocks_take(&p, &t3, &n3, &c3, 8 * bs)); /* 8 > 7 available */
    assert_true(rw_kv_blocks_take(&p, &t3, &n3, &c3, 6 * bs));
    assert_int_equal(p.evicted, 1);
    assert_int_equal(t3[5], 1);
    assert_int_equal(rw_kv_blocks_lookup(&p, 5, toks, 4, false, false, found, &k2), 1);
    /* the reused block registered again at position 1 with the same tokens: the old position 2
     * (held, still cached) was chained to the block's previous life and no longer matches */
    uint64_t k0 = rw_kv_blocks_key(&p, true, 0, 5, toks);
    assert_int_equal(rw_kv_blocks_register(&p, 1, 0, k0, 5, toks + bs, NULL, NULL, &kk), 1);
    assert_int_equal(rw_kv_blocks_lookup(&p, 5, toks, 4, false, false, found, &k2), 2);
    /* the last idle block goes next; the held one never */
    assert_true(rw_kv_blocks_take(&p, &t3, &n3, &c3, 7 * bs));
    assert_int_equal(p.evicted, 2);
    assert_false(rw_kv_blocks_take(&p, &t3, &n3, &c3, 8 * bs));
    rw_kv_blocks_give(&p, t3, n3);
    rw_kv_blocks_uncache_all(&p);
    assert_int_equal(p.ncached, 0);
    assert_int_equal(rw_kv_blocks_held(&p), 1); /* the held block stays held */
    assert_int_equal(rw_kv_blocks_avail(&p), 7);
    free(tab);
    free(tab2);
    free(t3);
    rw_kv_blocks_fini(&p);
}

/* ------------------------------------------------------------------------------------------ */
/* n samples of prompts of P tokens against their runs alone; returns the sharing engine's stats. */
static void samples_case(ctx *c, int P, int nsamp, float temperature, int top_logprobs) {
    rw_err err = {0};
    const int bs = 16, maxnew = 10;
    int32_t prompt[256];
    rw_random_prompt(prompt, P, c->cfg.vocab_size, 1000 + (uint64_t)P);
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = maxnew;
    sp.temperature = temperature;
    sp.top_p = temperature > 0 ? 0.95f : 1.0f;
    sp.seed = 4242;
    sp.top_logprobs = top_logprobs;
    rw_output *alone[16];
    for (int i = 0; i < nsamp; i++) {
        rw_sampling s = sp;
        s.seed = sp.seed + (uint64_t)i;
        alone[i] = rw_run_alone(c->m, prompt, P, &s, NULL);
    }
    for (int share = 1; share >= 0; share--) {
        rw_engine_opts o = rw_engine_opts_default();
        o.kv_block_size = bs;
        o.prefix_sharing = share;
        rw_engine *e;
        RW_ASSERT_OK(rw_engine_create(c->m, &o, &e, &err), &err);
        rw_request_opts ro = {.n_samples = nsamp};
        RW_ASSERT_OK(rw_engine_add_ex(e, 100, prompt, P, &sp, &ro, &err), &err);
        RW_ASSERT_OK(rw_engine_run(e, &err), &err);
        for (int i = 0; i < nsamp; i++) {
            rw_output *out = rw_engine_pop_output(e);
            assert_non_null(out);
            assert_true(out->id >= 100 && out->id < 100 + (uint64_t)nsamp);
            char what[96];
            snprintf(what, sizeof what, "P %d sample %d (sharing %d)", P, (int)(out->id - 100),
                     share);
            rw_out_same(out, alone[out->id - 100], what);
            if (share && out->id > 100) assert_int_equal(out->n_reused, P);
            rw_output_free(out);
        }
        rw_engine_stats st;
        rw_engine_stats_get(e, &st);
        /* blocks for the KV of one sample: the prompt and the tokens fed back */
        const int per = (P + maxnew - 1 + bs - 1) / bs, full = P / bs;
        if (share) {
            /* the prompt's full blocks allocated once, the rest (the copied partial block and
             * the generated tokens' blocks) per sample; one prefill */
            assert_int_equal(st.kv_blocks_allocated, full + (int64_t)nsamp * (per - full));
            assert_int_equal(st.prompt_tokens, P);
            assert_int_equal(st.forked_samples, nsamp - 1);
            assert_int_equal(st.prefix_tokens_saved, (int64_t)(nsamp - 1) * P);
            assert_true(st.kv_blocks_cached >= full);
        } else {
            assert_int_equal(st.kv_blocks_allocated, (int64_t)nsamp * per);
            assert_int_equal(st.prompt_tokens, (int64_t)nsamp * P);
            assert_int_equal(st.forked_samples, 0);
            assert_int_equal(st.kv_blocks_cached, 0);
        }
        assert_int_equal(st.kv_blocks_used, 0);
        rw_engine_destroy(e);
    }
    for (int i = 0; i < nsamp; i++)
        rw_output_free(alone[i]);
}

static void test_n_samples(void **state) {
    ctx *c = *state;
    samples_case(c, 45, 8, 0.9f, 0); /* 2 full blocks + a partial one copied per sample */
    samples_case(c, 32, 5, 1.0f, 3); /* block-aligned: nothing copied */
    samples_case(c, 7, 4, 0.0f, 0);  /* no full block, greedy: identical samples */
}

/* Samples of one prompt with their own lengths (rw_request_opts.sample_max_new). */
static void test_sample_lengths(void **state) {
    ctx *c = *state;
    rw_err err = {0};
    int32_t prompt[40];
    rw_random_prompt(prompt, 40, c->cfg.vocab_size, 8);
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = 12;
    sp.temperature = 1.0f;
    sp.seed = 21;
    const int lens[5] = {3, 9, 1, 12, 6};
    rw_request_opts ro = {.n_samples = 5, .sample_max_new = lens};
    rw_engine *e;
    RW_ASSERT_OK(rw_engine_create(c->m, NULL, &e, &err), &err);
    RW_ASSERT_OK(rw_engine_add_ex(e, 0, prompt, 40, &sp, &ro, &err), &err);
    RW_ASSERT_OK(rw_engine_run(e, &err), &err);
    rw_output *o;
    int got = 0;
    while ((o = rw_engine_pop_output(e))) {
        rw_sampling s = sp;
        s.seed += o->id;
        s.max_new_tokens = lens[o->id];
        rw_output *ref = rw_run_alone(c->m, prompt, 40, &s, NULL);
        assert_int_equal(o->n, lens[o->id]);
        rw_out_same(o, ref, "sample with its own length");
        rw_output_free(ref);
        rw_output_free(o);
        got++;
    }
    assert_int_equal(got, 5);
    const int bad[5] = {3, 0, 1, 1, 1};
    ro.sample_max_new = bad;
    assert_int_equal(rw_engine_add_ex(e, 10, prompt, 40, &sp, &ro, &err), RW_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "sample_max_new[1]"));
    rw_engine_destroy(e);
}

/* ------------------------------------------------------------------------------------------ */
/* A conversation: turn k's prompt is turn k-1's prompt and output plus new tokens. */
static void test_multi_turn(void **state) {
    ctx *c = *state;
    rw_err err = {0};
    const int bs = 16, turns = 5;
    rw_engine_opts o = rw_engine_opts_default();
    o.kv_block_size = bs;
    o.max_batch_tokens = 40; /* the turns' prefills are chunked too */
    rw_engine *e;
    RW_ASSERT_OK(rw_engine_create(c->m, &o, &e, &err), &err);
    int32_t conv[512];
    int len = 0, prev_computed = 0;
    for (int k = 0; k < turns; k++) {
        const int add = 9 + 7 * k;
        rw_random_prompt(conv + len, add, c->cfg.vocab_size, 77 + (uint64_t)k);
        len += add;
        rw_sampling sp = rw_sampling_default();
        sp.max_new_tokens = 12 + k;
        sp.temperature = k % 2 ? 0.8f : 0.0f;
        sp.seed = 9 + (uint64_t)k;
        rw_output *ref = rw_run_alone(c->m, conv, len, &sp, NULL);
        rw_engine_stats a, z;
        rw_engine_stats_get(e, &a);
        RW_ASSERT_OK(rw_engine_add(e, (uint64_t)k, conv, len, &sp, &err), &err);
        RW_ASSERT_OK(rw_engine_run(e, &err), &err);
        rw_output *out = rw_engine_pop_output(e);
        rw_engine_stats_get(e, &z);
        char what[64];
        snprintf(what, sizeof what, "turn %d", k);
        rw_out_same(out, ref, what);
        /* reused: the previous turn's full blocks (it computed all but its last token), up to
         * the last block boundary before this turn's last prompt token */
        const int fb_prev = prev_computed / bs, fb_now = (len - 1) / bs;
        const int reused = bs * (fb_prev < fb_now ? fb_prev : fb_now);
        assert_int_equal(out->n_reused, reused);
        assert_int_equal(z.prompt_tokens - a.prompt_tokens, len - reused);
        assert_int_equal(z.prefix_tokens_saved - a.prefix_tokens_saved, reused);
        if (k > 0) {
            assert_true(reused > 0);
            assert_int_equal(z.prefix_hits - a.prefix_hits, 1);
        }
        print_message("turn %d: prompt %d, reused %d, computed %lld\n", k, len, reused,
                      (long long)(z.prompt_tokens - a.prompt_tokens));
        memcpy(conv + len, out->tokens, sizeof(int32_t) * (size_t)out->n);
        len += out->n;
        prev_computed = len - 1;
        rw_output_free(out);
        rw_output_free(ref);
    }
    rw_engine_destroy(e);
}

/* ------------------------------------------------------------------------------------------ */
/* Turn 1 on the fixture weights (version 0), then new weights; turn 2 extends turn 1. With a new
 * version it recomputes and equals its run alone on the new weights; keeping the old version on
 * purpose reuses the stale blocks and changes the output, which shows the check can fail. */
static void test_weight_commit(void **state) {
    ctx *c = *state;
    rw_err err = {0};
    rw_model *m = rw_test_load_model(&c->cfg, RW_BACKEND_CPU, c->dir);
    int32_t conv[256];
    const int P1 = 50;
    rw_random_prompt(conv, P1, c->cfg.vocab_size, 5);
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = 14;
    rw_output *stale_out = NULL, *fresh_out = NULL;
    int len2 = 0;
    for (int bump = 0; bump < 2; bump++) {
        RW_ASSERT_OK(rw_model_load_ckpt(m, c->dir, &err), &err);
        rw_engine *e;
        RW_ASSERT_OK(rw_engine_create(m, NULL, &e, &err), &err);
        RW_ASSERT_OK(rw_engine_add(e, 1, conv, P1, &sp, &err), &err);
        RW_ASSERT_OK(rw_engine_run(e, &err), &err);
        rw_output *t1 = rw_engine_pop_output(e);
        int len = P1;
        memcpy(conv + len, t1->tokens, sizeof(int32_t) * (size_t)t1->n);
        len += t1->n;
        rw_random_prompt(conv + len, 11, c->cfg.vocab_size, 6);
        len += 11;
        len2 = len;
        rw_output_free(t1);
        rw_engine_stats a, z;
        rw_engine_stats_get(e, &a);
        assert_true(a.kv_blocks_cached >= 3);
        /* the commit: new weights */
        RW_ASSERT_OK(rw_model_load_random(m, 31337, 0.05f, &err), &err);
        if (bump) {
            rw_engine_set_weight_version(e, 1);
            rw_engine_stats_get(e, &a);
            assert_int_equal(a.kv_blocks_cached, 0); /* dropped at the version change */
        }
        RW_ASSERT_OK(rw_engine_add(e, 2, conv, len, &sp, &err), &err);
        RW_ASSERT_OK(rw_engine_run(e, &err), &err);
        rw_output *t2 = rw_engine_pop_output(e);
        rw_engine_stats_get(e, &z);
        if (bump) {
            assert_int_equal(z.prompt_tokens - a.prompt_tokens, len); /* all recomputed */
            assert_int_equal(z.prefix_hits, a.prefix_hits);
            assert_int_equal(t2->n_reused, 0);
            fresh_out = t2;
        } else {
            assert_true(t2->n_reused > 0); /* the stale blocks were reused */
            stale_out = t2;
        }
        rw_engine_destroy(e);
    }
    /* the new weights alone */
    rw_output *ref = rw_run_alone(m, conv, len2, &sp, NULL);
    rw_out_same(fresh_out, ref, "turn 2 after the commit");
    bool differs = stale_out->n != ref->n;
    for (int j = 0; j < ref->n && !differs; j++)
        differs = stale_out->tokens[j] != ref->tokens[j] ||
                  memcmp(&stale_out->logprobs[j], &ref->logprobs[j], 4) != 0;
    assert_true(differs);
    rw_output_free(stale_out);
    rw_output_free(fresh_out);
    rw_output_free(ref);
    rw_model_destroy(m);
}

/* ------------------------------------------------------------------------------------------ */
/* Three "system prompts", each continued by several requests (some with n samples), then a
 * second turn of each: under a KV cache of a few blocks and a small token budget. */
static void test_eviction_tiny_budget(void **state) {
    ctx *c = *state;
    rw_err err = {0};
    enum { NSYS = 3, PER = 4, NREQ = NSYS * PER };
    const int bs = 16;
    int32_t sys[NSYS][40];
    for (int s = 0; s < NSYS; s++)
        rw_random_prompt(sys[s], 40, c->cfg.vocab_size, 300 + (uint64_t)s);
    int32_t prompt[NREQ][80];
    int plen[NREQ];
    rw_sampling sp[NREQ];
    int nsamp[NREQ], nnext[NREQ] = {0};
    int32_t next[NREQ][20];
    for (int i = 0; i < NREQ; i++) {
        const int s = i % NSYS, tail = 3 + (i * 5) % 17;
        memcpy(prompt[i], sys[s], sizeof sys[s]);
        rw_random_prompt(prompt[i] + 40, tail, c->cfg.vocab_size, 500 + (uint64_t)i);
        plen[i] = 40 + tail;
        sp[i] = rw_sampling_default();
        sp[i].max_new_tokens = 6 + i % 9;
        sp[i].temperature = i % 3 ? 0.7f : 0.0f;
        sp[i].seed = 1000 + (uint64_t)i * 100;
        nsamp[i] = i % 4 == 1 ? 3 : 1;
    }
    rw_engine_opts o = rw_engine_opts_default();
    o.kv_block_size = bs;
    o.kv_bytes = 14 * rw_block_bytes(c->m, bs); /* about two requests' worth */
    o.max_batch_tokens = 24;
    o.max_running = 6;
    rw_engine *e;
    RW_ASSERT_OK(rw_engine_create(c->m, &o, &e, &err), &err);
    int total = 0;
    for (int round = 0; round < 2; round++) {
        /* round 1: the second turn of every request of round 0, with its first sample's output */
        for (int i = 0; i < NREQ; i++) {
            const uint64_t id = (uint64_t)(round * 100 + i * 10);
            rw_request_opts ro = {.n_samples = nsamp[i]};
            RW_ASSERT_OK(rw_engine_add_ex(e, id, prompt[i], plen[i], &sp[i], &ro, &err), &err);
        }
        RW_ASSERT_OK(rw_engine_run(e, &err), &err);
        rw_output *out;
        int got = 0;
        while ((out = rw_engine_pop_output(e))) {
            const int i = (int)((out->id - (uint64_t)round * 100) / 10), smp = (int)(out->id % 10);
            rw_sampling s = sp[i];
            s.seed += (uint64_t)smp;
            rw_output *ref = rw_run_alone(c->m, prompt[i], plen[i], &s, NULL);
            char what[64];
            snprintf(what, sizeof what, "round %d request %d sample %d", round, i, smp);
            rw_out_same(out, ref, what);
            if (smp == 0 && round == 0) { /* the next turn, once every sample is checked */
                nnext[i] = out->n < 20 ? out->n : 20;
                memcpy(next[i], out->tokens, sizeof(int32_t) * (size_t)nnext[i]);
            }
            rw_output_free(ref);
            rw_output_free(out);
            got++;
        }
        int want = 0;
        for (int i = 0; i < NREQ; i++)
            want += nsamp[i];
        assert_int_equal(got, want);
        total += got;
        for (int i = 0; i < NREQ; i++) {
            memcpy(prompt[i] + plen[i], next[i], sizeof(int32_t) * (size_t)nnext[i]);
            plen[i] += nnext[i];
            nnext[i] = 0;
        }
    }
    rw_engine_stats st;
    rw_engine_stats_get(e, &st);
    print_message("%d outputs exact: %lld evictions, %lld prefix hits (%lld tokens), %lld forks, "
                  "%lld retractions\n",
                  total, (long long)st.kv_blocks_evicted, (long long)st.prefix_hits,
                  (long long)st.prefix_tokens_saved, (long long)st.forked_samples,
                  (long long)st.preemptions);
    assert_true(st.kv_blocks_evicted > 0);
    assert_true(st.prefix_hits > 0);
    assert_true(st.forked_samples > 0);
    assert_int_equal(st.kv_blocks_used, 0);
    /* flush empties the cache */
    RW_ASSERT_OK(rw_engine_flush_cache(e, &err), &err);
    rw_engine_stats_get(e, &st);
    assert_int_equal(st.kv_blocks_cached, 0);
    rw_engine_destroy(e);
}

/* ------------------------------------------------------------------------------------------ */
static void test_add_ex_validation(void **state) {
    ctx *c = *state;
    rw_err err = {0};
    rw_engine *e;
    RW_ASSERT_OK(rw_engine_create(c->m, NULL, &e, &err), &err);
    rw_sampling sp = rw_sampling_default();
    int32_t p[5] = {1, 2, 3, 4, 5};
    rw_request_opts ro = {.n_samples = 3};
    RW_ASSERT_OK(rw_engine_add_ex(e, 10, p, 5, &sp, &ro, &err), &err);
    /* ids 10..12 are taken: 8..10 collide at 10 */
    assert_int_equal(rw_engine_add_ex(e, 8, p, 5, &sp, &ro, &err), RW_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "id 10 "));
    ro = (rw_request_opts){.n_score = 5};
    assert_int_equal(rw_engine_add_ex(e, 20, p, 5, &sp, &ro, &err), RW_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "n_score"));
    ro = (rw_request_opts){.n_score = 2, .n_samples = 2};
    assert_int_equal(rw_engine_add_ex(e, 21, p, 5, &sp, &ro, &err), RW_E_INVALID_ARG);
    ro = (rw_request_opts){.routing_weights = true};
    assert_int_equal(rw_engine_add_ex(e, 22, p, 5, &sp, &ro, &err), RW_E_INVALID_ARG);
    ro = (rw_request_opts){.prompt_logprobs = true};
    assert_int_equal(rw_engine_add_ex(e, 23, p, 5, &sp, &ro, &err), RW_E_INVALID_ARG);
    sp.logprob_mode = 7;
    assert_int_equal(rw_engine_add_ex(e, 24, p, 5, &sp, NULL, &err), RW_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "logprob_mode"));
    /* aborting a sample that waits for its first sibling's prefill, then the first */
    rw_engine_stats st;
    rw_engine_stats_get(e, &st);
    assert_int_equal(st.waiting, 3);
    RW_ASSERT_OK(rw_engine_abort(e, 11, &err), &err);
    RW_ASSERT_OK(rw_engine_abort(e, 10, &err), &err); /* 12 now runs on its own */
    RW_ASSERT_OK(rw_engine_run(e, &err), &err);
    int n = 0;
    rw_output *o;
    while ((o = rw_engine_pop_output(e))) {
        assert_int_equal(o->finish, o->id == 12 ? RW_FINISH_LENGTH : RW_FINISH_ABORT);
        n++;
        rw_output_free(o);
    }
    assert_int_equal(n, 3);
    rw_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_manager),
        cmocka_unit_test(test_add_ex_validation),
        cmocka_unit_test(test_n_samples),
        cmocka_unit_test(test_sample_lengths),
        cmocka_unit_test(test_multi_turn),
        cmocka_unit_test(test_weight_commit),
        cmocka_unit_test(test_eviction_tiny_budget),
    };
    return cmocka_run_group_tests(tests, rw_fixture_model_setup, rw_fixture_model_teardown);
}
