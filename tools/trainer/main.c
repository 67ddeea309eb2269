/* rw-trainer - the trainer side from the command line: pushes a checkpoint to workers as one
 * update (ZeroMQ frames or an NCCL broadcast from this process's GPU), optionally emulating a
 * Megatron-style trainer that holds TP shards, verifies the workers' checksums, and prints a JSON
 * summary; or prints the checksums a worker rank should report for a checkpoint.
 *
 *   rw-trainer push --model DIR --to ADDR[,ADDR...] [--transport zmq|nccl] [--trainer-tp K]
 *                   [--bucket-mb N | --bucket-bytes N] [--version V] [--only REGEX] [--verify]
 *                   [--flush-cache]
 *                   [--worker-ranks N[,N...]] [--device D] [--group NAME] [--timeout S]
 *   rw-trainer checksum --model DIR --tp T --rank R [--only REGEX] [--worker-config FILE]
 *
 * Exit status: 0 success, 1 error (message on stderr), 2 usage, 3 checksum mismatch. */
#include "rw_client.h"

#include <getopt.h>
#include <jansson.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fputs("usage:\n"
          "  rw-trainer push --model DIR --to ADDR[,ADDR...] [--transport zmq|nccl]\n"
          "                  [--trainer-tp K] [--bucket-mb N | --bucket-bytes N] [--version V]\n"
          "                  [--only REGEX] [--verify] [--flush-cache] [--worker-ranks N[,N...]]\n"
          "                  [--device D] [--group NAME] [--timeout SECONDS]\n"
          "  rw-trainer checksum --model DIR --tp T --rank R [--only REGEX]\n"
          "                  [--worker-config FILE]\n"
          "\n"
          "push: sends the checkpoint in DIR to every worker as one update session (begin,\n"
          "buckets of N MiB (default 512) or --bucket-bytes N bytes, commit); a tensor larger\n"
          "than a bucket goes as several row pieces. --trainer-tp K cuts each tensor along its\n"
          "tensor-parallel dim into K shards and sends expert gate/up as fused gate_up shards, as\n"
          "a Megatron trainer holding K shards would. --transport nccl broadcasts from CUDA\n"
          "device D (this process is rank 0; each worker joins with its --worker-ranks ranks).\n"
          "--verify compares the workers' checksums with the checkpoint's. Prints a JSON summary.\n"
          "checksum: prints the per-tensor checksums rank R of a TP-T worker reports for DIR\n"
          "(quantized the way --worker-config, default DIR/config.json, says).\n",
          f);
}

static int fail(const char *what, const rw_err *e) {
    /* a message that names what failed already is not prefixed twice ("push: push: ...") */
    const size_t n = strlen(what);
    const bool named = !strncmp(e->msg, what, n) && e->msg[n] == ':';
    fprintf(stderr, "rw-trainer: %s%s%s (%s)\n", named ? "" : what, named ? "" : ": ", e->msg,
            rw_status_str(e->status));
    return 1;
}

/* Splits a comma list in place. */
static int split(char *s, char **out, int cap) {
    int n = 0;
    for (char *tok = strtok(s, ","); tok && n < cap; tok = strtok(NULL, ","))
        out[n++] = tok;
    return n;
}

static int cmd_push(int argc, char **argv) {
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"to", required_argument, 0, 't'},
                                       {"transport", required_argument, 0, 'x'},
                                       {"trainer-tp", required_argument, 0, 'k'},
                                       {"bucket-mb", required_argument, 0, 'b'},
                                       {"bucket-bytes", required_argument, 0, 'B'},
                                       {"version", required_argument, 0, 'v'},
                                       {"only", required_argument, 0, 'o'},
                                       {"verify", no_argument, 0, 'V'},
                                       {"flush-cache", no_argument, 0, 'F'},
                                       {"worker-ranks", required_argument, 0, 'r'},
                                       {"device", required_argument, 0, 'd'},
                                       {"group", required_argument, 0, 'g'},
                                       {"timeout", required_argument, 0, 'T'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    const char *model = NULL, *transport = "zmq", *version = NULL, *only = NULL, *group = "weights";
    char *to = NULL, *ranks_s = NULL;
    int trainer_tp = 1, device = 0;
    long bucket_mb = 512;
    long long bucket_bytes = 0; /* --bucket-bytes: wins over --bucket-mb */
    double timeout = 120;
    bool verify = false, flush = false;
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 't': to = optarg; break;
        case 'x': transport = optarg; break;
        case 'k': trainer_tp = atoi(optarg); break;
        case 'b': bucket_mb = atol(optarg); break;
        case 'B': bucket_bytes = atoll(optarg); break;
        case 'v': version = optarg; break;
        case 'o': only = optarg; break;
        case 'V': verify = true; break;
        case 'F': flush = true; break;
        case 'r': ranks_s = optarg; break;
        case 'd': device = atoi(optarg); break;
        case 'g': group = optarg; break;
        case 'T': timeout = atof(optarg); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    /* bytes: at least one 256-byte aligned slot, at most 64 GiB (what a worker accepts) */
    if (!model || !to || trainer_tp < 1 || trainer_tp > 64 || bucket_mb < 1 || bucket_mb > 65536 ||
        bucket_bytes < 0 || (bucket_bytes && bucket_bytes < 256) || bucket_bytes > (64ll << 30) ||
        timeout <= 0 || (strcmp(transport, "zmq") && strcmp(transport, "nccl"))) {
        usage(stderr);
        return 2;
    }
    char *addrs[64], *rk[64];
    int n = split(to, addrs, 64);
    int nr = ranks_s ? split(ranks_s, rk, 64) : 0;
    if (n < 1 || (nr && nr != n)) {
        fprintf(stderr, "rw-trainer: --worker-ranks needs one count per --to address\n");
        return 2;
    }
    int wr[64];
    for (int i = 0; i < n; i++)
        wr[i] = nr ? atoi(rk[i]) : 1;
    rw_client *cl[64] = {0};
    rw_client_group *g = NULL;
    rw_err e;
    int rc = 0;
    for (int i = 0; i < n; i++)
        if (rw_client_connect(addrs[i], NULL, &cl[i], &e) != RW_OK) {
            rc = fail(addrs[i], &e);
            goto out;
        }
    bool nccl = !strcmp(transport, "nccl");
    if (nccl && rw_client_group_create(cl, wr, n, group, device, timeout, &g, &e) != RW_OK) {
        rc = fail("init_weights_update_group", &e);
        goto out;
    }
    rw_push_opts o = {.transport = transport,
                      .trainer_tp = trainer_tp,
                      .bucket_bytes =
                          bucket_bytes ? (uint64_t)bucket_bytes : (uint64_t)bucket_mb << 20,
                      .version = version,
                      .only = only,
                      .flush_cache = flush,
                      .verify = verify,
                      .timeout_ms = (int)(timeout * 1000),
                      .device = device};
    rw_push_summary s;
    if (rw_sync_push_ckpt(cl, n, g, model, &o, &s, &e) != RW_OK) {
        rc = fail("push", &e);
        goto out;
    }
    json_t *j = json_object();
    json_object_set_new(j, "version", json_string(s.version));
    json_object_set_new(j, "transport", json_string(transport));
    json_object_set_new(j, "workers", json_integer(n));
    json_object_set_new(j, "trainer_tp", json_integer(trainer_tp));
    json_object_set_new(j, "bucket_bytes", json_integer((json_int_t)o.bucket_bytes));
    json_object_set_new(j, "bytes", json_integer((json_int_t)s.bytes));
    json_object_set_new(j, "tensors", json_integer((json_int_t)s.tensors));
    json_object_set_new(j, "pieces", json_integer((json_int_t)s.pieces));
    json_object_set_new(j, "buckets", json_integer((json_int_t)s.buckets));
    json_object_set_new(j, "seconds", json_real(s.seconds));
    json_object_set_new(j, "gbps", json_real(s.gbps));
    json_object_set_new(j, "verified", json_boolean(s.verified));
    if (s.verified) {
        json_object_set_new(j, "checked", json_integer((json_int_t)s.checked));
        json_object_set_new(j, "mismatches", json_integer((json_int_t)s.mismatches));
        if (s.mismatches) json_object_set_new(j, "first_mismatch", json_string(s.first_mismatch));
    }
    char *txt = json_dumps(j, JSON_COMPACT);
    printf("%s\n", txt ? txt : "{}");
    free(txt);
    json_decref(j);
    if (s.verified && s.mismatches) rc = 3;
out:
    rw_client_group_destroy(g);
    for (int i = 0; i < n; i++)
        rw_client_close(cl[i]);
    return rc;
}

static int cmd_checksum(int argc, char **argv) {
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"tp", required_argument, 0, 't'},
                                       {"rank", required_argument, 0, 'r'},
                                       {"only", required_argument, 0, 'o'},
                                       {"worker-config", required_argument, 0, 'w'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    const char *model = NULL, *only = NULL, *wcfg = NULL;
    int tp = 1, rank = 0, c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 't': tp = atoi(optarg); break;
        case 'r': rank = atoi(optarg); break;
        case 'o': only = optarg; break;
        case 'w': wcfg = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!model || tp < 1 || rank < 0 || rank >= tp) {
        usage(stderr);
        return 2;
    }
    rw_err e;
    rw_config cfg;
    char path[4096];
    if (!wcfg) {
        snprintf(path, sizeof path, "%s/config.json", model);
        wcfg = path;
    }
    if (rw_config_load(wcfg, &cfg, &e) != RW_OK) return fail(wcfg, &e);
    rw_ckpt *ck = NULL;
    regex_t re;
    bool have_re = false;
    int rc = 0;
    json_t *sums = json_object();
    if (rw_ckpt_open(model, &ck, &e) != RW_OK) {
        rc = fail(model, &e);
        goto out;
    }
    if (only && only[0]) {
        if (regcomp(&re, only, REG_EXTENDED | REG_NOSUB)) {
            fprintf(stderr, "rw-trainer: bad --only regex '%s'\n", only);
            rc = 2;
            goto out;
        }
        have_re = true;
    }
    for (size_t i = 0; i < rw_ckpt_count(ck); i++) {
        const rw_st_entry *t = rw_ckpt_at(ck, i);
        if (have_re && regexec(&re, t->name, 0, NULL, 0)) continue;
        for (int pass = 0; pass < 2; pass++) {
            /* pass 1: the scale a quantized layer stores beside its weight */
            char name[RW_SYNC_MAX_NAME + 16];
            snprintf(name, sizeof name, "%s%s", t->name, pass ? "_scale_inv" : "");
            if (pass) {
                rw_wname w;
                if (rw_name_parse(t->name, &cfg, &w, NULL) != RW_OK ||
                    rw_quant_policy(&cfg, &w) == RW_WFMT_BF16)
                    break;
            }
            uint64_t v;
            if (rw_sync_expected_checksum(&cfg, tp, rank, name, t->data, t->dtype, &v, &e) !=
                RW_OK) {
                rc = fail(name, &e);
                goto out;
            }
            char hex[17];
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)v);
            json_object_set_new(sums, name, json_string(hex));
        }
    }
    json_t *j = json_object();
    json_object_set_new(j, "tp", json_integer(tp));
    json_object_set_new(j, "rank", json_integer(rank));
    json_object_set(j, "checksums", sums);
    char *txt = json_dumps(j, JSON_COMPACT);
    printf("%s\n", txt ? txt : "{}");
    free(txt);
    json_decref(j);
out:
    json_decref(sums);
    if (have_re) regfree(&re);
    rw_ckpt_close(ck);
    rw_config_free(&cfg);
    return rc;
}

int main(int argc, char **argv) {
    rw_cuda_load_modules_eagerly(); /* before any CUDA call */
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "push")) return cmd_push(argc - 1, argv + 1);
    if (!strcmp(argv[1], "checksum")) return cmd_checksum(argc - 1, argv + 1);
    if (!strcmp(argv[1], "--version")) {
        printf("rw-trainer %s\n", RW_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return 0;
    }
    usage(stderr);
    return 2;
}
