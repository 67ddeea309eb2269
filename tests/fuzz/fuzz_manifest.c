/* fuzz_manifest.c - the manifest validator and the bucket apply path: an update_weights request
 * whose manifest value and data frame come from the input, handled by rw_sync_handle against a
 * host weight set of a tiny Qwen3-MoE model (the shape of tests/fixtures/qwen3-moe-tiny) in one
 * of four variants: bf16 TP1, bf16 TP2 rank 1, mxfp8 TP1, fp8-block TP2 rank 0.
 *
 * Input: byte 0 selects the variant (bits 0-1), how the frames arrive (bits 2-3: one frame, no
 * frame, the frame split in two, transport "nccl"), whether a successful bucket is committed
 * or aborted (bit 4), and whether the rest of the input is the bucket frame as it is (bit 5
 * clear) or the pattern that fills a frame of exactly manifest.nbytes bytes (bit 5 set, up to
 * 4 MiB: small inputs then reach whole tensors); bits 6-7 = 3 send a session token that is not
 * the session's (missing, another token, or not a string: by L % 3), else the session's own
 * (protocol 2); bytes 1-4 are the manifest's length L (little endian, clamped); then L bytes of
 * msgpack spliced in as args.manifest; then the frame bytes.
 *
 * Contract checked (rw_sync.h, docs/PROTOCOL.md):
 * - the reply decodes, is ok exactly when the handler returned RW_OK, and an error reply carries
 *   the handler's status and message;
 * - every failed update_weights ends the session; a bucket that is refused says "nothing was
 *   written" and then the weight bytes are bit-identical to before and the weights are ready,
 *   otherwise it says the weights are incomplete and they are (a manifest that does not fit the
 *   model is refused before any byte is written: on a host weight set nothing after validation
 *   can fail, so every failure here must be a clean refusal);
 * - an accepted bucket reports its tensor and byte counts, and on the bf16 TP1 variant every
 *   whole bf16 tensor in it reads back bit for bit;
 * - commit of an accepted bucket succeeds and serves the new version; abort after a write
 *   leaves the weights incomplete;
 * - a request without the session's token is refused with `auth` (`protocol` for a token that is
 *   not a string) and changes nothing: the session stays open, the weights bit-identical; its
 *   owner (or an abort with force) then ends it. */
#include "fuzz_util.h"

#include <string.h>

#include "rw_sync.h"

#define NVARIANT 4

static const char *const base_config =
    "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 512, \"hidden_size\": 128,"
    " \"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"head_dim\": 32, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
    " \"moe_intermediate_size\": 96, \"max_position_embeddings\": 512,"
    " \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-06, \"norm_topk_prob\": true,"
    " \"tie_word_embeddings\": false%s}";

static const struct {
    const char *quant; /* appended to the config */
    int tp, rank;
} variants[NVARIANT] = {
    {"", 1, 0},
    {"", 2, 1},
    {", \"quantization_config\": {\"quant_method\": \"mxfp8\", \"weight_block_size\": [1, 32],"
     " \"scale_fmt\": \"ue8m0\", \"modules_to_not_convert\": [\"model.layers.2.\"]}",
     1, 0},
    {", \"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}", 2,
     0},
};

typedef struct model {
    rw_config cfg;
    rw_wset *ws;
} model;

/* Built on first use and kept for the process (a fuzzer runs millions of inputs). */
static model models[NVARIANT];

static model *get_model(int v) {
    model *m = &models[v];
    if (m->ws) return m;
    char json[1024];
    snprintf(json, sizeof json, base_config, variants[v].quant);
    rw_err e;
    memset(&e, 0, sizeof e);
    FUZZ_CHECK(rw_config_parse(json, strlen(json), &m->cfg, &e) == RW_OK, "config: %s", e.msg);
    FUZZ_CHECK(rw_wset_create(&m->cfg, variants[v].tp, variants[v].rank, RW_PLACE_HOST, 0, &m->ws,
                              &e) == RW_OK,
               "weight set of variant %d: %s", v, e.msg);
    return m;
}

static uint64_t weights_hash(rw_wset *ws) {
    rw_arena *a = rw_wset_arena(ws);
    return rw_checksum64(rw_arena_base(a), rw_arena_used(a), 0);
}

/* Runs one request through the handler; checks the reply against the returned status. */
static rw_status handle(rw_sync_session *s, const void *env, size_t env_len,
                        const rw_sync_frames *fr, rw_err *e) {
    rw_msg *msg;
    rw_request rq;
    memset(e, 0, sizeof *e);
    rw_status st = rw_msg_decode_request(env, env_len, &msg, &rq, e);
    if (st != RW_OK) {
        FUZZ_CHECK_REFUSAL(st, *e);
        return st;
    }
    rw_mw *reply;
    FUZZ_CHECK(rw_mw_create(&reply, NULL) == RW_OK, "writer");
    rw_sync_outcome out;
    st = rw_sync_handle(s, 0, &rq, fr, reply, &out, e);
    if (st != RW_OK) FUZZ_CHECK_REFUSAL(st, *e);
    FUZZ_CHECK(out.frame.data == NULL, "%s returned a data frame", rq.cmd);
    rw_sync_outcome_free(&out);
    const void *rb;
    size_t rl;
    FUZZ_CHECK(rw_mw_finish(reply, &rb, &rl, NULL) == RW_OK, "reply writer failed");
    rw_msg *rmsg;
    rw_reply rp;
    rw_err re;
    memset(&re, 0, sizeof re);
    FUZZ_CHECK(rw_msg_decode_reply(rb, rl, &rmsg, &rp, &re) == RW_OK, "reply undecodable: %s",
               re.msg);
    FUZZ_CHECK(rp.id == rq.id, "reply id %llu for request %llu", (unsigned long long)rp.id,
               (unsigned long long)rq.id);
    FUZZ_CHECK(rp.ok == (st == RW_OK), "reply ok=%d but status %s", rp.ok, rw_status_str(st));
    if (!rp.ok) {
        /* the message as it goes on the wire: valid UTF-8 (each bad byte U+FFFD) */
        char want[3 * sizeof e->msg + 1];
        const size_t ml = strlen(e->msg);
        if (rw_utf8_valid(e->msg, ml))
            memcpy(want, e->msg, ml + 1);
        else
            rw_utf8_repair(e->msg, ml, want, sizeof want);
        FUZZ_CHECK(rp.status == st && !strncmp(rp.message, want, sizeof rp.message - 1),
                   "error reply %s '%s' for %s '%s'", rw_status_str(rp.status), rp.message,
                   rw_status_str(st), want);
    }
    rw_msg_free(rmsg);
    rw_mw_destroy(reply);
    rw_msg_free(msg);
    return st;
}

/* A request whose args hold the open session's token, built by the writer (`force`: abort
 * with force instead). */
static rw_status simple(rw_sync_session *s, const char *cmd, bool force, rw_err *e) {
    rw_mw *w;
    FUZZ_CHECK(rw_mw_create(&w, NULL) == RW_OK, "writer");
    rw_mw_request(w, 7, cmd);
    rw_mw_map(w, 1);
    if (force)
        rw_mw_kv_bool(w, "force", true);
    else
        rw_mw_kv_str(w, "session", rw_sync_session_token(s));
    const void *p;
    size_t n;
    FUZZ_CHECK(rw_mw_finish(w, &p, &n, NULL) == RW_OK, "writer failed");
    rw_sync_frames none = {0};
    rw_status st = handle(s, p, n, &none, e);
    rw_mw_destroy(w);
    return st;
}

/* On the bf16 TP1 variant the readback of a whole bf16 tensor is its canonical bytes. */
static void check_readback(rw_wset *ws, const uint8_t *bucket, const rw_sync_manifest *m) {
    for (size_t i = 0; i < rw_sync_manifest_count(m); i++) {
        const rw_sync_tensor *t = rw_sync_manifest_at(m, i);
        if (t->shard_dim >= 0 || t->dtype != RW_DTYPE_BF16) continue;
        size_t len = 0;
        rw_err e;
        memset(&e, 0, sizeof e);
        FUZZ_CHECK(rw_wset_readback(ws, t->name, NULL, 0, &len, NULL, NULL, &e) == RW_OK,
                   "%s: accepted but no readback: %s", t->name, e.msg);
        FUZZ_CHECK(len == t->nbytes, "%s: readback of %zu bytes, piece of %llu", t->name, len,
                   (unsigned long long)t->nbytes);
        uint8_t *buf = malloc(len ? len : 1);
        FUZZ_CHECK(buf != NULL, "out of memory");
        FUZZ_CHECK(rw_wset_readback(ws, t->name, buf, len, &len, NULL, NULL, &e) == RW_OK,
                   "%s: readback: %s", t->name, e.msg);
        FUZZ_CHECK(!memcmp(buf, bucket + t->offset, len), "%s: readback differs from the piece",
                   t->name);
        free(buf);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 5) return 0;
    int v = data[0] & 3, frames_mode = (data[0] >> 2) & 3;
    bool commit = data[0] & 0x10;
    size_t mlen = fuzz_u32le(data + 1, 4);
    if (mlen > size - 5) mlen = size - 5;
    const uint8_t *man = data + 5, *frame = man + mlen;
    size_t frame_len = size - 5 - mlen;
    if (mlen == 0) return 0; /* a value is needed to splice in */
    uint8_t *filled = NULL;
    if (data[0] & 0x20) {
        /* the frame the manifest asks for, filled with the input's tail (an exact-size
         * allocation: ASan sees any read past it) */
        rw_msg *mm = NULL;
        const rw_mobj *mv;
        uint64_t nb = 0;
        if (rw_msg_decode_value(man, mlen, &mm, &mv, NULL) == RW_OK &&
            rw_mobj_u64(rw_mobj_get(mv, "nbytes"), "nbytes", &nb, NULL) == RW_OK &&
            nb <= (4u << 20)) {
            filled = malloc(nb ? nb : 1);
            FUZZ_CHECK(filled != NULL, "out of memory");
            for (uint64_t i = 0; i < nb; i++)
                filled[i] = frame_len ? frame[i % frame_len] : 0x3c;
            frame = filled;
            frame_len = nb;
        }
        rw_msg_free(mm);
    }

    model *md = get_model(v);
    rw_sync_session *s;
    rw_err e;
    memset(&e, 0, sizeof e);
    FUZZ_CHECK(rw_sync_session_create(md->ws, "before", false, &s, &e) == RW_OK, "session: %s",
               e.msg);
    rw_sync_begin_args b = {.version = "fuzz", .bucket_bytes = 4u << 20, .timeout_s = 60};
    FUZZ_CHECK(rw_sync_session_begin(s, &b, &e) == RW_OK, "begin: %s", e.msg);
    uint64_t h0 = weights_hash(md->ws);

    /* the request: {protocol, id, cmd: update_weights, args: {[session,] manifest: <input>[,
     * transport]}} */
    const int token_mode = (data[0] >> 6) == 3 ? (int)(mlen % 3) : -1; /* -1: the session's own */
    rw_mw *w;
    FUZZ_CHECK(rw_mw_create(&w, NULL) == RW_OK, "writer");
    rw_mw_request(w, 42, "update_weights");
    rw_mw_map(w, (frames_mode == 3 ? 2 : 1) + (token_mode != 0 ? 1 : 0));
    if (token_mode == -1) {
        rw_mw_kv_str(w, "session", rw_sync_session_token(s));
    } else if (token_mode == 1) {
        char other[RW_SYNC_TOKEN_LEN + 1];
        memcpy(other, rw_sync_session_token(s), sizeof other);
        other[0] = other[0] == 'a' ? 'b' : 'a'; /* one digit off */
        rw_mw_kv_str(w, "session", other);
    } else if (token_mode == 2) {
        rw_mw_kv_u64(w, "session", 12345);
    }
    rw_mw_str(w, "manifest");
    rw_mw_raw(w, man, mlen);
    if (frames_mode == 3) {
        rw_mw_str(w, "transport");
        rw_mw_str(w, "nccl");
    }
    const void *env;
    size_t env_len;
    FUZZ_CHECK(rw_mw_finish(w, &env, &env_len, NULL) == RW_OK, "writer failed");
    rw_sync_frames fr = {0};
    if (frames_mode == 0 || frames_mode == 3) {
        fr.n = frames_mode == 0 ? 1 : 0;
        fr.data[0] = frame;
        fr.len[0] = frame_len;
    } else if (frames_mode == 2) {
        fr.n = 2;
        fr.data[0] = frame;
        fr.len[0] = frame_len / 2;
        fr.data[1] = frame + frame_len / 2;
        fr.len[1] = frame_len - frame_len / 2;
    }
    rw_status st = handle(s, env, env_len, &fr, &e);
    rw_sync_info info;
    rw_sync_session_info(s, &info);
    if (token_mode >= 0 && (st == RW_E_AUTH || (token_mode == 2 && st == RW_E_PROTOCOL &&
                                                strstr(e.msg, "args.session")))) {
        /* not the session's owner: nothing changed, the owner or a forced abort ends it */
        FUZZ_CHECK(info.state == RW_SYNC_UPDATING && info.buckets == 0,
                   "a request without the session's token changed it: %s, %llu buckets",
                   rw_sync_wstate_str(info.state), (unsigned long long)info.buckets);
        FUZZ_CHECK(weights_hash(md->ws) == h0, "a request without the token wrote: %s", e.msg);
        st = simple(s, "abort_update", commit, &e);
        FUZZ_CHECK(st == RW_OK, "abort by %s: %s", commit ? "force" : "the owner", e.msg);
        rw_sync_session_info(s, &info);
        FUZZ_CHECK(info.state == RW_SYNC_READY && !strcmp(info.version, "before"),
                   "after the owner's abort: %s '%s'", rw_sync_wstate_str(info.state),
                   info.version);
    } else if (token_mode >= 0 && st == RW_OK) {
        FUZZ_CHECK(0, "update_weights without the session's token accepted");
    } else if (st != RW_OK) {
        if (info.state == RW_SYNC_UPDATING) {
            /* the envelope itself was refused before any handler ran */
            bool intact = false;
            FUZZ_CHECK(rw_sync_session_abort(s, &intact, NULL) == RW_OK && intact,
                       "abort after an undecodable request");
            rw_sync_session_info(s, &info);
        } else {
            /* a host weight set cannot fail after validation: every failure is a refusal */
            FUZZ_CHECK(strstr(e.msg, "nothing was written") != NULL,
                       "a failed bucket wrote weights: %s", e.msg);
        }
        FUZZ_CHECK(info.state == RW_SYNC_READY && !strcmp(info.version, "before"),
                   "after a refused bucket: state %s, version '%s'", rw_sync_wstate_str(info.state),
                   info.version);
        FUZZ_CHECK(weights_hash(md->ws) == h0, "a refused bucket changed the weights: %s", e.msg);
        FUZZ_CHECK(info.sessions_committed == 0, "committed");
    } else {
        FUZZ_CHECK(info.state == RW_SYNC_UPDATING && info.buckets == 1 && info.bytes == frame_len,
                   "after an accepted bucket: state %s, %llu buckets, %llu bytes",
                   rw_sync_wstate_str(info.state), (unsigned long long)info.buckets,
                   (unsigned long long)info.bytes);
        /* decode the manifest again to know what was written */
        rw_msg *mm;
        const rw_mobj *mv;
        rw_sync_manifest *m;
        FUZZ_CHECK(rw_msg_decode_value(man, mlen, &mm, &mv, &e) == RW_OK, "manifest: %s", e.msg);
        FUZZ_CHECK(rw_sync_manifest_create(&m, NULL) == RW_OK, "manifest");
        FUZZ_CHECK(rw_sync_manifest_read(mv, "m", m, &e) == RW_OK, "manifest: %s", e.msg);
        bool wrote = rw_sync_manifest_count(m) > 0;
        if (v == 0) check_readback(md->ws, frame, m);
        rw_sync_manifest_destroy(m);
        rw_msg_free(mm);
        if (commit) {
            st = simple(s, "commit_update", false, &e);
            FUZZ_CHECK(st == RW_OK, "commit of an accepted bucket: %s", e.msg);
            rw_sync_session_info(s, &info);
            FUZZ_CHECK(info.state == RW_SYNC_READY && !strcmp(info.version, "fuzz"),
                       "after commit: %s '%s'", rw_sync_wstate_str(info.state), info.version);
            FUZZ_CHECK(rw_sync_session_ready(s, NULL, 0, NULL) == RW_OK, "not ready after commit");
        } else {
            st = simple(s, "abort_update", false, &e);
            FUZZ_CHECK(st == RW_OK, "abort: %s", e.msg);
            rw_sync_session_info(s, &info);
            FUZZ_CHECK(info.state == (wrote ? RW_SYNC_INCOMPLETE : RW_SYNC_READY),
                       "abort after a written bucket: state %s", rw_sync_wstate_str(info.state));
            FUZZ_CHECK(rw_sync_session_ready(s, NULL, 0, NULL) ==
                           (info.state == RW_SYNC_READY ? RW_OK : RW_E_WEIGHTS_INCOMPLETE),
                       "ready() disagrees with the state");
        }
    }
    rw_mw_destroy(w);
    rw_sync_session_destroy(s);
    free(filled);
    return 0;
}
