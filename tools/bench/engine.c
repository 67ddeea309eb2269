/* engine.c - `rw-bench decode` (G1, G2, G3 and the rw side of G5) and `rw-bench prefill` (G4),
 * measured through the worker's public engine API on the CUDA backend, TP1 on one GPU, with the
 * benchmarked config's weights drawn at random on the GPU and written through the weight set's
 * apply path (rw_wset_apply_batch: slicing, quantize on load, packing - as an update would).
 *
 * decode: for each context length, one batch of requests is prefilled (its KV cache is real),
 * then the batch is cut down request by request (aborts) so every batch size of the sweep is timed
 * on the same cache: warm-up steps, then `steps` engine steps, each timed from the call to a
 * device synchronize. Tokens per second = batch / median step time; the tokens actually generated
 * are counted from the engine's stats and reported beside it. The ceiling is the memory floor:
 * the bytes a step must read (attention and router weights, the lm_head, the distinct experts the
 * batch touches in expectation under uniform top-k routing, E (1 - (1 - k/E)^B) per layer, and the
 * KV cache of every sequence) over the HBM copy bandwidth measured in the same run.
 *
 * generate: B prompts of P tokens, N new tokens each (greedy, no stop), timed from the first
 * add to the last token: output tokens per second, the quantity tools/peer/hf_generate.py reports
 * for the same prompts (rwb_prompt_token) - their ratio is G5.
 *
 * prefill: nprompt prompts of plen tokens (max_new_tokens 1), timed from the first add to idle;
 * achieved TFLOP/s counts the FLOPs of the model's GEMMs only (attention's score and value
 * products are not counted, so the ratio understates the work done), against a cuBLASLt bf16
 * GEMM 8192^3 measured in the same run and against cuBLASLt on the model's own GEMM shapes.
 *
 * Beside the engine path, the forward-level benchmarks (forward.h: rwb_fwd_decode and
 * rwb_fwd_prefill, one forward pass on a synthetic KV cache, no scheduler) are run at the target
 * points and re-emitted as *_forward lines (forward_lines.c), so the engine's overhead shows as
 * the difference between the two. */
#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef RWB_HAVE_WORKER
#include "engine.h"
#include "forward.h"

typedef struct eng_state {
    rw_model *m;
    bool quant;      /* m was made from cfg_q */
    double hbm_gbps; /* measured in this run; 0 = not yet */
    double g1_tok_s; /* bf16 decode at the G1 point, for G3 */
} eng_state;

static eng_state *state(rwb_ctx *c) {
    if (!c->engine_state) c->engine_state = calloc(1, sizeof(eng_state));
    return c->engine_state;
}

void rwb_engine_release(rwb_ctx *c) {
    eng_state *s = c->engine_state;
    if (!s) return;
    rw_model_destroy(s->m);
    free(s);
    c->engine_state = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Random weights on the GPU through the apply path                                             */
/* ------------------------------------------------------------------------------------------ */
typedef struct wlist {
    const rw_config *cfg;
    rw_wname *w;
    size_t n, cap;
} wlist;

static rw_status collect(const rw_wname *w, void *vctx) {
    wlist *l = vctx;
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 1024;
        rw_wname *p = realloc(l->w, nc * sizeof *p);
        if (!p) return RW_E_OOM;
        l->w = p;
        l->cap = nc;
    }
    l->w[l->n++] = *w;
    return RW_OK;
}

static bool is_norm(rw_wkind k) {
    return k == RW_W_INPUT_NORM || k == RW_W_POST_NORM || k == RW_W_FINAL_NORM ||
           k == RW_W_Q_NORM || k == RW_W_K_NORM;
}

#define FILL_NAME 192
typedef struct fill_batch {
    rw_piece *p;
    char (*names)[FILL_NAME];
    bool *norm;
    size_t n;
    size_t used;
} fill_batch;

static rw_status fill_flush(rw_wset *ws, fill_batch *b, uint8_t *scratch, uint64_t seed,
                            rw_stream s, rw_err *err) {
    if (b->n == 0) return RW_OK;
    /* weights N(0, 0.02)-like, norms 1 + 0.1 N(0, 1)-like, as rw_model_load_random draws them */
    RW_CHECK(rwb_fill_bf16(scratch, b->used / 2, seed, 0.0f, 0.02f, s, err));
    for (size_t i = 0; i < b->n; i++)
        if (b->norm[i])
            RW_CHECK(rwb_fill_bf16((void *)b->p[i].data,
                                   (uint64_t)rw_shape_numel(b->p[i].ndim, b->p[i].shape),
                                   seed ^ (0x9e37ull * (i + 1)), 1.0f, 0.1f, s, err));
    RW_CHECK(rw_wset_apply_batch(ws, b->p, b->n, s, err));
    RW_CHECK(rw_stream_sync(s, err));
    b->n = 0;
    b->used = 0;
    return RW_OK;
}

static rw_status fill_random(rw_model *m, int dev, uint64_t seed, rw_err *err) {
    const rw_config *cfg = rw_model_config(m);
    rw_wset *ws = rw_model_wset(m);
    wlist l = {cfg, NULL, 0, 0};
    fill_batch b = {0};
    uint8_t *scratch = NULL;
    rw_stream s = NULL;
    rw_status st = rw_config_for_each_weight(cfg, collect, &l);
    if (st != RW_OK) {
        free(l.w);
        RW_FAIL(err, st, "random weights: listing the weights failed");
    }
    size_t cap = 1ull << 30, largest = 0;
    for (size_t i = 0; i < l.n; i++) {
        int nd;
        int64_t sh[RW_MAX_DIMS];
        RW_CHECKGOTO(rw_config_weight_shape(cfg, &l.w[i], &nd, sh, err), st, out);
        size_t bytes = (size_t)rw_shape_numel(nd, sh) * 2;
        if (bytes > largest) largest = bytes;
    }
    if (largest + 256 > cap) cap = largest + 256;
    b.p = calloc(l.n, sizeof *b.p);
    b.names = calloc(l.n, sizeof *b.names);
    b.norm = calloc(l.n, sizeof *b.norm);
    if (!b.p || !b.names || !b.norm) {
        st = RW_ERR(err, RW_E_OOM, "random weights: out of memory");
        goto out;
    }
    RW_CHECKGOTO(rw_cuda_set_device(dev, err), st, out);
    RW_CHECKGOTO(rw_stream_create(&s, err), st, out);
    RW_CHECKGOTO(rw_dev_malloc(cap, (void **)&scratch, err), st, out);
    rw_wset_mark_clear(ws);
    uint64_t batch_no = 0;
    for (size_t i = 0; i < l.n; i++) {
        rw_piece *p = &b.p[b.n];
        memset(p, 0, sizeof *p);
        RW_CHECKGOTO(rw_config_weight_shape(cfg, &l.w[i], &p->ndim, p->shape, err), st, out);
        size_t bytes = (size_t)rw_shape_numel(p->ndim, p->shape) * 2;
        size_t off = (b.used + 255) & ~(size_t)255;
        if (off + bytes > cap) {
            RW_CHECKGOTO(fill_flush(ws, &b, scratch, seed + 1000003ull * ++batch_no, s, err), st,
                         out);
            off = 0;
            p = &b.p[0];
            memset(p, 0, sizeof *p);
            RW_CHECKGOTO(rw_config_weight_shape(cfg, &l.w[i], &p->ndim, p->shape, err), st, out);
        }
        rw_name_format(&l.w[i], b.names[b.n], FILL_NAME);
        p->name = b.names[b.n];
        p->dtype = RW_DTYPE_BF16;
        p->shard_dim = -1;
        p->layout = RW_PIECE_PLAIN;
        p->data = scratch + off;
        p->place = RW_PLACE_DEVICE;
        b.norm[b.n] = is_norm(l.w[i].kind);
        b.n++;
        b.used = off + bytes;
    }
    RW_CHECKGOTO(fill_flush(ws, &b, scratch, seed + 1000003ull * ++batch_no, s, err), st, out);
    char missing[512];
    if (!rw_wset_complete(ws, missing, sizeof missing))
        st = RW_ERR(err, RW_E_INTERNAL, "random weights: incomplete after the fill: %s", missing);
out:
    if (s) rw_stream_sync(s, NULL);
    rw_dev_free(scratch);
    rw_stream_destroy(s);
    free(b.p);
    free(b.names);
    free(b.norm);
    free(l.w);
    return st;
}

rw_status rwb_engine_model(rwb_ctx *c, bool quant, rw_model **out, rw_err *err) {
    eng_state *es = state(c);
    if (!es) RW_FAIL(err, RW_E_OOM, "out of memory");
    if (es->m && es->quant == quant) {
        *out = es->m;
        return RW_OK;
    }
    rw_model_destroy(es->m);
    es->m = NULL;
    rw_model_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.backend = RW_BACKEND_CUDA;
    mo.device = c->o.gpu0;
    mo.tp = 1;
    mo.rank = 0;
    mo.comm = NULL;
    mo.precision = (rw_precision)c->o.precision;
    double t0 = rw_now();
    fprintf(stderr, "rw-bench: building the %s model on GPU %d\n",
            quant ? "mxfp8-last-8-bf16" : "bf16", c->o.gpu0);
    RW_CHECK(rw_model_create(quant ? &c->cfg_q : &c->cfg, &mo, &es->m, err));
    rw_status st = fill_random(es->m, c->o.gpu0, c->o.seed + (quant ? 7 : 0), err);
    if (st != RW_OK) {
        rw_model_destroy(es->m);
        es->m = NULL;
        return st;
    }
    es->quant = quant;
    fprintf(stderr, "rw-bench: model ready in %.1f s (%.2f GB of weights)\n", rw_now() - t0,
            (double)rw_wset_bytes(rw_model_wset(es->m)) / 1e9);
    *out = es->m;
    return RW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Memory floor of a decode step                                                                */
/* ------------------------------------------------------------------------------------------ */
static double tbytes(const rw_tensor *t) {
    return t->data && t->ndim > 0 ? (double)rw_tensor_nbytes(t) : 0;
}

rwb_floor rwb_floor_of(rw_model *m) {
    rwb_floor f;
    memset(&f, 0, sizeof f);
    const rw_config *cfg = rw_model_config(m);
    rw_wset *ws = rw_model_wset(m);
    f.E = cfg->num_experts;
    f.k = cfg->top_k;
    for (int l = 0; l < cfg->num_layers; l++) {
        const rw_layer_weights *lw = rw_wset_layer(ws, l);
        f.fixed += tbytes(&lw->input_norm) + tbytes(&lw->post_norm) + tbytes(&lw->q_norm) +
                   tbytes(&lw->k_norm) + tbytes(&lw->q) + tbytes(&lw->k) + tbytes(&lw->v) +
                   tbytes(&lw->o) + tbytes(&lw->router);
        if (lw->attn_fmt != RW_WFMT_BF16)
            f.fixed += tbytes(&lw->q_scale) + tbytes(&lw->k_scale) + tbytes(&lw->v_scale) +
                       tbytes(&lw->o_scale);
        double ex = tbytes(&lw->w13) + tbytes(&lw->w2);
        if (lw->moe_fmt != RW_WFMT_BF16) ex += tbytes(&lw->w13_scale) + tbytes(&lw->w2_scale);
        f.per_expert += ex / f.E;
    }
    rw_tensor lm = rw_wset_lm_head(ws), fn = rw_wset_final_norm(ws);
    f.fixed += tbytes(&lm) + tbytes(&fn);
    f.per_row = (double)cfg->hidden_size * 2.0;
    /* bf16 K and V of every layer (the CUDA backend's cache); replaced by the engine's own count
     * when its stats give one */
    f.kv_per_token = (double)cfg->num_layers * 2.0 * cfg->num_kv_heads * cfg->head_dim * 2.0;
    return f;
}

double rwb_floor_bytes(const rwb_floor *f, int batch, double ctx, double *experts) {
    double d = f->E * (1.0 - pow(1.0 - (double)f->k / f->E, batch));
    if (experts) *experts = d;
    return f->fixed + f->per_row * batch + f->per_expert * d + f->kv_per_token * batch * ctx;
}

rw_status rwb_engine_hbm(rwb_ctx *c, const char *bench, double *gbps, rw_err *err) {
    eng_state *es = state(c);
    if (!es) RW_FAIL(err, RW_E_OOM, "out of memory");
    if (es->hbm_gbps <= 0) {
        /* measured with no engine model resident (the next rwb_engine_model builds it again),
         * which leaves the copy's buffers room beside a full KV cache. The copy waits for its
         * rate to settle (settle.h): right after the model is freed the driver clears its
         * memory, and a copy timed then read 3.80-3.81 TB/s on an H200 against 4.2 otherwise,
         * which made the decode ratios of `prefill,decode` runs read higher than those of
         * `decode` runs (docs/BENCHMARKS.md, thirteenth and twenty-fourth sessions) */
        if (es->m) {
            fprintf(stderr, "rw-bench: releasing the model to measure the HBM copy ceiling\n");
            rw_model_destroy(es->m);
            es->m = NULL;
        }
        RW_CHECK(rwb_measure_hbm(c, c->o.gpu0, bench, &es->hbm_gbps, err));
    }
    *gbps = es->hbm_gbps;
    return RW_OK;
}

void rwb_free_outputs(rw_engine *e) {
    rw_output *o;
    while ((o = rw_engine_pop_output(e))) rw_output_free(o);
}

/* Queues n prompts of plen tokens (rwb_prompt_token), ids id0.., `new_tokens` each; temperature
 * 0 is greedy, 1 the RL rollout setting (full-vocabulary sampling). No stop tokens. With
 * `routes` each records its routed experts (rw_request_opts.routed_experts). */
static rw_status add_prompts(rwb_ctx *c, rw_engine *e, const rw_config *cfg, uint64_t id0,
                             int n, int plen, int new_tokens, float temperature, bool routes,
                             rw_err *err) {
    const rw_request_opts ro = {.routed_experts = routes};
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)plen);
    if (!toks) RW_FAIL(err, RW_E_OOM, "out of memory");
    rw_sampling sp = rw_sampling_default();
    sp.max_new_tokens = new_tokens;
    sp.temperature = temperature;
    sp.seed = c->o.seed;
    rw_status st = RW_OK;
    for (int i = 0; i < n && st == RW_OK; i++) {
        for (int t = 0; t < plen; t++)
            toks[t] = rwb_prompt_token(c->o.seed, i, t, cfg->vocab_size);
        st = rw_engine_add_ex(e, id0 + (uint64_t)i, toks, plen, &sp, &ro, err);
    }
    free(toks);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* generate: the rw side of G5                                                                  */
/* ------------------------------------------------------------------------------------------ */
/* FNV-1a over an output's request id, tokens and logprob bits: a variant of the kernels that
 * claims the same bits shows the same digest on the same run (the prompts and greedy sampling
 * fix everything else). */
static uint64_t output_digest(const rw_output *o) {
    uint64_t h = 1469598103934665603ull;
    const uint64_t words[2] = {o->id, (uint64_t)o->n};
    const unsigned char *b = (const unsigned char *)words;
    for (size_t i = 0; i < sizeof words; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    b = (const unsigned char *)o->tokens;
    for (size_t i = 0; i < sizeof(int32_t) * (size_t)o->n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    b = (const unsigned char *)o->logprobs;
    for (size_t i = 0; b && i < sizeof(float) * (size_t)o->n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void run_generate(rwb_ctx *c, rw_model *m, double gbps) {
    rw_err err = {0};
    const rw_config *cfg = rw_model_config(m);
    const int B = c->o.gen_batch, P = c->o.gen_prompt, N = c->o.gen_new;
    const int reps = c->o.gen_reps < RWB_MAX_SAMPLES ? c->o.gen_reps : RWB_MAX_SAMPLES;
    double smp[RWB_MAX_SAMPLES];
    rw_engine *e = NULL;
    rw_engine_opts eo = rw_engine_opts_default();
    eo.max_running = B;
    eo.max_batch_tokens = B > 8192 ? B : 8192;
    eo.max_seq_len = P + N + 16;
    /* every repetition sends the same prompts (the peer's): with the prefix cache on, the ones
     * after the first would reuse the first one's prompt KV, which the peer computes each time */
    eo.prefix_sharing = false;
    if (rw_engine_create(m, &eo, &e, &err) != RW_OK) {
        rwb_emit_error(c, "decode", "generate_bf16", &err);
        return;
    }
    int64_t toks = 0;
    int done_reps = 0;
    uint64_t digest = 0;
    for (int r = -1; r < reps; r++) {
        int n_new = r < 0 ? (N < 8 ? N : 8) : N;
        uint64_t id0 = (uint64_t)(r + 2) * 1000000ull;
        double t0 = rw_now();
        if (add_prompts(c, e, cfg, id0, B, P, n_new, 0.0f, false, &err) != RW_OK ||
            rw_engine_run(e, &err) != RW_OK || rwb_device_sync(c->o.gpu0, &err) != RW_OK) {
            rwb_emit_error(c, "decode", "generate_bf16", &err);
            rw_engine_abort_all(e);
            rwb_free_outputs(e);
            rw_engine_destroy(e);
            return;
        }
        double t1 = rw_now();
        rw_output *o;
        int64_t got = 0;
        digest = 0; /* the outputs' digests summed: the order they come out in does not count */
        while ((o = rw_engine_pop_output(e))) {
            got += o->n;
            digest += output_digest(o);
            rw_output_free(o);
        }
        if (r >= 0) {
            smp[r] = t1 - t0;
            toks += got;
            done_reps++;
            if (rwb_out_of_time(c)) break;
        }
    }
    rw_engine_destroy(e);
    rwb_stats s = rwb_stats_of(smp, done_reps);
    rwb_floor f = rwb_floor_of(m);
    /* decode-only floor at the mean context of the run (prefill time not counted) */
    double fb = rwb_floor_bytes(&f, B, P + N / 2.0, NULL);
    double floor_tok_s = B / (fb / (gbps * 1e9));
    json_t *j = rwb_line(c, "decode", "generate_bf16");
    rwb_set_int(j, "batch", B);
    rwb_set_int(j, "prompt", P);
    rwb_set_int(j, "new", N);
    rwb_set_int(j, "tokens", (int64_t)B * N);
    rwb_set_int(j, "generated_tokens", toks);
    rwb_set_int(j, "max_batch_tokens", eo.max_batch_tokens);
    json_object_set_new(j, "prefix_sharing", json_false());
    rwb_set_str(j, "sampling", "greedy");
    char dg[24];
    snprintf(dg, sizeof dg, "%016llx", (unsigned long long)digest);
    rwb_set_str(j, "outputs_digest", dg); /* the last repetition's */
    rwb_line_stats(j, &s);
    rwb_line_rate(j, (double)B * N / s.median, "tok/s", floor_tok_s,
                  "decode memory floor at this batch and the mean context (prefill not counted)");
    rwb_line_target(j, "G5", "rw generate tok/s >= 20 x peer (transformers generate) tok/s", -1);
    if (toks != (int64_t)B * N * done_reps)
        rwb_set_str(j, "warning", "generated token count differs from batch x new x reps");
    rwb_emit(j);
}

/* ------------------------------------------------------------------------------------------ */
/* decode sweep                                                                                 */
/* ------------------------------------------------------------------------------------------ */
static int cmp_desc(const void *a, const void *b) { return *(const int *)b - *(const int *)a; }

static json_t *point_params(int batch, int ctx) {
    json_t *p = json_object();
    json_object_set_new(p, "batch", json_integer(batch));
    json_object_set_new(p, "ctx", json_integer(ctx));
    return p;
}

/* Mean number of tokens generated so far by requests 0..n-1 (their context is ctx + this). */
static double mean_progress(const rw_engine *e, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) {
        int p = rw_engine_progress(e, (uint64_t)i);
        sum += p > 0 ? p : 0;
    }
    return n ? sum / n : 0;
}

/* One context length: prefill the largest batch that fits, then time every batch size. With
 * `routes` the requests record their routed experts (the cost of return_routed_experts). */
static void decode_ctx(rwb_ctx *c, rw_model *m, bool quant, int ctx, const int *batches, int nb,
                       double gbps, bool routes) {
    rw_err err = {0};
    const char *what = routes ? "decode_bf16_routes" : quant ? "decode_mxfp8" : "decode_bf16";
    const rw_config *cfg = rw_model_config(m);
    const int steps = c->o.steps < RWB_MAX_SAMPLES ? c->o.steps : RWB_MAX_SAMPLES;
    rw_engine *e = NULL;
    rw_engine_opts eo = rw_engine_opts_default();
    eo.max_running = batches[0];
    eo.max_batch_tokens = batches[0] > 8192 ? batches[0] : 8192;
    /* new tokens per request: the sweep's steps, plus the tokens the first requests generate
     * while the later ones are still being prefilled (about one per prefill step), plus margin */
    const int slack = nb * (c->o.warmup + steps) +
                      (int)((int64_t)batches[0] * ctx / eo.max_batch_tokens) + 16;
    eo.max_seq_len = ctx + slack + 16;
    if (rw_engine_create(m, &eo, &e, &err) != RW_OK) {
        rwb_emit_error(c, "decode", what, &err);
        return;
    }
    rw_engine_stats es;
    rw_engine_stats_get(e, &es);
    rwb_floor f = rwb_floor_of(m);
    if (es.kv_blocks_total > 0 && es.kv_block_size > 0 && es.kv_bytes > 0)
        f.kv_per_token = (double)es.kv_bytes / ((double)es.kv_blocks_total * es.kv_block_size);
    const int bs = es.kv_block_size > 0 ? es.kv_block_size : 1;
    const int64_t per_seq = (ctx + slack + bs - 1) / bs;
    const int64_t fit = per_seq > 0 ? es.kv_blocks_total / per_seq : 0;
    int first = 0;
    while (first < nb && batches[first] > fit) {
        char why[160];
        snprintf(why, sizeof why, "KV cache holds %lld sequences of %d + %d tokens",
                 (long long)fit, ctx, slack);
        rwb_emit_skip(c, "decode", what, why, point_params(batches[first], ctx));
        first++;
    }
    if (first == nb) {
        rw_engine_destroy(e);
        return;
    }
    int cur = batches[first];
    double t0 = rw_now();
    if (add_prompts(c, e, cfg, 0, cur, ctx, slack, 1.0f, routes, &err) != RW_OK) goto fail;
    /* prefill until every request has its first token */
    for (;;) {
        int done = 0;
        for (int i = 0; i < cur; i++) done += rw_engine_progress(e, (uint64_t)i) >= 1;
        if (done == cur) break;
        if (rw_now() - t0 > c->o.setup_timeout_s) {
            RW_ERR(&err, RW_E_TIMEOUT, "prefill of %d x %d tokens took over %.0f s", cur, ctx,
                   c->o.setup_timeout_s);
            goto fail;
        }
        if (rw_engine_step(e, &err) != RW_OK) goto fail;
    }
    if (rwb_device_sync(c->o.gpu0, &err) != RW_OK) goto fail;
    {
        double dt = rw_now() - t0;
        json_t *j = rwb_line(c, "decode", quant ? "setup_prefill_mxfp8" : "setup_prefill_bf16");
        rwb_set_str(j, "role", "info");
        rwb_set_int(j, "batch", cur);
        rwb_set_int(j, "ctx", ctx);
        rwb_set_int(j, "tokens", (int64_t)cur * ctx);
        rwb_stats s = rwb_stats_of(&dt, 1);
        rwb_line_stats(j, &s);
        rwb_line_rate(j, (double)cur * ctx / dt, "tok/s", 0, NULL);
        rwb_emit(j);
    }
    for (int bi = first; bi < nb; bi++) {
        const int B = batches[bi];
        if (rwb_out_of_time(c)) {
            rwb_emit_skip(c, "decode", what, "time limit reached", point_params(B, ctx));
            continue;
        }
        for (int i = B; i < cur; i++) rw_engine_abort(e, (uint64_t)i, NULL);
        cur = B;
        rwb_free_outputs(e);
        for (int w = 0; w < c->o.warmup; w++)
            if (rw_engine_step(e, &err) != RW_OK) goto fail;
        if (rwb_device_sync(c->o.gpu0, &err) != RW_OK) goto fail;
        double smp[RWB_MAX_SAMPLES];
        const double g0 = mean_progress(e, B);
        rw_engine_stats a, z;
        rw_engine_stats_get(e, &a);
        int done_steps = 0;
        /* RW_BENCH_NCU_ENGINE=B:C: the first timed engine step at batch B, context C runs
         * between the profiler's start and stop, so `ncu --profile-from-start off` sees that one
         * step (tools/gpu/kernel-times.sh; RW_BENCH_NCU_BATCH is the forward entry's) */
        const char *ncu_pt = getenv("RW_BENCH_NCU_ENGINE");
        int ncu_b = 0, ncu_c = 0;
        const bool ncu_step = ncu_pt && sscanf(ncu_pt, "%d:%d", &ncu_b, &ncu_c) == 2 &&
                              ncu_b == B && ncu_c == ctx;
        for (int s = 0; s < steps; s++) {
            double s0 = rw_now();
            if (ncu_step && s == 0) rwb_profiler(true);
            if (rw_engine_step(e, &err) != RW_OK) goto fail;
            if (rwb_device_sync(c->o.gpu0, &err) != RW_OK) goto fail;
            if (ncu_step && s == 0) rwb_profiler(false);
            smp[s] = rw_now() - s0;
            done_steps++;
            if (done_steps >= 5 && rwb_out_of_time(c)) break; /* fewer reps, still a median */
        }
        rw_engine_stats_get(e, &z);
        const double g1 = mean_progress(e, B);
        const int64_t gen = z.generated_tokens - a.generated_tokens;
        const int nsteps = done_steps;
        const double ctx_mean = ctx + (g0 + g1) / 2.0;
        rwb_stats st = rwb_stats_of(smp, nsteps);
        double experts;
        double fb = rwb_floor_bytes(&f, B, ctx_mean, &experts);
        double floor_s = fb / (gbps * 1e9);
        json_t *j = rwb_line(c, "decode", what);
        rwb_set_int(j, "batch", B);
        rwb_set_int(j, "ctx", ctx);
        rwb_set_num(j, "ctx_mean", ctx_mean);
        rwb_set_int(j, "tokens", (int64_t)B * nsteps);
        rwb_set_int(j, "generated_tokens", gen);
        rwb_set_int(j, "preemptions", z.preemptions - a.preemptions);
        rwb_line_stats(j, &st);
        rwb_set_num(j, "ms_per_step", st.median * 1e3);
        /* the engine's own host work a step (scheduling, bookkeeping), beside the model's calls
         * (forward, sampling: the device's time included), means over the timed steps */
        if (z.steps > a.steps) {
            const double n = (double)(z.steps - a.steps);
            rwb_set_num(j, "host_ms_per_step", ((z.step_s - a.step_s) - (z.model_s - a.model_s)) /
                                                   n * 1e3);
            rwb_set_num(j, "model_ms_per_step", (z.model_s - a.model_s) / n * 1e3);
        }
        rwb_set_str(j, "sampling", "temperature 1, full vocabulary");
        double achieved = B / st.median;
        rwb_line_rate(j, achieved, "tok/s", B / floor_s,
                      "memory floor: bytes read per step / HBM copy bandwidth (same run)");
        rwb_set_num(j, "floor_bytes", fb);
        rwb_set_num(j, "floor_s", floor_s);
        rwb_set_num(j, "floor_experts_per_layer", experts);
        rwb_set_num(j, "hbm_gbps", gbps);
        if (gen != (int64_t)B * nsteps)
            rwb_set_str(j, "warning", "generated tokens differ from batch x steps");
        const bool g1pt = B == c->o.g1_batch && ctx == c->o.g1_ctx;
        if (routes) {
            const double g1 = state(c)->g1_tok_s;
            if (g1 > 0) rwb_set_num(j, "vs_plain", achieved / g1);
            rwb_set_str(j, "routes", "return_routed_experts: ids of every layer copied out per step");
            if (g1pt)
                rwb_line_target(j, "routes", "decode tok/s with routed experts >= 0.98 x without",
                                g1 > 0 ? achieved >= 0.98 * g1 : -1);
        } else if (!quant && g1pt) {
            state(c)->g1_tok_s = achieved;
            rwb_line_target(j, "G1", "decode tok/s >= 0.85 x memory floor",
                            achieved >= 0.85 * (B / floor_s));
        } else if (!quant && B == 1 && ctx == c->o.g1_ctx) {
            rwb_set_num(j, "target_max_s", 2.5e-3);
            rwb_line_target(j, "G2",
                            "decode latency at batch 1 <= 2.5 ms per token and >= 0.6 x memory "
                            "floor",
                            st.median <= 2.5e-3 && achieved >= 0.6 * (B / floor_s));
        } else if (quant && g1pt) {
            double g1 = state(c)->g1_tok_s;
            if (g1 > 0) rwb_set_num(j, "vs_bf16", achieved / g1);
            rwb_line_target(j, "G3",
                            "mxfp8-last-8-bf16 decode tok/s >= 0.75 x its own memory floor and "
                            ">= 1.25 x bf16 (G1)",
                            g1 > 0 ? achieved >= 0.75 * (B / floor_s) && achieved >= 1.25 * g1
                                   : -1);
        }
        rwb_emit(j);
    }
    rw_engine_abort_all(e);
    rwb_free_outputs(e);
    rw_engine_destroy(e);
    return;
fail:
    rwb_emit_error(c, "decode", what, &err);
    rw_engine_abort_all(e);
    rwb_free_outputs(e);
    rw_engine_destroy(e);
}

void rwb_mode_decode(rwb_ctx *c) {
    rw_err err = {0};
    double gbps = 0;
    rw_model *m = NULL;
    if (rwb_engine_hbm(c, "decode", &gbps, &err) != RW_OK) {
        rwb_emit_error(c, "decode", "hbm_copy", &err);
        return;
    }
    if (rwb_engine_model(c, false, &m, &err) != RW_OK) {
        rwb_emit_error(c, "decode", "decode_bf16", &err);
        return;
    }
    run_generate(c, m, gbps);
    int batches[RWB_MAX_LIST];
    int nb = c->o.nbatches;
    memcpy(batches, c->o.batches, sizeof(int) * (size_t)nb);
    qsort(batches, (size_t)nb, sizeof(int), cmp_desc);
    for (int i = 0; i < c->o.nctxs; i++)
        decode_ctx(c, m, false, c->o.ctxs[i], batches, nb, gbps, false);
    if (c->o.routes) { /* the G1 point again, every request returning its routed experts */
        int one[1] = {c->o.g1_batch};
        decode_ctx(c, m, false, c->o.g1_ctx, one, 1, gbps, true);
    }
    if (!c->o.no_quant && rwb_out_of_time(c)) {
        rwb_emit_skip(c, "decode", "decode_mxfp8", "time limit reached", NULL);
    } else if (!c->o.no_quant) {
        if (rwb_engine_model(c, true, &m, &err) != RW_OK) {
            rwb_emit_error(c, "decode", "decode_mxfp8", &err);
        } else if (c->o.full) {
            decode_ctx(c, m, true, c->o.g1_ctx, batches, nb, gbps, false);
        } else {
            int one[1] = {c->o.g1_batch};
            decode_ctx(c, m, true, c->o.g1_ctx, one, 1, gbps, false);
        }
    }
    /* the worker's forward-level entry point builds its own model: free ours first */
    rwb_engine_release(c);
    if (c->o.no_forward) return;
    double g1_fwd = 0;
    if (rwb_out_of_time(c)) {
        rwb_emit_skip(c, "decode", "decode_forward_bf16", "time limit reached", NULL);
        return;
    }
    rwb_fwd_decode_lines(c, false, c->o.g1_batch, c->o.g1_ctx, "G1/forward", &g1_fwd);
    rwb_fwd_decode_lines(c, false, 1, c->o.g1_ctx, "G2/forward", NULL);
    if (!c->o.no_quant) rwb_fwd_decode_lines(c, true, c->o.g1_batch, c->o.g1_ctx, "G3/forward", &g1_fwd);
}

/* ------------------------------------------------------------------------------------------ */
/* prefill                                                                                      */
/* ------------------------------------------------------------------------------------------ */
typedef struct gemm_shape {
    const char *name;
    int64_t m, n, k; /* C[m x n] = W[m x k] x X[k x n]: m output features, n tokens */
    int batch;
    int per_layer;   /* 1: once per layer; 0: once per forward */
} gemm_shape;

void rwb_mode_prefill(rwb_ctx *c) {
    rw_err err = {0};
    const rw_config *cfg = &c->cfg;
    const int64_t T = (int64_t)c->o.nprompt * c->o.plen;
    const int64_t H = cfg->hidden_size, I = cfg->moe_intermediate, E = cfg->num_experts;
    const int64_t qkv = (int64_t)(cfg->num_heads + 2 * cfg->num_kv_heads) * cfg->head_dim;
    const int64_t per_expert = T * cfg->top_k / E; /* tokens per expert under uniform routing */
    const gemm_shape shapes[] = {
        {"qkv_proj", qkv, T, H, 1, 1},
        {"o_proj", H, T, (int64_t)cfg->num_heads * cfg->head_dim, 1, 1},
        {"router", E, T, H, 1, 1},
        {"experts_gate_up", 2 * I, per_expert, H, (int)E, 1},
        {"experts_down", H, per_expert, I, (int)E, 1},
        {"lm_head", cfg->vocab_size, c->o.nprompt, H, 1, 0},
    };
    const int nshape = (int)(sizeof shapes / sizeof shapes[0]);

    /* 1. GEMM ceilings in this run: the 8192^3 reference and the model's shapes */
    rwb_gemm *g = NULL;
    double t8192 = 0, shapes_s = 0, flops = 0;
    bool shapes_ok = true;
    if (rwb_gemm_create(c->o.gpu0, &g, &err) != RW_OK) {
        rwb_emit_error(c, "prefill", "gemm_bf16_8192", &err);
        return;
    }
    if (rwb_measure_gemm(c, g, "prefill", "gemm_bf16_8192", 8192, 8192, 8192, 1, true, &t8192,
                         &err) != RW_OK) {
        rwb_emit_error(c, "prefill", "gemm_bf16_8192", &err);
        t8192 = 0;
    }
    for (int i = 0; i < nshape; i++) {
        const gemm_shape *s = &shapes[i];
        double f = 2.0 * (double)s->m * (double)s->n * (double)s->k * s->batch;
        double mult = s->per_layer ? cfg->num_layers : 1;
        flops += f * mult;
        char what[64];
        snprintf(what, sizeof what, "gemm_shape_%s", s->name);
        double t = 0;
        if (s->n < 1 ||
            rwb_measure_gemm(c, g, "prefill", what, s->m, s->n, s->k, s->batch, true, &t, &err) !=
                RW_OK) {
            if (s->n >= 1) rwb_emit_error(c, "prefill", what, &err);
            shapes_ok = false;
            continue;
        }
        shapes_s += t * mult;
    }
    rwb_gemm_destroy(g);
    const double ceil_8192 = t8192 > 0 ? 2.0 * 8192.0 * 8192.0 * 8192.0 / t8192 / 1e12 : 0;
    const double ceil_shapes = shapes_ok && shapes_s > 0 ? flops / shapes_s / 1e12 : 0;

    /* 2. the worker's forward-level entry point (its own model: ours must not be resident) */
    rwb_engine_release(c);
    rwb_fwd_prefill_lines(c, ceil_8192);

    /* 3. the engine's prefill */
    rw_model *m = NULL;
    if (rwb_engine_model(c, false, &m, &err) != RW_OK) {
        rwb_emit_error(c, "prefill", "prefill_bf16", &err);
        return;
    }
    rw_engine *e = NULL;
    rw_engine_opts eo = rw_engine_opts_default();
    eo.max_running = c->o.nprompt;
    eo.max_batch_tokens = c->o.prefill_max_tokens > 0 ? c->o.prefill_max_tokens : (int)T;
    eo.max_seq_len = c->o.plen + 16;
    /* the same prompts every repetition: with the prefix cache on, every repetition after the
     * warm-up found them cached and computed one token each (G4 read 20 ms for 16,384 tokens,
     * "5.9 x the GEMM peak", from 1037e73 to 3727598) */
    eo.prefix_sharing = false;
    if (rw_engine_create(m, &eo, &e, &err) != RW_OK) {
        rwb_emit_error(c, "prefill", "prefill_bf16", &err);
        return;
    }
    const int reps = c->o.prefill_reps < RWB_MAX_SAMPLES ? c->o.prefill_reps : RWB_MAX_SAMPLES;
    double smp[RWB_MAX_SAMPLES];
    int done_reps = 0;
    for (int r = -1; r < reps; r++) {
        double t0 = rw_now();
        if (add_prompts(c, e, cfg, (uint64_t)(r + 2) * 1000000ull, c->o.nprompt, c->o.plen, 1,
                        0.0f, false, &err) != RW_OK ||
            rw_engine_run(e, &err) != RW_OK || rwb_device_sync(c->o.gpu0, &err) != RW_OK) {
            rwb_emit_error(c, "prefill", "prefill_bf16", &err);
            rw_engine_abort_all(e);
            rwb_free_outputs(e);
            rw_engine_destroy(e);
            return;
        }
        double t1 = rw_now();
        rwb_free_outputs(e);
        if (r >= 0) {
            smp[r] = t1 - t0;
            done_reps++;
            if (done_reps >= 3 && rwb_out_of_time(c)) break;
        }
    }
    rw_engine_destroy(e);
    rwb_stats s = rwb_stats_of(smp, done_reps);
    /* G4 counts the model's FLOPs: the GEMMs and causal attention (q.k and p.v over the keys at
     * or before each query), each once */
    const double attn_flops = rwb_prefill_attn_flops(cfg, c->o.nprompt, c->o.plen);
    const double achieved = (flops + attn_flops) / s.median / 1e12;
    json_t *j = rwb_line(c, "prefill", "prefill_bf16");
    rwb_set_int(j, "tokens", T);
    rwb_set_int(j, "nprompt", c->o.nprompt);
    rwb_set_int(j, "plen", c->o.plen);
    rwb_set_int(j, "max_batch_tokens", eo.max_batch_tokens);
    rwb_set_num(j, "gemm_flops", flops);
    rwb_set_num(j, "attention_flops", attn_flops);
    json_object_set_new(j, "prefix_sharing", json_false());
    rwb_line_stats(j, &s);
    rwb_line_rate(j, achieved, "TFLOP/s", ceil_8192,
                  "cuBLASLt bf16 GEMM 8192^3 (same run); FLOPs of the model's GEMMs and "
                  "attention, each once");
    rwb_set_num(j, "achieved_gemm_only", flops / s.median / 1e12);
    rwb_set_num(j, "tok_per_s", (double)T / s.median);
    if (ceil_shapes > 0) { /* the GEMMs alone against cuBLASLt on the same shapes */
        rwb_set_num(j, "ceiling_shapes", ceil_shapes);
        rwb_set_num(j, "ratio_shapes", flops / s.median / 1e12 / ceil_shapes);
    }
    /* more than the GEMM peak is not a measurement of this prefill (the bug that a warm prefix
     * cache once hid here): no verdict then */
    const bool sane = ceil_8192 > 0 && achieved <= 1.1 * ceil_8192;
    if (ceil_8192 > 0 && !sane)
        rwb_set_str(j, "warning", "above the GEMM peak: not a measurement of prefill work");
    rwb_line_target(j, "G4", "prefill model TFLOP/s (GEMMs and attention) >= 0.45 x bf16 GEMM 8192^3",
                    sane ? achieved >= 0.45 * ceil_8192 : -1);
    rwb_emit(j);
}

#else /* no worker module in this build */

void rwb_engine_release(rwb_ctx *c) { (void)c; }

static void no_worker(rwb_ctx *c, const char *bench, const char *what) {
    rw_err err = {0};
    RW_ERR(&err, RW_E_UNSUPPORTED, "the worker module (engine API) is not in this build");
    rwb_emit_error(c, bench, what, &err);
}

void rwb_mode_decode(rwb_ctx *c) {
    rw_err err = {0};
    double gbps;
    if (rwb_measure_hbm(c, c->o.gpu0, "decode", &gbps, &err) != RW_OK)
        rwb_emit_error(c, "decode", "hbm_copy", &err);
    no_worker(c, "decode", "decode_bf16");
}

void rwb_mode_prefill(rwb_ctx *c) {
    rw_err err = {0};
    rwb_gemm *g = NULL;
    double t;
    if (rwb_gemm_create(c->o.gpu0, &g, &err) != RW_OK ||
        rwb_measure_gemm(c, g, "prefill", "gemm_bf16_8192", 8192, 8192, 8192, 1, true, &t,
                         &err) != RW_OK)
        rwb_emit_error(c, "prefill", "gemm_bf16_8192", &err);
    rwb_gemm_destroy(g);
    no_worker(c, "prefill", "prefill_bf16");
}
void rwb_mode_kernels(rwb_ctx *c) {
    no_worker(c, "kernels", "kernels");
}

int rwb_print_routing(const rw_config *cfg, uint64_t seed, long tokens) {
    (void)cfg, (void)seed, (void)tokens;
    fprintf(stderr, "rw-bench: --print-routing needs the worker module in this build\n");
    return 1;
}
#endif
