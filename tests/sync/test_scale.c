/* test_scale.c - the per-bucket host cost of an update does not grow with what the session has
 * already applied. A model with the 30B-A3B's tensor count (48 layers x 128 experts: 18,867
 * tensors) but tiny dims goes through the worker's whole per-bucket host path - the
 * update_weights request decoded from msgpack, the manifest read and checked, every piece
 * validated against the model, cut into ops with the written regions recorded, applied - in a
 * few thousand small buckets into a host weight set. The median time per piece of the last 10%
 * of the buckets must stay within a generous factor of the first 10%'s: a loose timing bound,
 * used only as a complexity check (anything linear in the pieces already applied - region lists
 * scanned per piece, a table rebuilt over every tensor - grows by orders of magnitude over the
 * run). The weights that arrive are compared with what was sent, and the session's stats count
 * every bucket and piece. */
#include "sync_util.h"

#include "rand.h"
#include "sync_internal.h"

#define LAYERS 48
#define EXPERTS 128
#define BUCKET (24u << 10) /* 6 expert tensors of 4 KiB each: ~3,200 buckets */

static const char *CFG_JSON =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", "
    "\"head_dim\": 32, \"hidden_size\": 64, \"intermediate_size\": 128, "
    "\"max_position_embeddings\": 512, \"moe_intermediate_size\": 32, \"norm_topk_prob\": true, "
    "\"num_attention_heads\": 2, \"num_experts_per_tok\": 2, \"num_hidden_layers\": %d, "
    "\"num_key_value_heads\": 1, \"num_experts\": %d, \"rms_norm_eps\": 1e-6, "
    "\"rope_theta\": 1000000.0, \"tie_word_embeddings\": false, \"vocab_size\": 128, "
    "\"decoder_sparse_step\": 1, \"mlp_only_layers\": []}";

/* The trainer side: every canonical tensor in one buffer, cut into buckets of whole tensors. */
typedef struct plan {
    const rw_config *cfg;
    rw_sync_manifest **m;
    uint64_t *base; /* offset of bucket i in buf */
    size_t n, cap;
    uint64_t total;
    rw_err *err;
} plan;

static rw_status plan_cb(const rw_wname *w, void *ctx) {
    plan *p = ctx;
    int nd;
    int64_t shape[RW_MAX_DIMS];
    RW_CHECK(rw_config_weight_shape(p->cfg, w, &nd, shape, p->err));
    char name[RW_SYNC_MAX_NAME];
    rw_name_format(w, name, sizeof name);
    uint64_t nb = 2;
    for (int d = 0; d < nd; d++)
        nb *= (uint64_t)shape[d];
    rw_sync_manifest *cur = p->n ? p->m[p->n - 1] : NULL;
    uint64_t at =
        cur ? (rw_sync_manifest_bytes(cur) + RW_SYNC_ALIGN - 1) / RW_SYNC_ALIGN * RW_SYNC_ALIGN : 0;
    if (!cur || at + nb > BUCKET) {
        if (p->n == p->cap) {
            p->cap = p->cap ? 2 * p->cap : 256;
            p->m = realloc(p->m, p->cap * sizeof *p->m);
            p->base = realloc(p->base, p->cap * sizeof *p->base);
            assert_non_null(p->m);
            assert_non_null(p->base);
        }
        p->base[p->n] = p->total;
        RW_CHECK(rw_sync_manifest_create(&p->m[p->n], p->err));
        cur = p->m[p->n++];
    }
    RW_CHECK(rw_sync_manifest_add(cur, name, RW_DTYPE_BF16, nd, shape, -1, 0, 0, RW_PIECE_PLAIN,
                                  NULL, p->err));
    uint64_t end = p->base[p->n - 1] + rw_sync_manifest_bytes(cur);
    p->total = (end + RW_SYNC_ALIGN - 1) / RW_SYNC_ALIGN * RW_SYNC_ALIGN;
    return RW_OK;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n) {
    qsort(v, n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One update_weights request over ZeroMQ framing, handled as the worker's control thread does. */
static void send_bucket(rw_sync_session *s, rw_mw *w, rw_mw *reply, const rw_sync_manifest *m,
                        const uint8_t *bytes, uint64_t id) {
    rw_err e;
    rw_mw_reset(w);
    rw_mw_request(w, id, "update_weights");
    rw_mw_map(w, 3);
    rw_mw_kv_str(w, "session", rw_sync_session_token(s)); /* the open session's owner token */
    rw_mw_str(w, "transport");
    rw_mw_str(w, "zmq");
    rw_mw_str(w, "manifest");
    rw_sync_manifest_write(m, w);
    const void *env;
    size_t len;
    RW_ASSERT_OK(rw_mw_finish(w, &env, &len, &e), &e);
    rw_msg *msg;
    rw_request req;
    RW_ASSERT_OK(rw_msg_decode_request(env, len, &msg, &req, &e), &e);
    rw_sync_frames in = {.n = 1, .data = {bytes}, .len = {rw_sync_manifest_bytes(m)}};
    rw_sync_outcome out;
    RW_ASSERT_OK(rw_sync_handle(s, 0, &req, &in, reply, &out, &e), &e);
    rw_sync_outcome_free(&out);
    rw_msg_free(msg);
}

static void test_per_piece_cost_flat(void **state) {
    (void)state;
    char js[1024];
    snprintf(js, sizeof js, CFG_JSON, LAYERS, EXPERTS);
    rw_config cfg;
    rw_err e;
    RW_ASSERT_OK(rw_config_parse(js, strlen(js), &cfg, &e), &e);
    assert_int_equal(rw_config_weight_count(&cfg), 18867);
    rw_wset *ws;
    RW_ASSERT_OK(rw_wset_create(&cfg, 1, 0, RW_PLACE_HOST, 0, &ws, &e), &e);
    rw_sync_session *s;
    RW_ASSERT_OK(rw_sync_session_create(ws, "init", false, &s, &e), &e);

    plan p = {.cfg = &cfg, .err = &e};
    RW_ASSERT_OK(rw_config_for_each_weight(&cfg, plan_cb, &p), &e);
    assert_true(p.n > 2000);
    uint16_t *buf = malloc(p.total);
    assert_non_null(buf);
    for (uint64_t i = 0; i < p.total / 2; i++)
        buf[i] = rw_rand_bf16_at(0x5ca1e, i, 0.0f, 0.02f);

    rw_mw *w, *reply;
    RW_ASSERT_OK(rw_mw_create(&w, &e), &e);
    RW_ASSERT_OK(rw_mw_create(&reply, &e), &e);
    double *per_piece = calloc(p.n, sizeof *per_piece);
    assert_non_null(per_piece);
    /* two sessions: the first warms up allocations and page faults, the second is measured */
    for (int pass = 0; pass < 2; pass++) {
        rw_sync_begin_args a = {.version = pass ? "v2" : "v1", .bucket_bytes = BUCKET};
        RW_ASSERT_OK(rw_sync_session_begin(s, &a, &e), &e);
        double t_all = rw_now();
        for (size_t i = 0; i < p.n; i++) {
            double t0 = rw_now();
            send_bucket(s, w, reply, p.m[i], (const uint8_t *)buf + p.base[i], i + 1);
            per_piece[i] = (rw_now() - t0) / (double)rw_sync_manifest_count(p.m[i]);
        }
        t_all = rw_now() - t_all;
        rw_sync_sstats st;
        rw_sync_session_stats(s, &st);
        assert_int_equal(st.buckets, p.n);
        assert_int_equal(st.pieces, 18867);
        rw_sync_commit_result cr;
        RW_ASSERT_OK(rw_sync_session_commit(s, &cr, &e), &e);
        assert_int_equal(cr.buckets, p.n);
        char missing[256];
        assert_true(rw_wset_complete(ws, missing, sizeof missing));
        size_t k = p.n / 10;
        double *first = malloc(k * sizeof *first), *last = malloc(k * sizeof *last);
        assert_non_null(first);
        assert_non_null(last);
        memcpy(first, per_piece, k * sizeof *first);
        memcpy(last, per_piece + p.n - k, k * sizeof *last);
        double m0 = median(first, k), m1 = median(last, k);
        fprintf(stderr,
                "pass %d: %zu buckets, 18867 pieces in %.3f s (%.2f us per piece); median per "
                "piece: first 10%% %.2f us, last 10%% %.2f us (x%.2f)\n",
                pass, p.n, t_all, 1e6 * t_all / 18867.0, 1e6 * m0, 1e6 * m1, m1 / m0);
        if (pass == 1)
            /* generous: a cost linear in the pieces already applied grows ~100x over the run */
            assert_true(m1 <= 4.0 * m0 + 2e-6);
        free(first);
        free(last);
    }

    /* the last expert of the last layer arrived as sent */
    rw_wname dn = {RW_W_EXP_DOWN, LAYERS - 1, EXPERTS - 1, false};
    char name[RW_SYNC_MAX_NAME];
    rw_name_format(&dn, name, sizeof name);
    const rw_sync_manifest *lm = NULL;
    uint64_t lbase = 0;
    const rw_sync_tensor *lt = NULL;
    for (size_t i = 0; i < p.n && !lt; i++)
        for (size_t j = 0; j < rw_sync_manifest_count(p.m[i]); j++)
            if (!strcmp(rw_sync_manifest_at(p.m[i], j)->name, name)) {
                lm = p.m[i];
                lbase = p.base[i];
                lt = rw_sync_manifest_at(lm, j);
                break;
            }
    assert_non_null(lt);
    uint8_t got[64 * 32 * 2];
    size_t len = 0;
    RW_ASSERT_OK(rw_wset_readback(ws, name, got, sizeof got, &len, NULL, NULL, &e), &e);
    assert_int_equal(len, lt->nbytes);
    rw_assert_bytes_equal(got, (const uint8_t *)buf + lbase + lt->offset, len, name);

    free(per_piece);
    rw_mw_destroy(w);
    rw_mw_destroy(reply);
    for (size_t i = 0; i < p.n; i++)
        rw_sync_manifest_destroy(p.m[i]);
    free(p.m);
    free(p.base);
    free(buf);
    rw_sync_session_destroy(s);
    rw_wset_destroy(ws);
    rw_config_free(&cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_per_piece_cost_flat),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
