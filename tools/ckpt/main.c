/* main.c - rw-ckpt: inspect, generate and quantize Qwen3-MoE checkpoints. Dispatches to one
 * subcommand, passing it argv from the subcommand name on. */
#include "ckpt_tool.h"

#include <stdio.h>

static void usage(FILE *f) {
    fprintf(
        f, "usage: rw-ckpt COMMAND [ARGS]\n"
           "\n"
           "commands:\n"
           "  inspect DIR            config summary, tensor count, bytes per dtype; every tensor\n"
           "                         checked against config.json (exit 1 on any problem)\n"
           "  random --config CONFIG --out DIR [--seed S] [--dtype bf16|f16|f32]\n"
           "                         a random checkpoint of the config, in files of at most 4 GiB\n"
           "  quantize --format mxfp8|fp8-block [--last-n-bf16 N] IN_DIR OUT_DIR\n"
           "                         a quantized copy of a bf16 checkpoint\n"
           "\n"
           "`rw-ckpt COMMAND --help` describes each command.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version")) {
        printf("rw-ckpt %s\n", RW_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "inspect")) return rw_ckpt_inspect_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "random")) return rw_ckpt_random_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) {
#ifdef RW_CKPT_HAVE_QUANTIZE
        return rw_ckpt_quantize_main(argc - 1, argv + 1);
#else
        fprintf(stderr, "rw-ckpt: the quantize command is not built in this binary "
                        "(tools/ckpt/quantize.c was absent at configure time)\n");
        return 2;
#endif
    }
    fprintf(stderr, "rw-ckpt: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
