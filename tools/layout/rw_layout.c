/* rw_layout.c - rw-layout: prints the shard plan of one rank as JSON, one object per canonical
 * tensor (a JSON array), or a single object with --tensor.
 *
 *   rw-layout --config CONFIG --tp T --rank R [--tensor NAME]
 */
#include "rw_moe.h"

#include <stdio.h>
#include <stdlib.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: rw-layout --config CONFIG --tp T --rank R [--tensor NAME]\n"
            "  Prints rank R's shard plan (of T) as JSON: per tensor its sharded dim (null when\n"
            "  replicated), the source range [src_begin, src_end) along it (unpadded offsets),\n"
            "  the local padded shape dst_shape, and whether it is padded.\n");
}

static bool parse_int(const char *s, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < -1000000 || v > 1000000) return false;
    *out = (int)v;
    return true;
}

typedef struct walk {
    const rw_config *cfg;
    int tp, rank;
    bool first;
    rw_err *err;
} walk;

static rw_status print_one(const rw_wname *w, void *ctx) {
    walk *k = ctx;
    rw_shard_plan p;
    RW_CHECK(rw_moe_plan_tensor(k->cfg, k->tp, k->rank, w, &p, k->err));
    char *js;
    RW_CHECK(rw_moe_plan_json(&p, &js, k->err));
    printf("%s  %s", k->first ? "" : ",\n", js);
    k->first = false;
    free(js);
    return RW_OK;
}

int main(int argc, char **argv) {
    const char *config = NULL, *tensor = NULL;
    int tp = -1, rank = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--version")) {
            printf("rw-layout %s\n", RW_VERSION);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "rw-layout: %s needs a value\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--config")) {
            config = v;
        } else if (!strcmp(a, "--tensor")) {
            tensor = v;
        } else if (!strcmp(a, "--tp")) {
            if (!parse_int(v, &tp)) {
                fprintf(stderr, "rw-layout: --tp '%s' is not an integer\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--rank")) {
            if (!parse_int(v, &rank)) {
                fprintf(stderr, "rw-layout: --rank '%s' is not an integer\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "rw-layout: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!config || tp < 0 || rank < 0) {
        fprintf(stderr, "rw-layout: --config, --tp and --rank are required\n");
        usage(stderr);
        return 2;
    }
    rw_err err = {0};
    rw_config cfg;
    if (rw_config_load(config, &cfg, &err) != RW_OK) {
        fprintf(stderr, "rw-layout: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    rw_tp_dims d;
    if (rw_tp_dims_make(&cfg, tp, rank, &d, &err) != RW_OK) {
        fprintf(stderr, "rw-layout: %s\n", err.msg);
        rc = 1;
        goto done;
    }
    if (tensor) {
        rw_wname w;
        rw_shard_plan p;
        char *js;
        if (rw_name_parse(tensor, &cfg, &w, &err) != RW_OK ||
            rw_moe_plan_tensor(&cfg, tp, rank, &w, &p, &err) != RW_OK ||
            rw_moe_plan_json(&p, &js, &err) != RW_OK) {
            fprintf(stderr, "rw-layout: %s\n", err.msg);
            rc = 1;
            goto done;
        }
        printf("%s\n", js);
        free(js);
    } else {
        walk k = {&cfg, tp, rank, true, &err};
        printf("[\n");
        if (rw_config_for_each_weight(&cfg, print_one, &k) != RW_OK) {
            fflush(stdout);
            fprintf(stderr, "rw-layout: %s\n", err.msg);
            rc = 1;
            goto done;
        }
        printf("\n]\n");
    }
done:
    rw_config_free(&cfg);
    return rc;
}
