/* rw_tokenizer.h - the tokenizer module's public contract: text <-> token ids with the byte-level
 * BPE `tokenizer.json` format of Qwen2/Qwen3 (Hugging Face `tokenizers`), an incremental decoder
 * for streaming, and the Qwen3 chat format.
 *
 * What is supported, read from tokenizer.json (anything else is refused at load with
 * RW_E_UNSUPPORTED naming the field): normalizer null or NFC; pre_tokenizer ByteLevel, or a
 * Sequence of Split (Regex, behavior Isolated or Removed, invert false) and ByteLevel
 * (add_prefix_space false); model BPE (no dropout, no byte_fallback, no unk token,
 * ignore_merges either way); decoder ByteLevel or null; added_tokens with their lstrip, rstrip,
 * single_word, normalized and special flags.
 *
 * Encoding follows Hugging Face `tokenizers` (the trainer's tokenizer), step by step:
 *   1. invalid UTF-8 in the input is replaced by U+FFFD, one per maximal invalid subpart (what a
 *      UTF-8 decoder does to bytes before either reference tokenizer ever sees them);
 *   2. added tokens with normalized=false are matched in the raw text, leftmost-longest;
 *   3. the text between them is NFC-normalized (when the file says so), then searched for the
 *      added tokens with normalized=true;
 *   4. the remaining text is split by the pre-tokenizer's regex (PCRE2, UTF + UCP, JIT);
 *   5. each piece's UTF-8 bytes are merged by BPE rank (lowest rank first, leftmost on ties).
 * Where the JavaScript reference (transformers.js) differs from `tokenizers`, rw follows
 * `tokenizers`: docs/TOKENIZER.md lists the cases.
 *
 * Decoding: an added token decodes to its content; a run of model tokens decodes to the bytes
 * they stand for, read as UTF-8 with every maximal invalid subpart replaced by U+FFFD (as
 * `tokenizers`, transformers.js and the WHATWG decoder do). The result is always valid UTF-8.
 *
 * Threads: after rw_tok_load returns, a rw_tok is read-only except for an internal cache of
 * merged pieces that is guarded by locks; encode and decode may be called from any number of
 * threads at once. A rw_tok_stream belongs to one caller at a time.
 *
 * Prefix rw_tok_. Conventions of rw_core.h: every fallible function returns rw_status and takes
 * an optional rw_err* last; destroy(NULL) is a no-op; nothing here exits.
 */
#ifndef RW_TOKENIZER_H
#define RW_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rw_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rw_tok rw_tok;

/* ------------------------------------------------------------------------------------------ */
/* Loading                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* Loads `dir`/tokenizer.json and, when it exists, `dir`/tokenizer_config.json (special tokens:
 * eos_token, pad_token, bos_token; the chat template's presence). A missing or malformed file is
 * RW_E_IO / RW_E_FORMAT with the path and the offending field in err->msg; a valid file with a
 * component rw does not implement is RW_E_UNSUPPORTED naming the field. *out is owned by the
 * caller (rw_tok_destroy). Loading the Qwen3 file (11 MB) takes about 0.6 s of CPU. */
rw_status rw_tok_load(const char *dir, rw_tok **out, rw_err *err);
/* The same from explicit paths; `config_json` may be NULL. */
rw_status rw_tok_load_files(const char *tokenizer_json, const char *config_json, rw_tok **out,
                            rw_err *err);
void rw_tok_destroy(rw_tok *t);

/* Ids are 0 .. rw_tok_id_end(t) - 1; an id in that range may still have no token (a gap), see
 * rw_tok_token. Qwen3: 151669 (151643 BPE tokens + 26 added tokens); the model's embedding has
 * more rows (151936) than the tokenizer has tokens. */
int32_t rw_tok_id_end(const rw_tok *t);
/* The bytes a token decodes to (borrowed from t; not NUL-terminated): for an added token its
 * content, for a BPE token the bytes it stands for (possibly part of a UTF-8 character).
 * RW_E_RANGE for an id that has no token. */
rw_status rw_tok_token(const rw_tok *t, int32_t id, const char **bytes, size_t *len, rw_err *err);
/* The id of a token given by its content (added tokens) or by its bytes (BPE tokens);
 * RW_E_NOT_FOUND when there is none. */
rw_status rw_tok_token_id(const rw_tok *t, const char *bytes, size_t len, int32_t *id, rw_err *err);
/* An added token with special=true (what skip-special decoding drops). */
bool rw_tok_is_special(const rw_tok *t, int32_t id);
/* tokenizer_config.json's eos_token / pad_token / bos_token as ids; -1 when absent (or when the
 * file was not there). Qwen3: eos <|im_end|> 151645, pad <|endoftext|> 151643, no bos. */
int32_t rw_tok_eos_id(const rw_tok *t);
int32_t rw_tok_pad_id(const rw_tok *t);
int32_t rw_tok_bos_id(const rw_tok *t);
/* tokenizer_config.json has a chat_template (rw formats chats with rw_tok_chat_qwen3, which
 * implements the Qwen3 template in C; rw does not run Jinja). */
bool rw_tok_has_chat_template(const rw_tok *t);

/* ------------------------------------------------------------------------------------------ */
/* Encoding                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* A growable id vector owned by the caller: zero-initialize it, reuse it across calls
 * (rw_tok_encode appends), free it with rw_tok_ids_free. */
typedef struct rw_tok_ids {
    int32_t *ids;
    size_t n, cap;
} rw_tok_ids;
void rw_tok_ids_free(rw_tok_ids *v);

enum {
    /* Special added tokens written in the text are encoded as plain text, not as their id (HF's
     * split_special_tokens=True): use for untrusted text that must not inject <|im_start|>.
     * Added tokens with special=false are still matched. */
    RW_TOK_ENCODE_SPLIT_SPECIAL = 1u << 0,
};

/* Appends the ids of text[0..len) to `out` (no BOS/EOS is added: Qwen3's post-processor adds
 * none). `text` need not be NUL-terminated or valid UTF-8 (see step 1 above). RW_E_OOM when
 * memory runs out; RW_E_INTERNAL if the regex engine fails (message says how). On failure `out`
 * keeps the ids it had before the call. */
rw_status rw_tok_encode(const rw_tok *t, const char *text, size_t len, uint32_t flags,
                        rw_tok_ids *out, rw_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Decoding                                                                                     */
/* ------------------------------------------------------------------------------------------ */

enum {
    RW_TOK_DECODE_SKIP_SPECIAL = 1u << 0, /* drop special added tokens (skip_special_tokens) */
    /* Drop ids that have no token (negative, gaps, >= rw_tok_id_end) instead of failing, as
     * `tokenizers` does silently; for text of ids sampled over the model's whole vocabulary. */
    RW_TOK_DECODE_SKIP_UNKNOWN = 1u << 1,
};

/* Decodes ids[0..n) into a NUL-terminated, valid UTF-8 string (*out, malloc'd, caller frees;
 * *out_len excludes the NUL; out_len may be NULL). An id without a token is RW_E_RANGE naming
 * the id and its position, unless RW_TOK_DECODE_SKIP_UNKNOWN. */
rw_status rw_tok_decode(const rw_tok *t, const int32_t *ids, size_t n, uint32_t flags, char **out,
                        size_t *out_len, rw_err *err);

/* Incremental decoding for streaming: feed ids one at a time; each call yields only text that
 * is final (complete UTF-8 characters, or U+FFFD for bytes that can no longer become one), so
 * emitted text is never revised. The concatenation of every piece yielded by push and finish
 * equals rw_tok_decode of the same ids with the same flags, byte for byte. */
typedef struct rw_tok_stream rw_tok_stream;
rw_status rw_tok_stream_create(const rw_tok *t, uint32_t flags, rw_tok_stream **out, rw_err *err);
void rw_tok_stream_destroy(rw_tok_stream *s);
/* Feeds one id. *text / *len receive the newly final text (len may be 0, e.g. in the middle of a
 * multi-byte character); the buffer is owned by the stream and valid until its next call. An id
 * without a token is RW_E_RANGE (the stream is unchanged) unless the stream's flags skip it. */
rw_status rw_tok_stream_push(rw_tok_stream *s, int32_t id, const char **text, size_t *len,
                             rw_err *err);
/* Ends the stream: yields what is still held (an incomplete character becomes U+FFFD) and
 * resets the stream for reuse. */
rw_status rw_tok_stream_finish(rw_tok_stream *s, const char **text, size_t *len, rw_err *err);
/* Bytes held back, waiting for the rest of a UTF-8 character (0..3). */
size_t rw_tok_stream_pending(const rw_tok_stream *s);

/* ------------------------------------------------------------------------------------------ */
/* Chat format (Qwen3)                                                                          */
/* ------------------------------------------------------------------------------------------ */

typedef enum rw_chat_role {
    RW_CHAT_SYSTEM = 0,
    RW_CHAT_USER = 1,
    RW_CHAT_ASSISTANT = 2,
    RW_CHAT_TOOL = 3, /* a tool's reply, rendered inside a user turn as <tool_response> */
} rw_chat_role;

/* One message; strings are borrowed, NUL-terminated UTF-8. `reasoning` (assistant only) is the
 * thinking text, or NULL: then a "<think>...</think>" prefix of `content` is split off as the
 * template does. */
typedef struct rw_chat_msg {
    rw_chat_role role;
    const char *content;
    const char *reasoning;
} rw_chat_msg;

typedef struct rw_chat_opts {
    bool add_generation_prompt; /* end with "<|im_start|>assistant\n" */
    bool disable_thinking;      /* enable_thinking=false: also "<think>\n\n</think>\n\n" */
} rw_chat_opts;

/* The prompt text the Qwen3 chat template (tokenizer_config.json's chat_template, without
 * tools) renders for msgs[0..n) (n >= 1; opts may be NULL: no generation prompt, thinking on),
 * as transformers' apply_chat_template(tokenize=False) does. *out is malloc'd, NUL-terminated,
 * caller frees; out_len may be NULL. Encode it with rw_tok_encode (its special tokens are then
 * matched). RW_E_INVALID_ARG for n == 0, a NULL content or an unknown role. */
rw_status rw_tok_chat_qwen3(const rw_chat_msg *msgs, size_t n, const rw_chat_opts *opts, char **out,
                            size_t *out_len, rw_err *err);

#ifdef __cplusplus
}
#endif

#endif /* RW_TOKENIZER_H */
