/* dtype.c - dtype sizes and names (both our spelling and the safetensors one). */
#include "rw_core.h"

#include <strings.h>

static const struct {
    rw_dtype dt;
    size_t size;
    const char *name;
    const char *st;
} dtypes[] = {
    {RW_DTYPE_BF16, 2, "bf16", "BF16"},   {RW_DTYPE_F16, 2, "f16", "F16"},
    {RW_DTYPE_F32, 4, "f32", "F32"},      {RW_DTYPE_I32, 4, "i32", "I32"},
    {RW_DTYPE_E4M3, 1, "e4m3", "F8_E4M3"}, {RW_DTYPE_UE8M0, 1, "ue8m0", "F8_E8M0"},
    {RW_DTYPE_U8, 1, "u8", "U8"},         {RW_DTYPE_I64, 8, "i64", "I64"},
    {RW_DTYPE_F64, 8, "f64", "F64"},      {RW_DTYPE_I8, 1, "i8", "I8"},
    {RW_DTYPE_BOOL, 1, "bool", "BOOL"},   {RW_DTYPE_I16, 2, "i16", "I16"},
};
#define NDT (sizeof dtypes / sizeof dtypes[0])

size_t rw_dtype_size(rw_dtype dt) {
    for (size_t i = 0; i < NDT; i++)
        if (dtypes[i].dt == dt) return dtypes[i].size;
    return 0;
}

const char *rw_dtype_name(rw_dtype dt) {
    for (size_t i = 0; i < NDT; i++)
        if (dtypes[i].dt == dt) return dtypes[i].name;
    return "invalid";
}

const char *rw_dtype_st_name(rw_dtype dt) {
    for (size_t i = 0; i < NDT; i++)
        if (dtypes[i].dt == dt) return dtypes[i].st;
    return "INVALID";
}

rw_dtype rw_dtype_from_name(const char *s) {
    if (!s) return RW_DTYPE_INVALID;
    for (size_t i = 0; i < NDT; i++)
        if (!strcmp(s, dtypes[i].st) || !strcasecmp(s, dtypes[i].name)) return dtypes[i].dt;
    if (!strcasecmp(s, "bfloat16")) return RW_DTYPE_BF16;
    if (!strcasecmp(s, "float32")) return RW_DTYPE_F32;
    if (!strcasecmp(s, "float16")) return RW_DTYPE_F16;
    if (!strcasecmp(s, "int32")) return RW_DTYPE_I32;
    if (!strcasecmp(s, "float8_e4m3fn")) return RW_DTYPE_E4M3;
    if (!strcasecmp(s, "uint8")) return RW_DTYPE_U8;
    return RW_DTYPE_INVALID;
}
