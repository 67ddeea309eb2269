/* chat.c - the Qwen3 chat format in C: what tokenizer_config.json's Jinja chat_template renders
 * for system/user/assistant/tool messages without tools, line for line (the template's branches
 * are quoted beside the code that implements them). rw does not embed a Jinja engine: the
 * template is fixed per model family and a C rendering is checked against the real template
 * rendered by Jinja2 (tests/tokenizer/chat_ref.py) in the tests.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct slice {
    const char *p;
    size_t n;
} slice;

static slice sl(const char *s) {
    return (slice){s, strlen(s)};
}

/* Python's str.find / rfind on slices; -1 when absent. */
static long find_first(slice s, const char *pat) {
    size_t m = strlen(pat);
    for (size_t i = 0; i + m <= s.n; i++)
        if (!memcmp(s.p + i, pat, m)) return (long)i;
    return -1;
}
static long find_last(slice s, const char *pat) {
    size_t m = strlen(pat);
    for (size_t i = s.n >= m ? s.n - m + 1 : 0; i-- > 0;)
        if (!memcmp(s.p + i, pat, m)) return (long)i;
    return -1;
}
static slice lstrip_nl(slice s) {
    while (s.n && s.p[0] == '\n')
        s.p++, s.n--;
    return s;
}
static slice rstrip_nl(slice s) {
    while (s.n && s.p[s.n - 1] == '\n')
        s.n--;
    return s;
}
static bool starts_with(slice s, const char *pat) {
    size_t m = strlen(pat);
    return s.n >= m && !memcmp(s.p, pat, m);
}
static bool ends_with(slice s, const char *pat) {
    size_t m = strlen(pat);
    return s.n >= m && !memcmp(s.p + s.n - m, pat, m);
}

static const char *role_name(rw_chat_role r) {
    switch (r) {
    case RW_CHAT_SYSTEM: return "system";
    case RW_CHAT_USER: return "user";
    case RW_CHAT_ASSISTANT: return "assistant";
    case RW_CHAT_TOOL: return "tool";
    }
    return NULL;
}

#define PUT(b, s, n)                                                                               \
    do {                                                                                           \
        if (!tok_buf_put((b), (s), (n))) goto oom;                                                 \
    } while (0)
#define PUTS(b, s) PUT(b, s, strlen(s))
#define PUTSL(b, x) PUT(b, (x).p, (x).n)

rw_status rw_tok_chat_qwen3(const rw_chat_msg *msgs, size_t n, const rw_chat_opts *opts, char **out,
                            size_t *out_len, rw_err *err) {
    if (!out || (!msgs && n)) RW_FAIL(err, RW_E_INVALID_ARG, "rw_tok_chat_qwen3: NULL argument");
    *out = NULL;
    if (n == 0) RW_FAIL(err, RW_E_INVALID_ARG, "chat: no messages");
    for (size_t i = 0; i < n; i++) {
        if (!role_name(msgs[i].role))
            RW_FAIL(err, RW_E_INVALID_ARG, "chat: messages[%zu].role = %d is not a role", i,
                    (int)msgs[i].role);
        if (!msgs[i].content)
            RW_FAIL(err, RW_E_INVALID_ARG, "chat: messages[%zu].content is NULL", i);
    }
    rw_chat_opts o = opts ? *opts : (rw_chat_opts){0};
    tok_buf b = {0};

    /* {%- if messages[0].role == 'system' %} '<|im_start|>system\n' + content + '<|im_end|>\n' */
    if (msgs[0].role == RW_CHAT_SYSTEM) {
        PUTS(&b, "<|im_start|>system\n");
        PUTS(&b, msgs[0].content);
        PUTS(&b, "<|im_end|>\n");
    }
    /* last_query_index: the last user message that is not a bare <tool_response>...</tool_response>
     * (messages|length - 1 when there is none) */
    size_t last_query = n - 1;
    for (size_t k = n; k-- > 0;) {
        slice c = sl(msgs[k].content);
        if (msgs[k].role == RW_CHAT_USER &&
            !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const rw_chat_msg *m = &msgs[i];
        slice content = sl(m->content);
        bool last = i + 1 == n;
        if (m->role == RW_CHAT_USER || (m->role == RW_CHAT_SYSTEM && i > 0)) {
            PUTS(&b, "<|im_start|>");
            PUTS(&b, role_name(m->role));
            PUTS(&b, "\n");
            PUTSL(&b, content);
            PUTS(&b, "<|im_end|>\n");
        } else if (m->role == RW_CHAT_ASSISTANT) {
            slice reasoning = {"", 0};
            if (m->reasoning) {
                reasoning = sl(m->reasoning);
            } else if (find_first(content, "</think>") >= 0) {
                /* content = content.split('</think>')[-1].lstrip('\n')
                 * reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1]
                 *             .lstrip('\n') */
                slice all = content;
                long e_last = find_last(all, "</think>"), e_first = find_first(all, "</think>");
                content = lstrip_nl((slice){all.p + e_last + 8, all.n - (size_t)e_last - 8});
                slice before = rstrip_nl((slice){all.p, (size_t)e_first});
                long s_last = find_last(before, "<think>");
                if (s_last >= 0)
                    before = (slice){before.p + s_last + 7, before.n - (size_t)s_last - 7};
                reasoning = lstrip_nl(before);
            }
            /* {%- if loop.index0 > ns.last_query_index %}{%- if loop.last or reasoning_content %}
             */
            if (i > last_query && (last || reasoning.n)) {
                PUTS(&b, "<|im_start|>assistant\n<think>\n");
                PUTSL(&b, rstrip_nl(lstrip_nl(reasoning)));
                PUTS(&b, "\n</think>\n\n");
                PUTSL(&b, lstrip_nl(content));
            } else {
                PUTS(&b, "<|im_start|>assistant\n");
                PUTSL(&b, content);
            }
            PUTS(&b, "<|im_end|>\n");
        } else if (m->role == RW_CHAT_TOOL) {
            if (i == 0 || msgs[i - 1].role != RW_CHAT_TOOL) PUTS(&b, "<|im_start|>user");
            PUTS(&b, "\n<tool_response>\n");
            PUTSL(&b, content);
            PUTS(&b, "\n</tool_response>");
            if (last || msgs[i + 1].role != RW_CHAT_TOOL) PUTS(&b, "<|im_end|>\n");
        }
        /* a system message at index 0 was rendered above */
    }
    if (o.add_generation_prompt) {
        PUTS(&b, "<|im_start|>assistant\n");
        if (o.disable_thinking) PUTS(&b, "<think>\n\n</think>\n\n");
    }
    if (!tok_buf_reserve(&b, 0)) goto oom;
    b.p[b.n] = 0;
    *out = b.p;
    if (out_len) *out_len = b.n;
    return RW_OK;
oom:
    tok_buf_free(&b);
    RW_FAIL(err, RW_E_OOM, "chat: out of memory");
}
