/* rw_core.h - the core module's public contract: status and errors, logging, dtypes and their
 * scalar conversions, tensor views, the weight arena, safetensors files and checkpoints,
 * config.json for Qwen3-MoE, canonical tensor names, and device/stream helpers.
 *
 * Compiles as C11 and as CUDA C++ (the scalar conversions are host+device inline functions so the
 * CPU reference and the CUDA kernels share one definition, bit for bit).
 *
 * Conventions (see style.md): every fallible function returns rw_status and takes an optional
 * `rw_err *` last; inputs first, out-params last; `destroy(NULL)` is a no-op. Library code never exits.
 */
#ifndef RW_CORE_H
#define RW_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__CUDACC__)
#define RW_HD __host__ __device__ __forceinline__
#else
#define RW_HD static inline
#endif

/* ------------------------------------------------------------------------------------------ */
/* Status and errors                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* Append-only; the numbers travel in protocol error replies. */
typedef enum rw_status {
    RW_OK = 0,
    RW_E_INVALID_ARG = 1,       /* a caller passed something that cannot be right */
    RW_E_OOM = 2,               /* host or device allocation failed */
    RW_E_IO = 3,                /* open/read/write/mmap failed */
    RW_E_FORMAT = 4,            /* malformed file or message */
    RW_E_UNSUPPORTED = 5,       /* valid but not implemented (say what) */
    RW_E_NOT_FOUND = 6,         /* a named thing does not exist */
    RW_E_SHAPE = 7,             /* shape or byte count does not fit */
    RW_E_DTYPE = 8,             /* dtype does not fit */
    RW_E_CUDA = 9,              /* CUDA runtime or driver error */
    RW_E_NCCL = 10,             /* NCCL error */
    RW_E_ZMQ = 11,              /* ZeroMQ error */
    RW_E_TIMEOUT = 12,          /* a bounded wait ran out */
    RW_E_STATE = 13,            /* not allowed in the current state */
    RW_E_PROTOCOL = 14,         /* protocol violation (version, command, field) */
    RW_E_BUSY = 15,             /* refused because work is in progress */
    RW_E_WEIGHTS_INCOMPLETE = 16, /* a failed update left weights partly written */
    RW_E_ABORTED = 17,          /* the operation was aborted */
    RW_E_INTERNAL = 18,         /* a bug: an invariant did not hold */
    RW_E_AUTH = 19,             /* authentication refused */
    RW_E_NO_DEVICE = 20,        /* no CUDA device, or built without CUDA */
    RW_E_RANGE = 21,            /* a value outside its allowed range (token id, size, index) */
} rw_status;

/* Name of a status, e.g. "invalid_arg". Never NULL. */
const char *rw_status_str(rw_status s);

/* Detailed error: the status, a human message naming what was wrong, and where it was raised.
 * Callers own it (usually on the stack); pass NULL where the detail is not wanted. */
typedef struct rw_err {
    rw_status status;
    char msg[512];
    char where[64]; /* "file.c:123" */
} rw_err;

/* Records `s` and a printf-style message in `e` (if non-NULL); returns `s`. A message set later
 * overwrites an earlier one, except rw_err_prefix which prepends context. */
rw_status rw_err_set(rw_err *e, rw_status s, const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
/* Prepends "context: " to the message already in `e`; returns e->status (RW_OK if e is NULL). */
rw_status rw_err_prefix(rw_err *e, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void rw_err_clear(rw_err *e);

#define RW_FAIL(err, st, ...) return rw_err_set((err), (st), __FILE__, __LINE__, __VA_ARGS__)
#define RW_ERR(err, st, ...) rw_err_set((err), (st), __FILE__, __LINE__, __VA_ARGS__)
/* Propagate a failing rw_status. */
#define RW_CHECK(expr)                                                                             \
    do {                                                                                           \
        rw_status rw_check_s_ = (expr);                                                            \
        if (rw_check_s_ != RW_OK) return rw_check_s_;                                              \
    } while (0)
/* Propagate to one cleanup label: `st` receives the status. */
#define RW_CHECKGOTO(expr, st, label)                                                              \
    do {                                                                                           \
        (st) = (expr);                                                                             \
        if ((st) != RW_OK) goto label;                                                             \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Logging: level from the environment variable RW_LOG (error|warn|info|debug|trace, default     */
/* info), written to stderr with a level tag; RW_LOG_PREFIX adds a tag (e.g. "rank1").          */
/* ------------------------------------------------------------------------------------------ */
typedef enum rw_log_level {
    RW_LOG_ERROR = 0,
    RW_LOG_WARN = 1,
    RW_LOG_INFO = 2,
    RW_LOG_DEBUG = 3,
    RW_LOG_TRACE = 4,
} rw_log_level;

bool rw_log_enabled(rw_log_level lvl);
void rw_log(rw_log_level lvl, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
#define RW_LOGE(...) rw_log(RW_LOG_ERROR, __VA_ARGS__)
#define RW_LOGW(...) rw_log(RW_LOG_WARN, __VA_ARGS__)
#define RW_LOGI(...) rw_log(RW_LOG_INFO, __VA_ARGS__)
#define RW_LOGD(...) rw_log(RW_LOG_DEBUG, __VA_ARGS__)

/* Monotonic seconds. */
double rw_now(void);

/* ------------------------------------------------------------------------------------------ */
/* dtypes                                                                                       */
/* ------------------------------------------------------------------------------------------ */
typedef enum rw_dtype {
    RW_DTYPE_INVALID = 0,
    RW_DTYPE_BF16 = 1,
    RW_DTYPE_F16 = 2,
    RW_DTYPE_F32 = 3,
    RW_DTYPE_I32 = 4,
    RW_DTYPE_E4M3 = 5,  /* float8 e4m3fn: saturating, no inf, NaN 0x7f/0xff */
    RW_DTYPE_UE8M0 = 6, /* unsigned exponent-only scale: 2^(b-127); 0xff is NaN */
    RW_DTYPE_U8 = 7,
    RW_DTYPE_I64 = 8,
    RW_DTYPE_F64 = 9,
    RW_DTYPE_I8 = 10,
    RW_DTYPE_BOOL = 11,
    RW_DTYPE_I16 = 12,
    RW_DTYPE_COUNT_ = 13,
} rw_dtype;

size_t rw_dtype_size(rw_dtype dt);          /* bytes per element; 0 for INVALID */
const char *rw_dtype_name(rw_dtype dt);     /* "bf16", "f32", "e4m3", ... ("invalid") */
const char *rw_dtype_st_name(rw_dtype dt);  /* safetensors spelling: "BF16", "F8_E4M3", ... */
rw_dtype rw_dtype_from_name(const char *s); /* accepts both spellings; INVALID if unknown */

/* --- scalar conversions, host + device, bit-exact ---------------------------------------- */

RW_HD uint32_t rw_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
RW_HD float rw_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* bf16 -> fp32: exact. */
RW_HD float rw_bf16_to_f32(uint16_t h) { return rw_bits_f32((uint32_t)h << 16); }

/* fp32 -> bf16: round to nearest, ties to even; every NaN becomes the canonical quiet NaN
 * 0x7fc0 (a NaN produced by arithmetic has a different sign and payload on x86 and on the GPU, so
 * one encoding keeps CPU references and kernels byte-identical); inf stays inf, overflow rounds to
 * inf as IEEE rounding does. */
RW_HD uint16_t rw_f32_to_bf16(float f) {
    uint32_t u = rw_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;
    return (uint16_t)(u >> 16);
}

/* The low half of v as a hi + lo bf16 pair, hi = rw_f32_to_bf16(v): lo = bf16(v - hi) (the
 * difference is exact in fp32), so hi + lo carries about 16 significant bits of v. The CUDA
 * backend feeds its GEMMs such pairs (worker/kernels/common.h). */
RW_HD uint16_t rw_bf16_split_lo(float v, uint16_t hi) {
    return rw_f32_to_bf16(v - rw_bf16_to_f32(hi));
}

/* fp16 -> fp32: exact, subnormals included. */
RW_HD float rw_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return rw_bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0));
    if (exp == 0) {
        if (man == 0) return rw_bits_f32(sign);
        /* subnormal: man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return rw_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

/* fp32 -> fp16: round to nearest even, overflow to inf, NaN kept. */
RW_HD uint16_t rw_f32_to_f16(float f) {
    uint32_t u = rw_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                                    /* below 2^-14: subnormal or zero */
        /* value / 2^-24 rounded to nearest even, as an integer mantissa */
        uint32_t e = a >> 23;
        if (e < 102) return sign; /* < 2^-25: rounds to zero */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* m * 2^(e-150) / 2^-24 = m >> (126 - e) */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t lsb = (a >> 13) & 1u;
    a += 0xfffu + lsb;
    return (uint16_t)(sign | (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu));
}

/* e4m3fn -> fp32: exact. 0x7f / 0xff are NaN; there are no infinities. Max 448. */
RW_HD float rw_e4m3_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t exp = (b >> 3) & 0xfu;
    uint32_t man = b & 0x7u;
    if (exp == 0xf && man == 0x7) return rw_bits_f32(0x7fc00000u | sign);
    if (exp == 0) {
        float v = (float)man * 0.001953125f; /* man * 2^-9 */
        return sign ? -v : v;
    }
    return rw_bits_f32(sign | ((exp + 120u) << 23) | (man << 20));
}

/* fp32 -> e4m3fn: saturating (|x| > 448 -> 448 with sign, inf too), round to nearest even,
 * every NaN -> 0x7f. NaN is canonical (sign dropped) because the sign of a NaN produced by
 * arithmetic (x / scale) differs between x86 and the GPU; one encoding keeps the CPU reference
 * and the CUDA quantizers byte-identical. */
RW_HD uint8_t rw_f32_to_e4m3(float f) {
    uint32_t u = rw_f32_bits(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fu;
    if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* >= 448 (and inf): saturate */
    uint32_t e = a >> 23;
    if (e < 121) { /* below 2^-6: subnormal range of e4m3, step 2^-9 */
        if (e < 116) return sign; /* < 2^-10: rounds to zero (2^-10 exactly is a tie -> 0) */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 141u - e; /* m * 2^(e-150) / 2^-9 = m >> (141 - e) */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint8_t)(sign | q); /* q == 8 carries into the exponent field correctly */
    }
    uint32_t lsb = (a >> 20) & 1u;
    a += 0x7ffffu + lsb;
    uint32_t r = (((a >> 23) - 120u) << 3) | ((a >> 20) & 0x7u);
    if (r > 0x7eu) r = 0x7eu; /* values in [448, 464) rounded up past 448: saturate */
    return (uint8_t)(sign | r);
}

/* UE8M0 -> fp32: 2^(b-127); 0xff is NaN. b = 0 gives 2^-127 (a subnormal float). */
RW_HD float rw_ue8m0_to_f32(uint8_t b) {
    /* selects, not branches: the quantized expert tiles convert four scales a K block */
    const uint32_t bits = (uint32_t)b << 23;
    return rw_bits_f32(b == 0xff ? 0x7fc00000u : b == 0 ? 0x00400000u : bits);
}

/* ------------------------------------------------------------------------------------------ */
/* Tensor views                                                                                 */
/* ------------------------------------------------------------------------------------------ */
#define RW_MAX_DIMS 6

typedef enum rw_place {
    RW_PLACE_HOST = 0,
    RW_PLACE_DEVICE = 1,
} rw_place;

/* A view: borrows `data`, owns nothing. Strides are in elements; a contiguous row-major view has
 * stride[ndim-1] == 1. */
typedef struct rw_tensor {
    rw_dtype dtype;
    int ndim;
    int64_t shape[RW_MAX_DIMS];
    int64_t stride[RW_MAX_DIMS];
    void *data;
    rw_place place;
    int device; /* CUDA ordinal when place == DEVICE */
} rw_tensor;

/* A contiguous row-major view over `data`. */
rw_tensor rw_tensor_view(void *data, rw_dtype dt, int ndim, const int64_t *shape, rw_place place,
                         int device);
int64_t rw_shape_numel(int ndim, const int64_t *shape);
int64_t rw_tensor_numel(const rw_tensor *t);
size_t rw_tensor_nbytes(const rw_tensor *t); /* numel * dtype size (contiguous extent) */
bool rw_tensor_is_contiguous(const rw_tensor *t);
/* "[96, 128]" into buf; returns buf. */
const char *rw_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

/* ------------------------------------------------------------------------------------------ */
/* Arena: one allocation (host or device), many views. Used for all weights of a rank so they    */
/* can be released and re-taken as one piece.                                                   */
/* ------------------------------------------------------------------------------------------ */
typedef struct rw_arena rw_arena;

/* Allocates `capacity` bytes on the host (64-byte aligned) or on CUDA device `device`.
 * Host memory is zero-filled; device memory is zeroed with cudaMemset. */
rw_status rw_arena_create(rw_place place, int device, size_t capacity, rw_arena **out, rw_err *err);
void rw_arena_destroy(rw_arena *a);
/* Bump-allocates `bytes` aligned to `align` (power of two, at least 1; 256 recommended for device).
 * The memory stays owned by the arena. */
rw_status rw_arena_alloc(rw_arena *a, size_t bytes, size_t align, void **out, rw_err *err);
/* A contiguous tensor view allocated in the arena (256-byte aligned). */
rw_status rw_arena_tensor(rw_arena *a, rw_dtype dt, int ndim, const int64_t *shape, rw_tensor *out,
                          rw_err *err);
size_t rw_arena_used(const rw_arena *a);
size_t rw_arena_capacity(const rw_arena *a);
void *rw_arena_base(const rw_arena *a);
rw_place rw_arena_place(const rw_arena *a);
/* Frees the backing memory but keeps the bookkeeping (offsets of every allocation), so that
 * rw_arena_resume() re-takes the same amount; pointers handed out before become invalid unless
 * the base address is kept (device arenas reserve their virtual range and keep it). */
rw_status rw_arena_release(rw_arena *a, rw_err *err);
rw_status rw_arena_resume(rw_arena *a, rw_err *err);
bool rw_arena_is_released(const rw_arena *a);

/* ------------------------------------------------------------------------------------------ */
/* safetensors                                                                                  */
/* ------------------------------------------------------------------------------------------ */
/* Limits applied by the reader (a header past these is refused, not trusted). */
#define RW_ST_MAX_HEADER (100u * 1024u * 1024u)
#define RW_ST_MAX_NAME 512

typedef struct rw_st_entry {
    const char *name;           /* owned by the file handle */
    rw_dtype dtype;
    int ndim;
    int64_t shape[RW_MAX_DIMS];
    uint64_t begin, end;        /* byte offsets relative to the start of the data section */
    /* Begin of the bytes in the file's mapping (rw_st_open) or buffer (rw_st_open_mem). Reading
     * through a mapping faults (SIGBUS) if the file shrinks meanwhile: code that must survive a
     * file changed under it (the worker's load and update paths) reads with rw_st_read. */
    const void *data;
    int file_index;             /* index of the file within a checkpoint (0 for a lone file) */
} rw_st_entry;

typedef struct rw_st_file rw_st_file;

/* Validates a file: header length sane (<= RW_ST_MAX_HEADER and within the file), header is a
 * JSON object, every dtype known, shape x dtype size == end - begin, offsets inside the data
 * section, no two tensors overlapping. Errors name the tensor and the rule it broke. The header
 * is read with pread; the handle keeps the file descriptor open (for rw_st_read) and maps the
 * file (for rw_st_entry.data; mapping reads nothing until a caller touches it). */
rw_status rw_st_open(const char *path, rw_st_file **out, rw_err *err);
/* Same validation over bytes in memory (borrowed; must outlive the handle). For fuzzing and for
 * buffers received over the wire. */
rw_status rw_st_open_mem(const void *buf, size_t len, rw_st_file **out, rw_err *err);
void rw_st_close(rw_st_file *f);
size_t rw_st_count(const rw_st_file *f);
const rw_st_entry *rw_st_at(const rw_st_file *f, size_t i); /* sorted by data offset */
const rw_st_entry *rw_st_find(const rw_st_file *f, const char *name);
/* A "__metadata__" string value, or NULL. */
const char *rw_st_metadata(const rw_st_file *f, const char *key);
/* The path given to rw_st_open (borrowed), NULL for rw_st_open_mem. */
const char *rw_st_path(const rw_st_file *f);
/* Copies bytes [off, off + len) of the data section (offsets as rw_st_entry.begin) to dst, with
 * pread on the handle's descriptor, never through the mapping (a buffer handle: memcpy). A file
 * that became shorter since it was validated gives RW_E_IO "<path>: file shrank while loading"
 * naming the byte of the file where it ends now and the tensor cut there, not a signal (every
 * read of a shrunk handle reports the same); a file modified since (mtime differs after the
 * read) gives RW_E_IO "file changed while loading", since the bytes may mix two versions.
 * RW_E_RANGE past the data section. Thread-safe: several threads may read one handle at once.
 * Test hook: when the environment variable RW_TEST_READ_PAUSE names a file that exists at
 * rw_st_open and holds a tensor name of the opened file, the handle's first read that touches
 * that tensor creates "<RW_TEST_READ_PAUSE>.paused" and waits (at most 60 s) until the named
 * file is removed (the reliability tests truncate checkpoint files at that point). */
rw_status rw_st_read(const rw_st_file *f, uint64_t off, void *dst, size_t len, rw_err *err);

/* Streaming writer: the header is written first from the declared tensors, then the data of each
 * tensor in declaration order through rw_st_writer_write (any chunking). Close checks that every
 * declared byte was written. */
typedef struct rw_st_writer rw_st_writer;
typedef struct rw_st_decl {
    const char *name;
    rw_dtype dtype;
    int ndim;
    int64_t shape[RW_MAX_DIMS];
} rw_st_decl;
rw_status rw_st_writer_create(const char *path, const rw_st_decl *decls, size_t n,
                              const char *const *meta_kv /* key,value,...,NULL or NULL */,
                              rw_st_writer **out, rw_err *err);
rw_status rw_st_writer_write(rw_st_writer *w, const void *bytes, size_t len, rw_err *err);
/* Finishes the file; fails (and removes the file) if fewer bytes were written than declared. */
rw_status rw_st_writer_close(rw_st_writer *w, rw_err *err);
/* Abandons a partly written file and removes it. */
void rw_st_writer_discard(rw_st_writer *w);

/* ------------------------------------------------------------------------------------------ */
/* Checkpoint directory: config.json + model.safetensors, or shards with                        */
/* model.safetensors.index.json (every tensor listed there must exist in its file).             */
/* ------------------------------------------------------------------------------------------ */
typedef struct rw_ckpt rw_ckpt;
rw_status rw_ckpt_open(const char *dir, rw_ckpt **out, rw_err *err);
void rw_ckpt_close(rw_ckpt *c);
size_t rw_ckpt_count(const rw_ckpt *c);
const rw_st_entry *rw_ckpt_at(const rw_ckpt *c, size_t i);
const rw_st_entry *rw_ckpt_find(const rw_ckpt *c, const char *name);
size_t rw_ckpt_file_count(const rw_ckpt *c);
const char *rw_ckpt_file_path(const rw_ckpt *c, size_t i);
/* File i (an entry's file_index) as a safetensors handle, borrowed from the checkpoint: read
 * tensor bytes with rw_st_read(rw_ckpt_file(c, e->file_index), e->begin, ...). */
const rw_st_file *rw_ckpt_file(const rw_ckpt *c, size_t i);
const char *rw_ckpt_dir(const rw_ckpt *c);

/* ------------------------------------------------------------------------------------------ */
/* config.json (Qwen3-MoE)                                                                      */
/* ------------------------------------------------------------------------------------------ */
typedef enum rw_qmethod {
    RW_QMETHOD_NONE = 0,
    RW_QMETHOD_MXFP8 = 1,    /* e4m3 + UE8M0 scale per 1x32 along K */
    RW_QMETHOD_FP8_BLOCK = 2 /* e4m3 + fp32 scale per 128x128 */
} rw_qmethod;

#define RW_MAX_NOT_CONVERT 256
typedef struct rw_quant_config {
    rw_qmethod method;
    int block[2];                 /* weight_block_size: [1, 32] or [128, 128] */
    char fmt[16];                 /* "e4m3" */
    char scale_fmt[16];           /* "ue8m0" or "" */
    char activation_scheme[16];   /* "dynamic" */
    int n_not_convert;
    char *not_convert[RW_MAX_NOT_CONVERT]; /* owned; prefixes such as "model.layers.46." */
} rw_quant_config;

typedef struct rw_config {
    int vocab_size;           /* V */
    int hidden_size;          /* H */
    int num_layers;           /* L */
    int num_heads;            /* nH */
    int num_kv_heads;         /* nKV */
    int head_dim;             /* hd */
    int num_experts;          /* E */
    int top_k;                /* num_experts_per_tok */
    int moe_intermediate;     /* I */
    int max_position;         /* max_position_embeddings */
    double rope_theta;
    double rms_eps;
    bool norm_topk_prob;
    bool tie_word_embeddings;
    rw_quant_config quant;
} rw_config;

/* Parses a Qwen3-MoE config.json (either spelling of num_experts / rope_theta). Refuses what the
 * engine cannot run (dense mlp_only_layers, decoder_sparse_step != 1, attention bias) with
 * RW_E_UNSUPPORTED naming the field. */
rw_status rw_config_load(const char *path, rw_config *out, rw_err *err);
rw_status rw_config_parse(const char *json, size_t len, rw_config *out, rw_err *err);
/* Writes the config as config.json text (caller frees with free()). Includes quantization_config
 * when quant.method != NONE. */
rw_status rw_config_to_json(const rw_config *c, char **out, rw_err *err);
void rw_config_free(rw_config *c); /* frees quant.not_convert strings */
rw_status rw_config_copy(const rw_config *src, rw_config *dst, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Canonical tensor names                                                                       */
/* ------------------------------------------------------------------------------------------ */
typedef enum rw_wkind {
    RW_W_INVALID = 0,
    RW_W_EMBED = 1,        /* model.embed_tokens.weight            [V, H] */
    RW_W_LM_HEAD = 2,      /* lm_head.weight                       [V, H] */
    RW_W_FINAL_NORM = 3,   /* model.norm.weight                    [H] */
    RW_W_INPUT_NORM = 4,   /* model.layers.N.input_layernorm.weight [H] */
    RW_W_POST_NORM = 5,    /* model.layers.N.post_attention_layernorm.weight [H] */
    RW_W_Q = 6,            /* self_attn.q_proj.weight [nH*hd, H] */
    RW_W_K = 7,            /* self_attn.k_proj.weight [nKV*hd, H] */
    RW_W_V = 8,            /* self_attn.v_proj.weight [nKV*hd, H] */
    RW_W_O = 9,            /* self_attn.o_proj.weight [H, nH*hd] */
    RW_W_Q_NORM = 10,      /* self_attn.q_norm.weight [hd] */
    RW_W_K_NORM = 11,      /* self_attn.k_norm.weight [hd] */
    RW_W_ROUTER = 12,      /* mlp.gate.weight [E, H] */
    RW_W_EXP_GATE = 13,    /* mlp.experts.E.gate_proj.weight [I, H] */
    RW_W_EXP_UP = 14,      /* mlp.experts.E.up_proj.weight   [I, H] */
    RW_W_EXP_DOWN = 15,    /* mlp.experts.E.down_proj.weight [H, I] */
    RW_W_EXP_GATE_UP = 16, /* mlp.experts.gate_up_proj [E, 2I, H] (fused, [gate; up]) */
    RW_W_EXP_DOWN_ALL = 17,/* mlp.experts.down_proj    [E, H, I] (fused) */
    RW_W_KIND_COUNT_ = 18,
} rw_wkind;

typedef struct rw_wname {
    rw_wkind kind;
    int layer;   /* -1 for non-layer tensors */
    int expert;  /* -1 unless a per-expert tensor */
    bool scale;  /* the name ends in .weight_scale_inv (a quantization scale) */
} rw_wname;

/* Parses a canonical name. Unknown names are RW_E_NOT_FOUND with the name in the message.
 * Layer / expert indices are checked against `cfg` when it is non-NULL (RW_E_RANGE). */
rw_status rw_name_parse(const char *name, const rw_config *cfg, rw_wname *out, rw_err *err);
/* Formats the canonical name; returns the length (snprintf semantics). */
int rw_name_format(const rw_wname *w, char *buf, size_t cap);
const char *rw_wkind_str(rw_wkind k); /* "q_proj", "expert.up_proj", ... */
bool rw_wkind_is_expert(rw_wkind k);
/* Canonical (unquantized) shape of a weight for `cfg` (scale=false). */
rw_status rw_config_weight_shape(const rw_config *cfg, const rw_wname *w, int *ndim, int64_t *shape,
                                 rw_err *err);
/* Enumerates the canonical per-expert tensor set of the model (what a HF checkpoint holds, without
 * scales): calls `fn` for each; stops early and returns the status if fn fails. */
typedef rw_status (*rw_weight_fn)(const rw_wname *w, void *ctx);
rw_status rw_config_for_each_weight(const rw_config *cfg, rw_weight_fn fn, void *ctx);
size_t rw_config_weight_count(const rw_config *cfg);

/* ------------------------------------------------------------------------------------------ */
/* Device helpers (available in every build; report RW_E_NO_DEVICE without CUDA)               */
/* ------------------------------------------------------------------------------------------ */
typedef void *rw_stream; /* a cudaStream_t; NULL = default stream */
/* Bytes of an NCCL unique id (ncclUniqueId), as the TP communicators and the weight-update groups
 * pass it out of band. */
#define RW_NCCL_ID_BYTES 128

bool rw_cuda_built(void);                       /* compiled with CUDA */
/* Programs call this first thing in main(), before any CUDA call: CUDA modules are then loaded
 * when the context is created, not at a kernel's first launch. A lazily loaded first launch waits
 * for the device, and during an NCCL update the device holds a broadcast kernel that waits for the
 * trainer, which sends only after this rank replied (see rw_moe_cuda_preload). An explicit
 * CUDA_MODULE_LOADING in the environment is kept. */
void rw_cuda_load_modules_eagerly(void);
int rw_cuda_device_count(void);                 /* 0 without CUDA or device */
rw_status rw_cuda_set_device(int dev, rw_err *err);
/* Multiprocessors of the current device (kernels size their grids and pipelines by it). */
rw_status rw_cuda_sm_count(int *sms, rw_err *err);
rw_status rw_dev_malloc(size_t bytes, void **out, rw_err *err);
void rw_dev_free(void *p);
rw_status rw_host_malloc_pinned(size_t bytes, void **out, rw_err *err);
void rw_host_free_pinned(void *p);
/* Copies between any two places (host<->device, device<->device); async on `s` when a device is
 * involved. The copy kind follows from the places. On the default stream (s NULL), device memory
 * of another device than the current one is copied with its own device current (device arenas
 * are mapped for their own device only), and that copy has completed when the call returns. */
rw_status rw_memcpy(void *dst, rw_place dplace, const void *src, rw_place splace, size_t bytes,
                    rw_stream s, rw_err *err);
rw_status rw_stream_create(rw_stream *out, rw_err *err);
void rw_stream_destroy(rw_stream s);
rw_status rw_stream_sync(rw_stream s, rw_err *err);
/* Call after each kernel launch: checks cudaGetLastError, and synchronizes when the environment
 * variable RW_CUDA_SYNC=1 is set to localise faults. */
rw_status rw_cuda_after_launch(rw_stream s, const char *what, const char *file, int line,
                               rw_err *err);
#define RW_LAUNCH_CHECK(s, what, err) rw_cuda_after_launch((s), (what), __FILE__, __LINE__, (err))

/* ------------------------------------------------------------------------------------------ */
/* Small utilities shared by the modules                                                        */
/* ------------------------------------------------------------------------------------------ */
/* Reads a whole file into a NUL-terminated malloc'd buffer. */
rw_status rw_read_file(const char *path, char **out, size_t *len, rw_err *err);
/* Opens a file the worker reads because a client named it (a checkpoint's files): without
 * blocking (O_NONBLOCK, O_CLOEXEC, so a FIFO or a device never stalls the caller), then checks
 * the open descriptor itself with fstat (no stat -> open race) and refuses anything but a regular
 * file (RW_E_IO "<path> is not a regular file (a FIFO)"; RW_E_NOT_FOUND when it does not exist).
 * Blocking reads are restored before it returns. *fd is the caller's (close()); *sb (may be NULL)
 * gets the fstat. Symbolic links are followed (Hugging Face caches are made of them). */
struct stat;
rw_status rw_open_regular(const char *path, int *fd, struct stat *sb, rw_err *err);
/* rw_read_file through rw_open_regular: a NUL-terminated malloc'd copy of a regular file of at
 * most max_bytes bytes (RW_E_RANGE beyond). */
rw_status rw_read_regular_file(const char *path, size_t max_bytes, char **out, size_t *len,
                               rw_err *err);
/* Text that may hold a client's bytes (text.c). rw_escape writes s[0..n) into buf[cap] as plain
 * ASCII for messages and logs: printable characters kept, `"` and `\` as \" and \\, every
 * other byte as \xNN; cut with "..." to fit. Returns buf. rw_utf8_valid: whether s[0..n) is
 * valid UTF-8 (shortest forms, no surrogates, <= U+10FFFF). rw_utf8_repair copies it into
 * buf[cap] with each invalid byte replaced by U+FFFD (cut to fit, NUL-terminated); returns the
 * length. */
const char *rw_escape(const char *s, size_t n, char *buf, size_t cap);
bool rw_utf8_valid(const char *s, size_t n);
size_t rw_utf8_repair(const char *s, size_t n, char *buf, size_t cap);
/* Whether got[n] equals the NUL-terminated secret `want`, in time that depends on the lengths
 * only (tokens: a mismatch must not tell where it is). */
bool rw_secret_equal(const char *want, const void *got, size_t n);
/* Deterministic PRNG (splitmix64 / xoshiro-like); state is the caller's. */
typedef struct rw_rng {
    uint64_t s[4];
} rw_rng;
void rw_rng_seed(rw_rng *r, uint64_t seed);
/* The next 64 bits of r (xoshiro256**), inline for generators' inner loops; rw_rng_u64 is this. */
static inline uint64_t rw_rng_next(rw_rng *r) {
    uint64_t *s = r->s;
    const uint64_t x = s[1] * 5, res = ((x << 7) | (x >> 57)) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return res;
}
uint64_t rw_rng_u64(rw_rng *r);
double rw_rng_uniform(rw_rng *r);  /* [0, 1) */
float rw_rng_normal(rw_rng *r);    /* standard normal */
/* The CPU references' one reduction order for a dot product of fp32 vectors: eight interleaved
 * partial sums (element i goes to sum i % 8 while 8 remain), combined pairwise
 * ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)), then the tail in order. Fixed by n alone, so
 * a row's result never depends on the batch it is computed in; every CPU dot product of the
 * model and of the expert reference uses it. */
static inline float rw_dot_f32(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}
/* Cutting a tensor that does not fit a buffer or a bucket into pieces along one dim (the
 * checkpoint cutter of sync/disk.c, the trainer's push of large tensors): how many consecutive indices of `unit`
 * bytes each one piece may hold within `limit` bytes. The most that fit, rounded down to a
 * multiple of 128 when at least 128 fit, so that cuts fall on fp8 block (128) and mxfp8 block
 * (32) boundaries and the weight set applies each piece without staging partial blocks. 0 when a
 * single index does not fit. Pieces are cut at multiples of the step (rw_split_end). */
static inline uint64_t rw_split_step(uint64_t unit, uint64_t limit) {
    if (unit == 0 || unit > limit) return 0;
    uint64_t n = limit / unit;
    return n >= 128 ? n / 128 * 128 : n;
}
/* The end of the piece that starts at index `at` of the range ending at `end`: the next multiple
 * of `step`, or `end`. */
static inline uint64_t rw_split_end(uint64_t at, uint64_t end, uint64_t step) {
    uint64_t e = (at / step + 1) * step;
    return e < end ? e : end;
}
/* 64-bit checksum of bytes (xxh3-64), the same on trainer and worker. */
uint64_t rw_checksum64(const void *bytes, size_t len, uint64_t seed);

#ifdef __cplusplus
}
#endif

#endif /* RW_CORE_H */
