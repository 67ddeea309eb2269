/* engine_internal.h - what the engine's files share: a request's state, the engine's state, and
 * the helpers the scheduler step (engine_step.c) needs from the request bookkeeping (engine.c).
 * Not part of any contract beyond the worker. */
#ifndef RW_WORKER_ENGINE_INTERNAL_H
#define RW_WORKER_ENGINE_INTERNAL_H

#include "internal.h"

typedef struct req req;
struct req {
    uint64_t id;
    rw_sampling sp;
    int n_prompt;
    int32_t *toks; /* [cap]: prompt then generated tokens (score: prompt then continuation) */
    int ntok, cap;
    float *lps;       /* [cap - n_prompt] logprob of each generated (score: continuation) token */
    int32_t *top_ids; /* [cap - n_prompt, top_logprobs] */
    float *top_lps;
    rw_version_span *spans;
    int n_spans, cap_spans;
    int32_t *blocks; /* KV block table */
    int nblocks, cap_blocks;
    int n_cached;    /* tokens [0, n_cached) have their KV in the cache */
    int chunk;       /* tokens scheduled in the current step */
    int row0, nrows; /* this step's logits rows (nrows 0: none) */
    bool decoding;   /* its last token was sampled with its KV in place: the next is a decode */
    bool running;
    double t_submit, t_first;
    /* scoring: the last ntok - n_prompt tokens are given; no sampling */
    bool score, prompt_lps;
    float *plps; /* [n_prompt] prompt logprobs (entry 0 NaN) when prompt_lps */
    /* routes: rows [0, n_cached) of rids / rwts [rcap, route_row] */
    bool rec_routes, rec_wts;
    uint16_t *rids;
    float *rwts;
    int rcap;
    /* prefix cache: blocks [0, n_reg) are cached, chained, the last with key reg_key; KV made
     * under kv_version (kv_valid false once the version changed while the KV was held) */
    int n_reg;
    uint64_t reg_key, kv_version;
    bool kv_valid;
    int n_reused;        /* prompt tokens whose KV was reused */
    rw_finish finishing; /* routes: finished, its last token still to run through the model */
    /* n samples: a follower waits attached to its leader until the leader's prefill ends */
    req *leader;
    req **follow; /* leader: its attached followers, in sample order */
    int nfollow, cap_follow;
};

/* Requests by id: open addressing, tombstones on removal. */
typedef struct idmap {
    uint64_t *keys;
    req **vals; /* NULL = empty, TOMB = removed */
    size_t cap, used;
} idmap;

struct rw_engine {
    rw_model *m;
    rw_engine_opts o;
    rw_kv *kv;
    rw_kv_blocks kvb; /* which blocks of kv are free, held, cached */
    int route_layers, route_k;
    req **waiting; /* FIFO: [whead, wtail) */
    int64_t whead, wtail, wcap;
    req **running; /* admission order */
    int nrun, cap_run;
    int nattached;    /* followers waiting attached to their leaders */
    rw_output **outq; /* finished, FIFO */
    int64_t ohead, otail, ocap;
    idmap ids;
    bool paused, kv_released;
    uint64_t version;
    int max_rows; /* logits rows (and sampling requests) per step */
    /* per-step scratch */
    int32_t *btok;
    rw_fwd_seq *bseq;
    rw_sample_req *sreq;
    rw_sample_res *sres;
    req **sreq_of;
    int *sreq_pos; /* score rows: position of the scored token; -1: a draw */
    int64_t cap_btok;
    int cap_bseq, cap_sreq;
    int32_t *rt_ids; /* routes of a step [L, ntok, k] */
    float *rt_wts;
    int64_t cap_rt;
    int32_t *cp_src, *cp_dst; /* copy-on-write block pairs of a step */
    int cap_cp;
    /* stats */
    int64_t steps, prompt_tokens, gen_tokens, preemptions;
    int64_t prefix_hits, tokens_saved, forks, score_tokens;
    int64_t last_tokens, last_seqs, last_logits, last_ctx, last_attn; /* the last forward */
    double step_s, model_s; /* rw_engine_stats */
    double rate_t[16];
    int64_t rate_n[16];
    int rate_i;
};

/* --- engine.c: queues and request bookkeeping -------------------------------------------- */
bool rw_eng_push_waiting(rw_engine *e, req *r, bool front);
void rw_eng_remove_running(rw_engine *e, int i);
/* Releases the request's KV references (blocks go idle or free) and forgets its cache chain. */
void rw_eng_free_kv(rw_engine *e, req *r);
/* Moves a request's results into an output, queues it, and frees the request (KV first). */
rw_status rw_eng_retire(rw_engine *e, req *r, rw_finish why, rw_err *err);
/* Retracts the most recently admitted running request: drops its KV, requeues it first. */
void rw_eng_preempt_newest(rw_engine *e);
/* Appends the running request r (grows the list). */
rw_status rw_eng_run_append(rw_engine *e, req *r, rw_err *err);
/* Routes rows for positions [0, upto) (grows r's arrays). */
bool rw_eng_route_rows(rw_engine *e, req *r, int upto);
/* Records that generated token idx of r was made under `version`. */
bool rw_eng_add_span(req *r, uint64_t version, int idx);
/* Detaches every follower of leader r: they go to the waiting queue's front, in order. */
void rw_eng_release_followers(rw_engine *e, req *r);

/* --- engine_step.c -------------------------------------------------------------------------- */
/* Reuses the longest cached prefix for a request that holds no KV (admission). Returns false
 * when even then its remaining tokens do not fit the available blocks (nothing taken). */
bool rw_eng_admit_prefix(rw_engine *e, req *r);

#endif
