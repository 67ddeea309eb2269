/* rw_ctl.c - rw-ctl: a command-line client for every control command of a worker
 * (docs/PROTOCOL.md; the names come from the one command table of rw_msg.h), built on the
 * trainer-side client library. Prints the result as one JSON line; exits 0 on success, 1 on an
 * error reply, 2 on a usage error, 3 when no reply came (timeout, transport). */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rw_client.h"

enum { EXIT_OK = 0, EXIT_ERR_REPLY = 1, EXIT_USAGE = 2, EXIT_NO_REPLY = 3 };

static void usage(FILE *f) {
    char list[512];
    fprintf(
        f,
        "usage: rw-ctl [--to ADDR] [--timeout-ms N] [--auth-token T] COMMAND [options]\n"
        "       rw-ctl --version | --help\n"
        "--to defaults to the worker's default address, " RW_DEFAULT_CONTROL ".\n"
        "commands (dashes or underscores): %s\n"
        "options per command:\n"
        "  generate (--prompt 1,2,3 [--prompt ...] | --text TEXT [--text ...]) [--n N]\n"
        "           [--max-new-tokens N]\n"
        "           [--temperature T] [--top-p P] [--top-k K] [--seed S] [--stop 7,8]\n"
        "           [--top-logprobs N] [--no-logprobs] [--stream] [--logprob-mode raw|processed]\n"
        "           [--return-routed-experts [--return-routing-weights]] [--out FILE]\n"
        "  score --prompt 1,2,3 --continuation 4,5 [--prompt ... --continuation ...]\n"
        "           [--prompt-logprobs] [--logprob-mode raw|processed] [--temperature T]\n"
        "           [--top-p P] [--top-k K] [--top-logprobs N]\n"
        "           [--return-routed-experts [--return-routing-weights]] [--out FILE]\n"
        "  (routed experts come in the reply's data frame: --out writes it to FILE; the\n"
        "  result's routed_experts / routing_weights give offset, nbytes, shape and dtype)\n"
        "  abort (--request-id ID | --all)\n"
        "  pause [--mode abort|retract|in_place]      resume      flush_cache\n"
        "  init_weights_update_group --unique-id HEX --world-size N --rank-offset K\n"
        "           [--group-name NAME] [--timeout-s S]\n"
        "  begin_update --version V [--flush-cache] [--bucket-bytes N] [--timeout-s S]\n"
        "           [--pause-mode abort|retract|in_place]\n"
        "  update_weights --manifest JSON|@FILE --data FILE [--transport zmq|nccl]\n"
        "           [--group-name NAME]\n"
        "  update_weights_from_disk --path DIR [--version V] [--only REGEX] [--flush-cache]\n"
        "           [--pause-mode M] [--timeout-s S]\n"
        "  commit_update      abort_update [--force]      get_weight_version\n"
        "  (update_weights, update_weights_from_disk inside a session, commit_update and\n"
        "   abort_update take --session TOKEN: the token begin_update printed; --force ends\n"
        "   another client's stuck session, which the worker logs)\n"
        "  get_weights --name NAME [--rank R] [--out FILE]\n"
        "  checksum [--name NAME ...]\n"
        "  release_memory [--weights] [--kv-cache]   resume_memory [--weights] [--kv-cache]\n"
        "           (neither flag: both)\n"
        "  health      stats      shutdown\n"
        "  call COMMAND [ARGS_JSON]      any command with raw JSON arguments\n"
        "Every command also takes --arg KEY=JSON to add a field to its arguments.\n"
        "The auth token defaults to $RW_AUTH_TOKEN. Exit: 0 ok, 1 error reply, 2 usage,\n"
        "3 no reply (nothing listens at the address: said within 2 s; or a timeout).\n",
        rw_cmd_list(list, sizeof list));
}

/* "1,2,3" -> a JSON array of integers (NULL on a malformed list). */
static json_t *id_list(const char *s) {
    json_t *a = json_array();
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || (*end && *end != ',')) {
            json_decref(a);
            return NULL;
        }
        json_array_append_new(a, json_integer(x));
        p = *end ? end + 1 : end;
    }
    if (json_array_size(a) == 0) {
        json_decref(a);
        return NULL;
    }
    return a;
}

static bool parse_i64(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end == s || *end || errno || x < lo || x > hi) return false;
    *out = x;
    return true;
}

static bool parse_u64(const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    if (s[0] == '-') return false;
    unsigned long long x = strtoull(s, &end, 10);
    if (end == s || *end || errno) return false;
    *out = x;
    return true;
}

static bool parse_f64(const char *s, double *out) {
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (end == s || *end || errno) return false;
    *out = x;
    return true;
}

/* Reads a whole file (for --manifest @FILE and --data FILE). */
static void *slurp(const char *path, size_t *len) {
    char *buf = NULL;
    rw_err e;
    if (rw_read_file(path, &buf, len, &e) != RW_OK) {
        fprintf(stderr, "rw-ctl: %s\n", e.msg);
        return NULL;
    }
    return buf;
}

static void canon(char *cmd) {
    for (char *p = cmd; *p; p++)
        if (*p == '-') *p = '_';
}

typedef struct ctl {
    const char *to, *token, *out_path;
    int timeout_ms;
    char cmd[RW_MSG_MAX_CMD + 1];
    json_t *args;
    void *data; /* update_weights: the bucket */
    size_t data_len;
    bool stream;
} ctl;

#define NEED(opt)                                                                                  \
    do {                                                                                           \
        if (i + 1 >= argc) {                                                                       \
            fprintf(stderr, "rw-ctl: %s needs a value\n", opt);                                    \
            return EXIT_USAGE;                                                                     \
        }                                                                                          \
        v = argv[++i];                                                                             \
    } while (0)
#define BAD(opt)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "rw-ctl: bad value '%s' for %s\n", v, opt);                                \
        return EXIT_USAGE;                                                                         \
    } while (0)

/* Turns the command's options into its JSON arguments. Returns 0 or an exit status. */
static int build_args(ctl *c, int argc, char **argv) {
    json_t *a = c->args;
    const rw_cmd cmd = rw_cmd_parse(c->cmd);
    json_t *prompts = NULL, *names = NULL, *conts = NULL, *texts = NULL;
    const bool gen_or_score = cmd == RW_CMD_GENERATE || cmd == RW_CMD_SCORE;
    bool weights = false, kv = false;
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i], *v = NULL;
        long long x;
        unsigned long long u;
        double d;
        if (!strcmp(o, "--arg")) {
            NEED(o);
            const char *eq = strchr(v, '=');
            if (!eq || eq == v) BAD(o);
            json_error_t je;
            json_t *val = json_loads(eq + 1, JSON_DECODE_ANY, &je);
            if (!val) val = json_string(eq + 1); /* a bare word is a string */
            char key[256];
            snprintf(key, sizeof key, "%.*s", (int)(eq - v), v);
            json_object_set_new(a, key, val);
        } else if (gen_or_score && !strcmp(o, "--prompt")) {
            NEED(o);
            json_t *p = id_list(v);
            if (!p) BAD(o);
            if (!prompts) prompts = json_array();
            json_array_append_new(prompts, p);
        } else if (cmd == RW_CMD_SCORE && !strcmp(o, "--continuation")) {
            NEED(o);
            json_t *p = id_list(v);
            if (!p) BAD(o);
            if (!conts) conts = json_array();
            json_array_append_new(conts, p);
        } else if (gen_or_score &&
                   (!strcmp(o, "--return-routed-experts") ||
                    !strcmp(o, "--return-routing-weights") || !strcmp(o, "--prompt-logprobs"))) {
            char key[64];
            snprintf(key, sizeof key, "%s", o + 2);
            canon(key);
            json_object_set_new(a, key, json_true());
        } else if (gen_or_score && !strcmp(o, "--logprob-mode")) {
            NEED(o);
            json_object_set_new(a, "logprob_mode", json_string(v));
        } else if (cmd == RW_CMD_GENERATE && !strcmp(o, "--text")) {
            NEED(o);
            json_t *t = json_string(v);
            if (!t) BAD(o); /* not UTF-8 */
            if (!texts) texts = json_array();
            json_array_append_new(texts, t);
        } else if (!strcmp(o, "--stop")) {
            NEED(o);
            json_t *p = id_list(v);
            if (!p) BAD(o);
            json_object_set_new(a, "stop", p);
        } else if (!strcmp(o, "--n") || !strcmp(o, "--max-new-tokens") || !strcmp(o, "--top-k") ||
                   !strcmp(o, "--top-logprobs") || !strcmp(o, "--world-size") ||
                   !strcmp(o, "--rank-offset") || !strcmp(o, "--bucket-bytes") ||
                   !strcmp(o, "--rank") || !strcmp(o, "--request-id") || !strcmp(o, "--seed")) {
            NEED(o);
            if (!parse_u64(v, &u) || u > (unsigned long long)INT64_MAX) BAD(o);
            char key[64];
            snprintf(key, sizeof key, "%s", o + 2);
            canon(key);
            json_object_set_new(a, key, json_integer((json_int_t)u));
        } else if (!strcmp(o, "--temperature") || !strcmp(o, "--top-p") ||
                   !strcmp(o, "--timeout-s")) {
            NEED(o);
            if (!parse_f64(v, &d)) BAD(o);
            char key[64];
            snprintf(key, sizeof key, "%s", o + 2);
            canon(key);
            json_object_set_new(a, key, json_real(d));
        } else if (!strcmp(o, "--mode") || !strcmp(o, "--pause-mode") || !strcmp(o, "--version") ||
                   !strcmp(o, "--path") || !strcmp(o, "--only") || !strcmp(o, "--unique-id") ||
                   !strcmp(o, "--group-name") || !strcmp(o, "--transport")) {
            NEED(o);
            char key[64];
            snprintf(key, sizeof key, "%s", o + 2);
            canon(key);
            json_object_set_new(a, key, json_string(v));
        } else if (!strcmp(o, "--name")) {
            NEED(o);
            if (cmd == RW_CMD_CHECKSUM) {
                if (!names) names = json_array();
                json_array_append_new(names, json_string(v));
            } else {
                json_object_set_new(a, "name", json_string(v));
            }
        } else if (!strcmp(o, "--session")) {
            NEED(o);
            json_object_set_new(a, "session", json_string(v));
        } else if (cmd == RW_CMD_ABORT_UPDATE && !strcmp(o, "--force")) {
            json_object_set_new(a, "force", json_true());
        } else if (!strcmp(o, "--all")) {
            json_object_set_new(a, "all", json_true());
        } else if (!strcmp(o, "--flush-cache")) {
            json_object_set_new(a, "flush_cache", json_true());
        } else if (!strcmp(o, "--no-logprobs")) {
            json_object_set_new(a, "logprobs", json_false());
        } else if (!strcmp(o, "--stream")) {
            json_object_set_new(a, "stream", json_true());
            c->stream = true;
        } else if (!strcmp(o, "--weights")) {
            weights = true;
        } else if (!strcmp(o, "--kv-cache")) {
            kv = true;
        } else if (!strcmp(o, "--out")) {
            NEED(o);
            c->out_path = v;
        } else if (!strcmp(o, "--manifest")) {
            NEED(o);
            char *text = NULL;
            size_t len = 0;
            if (v[0] == '@') {
                text = slurp(v + 1, &len);
                if (!text) return EXIT_USAGE;
            }
            json_error_t je;
            json_t *m = json_loads(text ? text : v, 0, &je);
            free(text);
            if (!m) {
                fprintf(stderr, "rw-ctl: --manifest: %s (line %d)\n", je.text, je.line);
                return EXIT_USAGE;
            }
            json_object_set_new(a, "manifest", m);
        } else if (!strcmp(o, "--data")) {
            NEED(o);
            c->data = slurp(v, &c->data_len);
            if (!c->data) return EXIT_USAGE;
        } else {
            fprintf(stderr, "rw-ctl: %s: unknown option '%s'\n", c->cmd, o);
            return EXIT_USAGE;
        }
        (void)x;
    }
    if (prompts) {
        if (json_array_size(prompts) == 1)
            json_object_set(a, "prompt", json_array_get(prompts, 0));
        else
            json_object_set(a, "prompts", prompts);
        json_decref(prompts);
    }
    if (conts) {
        if (json_array_size(conts) == 1)
            json_object_set(a, "continuation", json_array_get(conts, 0));
        else
            json_object_set(a, "continuations", conts);
        json_decref(conts);
    }
    if (texts) {
        if (prompts) {
            json_decref(texts);
            fprintf(stderr, "rw-ctl: generate takes --prompt or --text, not both\n");
            return EXIT_USAGE;
        }
        json_object_set(a, "text", json_array_size(texts) == 1 ? json_array_get(texts, 0) : texts);
        json_decref(texts);
    }
    if (names) json_object_set_new(a, "names", names);
    if ((weights || kv) && (cmd == RW_CMD_RELEASE_MEMORY || cmd == RW_CMD_RESUME_MEMORY)) {
        json_object_set_new(a, "weights", json_boolean(weights));
        json_object_set_new(a, "kv_cache", json_boolean(kv));
    }
    if (cmd == RW_CMD_GENERATE && !json_object_get(a, "prompt") && !json_object_get(a, "prompts") &&
        !json_object_get(a, "text")) {
        fprintf(stderr, "rw-ctl: generate needs --prompt or --text\n");
        return EXIT_USAGE;
    }
    if (cmd == RW_CMD_SCORE && (!json_object_get(a, "prompt") && !json_object_get(a, "prompts"))) {
        fprintf(stderr, "rw-ctl: score needs --prompt and --continuation (one per prompt)\n");
        return EXIT_USAGE;
    }
    return 0;
}

/* Prints an error reply as JSON on stdout and its message on stderr. */
static void print_error(rw_status st, const char *msg) {
    json_t *o = json_pack("{s:b, s:s, s:i, s:s}", "ok", 0, "status", rw_status_str(st), "code",
                          (int)st, "message", msg);
    char *s = json_dumps(o, JSON_COMPACT);
    printf("%s\n", s ? s : "{}");
    free(s);
    json_decref(o);
    fprintf(stderr, "rw-ctl: %s: %s\n", rw_status_str(st), msg);
}

/* The reply's result, with the readback frame described (and written to --out). */
static int print_result(ctl *c, const char *result, void *frame, size_t frame_len) {
    json_error_t je;
    json_t *r = json_loads(result ? result : "null", JSON_DECODE_ANY, &je);
    if (frame) {
        if (!json_is_object(r)) {
            json_decref(r);
            r = json_object();
        }
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, rw_checksum64(frame, frame_len, 0));
        json_object_set_new(r, "data_bytes", json_integer((json_int_t)frame_len));
        json_object_set_new(r, "data_xxh3", json_string(hex));
        if (c->out_path) {
            FILE *f = fopen(c->out_path, "wb");
            if (!f || fwrite(frame, 1, frame_len, f) != frame_len || fclose(f) != 0) {
                fprintf(stderr, "rw-ctl: --out %s: %s\n", c->out_path, strerror(errno));
                json_decref(r);
                return EXIT_ERR_REPLY;
            }
            json_object_set_new(r, "data_file", json_string(c->out_path));
        }
    }
    char *s = r ? json_dumps(r, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    printf("%s\n", s ? s : (result ? result : "null"));
    fflush(stdout);
    free(s);
    json_decref(r);
    return EXIT_OK;
}

int main(int argc, char **argv) {
    ctl c;
    memset(&c, 0, sizeof c);
    c.timeout_ms = 60000;
    c.token = getenv("RW_AUTH_TOKEN");
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *o = argv[i], *v = NULL;
        long long x;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            return EXIT_OK;
        } else if (!strcmp(o, "--version")) {
            printf("rw-ctl %s\n", RW_VERSION);
            return EXIT_OK;
        } else if (!strcmp(o, "--to")) {
            NEED(o);
            c.to = v;
        } else if (!strcmp(o, "--timeout-ms")) {
            NEED(o);
            if (!parse_i64(v, 1, 86400000, &x)) BAD(o);
            c.timeout_ms = (int)x;
        } else if (!strcmp(o, "--auth-token")) {
            NEED(o);
            c.token = v;
        } else {
            fprintf(stderr, "rw-ctl: unknown option '%s'\n", o);
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (!c.to) c.to = RW_DEFAULT_CONTROL;
    if (i >= argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    snprintf(c.cmd, sizeof c.cmd, "%s", argv[i++]);
    canon(c.cmd);
    c.args = json_object();
    int rc;
    if (!strcmp(c.cmd, "call")) {
        if (i >= argc) {
            fprintf(stderr, "rw-ctl: call needs a command name\n");
            return EXIT_USAGE;
        }
        snprintf(c.cmd, sizeof c.cmd, "%s", argv[i++]);
        if (i < argc) {
            json_error_t je;
            json_t *a = json_loads(argv[i++], 0, &je);
            if (!json_is_object(a)) {
                fprintf(stderr, "rw-ctl: call: ARGS_JSON must be a JSON object (%s)\n", je.text);
                json_decref(a);
                return EXIT_USAGE;
            }
            json_decref(c.args);
            c.args = a;
        }
        rc = build_args(&c, argc - i, argv + i);
    } else {
        rc = build_args(&c, argc - i, argv + i);
    }
    if (rc) {
        json_decref(c.args);
        free(c.data);
        return rc;
    }
    if (rw_cmd_parse(c.cmd) == RW_CMD_UPDATE_WEIGHTS && !c.data &&
        !json_object_get(c.args, "transport")) {
        fprintf(stderr, "rw-ctl: update_weights over ZeroMQ needs --data FILE (the bucket)\n");
        return EXIT_USAGE;
    }
    if (c.token && c.token[0]) json_object_set_new(c.args, "auth", json_string(c.token));
    c.stream = c.stream || json_is_true(json_object_get(c.args, "stream"));
    char *args = json_dumps(c.args, JSON_COMPACT);
    json_decref(c.args);

    rw_client *cl = NULL;
    rw_err e;
    rw_err_clear(&e);
    rc = EXIT_NO_REPLY;
    uint64_t id;
    /* ZeroMQ would wait for a peer in silence: say at once when nothing listens */
    if (rw_client_probe(c.to, 2000, &e) != RW_OK) {
        fprintf(stderr, "rw-ctl: %s\n", e.msg);
        goto out;
    }
    if (rw_client_connect(c.to, NULL, &cl, &e) != RW_OK) {
        fprintf(stderr, "rw-ctl: %s\n", e.msg);
        goto out;
    }
    const void *frames[1] = {c.data};
    size_t lens[1] = {c.data_len};
    if (rw_client_send_json(cl, c.cmd, args, frames, lens, c.data ? 1 : 0, &id, &e) != RW_OK) {
        fprintf(stderr, "rw-ctl: %s\n", e.msg);
        goto out;
    }
    for (;;) {
        char *result = NULL;
        void *frame = NULL;
        size_t frame_len = 0;
        rw_status st = rw_client_wait_json(cl, id, c.timeout_ms, &result, &frame, &frame_len, &e);
        if (st == RW_E_TIMEOUT || st == RW_E_ZMQ) {
            fprintf(stderr, "rw-ctl: %s (%s)\n", e.msg, c.to);
            break;
        }
        if (st != RW_OK) {
            print_error(st, e.msg);
            rc = EXIT_ERR_REPLY;
            break;
        }
        /* a streaming generate answers with partial results ({"stream": true}) first */
        bool partial = false;
        if (c.stream && result) {
            json_error_t je;
            json_t *r = json_loads(result, JSON_DECODE_ANY, &je);
            partial = json_is_true(json_object_get(r, "stream"));
            json_decref(r);
        }
        rc = print_result(&c, result, frame, frame_len);
        rw_client_free(result);
        rw_client_free(frame);
        if (!partial || rc != EXIT_OK) break;
    }
out:
    rw_client_close(cl);
    free(args);
    free(c.data);
    return rc;
}
