/* http_internal.h - what the HTTP server's files share: the server and request state (http.c),
 * replies and the ZeroMQ call into the daemon (http.c), JSON field readers (http_json.c), the
 * generation driver both APIs use (http_gen.c), and the route handlers (http_sglang.c,
 * http_openai.c). Not part of any contract beyond http.h. */
#ifndef RW_DAEMON_HTTP_INTERNAL_H
#define RW_DAEMON_HTTP_INTERNAL_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdatomic.h>

#include "http.h"
#include "metrics.h"
#include "rw_worker.h"

struct rw_http {
    struct MHD_Daemon *d;
    rw_http_opts o; /* strings below are copies */
    char *token, *model_name, *model_path, *tokenizer_path, *inproc;
    atomic_int stopping;
    atomic_uint_fast64_t seq; /* request numbers (completion ids, SGLang rids) */
    double t_start;
};

typedef struct rw_hstream rw_hstream;

/* One HTTP request being served (on its connection's thread). */
typedef struct rw_hreq {
    rw_http *h;
    struct MHD_Connection *conn;
    const char *method, *url;
    rw_tbuf body;
    bool too_large;             /* the body passed RW_HTTP_MAX_BODY: answered 413 */
    unsigned long long dropped; /* body bytes read and dropped after that */
    bool answered;              /* a response was queued */
    bool openai;                /* a /v1 route (OpenAI error types) */
    int client_fd; /* the connection's socket: a client that goes away aborts its work */
    bool client_gone;
    void *sock; /* DEALER on the daemon's in-process endpoint, opened on first use */
    uint64_t next_id;
    uint64_t num;       /* this request's number (rw_http.seq) */
    rw_hstream *stream; /* a streamed (SSE) response in progress */
    int refs;           /* the connection, and a stream while one is attached */
} rw_hreq;

/* --- http.c: replies --------------------------------------------------------------------- */
enum MHD_Result rw_hreply(rw_hreq *r, unsigned status, const char *ctype, const char *body,
                          size_t len);
/* Replies `j` as JSON (j is consumed). */
enum MHD_Result rw_hreply_json(rw_hreq *r, unsigned status, json_t *j);
/* {"error": {"message", "type", "param": null, "code": status}}: the shape OpenAI clients
 * read, and a superset of SGLang's {"error": {"message"}}. */
enum MHD_Result rw_hreply_error(rw_hreq *r, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The HTTP status for an rw_status (docs/PROTOCOL.md 6.1), and an error reply with it. */
unsigned rw_http_status(rw_status st);
enum MHD_Result rw_hreply_status(rw_hreq *r, rw_status st, const char *msg);

/* --- http.c: the call into the daemon ------------------------------------------------------ */
/* Sends command `cmd` with `args` (a JSON object, borrowed; NULL: {}) on the request's DEALER;
 * the worker's token is added. *id gets the request id. */
rw_status rw_hcall_send(rw_hreq *r, const char *cmd, json_t *args, uint64_t *id, rw_err *err);
/* Waits for the reply to `id` (replies to other ids are dropped). *result (caller decrefs) is
 * the result as JSON. An error reply returns its status and message; RW_E_ABORTED when the HTTP
 * client went away or the server stops. */
rw_status rw_hcall_recv(rw_hreq *r, uint64_t id, json_t **result, rw_err *err);
rw_status rw_hcall(rw_hreq *r, const char *cmd, json_t *args, json_t **result, rw_err *err);

/* --- http.c: streamed responses ------------------------------------------------------------ */
/* A streamed (server-sent events) response: `pump` is called on the connection's thread
 * whenever the client can take more; it appends "data: ...\n\n" events to `out` and returns
 * true while more will come (false: the stream ends after `out`). `done` frees `arg`. */
typedef bool (*rw_hpump)(void *arg, rw_hreq *r, rw_tbuf *out);
enum MHD_Result rw_hreply_stream(rw_hreq *r, rw_hpump pump, void (*done)(void *), void *arg);
/* Appends "data: <json>\n\n" (j is consumed). */
void rw_sse_json(rw_tbuf *out, json_t *j);
/* Appends the event that ends a stream: "data: [DONE]\n\n". */
void rw_sse_done(rw_tbuf *out);

/* --- http_json.c: request fields ------------------------------------------------------------- */
/* Refuses a key of `obj` that is not in allowed[] (NULL-terminated), naming it. */
rw_status rw_hj_only(const json_t *obj, const char *what, const char *const *allowed, rw_err *err);
/* Typed optional fields (absent or null: the default). `what` prefixes the field name in
 * errors ("sampling_params"). */
rw_status rw_hj_bool(const json_t *o, const char *what, const char *key, bool def, bool *out,
                     rw_err *err);
rw_status rw_hj_int(const json_t *o, const char *what, const char *key, int64_t def, int64_t lo,
                    int64_t hi, int64_t *out, rw_err *err);
rw_status rw_hj_num(const json_t *o, const char *what, const char *key, double def, double lo,
                    double hi, double *out, rw_err *err);
/* A string field (borrowed from o) or NULL when absent. */
rw_status rw_hj_str(const json_t *o, const char *what, const char *key, const char **out,
                    rw_err *err);
/* An array of token ids in [0, hi) into *out (appended). */
rw_status rw_hj_ids(const json_t *a, const char *what, int64_t hi, rw_tok_ids *out, rw_err *err);
/* A string or an array of strings (at most `cap`) into strs[] (borrowed); *n gets the count. */
rw_status rw_hj_strs(const json_t *v, const char *what, const char **strs, int cap, int *n,
                     rw_err *err);
/* Reads the body as a JSON object (400-worthy errors: malformed, not an object). */
rw_status rw_hj_body(rw_hreq *r, json_t **out, rw_err *err);
/* rw_hj_body, then rw_hj_only(allowed); an empty body is {} when empty_ok. *out: caller decrefs. */
rw_status rw_hj_request(rw_hreq *r, const char *const *allowed, bool empty_ok, json_t **out,
                        rw_err *err);

/* --- http_gen.c: one generation through the daemon -------------------------------------------- */
#define RW_HGEN_MAX_STOP_STR 8
#define RW_HGEN_MAX_STOP_LEN 256

typedef struct rw_hgen_params {
    const rw_tok_ids *prompts; /* [np] (borrowed) */
    size_t np;
    int n;                  /* samples per prompt */
    int64_t max_new_tokens; /* <= 0: as many as fit (max_seq_len - prompt) */
    double temperature, top_p;
    int64_t top_k;
    uint64_t seed;
    int32_t stop_ids[RW_MAX_STOP];
    int n_stop;
    const char *stop_strs[RW_HGEN_MAX_STOP_STR]; /* borrowed */
    int n_stop_strs;
    bool logprobs;
    int top_logprobs;
    bool stream;       /* partial replies wanted (streamed responses, stop strings) */
    bool skip_special; /* decoded text drops special tokens */
} rw_hgen_params;

typedef struct rw_hgen_out {
    int32_t *ids;
    double *lps;
    int n, cap;
    int32_t *top_ids; /* [n, top_n], from the final reply */
    double *top_lps;
    int top_n;
    rw_tok_stream *ts;
    int ndec;           /* ids fed to the decoder */
    rw_tbuf text;       /* decoded, final text */
    size_t emitted;     /* text bytes handed to the client */
    int ids_emitted;    /* ids handed to the client */
    const char *finish; /* NULL while running; "length", "stop", "abort" */
    bool cut;           /* a stop string ended the text */
    int matched_str;    /* index of the stop string, -1 */
    int prompt_tokens;
    json_t *final; /* the daemon's final output object (weight_version, version_spans, ...) */
} rw_hgen_out;

typedef struct rw_hgen {
    rw_hreq *r;
    rw_hgen_params p;
    uint64_t id;
    int nout;
    rw_hgen_out *out;
    bool final; /* the final reply came */
    bool abort_sent;
    size_t hold; /* bytes held back while a stop string may still be forming */
    double t0;
} rw_hgen;

/* Validates the parameters against the model (ids, lengths) and sends the generate command. */
rw_status rw_hgen_start(rw_hgen *g, rw_hreq *r, const rw_hgen_params *p, rw_err *err);
/* Waits for the next reply of the command and applies it (tokens, text, stop strings; the
 * final reply sets g->final). */
rw_status rw_hgen_next(rw_hgen *g, rw_err *err);
/* Runs the command to its final reply. */
rw_status rw_hgen_run(rw_hgen *g, rw_err *err);
/* start, then run to the point where the HTTP status is known: the end (stream false), or the
 * first reply (stream true: a refused request still gets its 4xx before any event). */
rw_status rw_hgen_begin(rw_hgen *g, rw_hreq *r, const rw_hgen_params *p, bool stream, rw_err *err);
/* Text of output k that may be shown now: [out[k].emitted, returned end). */
size_t rw_hgen_avail(const rw_hgen *g, int k);
/* Ids of output k that belong to its text (all, or up to the stop string). */
int rw_hgen_nids(const rw_hgen *g, int k);
void rw_hgen_free(rw_hgen *g);
/* Frees v[0..n) and the array (the prompts a route encoded). */
void rw_hids_free(rw_tok_ids *v, size_t n);
/* A token's text for logprobs (valid UTF-8; partial characters as U+FFFD) as a JSON string. */
json_t *rw_hgen_token_str(const rw_http *h, int32_t id);
/* The JSON number for a logprob (-inf / NaN, which JSON lacks, as -9999 / null). */
json_t *rw_hj_logprob(double v);

/* --- routes ------------------------------------------------------------------------------- */
typedef enum MHD_Result (*rw_hroute)(rw_hreq *r);
/* The handler for (method, path), or NULL; *known_path tells a wrong method from an unknown
 * path. */
rw_hroute rw_http_sglang_route(const char *method, const char *path, bool *known_path);
rw_hroute rw_http_openai_route(const char *method, const char *path, bool *known_path);

#endif
