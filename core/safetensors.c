/* safetensors.c - placeholder until the reader/writer lands. */
#include "rw_core.h"
rw_status rw_st_open(const char *path, rw_st_file **out, rw_err *err) { *out = NULL; RW_FAIL(err, RW_E_UNSUPPORTED, "safetensors reader not built yet (%s)", path); }
