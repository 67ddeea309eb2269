/* once.c - `rw-worker --once`: load a checkpoint (or seeded random weights from a config), generate
 * one request without a control socket, print the tokens and logprobs as JSON. For people trying
 * a checkpoint and for scripts. */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

static void usage(FILE *f) {
    fprintf(
        f, "usage: rw-worker --once (--model DIR | --config FILE --random-weights) --prompt 1,2,3\n"
           "         [--max-new-tokens N] [--temperature T] [--top-p P] [--top-k K] [--seed S]\n"
           "         [--stop 7,8] [--top-logprobs N] [--device cpu|cuda] [--gpu ORDINAL]\n"
           "         [--kv-mb MB] [--precision standard|high]\n"
           "  --seed seeds both the sampler and (with --random-weights) the weights.\n");
}

/* "1,2,3" -> malloc'd array; false on a malformed list. */
static bool parse_ids(const char *s, int32_t **out, int *n) {
    int cap = 16, k = 0;
    int32_t *v = malloc(sizeof(int32_t) * (size_t)cap);
    if (!v) return false;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < INT32_MIN || x > INT32_MAX || (*end && *end != ',')) {
            free(v);
            return false;
        }
        if (k == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, sizeof(int32_t) * (size_t)cap);
            if (!nv) {
                free(v);
                return false;
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (k == 0) {
        free(v);
        return false;
    }
    *out = v;
    *n = k;
    return true;
}

static bool parse_num(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (end == s || *end || errno || !(x >= lo && x <= hi)) return false;
    *out = x;
    return true;
}

int rw_worker_once_main(int argc, char **argv, FILE *out) {
    const char *model = NULL, *config = NULL, *prompt_s = NULL, *stop_s = NULL;
    bool random_w = false;
    rw_sampling sp = rw_sampling_default();
    rw_backend be = RW_BACKEND_CPU;
    rw_precision prec = RW_PRECISION_STANDARD;
    int gpu = 0;
    double kv_mb = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        rw_err err = {0};
#define NEED_VALUE                                                                                 \
    if (!v) {                                                                                      \
        fprintf(stderr, "rw-worker: %s needs a value\n", a);                                       \
        return 2;                                                                                  \
    }                                                                                              \
    i++;
#define BAD_VALUE                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "rw-worker: bad value '%s' for %s\n", v, a);                               \
        return 2;                                                                                  \
    } while (0)
        if (strcmp(a, "--once") == 0) continue;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { /* as the daemon's: exit 0 */
            usage(out);
            return 0;
        }
        if (strcmp(a, "--version") == 0) {
            fprintf(out, "rw-worker %s\n", RW_VERSION);
            return 0;
        }
        if (strcmp(a, "--random-weights") == 0) {
            random_w = true;
            continue;
        }
        if (strcmp(a, "--model") == 0) {
            NEED_VALUE model = v;
        } else if (strcmp(a, "--config") == 0) {
            NEED_VALUE config = v;
        } else if (strcmp(a, "--prompt") == 0) {
            NEED_VALUE prompt_s = v;
        } else if (strcmp(a, "--stop") == 0) {
            NEED_VALUE stop_s = v;
        } else if (strcmp(a, "--max-new-tokens") == 0) {
            NEED_VALUE if (!parse_num(v, 1, 1 << 24, &x)) BAD_VALUE;
            sp.max_new_tokens = (int)x;
        } else if (strcmp(a, "--temperature") == 0) {
            NEED_VALUE if (!parse_num(v, 0, 1e6, &x)) BAD_VALUE;
            sp.temperature = (float)x;
        } else if (strcmp(a, "--top-p") == 0) {
            NEED_VALUE if (!parse_num(v, 1e-9, 1, &x)) BAD_VALUE;
            sp.top_p = (float)x;
        } else if (strcmp(a, "--top-k") == 0) {
            NEED_VALUE if (!parse_num(v, 0, 1 << 30, &x)) BAD_VALUE;
            sp.top_k = (int)x;
        } else if (strcmp(a, "--top-logprobs") == 0) {
            NEED_VALUE if (!parse_num(v, 0, RW_MAX_TOP_LOGPROBS, &x)) BAD_VALUE;
            sp.top_logprobs = (int)x;
        } else if (strcmp(a, "--seed") == 0) {
            NEED_VALUE char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (end == v || *end || errno) BAD_VALUE;
            sp.seed = s;
        } else if (strcmp(a, "--device") == 0) {
            NEED_VALUE if (rw_backend_parse(v, &be, &err) != RW_OK) BAD_VALUE;
        } else if (strcmp(a, "--precision") == 0) {
            NEED_VALUE if (rw_precision_parse(v, &prec, &err) != RW_OK) BAD_VALUE;
        } else if (strcmp(a, "--gpu") == 0) {
            NEED_VALUE if (!parse_num(v, 0, 1024, &x)) BAD_VALUE;
            gpu = (int)x;
        } else if (strcmp(a, "--kv-mb") == 0) {
            NEED_VALUE if (!parse_num(v, 1, 1 << 24, &x)) BAD_VALUE;
            kv_mb = x;
        } else {
            fprintf(stderr, "rw-worker: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
#undef NEED_VALUE
#undef BAD_VALUE
    }
    if (!prompt_s || (!model && !(config && random_w)) || (model && config)) {
        usage(stderr);
        return 2;
    }
    int32_t *prompt = NULL;
    int n = 0;
    if (!parse_ids(prompt_s, &prompt, &n)) {
        fprintf(stderr, "rw-worker: --prompt wants comma-separated token ids, got '%s'\n",
                prompt_s);
        return 2;
    }
    if (stop_s) {
        int32_t *stops = NULL;
        int ns = 0;
        if (!parse_ids(stop_s, &stops, &ns) || ns > RW_MAX_STOP) {
            fprintf(stderr, "rw-worker: --stop wants up to %d comma-separated ids\n", RW_MAX_STOP);
            free(stops);
            free(prompt);
            return 2;
        }
        memcpy(sp.stop_ids, stops, sizeof(int32_t) * (size_t)ns);
        sp.n_stop = ns;
        free(stops);
    }

    rw_err err = {0};
    rw_status st;
    rw_config cfg;
    memset(&cfg, 0, sizeof cfg);
    rw_model *m = NULL;
    rw_engine *e = NULL;
    rw_output *o = NULL;
    char path[4096];
    if (model) snprintf(path, sizeof path, "%s/config.json", model);
    RW_CHECKGOTO(rw_config_load(model ? path : config, &cfg, &err), st, done);
    rw_model_opts mo = {be, gpu, 1, 0, NULL, prec};
    RW_CHECKGOTO(rw_model_create(&cfg, &mo, &m, &err), st, done);
    if (model)
        RW_CHECKGOTO(rw_model_load_ckpt(m, model, &err), st, done);
    else
        RW_CHECKGOTO(rw_model_load_random(m, sp.seed, 0.0f, &err), st, done);
    rw_engine_opts eo = rw_engine_opts_default();
    if (kv_mb > 0) eo.kv_bytes = (size_t)(kv_mb * 1048576.0);
    RW_CHECKGOTO(rw_engine_create(m, &eo, &e, &err), st, done);
    RW_CHECKGOTO(rw_engine_add(e, 1, prompt, n, &sp, &err), st, done);
    RW_CHECKGOTO(rw_engine_run(e, &err), st, done);
    o = rw_engine_pop_output(e);
    if (!o) {
        st = RW_ERR(&err, RW_E_INTERNAL, "no output after the run");
        goto done;
    }
    fprintf(out, "{\"tokens\": [");
    for (int i = 0; i < o->n; i++)
        fprintf(out, "%s%d", i ? ", " : "", o->tokens[i]);
    fprintf(out, "], \"logprobs\": [");
    for (int i = 0; i < o->n; i++)
        fprintf(out, "%s%.9g", i ? ", " : "", o->logprobs[i]);
    fprintf(out, "]");
    if (o->top_n) {
        fprintf(out, ", \"top_logprobs\": [");
        for (int i = 0; i < o->n; i++) {
            fprintf(out, "%s[", i ? ", " : "");
            for (int j = 0; j < o->top_n; j++)
                fprintf(out, "%s[%d, %.9g]", j ? ", " : "", o->top_ids[i * o->top_n + j],
                        o->top_logprobs[i * o->top_n + j]);
            fprintf(out, "]");
        }
        fprintf(out, "]");
    }
    fprintf(out, ", \"finish\": \"%s\"}\n", rw_finish_str(o->finish));
done:
    if (st != RW_OK)
        fprintf(stderr, "rw-worker: %s: %s (%s)\n", rw_status_str(st), err.msg, err.where);
    rw_output_free(o);
    rw_engine_destroy(e);
    rw_model_destroy(m);
    rw_config_free(&cfg);
    free(prompt);
    return st == RW_OK ? 0 : 1;
}
