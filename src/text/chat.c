/*
 * chat.c - renders a conversation into the prompt text a chat model was
 * trained on. Rather than running the Jinja template stored in
 * tokenizer.chat_template, the family is recognised by its distinctive
 * markers and rendered by a fixed routine per family:
 *
 *   chatml  (Qwen, SmolLM)   <|im_start|>ROLE\nCONTENT<|im_end|>\n ...
 *                            opening: <|im_start|>assistant\n
 *   llama3                   <|start_header_id|>ROLE<|end_header_id|>\n\n
 *                            CONTENT (trimmed)<|eot_id|> ...
 *                            opening: <|start_header_id|>assistant<|end_header_id|>\n\n
 *   llama2 / mistral         [INST] <<SYS>>\nSYSTEM\n<</SYS>>\n\nUSER [/INST]ASSISTANT</s>
 *                            [INST] USER [/INST] ...   (no opening: the model
 *                            answers right after [/INST])
 *   phi3                     <|system|>\nCONTENT<|end|>\n<|user|>\n...<|end|>\n
 *                            opening: <|assistant|>\n
 *
 * The BOS token is not part of the text: the tokenizer adds it (add_bos), so
 * render with special-token parsing on and BOS per the model.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "text/tokenizer.h"

static bool contains(const char *s, size_t n, const char *lit) {
    size_t l = strlen(lit);
    if (l > n) return false;
    for (size_t i = 0; i + l <= n; i++)
        if (s[i] == lit[0] && memcmp(s + i, lit, l) == 0) return true;
    return false;
}

chat_tmpl_t chat_detect_str(const char *s, size_t n) {
    if (!s || n == 0) return CHAT_UNKNOWN;
    if (contains(s, n, "<|im_start|>")) return CHAT_CHATML;
    if (contains(s, n, "<|start_header_id|>") && contains(s, n, "<|end_header_id|>")) return CHAT_LLAMA3;
    if (contains(s, n, "<|assistant|>") && contains(s, n, "<|end|>")) return CHAT_PHI3;
    if (contains(s, n, "[INST]")) return CHAT_LLAMA2;
    return CHAT_UNKNOWN;
}

chat_tmpl_t chat_detect(const gguf_file_t *f) {
    gguf_str_t s;
    if (!f || !gguf_find(f, "tokenizer.chat_template") || gguf_get_str(f, "tokenizer.chat_template", &s, NULL))
        return CHAT_UNKNOWN;
    return chat_detect_str(s.data, (size_t)s.len);
}

chat_tmpl_t chat_from_name(const char *name) {
    if (!name) return CHAT_UNKNOWN;
    static const struct {
        const char *name;
        chat_tmpl_t t;
    } names[] = {
        {"chatml", CHAT_CHATML}, {"qwen", CHAT_CHATML},   {"qwen2", CHAT_CHATML},   {"smollm", CHAT_CHATML},
        {"llama3", CHAT_LLAMA3}, {"llama-3", CHAT_LLAMA3}, {"llama2", CHAT_LLAMA2},  {"llama-2", CHAT_LLAMA2},
        {"mistral", CHAT_LLAMA2}, {"phi3", CHAT_PHI3},     {"phi-3", CHAT_PHI3},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i].name)) return names[i].t;
    return CHAT_UNKNOWN;
}

const char *chat_name(chat_tmpl_t t) {
    switch (t) {
    case CHAT_CHATML: return "chatml";
    case CHAT_LLAMA3: return "llama3";
    case CHAT_LLAMA2: return "llama2";
    case CHAT_PHI3: return "phi3";
    default: return "unknown";
    }
}

typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf_t;

static void put(sbuf_t *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = realloc(b->s, nc);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = nc;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void puts_(sbuf_t *b, const char *s) { put(b, s, strlen(s)); }

/* Llama 3's official template trims each message. */
static void put_trimmed(sbuf_t *b, const char *s) {
    size_t n = strlen(s);
    while (n && strchr(" \t\r\n", s[n - 1])) n--;
    while (n && strchr(" \t\r\n", *s)) s++, n--;
    put(b, s, n);
}

int chat_render(chat_tmpl_t tmpl, const chat_msg_t *msgs, size_t n, bool add_assistant, char **out,
                tern_error_t *err) {
    if (!out || (!msgs && n)) return tern_err(err, TERN_EINVAL, "chat_render: bad arguments");
    *out = NULL;
    if (tmpl != CHAT_CHATML && tmpl != CHAT_LLAMA3 && tmpl != CHAT_LLAMA2 && tmpl != CHAT_PHI3)
        return tern_err(err, TERN_EUNSUP, "chat_render: unknown chat template (known: chatml, llama3, llama2, phi3)");
    for (size_t i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r || !msgs[i].content) return tern_err(err, TERN_EINVAL, "chat message %zu: missing role or content", i);
        bool std_role = !strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant");
        /* ChatML and Llama 3 write any role name (tool, ipython ...); the
         * other two formats only know these three. */
        if (!std_role && (tmpl == CHAT_LLAMA2 || tmpl == CHAT_PHI3))
            return tern_err(err, TERN_EINVAL, "chat message %zu: role '%.32s' is not supported by the %s template", i, r,
                            chat_name(tmpl));
        if (!*r || strpbrk(r, "\n<>|"))
            return tern_err(err, TERN_EINVAL, "chat message %zu: invalid role name '%.32s'", i, r);
    }
    sbuf_t b = {0};
    put(&b, "", 0); /* an empty conversation still renders to "" */
    switch (tmpl) {
    case CHAT_CHATML:
        for (size_t i = 0; i < n; i++) {
            puts_(&b, "<|im_start|>");
            puts_(&b, msgs[i].role);
            puts_(&b, "\n");
            puts_(&b, msgs[i].content);
            puts_(&b, "<|im_end|>\n");
        }
        if (add_assistant) puts_(&b, "<|im_start|>assistant\n");
        break;
    case CHAT_LLAMA3:
        for (size_t i = 0; i < n; i++) {
            puts_(&b, "<|start_header_id|>");
            puts_(&b, msgs[i].role);
            puts_(&b, "<|end_header_id|>\n\n");
            put_trimmed(&b, msgs[i].content);
            puts_(&b, "<|eot_id|>");
        }
        if (add_assistant) puts_(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case CHAT_PHI3:
        for (size_t i = 0; i < n; i++) {
            puts_(&b, "<|");
            puts_(&b, msgs[i].role);
            puts_(&b, "|>\n");
            puts_(&b, msgs[i].content);
            puts_(&b, "<|end|>\n");
        }
        if (add_assistant) puts_(&b, "<|assistant|>\n");
        break;
    case CHAT_LLAMA2: {
        /* A turn opens with [INST] and closes after the assistant's </s>. */
        bool in_turn = false;
        for (size_t i = 0; i < n; i++) {
            const char *r = msgs[i].role;
            if (!in_turn) {
                puts_(&b, "[INST] ");
                in_turn = true;
            }
            if (!strcmp(r, "system")) {
                puts_(&b, "<<SYS>>\n");
                puts_(&b, msgs[i].content);
                puts_(&b, "\n<</SYS>>\n\n");
            } else if (!strcmp(r, "user")) {
                puts_(&b, msgs[i].content);
                puts_(&b, " [/INST]");
            } else {
                puts_(&b, msgs[i].content);
                puts_(&b, "</s>");
                in_turn = false;
            }
        }
        break;
    }
    default: break;
    }
    if (b.oom) {
        free(b.s);
        return tern_err(err, TERN_ENOMEM, "out of memory");
    }
    *out = b.s;
    return 0;
}
