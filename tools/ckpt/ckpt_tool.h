/* ckpt_tool.h - the subcommands of rw-ckpt, each a main() of its own (argv[0] is the subcommand
 * name). Internal to tools/ckpt. */
#ifndef RW_CKPT_TOOL_H
#define RW_CKPT_TOOL_H

#include "rw_core.h"

int rw_ckpt_inspect_main(int argc, char **argv);
int rw_ckpt_random_main(int argc, char **argv);
/* tools/ckpt/quantize.c, built when present (RW_CKPT_HAVE_QUANTIZE). */
int rw_ckpt_quantize_main(int argc, char **argv);

#endif
