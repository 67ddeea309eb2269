/* main.c - rw-bench: the benchmarks of docs/TARGETS.md (S1-S5, G1-G4 and the rw side of G5) on the
 * Qwen3-30B-A3B shape with random weights generated on the GPU. Each mode measures the ceiling it
 * is compared against in the same run and prints one JSON line per measurement on stdout
 * (docs/BENCHMARKS.md describes the fields; tools/bench/report.py turns them into its table). */
#include "bench.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef RWB_HAVE_WORKER
#include "rw_worker.h" /* rw_precision_parse */
#endif

#ifndef RWB_DEFAULT_CONFIG
#define RWB_DEFAULT_CONFIG "tools/configs/qwen3-30b-a3b.json"
#endif
#ifndef RWB_CKPT_TOOL
#define RWB_CKPT_TOOL ""
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: rw-bench MODE[,MODE...] [options]\n"
            "\n"
            "modes (each measures its own ceiling in the same run):\n"
            "  ceilings  HBM copy, pinned H2D, raw NCCL broadcast GPU0->GPU1, bf16 GEMM 8192^3\n"
            "  sync      S1 S2 S5: full-model update over NCCL vs raw ncclBroadcast, per bucket size\n"
            "  pack      S3: pack scatter vs device-to-device copy of the same bytes\n"
            "  disk      S4: update from a safetensors checkpoint (page cache warm) vs pinned H2D\n"
            "  prefill   G4: 8 x 2k-token prompts, GEMM TFLOP/s vs cuBLASLt 8192^3 and model shapes\n"
            "  decode    G1 G2 G3 + generate (rw side of G5): tok/s vs the memory floor\n"
            "  tokenizer encode tokens/s on 1 MB of text vs the reference tokenizers (CPU)\n"
            "  kernels   rw side of G6 / G7: attention and the expert layer alone (only when\n"
            "            named; tools/peer/torch_kernels.py times torch on the same shapes),\n"
            "            the dense GEMMs (--dense-tokens) against cuBLASLt, and the small\n"
            "            per-token kernels (--small-tokens) against the copy rate\n"
            "  rollout   R1: an RL-shaped rollout (64 prompts x 16 samples; --rollout), sum of\n"
            "            per-step floors / wall time, sharing on and off (only when named)\n"
            "  all       ceilings,sync,pack,disk,prefill,decode,tokenizer\n"
            "\n"
            "options:\n"
            "  --config FILE        model config.json (default %s)\n"
            "  --gpu N --gpu2 N     primary (trainer) and worker GPU for sync (default 0, 1)\n"
            "  --reps N --warmup N  timed repetitions and warm-up runs (default 5, 2)\n"
            "  --full               full sweeps: buckets 64 MiB..2 GiB, batch 1..512, context 128..4k\n"
            "  --no-quant           skip the mxfp8-last-8-bf16 variants (S2, G3)\n"
            "  --precision P        models of the generation modes: standard (default) or high\n"
            "  --seed N             random weights and prompts (default 1)\n"
            "  --buckets LIST       sync bucket sizes in MiB (default 64,512,1024,2048)\n"
            "  --pack-layers N      layers of experts per pack rep (default 1)\n"
            "  --disk-dir DIR       an existing checkpoint for disk (default: write one)\n"
            "  --scratch DIR        where disk writes its checkpoint (default $TMPDIR or /tmp)/rw-bench\n"
            "  --disk-layers N      layers of the written checkpoint (default 4; 0 = all)\n"
            "  --ckpt-tool PATH     rw-ckpt executable (default: the one of this build)\n"
            "  --batches LIST       decode batch sizes (default 1,16,64,256)\n"
            "  --ctxs LIST          decode context lengths (default 128,1024)\n"
            "  --steps N            timed decode steps per point (default 20)\n"
            "  --gen B,P,N          generate: batch, prompt length, new tokens (default 64,128,128)\n"
            "  --gen-reps N         generate repetitions (default 3)\n"
            "  --setup-timeout S    bound on the prefill that fills a decode batch (default 90)\n"
            "  --time-limit S       after S seconds, skip what is left (skipped lines; default:\n"
            "                       $RW_BENCH_TIME_LIMIT, else none)\n"
            "  --prefill NP,PLEN    prompts and their length (default 8,2048)\n"
            "  --prefill-max-tokens N  engine token budget per step for prefill (default NP*PLEN)\n"
            "  --prefill-reps N     (default 5)\n"
            "  --routed-experts     decode: time the G1 point again with every request returning\n"
            "                       its routed experts (the cost of return_routed_experts)\n"
            "  --no-forward         decode: skip the forward entry point's lines (G1/G2/G3\n"
            "                       forward: the G1 point and batch 1 whatever --batches names)\n"
            "  --rollout P,N[,PMIN,PMAX[,MEDIAN,CAP]]  rollout (R1): P prompts x N samples,\n"
            "                       prompt lengths uniform in [PMIN, PMAX], responses log-normal\n"
            "                       with median MEDIAN capped at CAP (default 64,16,256,1024,1500,8192)\n"
            "  --rollout-sigma S    log-normal sigma of the response lengths (default 0.8)\n"
            "  --rollout-sharing on|off|both  prefix sharing of the rollout runs (default both)\n"
            "  --rollout-max-running N  engine batch size for the rollout (default 512)\n"
            "  --rollout-max-batch-tokens N  engine token budget per step (default 8192)\n"
            "  --rollout-dt S       time-series interval in seconds (default 0.5)\n"
            "  --kernel-attention LIST  kernels: attention shapes, dSxK (S decode queries at\n"
            "                       position K - 1) or pSxK (S causal prompts of K tokens)\n"
            "                       (default d256x1024,d32x8192,d1x1024,p8x2048; d1x1024 is\n"
            "                       the batch-1 point, no G6 target)\n"
            "  --expert-tokens LIST kernels: expert-layer token counts (default\n"
            "                       1,16,64,256,2048,16384)\n"
            "  --dense-tokens LIST  kernels: token counts of the dense GEMMs (q/k/v, o_proj,\n"
            "                       lm_head; default 1,7,64,256,2048)\n"
            "  --small-tokens LIST  kernels: token counts of the q/k norm + RoPE + KV write and\n"
            "                       the combine + norm kernels (default 1,7,64,256,2048)\n"
            "  --kernel-layers N    kernels: layers whose expert weights the repetitions rotate\n"
            "                       over, so they do not stay in L2 (default 4)\n"
            "  --print-routing T    print the kernels' routing of T tokens (--seed) as JSON and exit\n"
            "  --list               print the plan and exit (no device needed)\n"
            "  --print-prompts      print the generate prompts (--gen B,P,N; --seed) as JSON and exit\n"
            "\n"
            "stdout: one JSON object per measurement; stderr: progress. Exit 1 when any\n"
            "measurement reported an error (its line has an \"error\" field).\n",
            RWB_DEFAULT_CONFIG);
}

static void defaults(rwb_opts *o) {
    memset(o, 0, sizeof *o);
    o->config_path = RWB_DEFAULT_CONFIG;
    o->gpu0 = 0;
    o->gpu1 = 1;
    o->reps = 5;
    o->warmup = 2;
    o->seed = 1;
    o->s1_bucket = 512ull << 20;
    o->pack_layers = 1;
    o->disk_layers = -1; /* grids(): 4, or all with --full */
    o->ckpt_tool = RWB_CKPT_TOOL;
    o->steps = 20;
    o->g1_batch = 256;
    o->g1_ctx = 1024;
    o->gen_batch = 64;
    o->gen_prompt = 128;
    o->gen_new = 128;
    o->gen_reps = 3;
    o->setup_timeout_s = 90;
    o->nprompt = 8;
    o->plen = 2048;
    o->prefill_reps = 5;
    o->ro_prompts = 64;
    o->ro_n = 16;
    o->ro_pmin = 256;
    o->ro_pmax = 1024;
    o->ro_median = 1500;
    o->ro_cap = 8192;
    o->ro_sigma = 0.8;
    o->ro_dt = 0.5;
    o->ro_sharing = 2;
    o->ro_max_running = 512;
    o->ro_max_batch_tokens = 8192;
    static const rwb_attn_shape ka[] = {
        {256, 1024, false}, {32, 8192, false}, {1, 1024, false}, {8, 2048, true}};
    static const int kt[] = {1, 16, 64, 256, 2048, 16384};
    o->nkattn = (int)(sizeof ka / sizeof ka[0]);
    memcpy(o->kattn, ka, sizeof ka);
    o->nktokens = 6;
    memcpy(o->ktokens, kt, sizeof kt);
    static const int dt[] = {1, 7, 64, 256, 2048}; /* the token counts of the GEMM tests */
    o->ndtokens = 5;
    memcpy(o->dtokens, dt, sizeof dt);
    o->nstokens = 5;
    memcpy(o->stokens, dt, sizeof dt);
    o->kernel_layers = 4;
}

/* The reduced default grids, or the full ones; lists given on the command line win. */
static void grids(rwb_opts *o, bool have_buckets, bool have_batches, bool have_ctxs) {
    static const uint64_t bk_small[] = {64, 512, 1024, 2048},
                          bk_full[] = {64, 128, 256, 512, 1024, 2048};
    static const int b_small[] = {1, 16, 64, 256}, b_full[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    static const int c_small[] = {128, 1024}, c_full[] = {128, 512, 1024, 2048, 4096};
    if (!have_buckets) {
        const uint64_t *v = o->full ? bk_full : bk_small;
        o->nbuckets = o->full ? 6 : 4;
        for (int i = 0; i < o->nbuckets; i++) o->buckets[i] = v[i] << 20;
    }
    if (!have_batches) {
        const int *v = o->full ? b_full : b_small;
        o->nbatches = o->full ? 10 : 4;
        memcpy(o->batches, v, sizeof(int) * (size_t)o->nbatches);
    }
    if (!have_ctxs) {
        const int *v = o->full ? c_full : c_small;
        o->nctxs = o->full ? 5 : 2;
        memcpy(o->ctxs, v, sizeof(int) * (size_t)o->nctxs);
    }
    if (o->disk_layers < 0) o->disk_layers = o->full ? 0 : 4;
}

static bool parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* "a,b,c" into v[cap]; every element in [lo, hi]. */
static int parse_list(const char *s, long lo, long hi, long *v, int cap) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    int n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == cap || !parse_long(t, lo, hi, &v[n])) return -1;
        n++;
    }
    return n;
}

/* A list option of ints 1..hi (at most RWB_MAX_LIST) into dst[0..*n); false when malformed. */
static bool int_list(const char *s, long hi, int *dst, int *n) {
    long v[RWB_MAX_LIST];
    const int k = parse_list(s, 1, hi, v, RWB_MAX_LIST);
    if (k < 1) return false;
    for (int i = 0; i < k; i++)
        dst[i] = (int)v[i];
    *n = k;
    return true;
}

/* "d256x1024,p8x2048" into the kernels' attention shapes; false on a malformed list. */
static bool parse_attn_shapes(const char *s, rwb_opts *o) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    int n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *x = strchr(t, 'x');
        long sq, kv;
        if (n == RWB_MAX_LIST || (t[0] != 'd' && t[0] != 'p') || !x) return false;
        *x = 0;
        if (!parse_long(t + 1, 1, 1L << 16, &sq) || !parse_long(x + 1, 1, 1L << 20, &kv))
            return false;
        o->kattn[n++] = (rwb_attn_shape){(int)sq, (int)kv, t[0] == 'p'};
    }
    if (n < 1) return false;
    o->nkattn = n;
    return true;
}

typedef void (*mode_fn)(rwb_ctx *);
static const struct {
    const char *name;
    mode_fn fn;
    bool not_in_all; /* runs only when named (longer than a stage of tools/gpu/run-all.sh) */
} MODES[] = {
    {"ceilings", rwb_mode_ceilings, false}, {"sync", rwb_mode_sync, false},
    {"pack", rwb_mode_pack, false},         {"disk", rwb_mode_disk, false},
    {"prefill", rwb_mode_prefill, false},   {"decode", rwb_mode_decode, false},
    {"tokenizer", rwb_mode_tokenizer, false}, {"rollout", rwb_mode_rollout, true},
    {"kernels", rwb_mode_kernels, true},
};
#define NMODES ((int)(sizeof MODES / sizeof MODES[0]))

static void print_plan(const rwb_opts *o, const bool *run) {
    fprintf(stderr,
            "rw-bench plan (config %s, GPU %d, and %d where a line takes two; %d reps after %d "
            "warm-up):\n",
            o->config_path, o->gpu0, o->gpu1, o->reps, o->warmup);
    for (int i = 0; i < NMODES; i++) {
        if (!run[i]) continue;
        fprintf(stderr, "  %-8s ", MODES[i].name);
        if (!strcmp(MODES[i].name, "sync")) {
            fprintf(stderr, "buckets MiB:");
            for (int k = 0; k < o->nbuckets; k++)
                fprintf(stderr, " %llu", (unsigned long long)(o->buckets[k] >> 20));
            fprintf(stderr, "; S1/S2/S5 at %llu MiB%s", (unsigned long long)(o->s1_bucket >> 20),
                    o->no_quant ? " (no S2)" : "");
        } else if (!strcmp(MODES[i].name, "decode")) {
            fprintf(stderr, "batches:");
            for (int k = 0; k < o->nbatches; k++) fprintf(stderr, " %d", o->batches[k]);
            fprintf(stderr, "; contexts:");
            for (int k = 0; k < o->nctxs; k++) fprintf(stderr, " %d", o->ctxs[k]);
            fprintf(stderr, "; %d steps; generate %d x (%d + %d)%s", o->steps, o->gen_batch,
                    o->gen_prompt, o->gen_new, o->no_quant ? "" : "; mxfp8 at the G1 point");
        } else if (!strcmp(MODES[i].name, "prefill")) {
            fprintf(stderr, "%d x %d tokens, %d reps", o->nprompt, o->plen, o->prefill_reps);
        } else if (!strcmp(MODES[i].name, "disk")) {
            if (o->disk_dir)
                fprintf(stderr, "checkpoint %s", o->disk_dir);
            else if (o->disk_layers)
                fprintf(stderr, "random checkpoint of %d layers under %s", o->disk_layers,
                        o->scratch);
            else
                fprintf(stderr, "random checkpoint of all layers under %s", o->scratch);
        } else if (!strcmp(MODES[i].name, "pack")) {
            fprintf(stderr, "%d layer(s) of experts per rep", o->pack_layers);
        } else if (!strcmp(MODES[i].name, "rollout")) {
            fprintf(stderr,
                    "%d prompts x %d, prompts %d..%d tokens, responses log-normal median %d "
                    "sigma %.2f cap %d; sharing %s; max running %d",
                    o->ro_prompts, o->ro_n, o->ro_pmin, o->ro_pmax, o->ro_median, o->ro_sigma,
                    o->ro_cap, o->ro_sharing == 2 ? "on and off" : o->ro_sharing ? "on" : "off",
                    o->ro_max_running);
        } else if (!strcmp(MODES[i].name, "kernels")) {
            fprintf(stderr, "attention:");
            for (int k = 0; k < o->nkattn; k++)
                fprintf(stderr, "%s %s %d x %d", k ? "," : "",
                        o->kattn[k].prefill ? "prefill" : "decode", o->kattn[k].seqs,
                        o->kattn[k].kv);
            fprintf(stderr, "; experts at tokens:");
            for (int k = 0; k < o->nktokens; k++) fprintf(stderr, " %d", o->ktokens[k]);
            fprintf(stderr, " (weights of %d layers); dense GEMMs at tokens:", o->kernel_layers);
            for (int k = 0; k < o->ndtokens; k++) fprintf(stderr, " %d", o->dtokens[k]);
            fprintf(stderr, "; small kernels at tokens:");
            for (int k = 0; k < o->nstokens; k++) fprintf(stderr, " %d", o->stokens[k]);
        }
        if (!strcmp(MODES[i].name, "decode") && o->routes)
            fprintf(stderr, "; the G1 point with routed experts");
        if (!strcmp(MODES[i].name, "decode"))
            fprintf(stderr, o->no_forward ? "; no forward lines"
                                          : "; forward lines at the G1 point and batch 1");
        fprintf(stderr, "\n");
    }
#ifndef RWB_HAVE_SYNC
    fprintf(stderr, "  note: built without the sync benchmark entry points (sync/disk give ceilings only)\n");
#endif
#ifndef RWB_HAVE_MOE_BENCH
    fprintf(stderr, "  note: built without CUDA (pack gives its ceiling only)\n");
#endif
#ifndef RWB_HAVE_WORKER
    fprintf(stderr, "  note: built without the worker module (decode/prefill give ceilings only)\n");
#endif
}

int main(int argc, char **argv) {
    rw_cuda_load_modules_eagerly(); /* before any CUDA call */
    rwb_ctx c;
    memset(&c, 0, sizeof c);
    rwb_opts *o = &c.o;
    defaults(o);
    bool run[NMODES] = {0}, any = false, list = false, print_prompts = false;
    long print_routing = 0;
    bool have_buckets = false, have_batches = false, have_ctxs = false;
    char scratch[1024];
    const char *tmp = getenv("TMPDIR");
    snprintf(scratch, sizeof scratch, "%s/rw-bench", tmp && *tmp ? tmp : "/tmp");
    o->scratch = scratch;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long v, lv[RWB_MAX_LIST];
        int n;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--version")) {
            printf("rw-bench %s\n", RW_VERSION);
            return 0;
        }
        if (a[0] != '-') {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", a);
            for (char *save = NULL, *t = strtok_r(buf, ",", &save); t;
                 t = strtok_r(NULL, ",", &save)) {
                bool found = false;
                for (int k = 0; k < NMODES; k++)
                    if ((!strcmp(t, "all") && !MODES[k].not_in_all) ||
                        !strcmp(t, MODES[k].name)) {
                        run[k] = true;
                        found = true;
                    }
                if (!found) {
                    fprintf(stderr, "rw-bench: unknown mode '%s'\n\n", t);
                    usage(stderr);
                    return 2;
                }
                any = true;
            }
            continue;
        }
        if (!strcmp(a, "--full")) {
            o->full = true;
            continue;
        }
        if (!strcmp(a, "--no-quant")) {
            o->no_quant = true;
            continue;
        }
        if (!strcmp(a, "--routed-experts")) {
            o->routes = true;
            continue;
        }
        if (!strcmp(a, "--no-forward")) {
            o->no_forward = true;
            continue;
        }
        if (!strcmp(a, "--list")) {
            list = true;
            continue;
        }
        if (!strcmp(a, "--print-prompts")) {
            print_prompts = true;
            any = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "rw-bench: %s needs a value\n", a);
            return 2;
        }
        const char *val = argv[++i];
#define INT_OPT(flag, lo, hi, dst)                                                                 \
    if (!strcmp(a, flag)) {                                                                        \
        if (!parse_long(val, lo, hi, &v)) goto bad;                                                \
        dst = v;                                                                                   \
        continue;                                                                                  \
    }
        INT_OPT("--gpu", 0, 63, o->gpu0)
        INT_OPT("--gpu2", 0, 63, o->gpu1)
        INT_OPT("--reps", 1, RWB_MAX_SAMPLES, o->reps)
        INT_OPT("--warmup", 0, 100, o->warmup)
        INT_OPT("--seed", 0, 1L << 62, o->seed)
        INT_OPT("--pack-layers", 1, 1024, o->pack_layers)
        INT_OPT("--disk-layers", 0, 100000, o->disk_layers)
        INT_OPT("--steps", 1, RWB_MAX_SAMPLES, o->steps)
        INT_OPT("--gen-reps", 1, RWB_MAX_SAMPLES, o->gen_reps)
        INT_OPT("--prefill-max-tokens", 0, 1L << 24, o->prefill_max_tokens)
        INT_OPT("--prefill-reps", 1, RWB_MAX_SAMPLES, o->prefill_reps)
        INT_OPT("--setup-timeout", 1, 100000, o->setup_timeout_s)
        INT_OPT("--time-limit", 0, 100000, o->time_limit_s)
        INT_OPT("--rollout-max-running", 1, 4096, o->ro_max_running)
        INT_OPT("--rollout-max-batch-tokens", 1, 1L << 20, o->ro_max_batch_tokens)
        INT_OPT("--kernel-layers", 1, 1024, o->kernel_layers)
        if (!strcmp(a, "--print-routing")) {
            if (!parse_long(val, 1, 1L << 20, &print_routing)) goto bad;
            any = true;
            continue;
        }
#undef INT_OPT
        if (!strcmp(a, "--precision")) {
#ifdef RWB_HAVE_WORKER
            rw_err e = {0};
            rw_precision p;
            if (rw_precision_parse(val, &p, &e) != RW_OK) goto bad;
            o->precision = (int)p;
#else
            goto bad; /* only the worker's modes have a precision */
#endif
        } else if (!strcmp(a, "--config")) {
            o->config_path = val;
        } else if (!strcmp(a, "--disk-dir")) {
            o->disk_dir = val;
        } else if (!strcmp(a, "--scratch")) {
            o->scratch = val;
        } else if (!strcmp(a, "--ckpt-tool")) {
            o->ckpt_tool = val;
        } else if (!strcmp(a, "--buckets")) {
            if ((n = parse_list(val, 1, 1L << 20, lv, RWB_MAX_LIST)) < 1) goto bad;
            for (int k = 0; k < n; k++) o->buckets[k] = (uint64_t)lv[k] << 20;
            o->nbuckets = n;
            have_buckets = true;
        } else if (!strcmp(a, "--batches")) {
            if (!int_list(val, 1L << 16, o->batches, &o->nbatches)) goto bad;
            have_batches = true;
        } else if (!strcmp(a, "--ctxs")) {
            if (!int_list(val, 1L << 20, o->ctxs, &o->nctxs)) goto bad;
            have_ctxs = true;
        } else if (!strcmp(a, "--gen")) {
            if (parse_list(val, 1, 1L << 20, lv, 3) != 3) goto bad;
            o->gen_batch = (int)lv[0];
            o->gen_prompt = (int)lv[1];
            o->gen_new = (int)lv[2];
        } else if (!strcmp(a, "--rollout")) {
            if ((n = parse_list(val, 1, 1L << 20, lv, 6)) != 2 && n != 4 && n != 6) goto bad;
            o->ro_prompts = (int)lv[0];
            o->ro_n = (int)lv[1];
            if (n >= 4) {
                o->ro_pmin = (int)lv[2];
                o->ro_pmax = (int)lv[3];
            }
            if (n == 6) {
                o->ro_median = (int)lv[4];
                o->ro_cap = (int)lv[5];
            }
            if (o->ro_pmin > o->ro_pmax || o->ro_n > 65536) goto bad;
        } else if (!strcmp(a, "--rollout-sigma") || !strcmp(a, "--rollout-dt")) {
            char *end;
            const double x = strtod(val, &end);
            if (end == val || *end || !(x > 0 && x <= 100)) goto bad;
            if (!strcmp(a, "--rollout-sigma"))
                o->ro_sigma = x;
            else
                o->ro_dt = x;
        } else if (!strcmp(a, "--rollout-sharing")) {
            if (!strcmp(val, "on"))
                o->ro_sharing = 1;
            else if (!strcmp(val, "off"))
                o->ro_sharing = 0;
            else if (!strcmp(val, "both"))
                o->ro_sharing = 2;
            else
                goto bad;
        } else if (!strcmp(a, "--kernel-attention")) {
            if (!parse_attn_shapes(val, o)) goto bad;
        } else if (!strcmp(a, "--expert-tokens")) {
            if (!int_list(val, 1L << 20, o->ktokens, &o->nktokens)) goto bad;
        } else if (!strcmp(a, "--dense-tokens")) {
            if (!int_list(val, 1L << 20, o->dtokens, &o->ndtokens)) goto bad;
        } else if (!strcmp(a, "--small-tokens")) {
            if (!int_list(val, 1L << 20, o->stokens, &o->nstokens)) goto bad;
        } else if (!strcmp(a, "--prefill")) {
            if (parse_list(val, 1, 1L << 20, lv, 2) != 2) goto bad;
            o->nprompt = (int)lv[0];
            o->plen = (int)lv[1];
        } else {
            fprintf(stderr, "rw-bench: unknown option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
        continue;
    bad:
        fprintf(stderr, "rw-bench: bad value '%s' for %s\n", val, a);
        return 2;
    }
    if (!any) {
        usage(stderr);
        return 2;
    }
    grids(o, have_buckets, have_batches, have_ctxs);
    bool s1_listed = false;
    for (int k = 0; k < o->nbuckets; k++) s1_listed |= o->buckets[k] == o->s1_bucket;
    if (!s1_listed && o->nbuckets < RWB_MAX_LIST) o->buckets[o->nbuckets++] = o->s1_bucket;
    /* ascending: the sync mode attaches S1/S2/S5 to the first size >= s1_bucket that works */
    for (int a = 1; a < o->nbuckets; a++)
        for (int b = a; b > 0 && o->buckets[b - 1] > o->buckets[b]; b--) {
            uint64_t t = o->buckets[b];
            o->buckets[b] = o->buckets[b - 1];
            o->buckets[b - 1] = t;
        }
    if (list) {
        print_plan(o, run);
        return 0;
    }

    rw_err err = {0};
    if (rw_config_load(o->config_path, &c.cfg, &err) != RW_OK) {
        fprintf(stderr, "rw-bench: %s\n", err.msg);
        return 1;
    }
    if (rwb_config_mxfp8_last(&c.cfg, 8, &c.cfg_q, &err) != RW_OK) {
        fprintf(stderr, "rw-bench: %s\n", err.msg);
        rw_config_free(&c.cfg);
        return 1;
    }
    if (print_prompts) {
        /* the generate prompts as a JSON array (tools/peer/hf_generate.py --print-prompts agrees) */
        printf("[");
        for (int b = 0; b < o->gen_batch; b++) {
            printf(b ? ", [" : "[");
            for (int t = 0; t < o->gen_prompt; t++)
                printf(t ? ", %d" : "%d", rwb_prompt_token(o->seed, b, t, c.cfg.vocab_size));
            printf("]");
        }
        printf("]\n");
        rw_config_free(&c.cfg);
        rw_config_free(&c.cfg_q);
        return 0;
    }
    if (print_routing) {
        /* the kernels' routing as a JSON array per token (tools/peer/torch_kernels.py agrees) */
        const int rc = rwb_print_routing(&c.cfg, o->seed, print_routing);
        rw_config_free(&c.cfg);
        rw_config_free(&c.cfg_q);
        return rc;
    }
    rwb_meta_init(&c.meta, o, argc, argv);
    print_plan(o, run);
    const char *tl = getenv("RW_BENCH_TIME_LIMIT"); /* set by tools/gpu/run-all.sh per stage */
    long tlv;
    if (o->time_limit_s <= 0 && tl && parse_long(tl, 1, 100000, &tlv)) o->time_limit_s = tlv;
    if (o->time_limit_s > 0) c.t_deadline = rw_now() + o->time_limit_s;
    for (int k = 0; k < NMODES; k++) {
        if (!run[k]) continue;
        if (rwb_out_of_time(&c)) {
            rwb_emit_skip(&c, MODES[k].name, "all", "time limit reached", NULL);
            continue;
        }
        double t0 = rw_now();
        fprintf(stderr, "rw-bench: --- %s ---\n", MODES[k].name);
        MODES[k].fn(&c);
        fprintf(stderr, "rw-bench: %s done in %.1f s\n", MODES[k].name, rw_now() - t0);
    }
    rwb_engine_release(&c);
    rwb_meta_free(&c.meta);
    rw_config_free(&c.cfg);
    rw_config_free(&c.cfg_q);
    if (c.failures) fprintf(stderr, "rw-bench: %d measurement(s) failed\n", c.failures);
    return c.failures ? 1 : 0;
}
