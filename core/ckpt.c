/* ckpt.c - placeholder until the checkpoint reader lands. */
#include "rw_core.h"
