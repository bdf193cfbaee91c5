/* request.c - request bodies of /v1/chat/completions and /v1/completions
 * -> srv_request_t (srv.h), with cJSON; then the prompt's token ids.
 *
 * Every field the server knows is checked for its type and range, and a
 * bad one gets a 400 whose message starts with the field's path
 * ("messages[2].content: ..."): http.c reports that leading path as the
 * OpenAI error's "param". Messages about the body as a whole start with a
 * capital letter instead (no param). Fields the server does not know are
 * ignored: clients send many.
 *
 * Before cJSON sees the body, one pass over its bytes bounds the nesting
 * depth (cJSON recurses once per level) and refuses raw control characters
 * inside strings and the escape \u0000 (which would cut a C string short).
 * Strings are then checked to be UTF-8 where they are used. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "json_schema.h"
#include "srv.h"

#define DEFAULT_MAX_MESSAGES 512
#define DEFAULT_MAX_DEPTH 32

static int fail(char *msg, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *msg, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (msg && cap) vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
    return 400;
}

size_t srv_utf8_seq(const unsigned char *s, size_t n) {
    if (!n) return 0;
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t k;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) k = 1, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) k = 2, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) k = 3, cp = c & 0x07, min = 0x10000;
    else return 0;
    if (n <= k) return 0;
    for (size_t j = 1; j <= k; j++) {
        if ((s[j] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[j] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return k + 1;
}

int srv_utf8_valid(const char *str, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t k = srv_utf8_seq((const unsigned char *)str + i, n - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

/* The pass before cJSON (see the top of the file). */
static int prescan(const char *b, size_t n, int max_depth, char *msg, size_t cap) {
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)b[i];
        if (in_str) {
            if (c == '\\') {
                if (i + 5 < n && b[i + 1] == 'u' && !memcmp(b + i + 2, "0000", 4))
                    return fail(msg, cap, "Invalid JSON: strings may not contain \\u0000 (at byte %zu)", i);
                i++; /* the escaped character */
            } else if (c == '"') {
                in_str = 0;
            } else if (c < 0x20) {
                return fail(msg, cap, "Invalid JSON: a raw control character (0x%02x) inside a string at byte %zu", c, i);
            }
            continue;
        }
        if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth)
                return fail(msg, cap, "Invalid JSON: nested deeper than %d levels (at byte %zu)", max_depth, i);
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return 0;
}

/* ---- fields -------------------------------------------------------------
 * Each getter returns 0 when the field is absent or null (the default
 * stays), 1 when it set *out, or 400 with the message. */

static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

static int get_num(const cJSON *o, const char *name, double lo, double hi, double *out, char *msg, size_t cap) {
    const cJSON *f = field(o, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f)) return fail(msg, cap, "%s: must be a number", name);
    double v = f->valuedouble;
    if (!isfinite(v) || v < lo || v > hi) return fail(msg, cap, "%s: must be between %g and %g", name, lo, hi);
    *out = v;
    return 1;
}

static int get_int(const cJSON *o, const char *name, double lo, double hi, int64_t *out, char *msg, size_t cap) {
    const cJSON *f = field(o, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f)) return fail(msg, cap, "%s: must be an integer", name);
    double v = f->valuedouble;
    if (!isfinite(v) || v != floor(v)) return fail(msg, cap, "%s: must be an integer", name);
    if (v < lo || v > hi) return fail(msg, cap, "%s: must be between %.0f and %.0f", name, lo, hi);
    *out = (int64_t)v;
    return 1;
}

static int get_bool(const cJSON *o, const char *name, int *out, char *msg, size_t cap) {
    const cJSON *f = field(o, name);
    if (!f) return 0;
    if (!cJSON_IsBool(f)) return fail(msg, cap, "%s: must be true or false", name);
    *out = cJSON_IsTrue(f) ? 1 : 0;
    return 1;
}

/* A string field, checked to be UTF-8; *out points into the cJSON tree. */
static int get_str(const cJSON *o, const char *name, const char **out, char *msg, size_t cap) {
    const cJSON *f = field(o, name);
    if (!f) return 0;
    if (!cJSON_IsString(f) || !f->valuestring) return fail(msg, cap, "%s: must be a string", name);
    if (!srv_utf8_valid(f->valuestring, strlen(f->valuestring))) return fail(msg, cap, "%s: not valid UTF-8", name);
    *out = f->valuestring;
    return 1;
}

/* Roles as the chat template knows them; "developer" (OpenAI's newer name
 * for the system role) is rendered as "system". */
static const char *role_name(const char *r) {
    if (!strcmp(r, "system") || !strcmp(r, "developer")) return "system";
    if (!strcmp(r, "user")) return "user";
    if (!strcmp(r, "assistant")) return "assistant";
    return NULL;
}

/* A message's content: a string, or an array of {"type":"text","text":...}
 * parts joined with "\n". *out is malloc'd. */
static int get_content(const cJSON *c, size_t i, const char *role, char **out, char *msg, size_t cap) {
    if (!c || cJSON_IsNull(c)) {
        /* An assistant turn may carry no content (OpenAI allows null there). */
        if (!strcmp(role, "assistant")) {
            *out = strdup("");
            return *out ? 0 : fail(msg, cap, "Out of memory");
        }
        return fail(msg, cap, "messages[%zu].content: required", i);
    }
    if (cJSON_IsString(c) && c->valuestring) {
        size_t n = strlen(c->valuestring);
        if (!srv_utf8_valid(c->valuestring, n)) return fail(msg, cap, "messages[%zu].content: not valid UTF-8", i);
        *out = strdup(c->valuestring);
        return *out ? 0 : fail(msg, cap, "Out of memory");
    }
    if (!cJSON_IsArray(c))
        return fail(msg, cap, "messages[%zu].content: must be a string or an array of text parts", i);
    size_t total = 1, j = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_IsObject(p) ? cJSON_GetObjectItemCaseSensitive(p, "type") : NULL;
        if (!cJSON_IsString(t) || !t->valuestring)
            return fail(msg, cap, "messages[%zu].content[%zu]: must be an object with a \"type\"", i, j);
        if (strcmp(t->valuestring, "text") != 0) {
            int show = strlen(t->valuestring) <= 32 && srv_utf8_valid(t->valuestring, strlen(t->valuestring));
            return fail(msg, cap, "messages[%zu].content[%zu].type: '%s' is not supported (only \"text\")", i, j,
                        show ? t->valuestring : "?");
        }
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(x) || !x->valuestring)
            return fail(msg, cap, "messages[%zu].content[%zu].text: must be a string", i, j);
        size_t n = strlen(x->valuestring);
        if (!srv_utf8_valid(x->valuestring, n)) return fail(msg, cap, "messages[%zu].content[%zu].text: not valid UTF-8", i, j);
        total += n + 1;
        j++;
    }
    char *s = malloc(total);
    if (!s) return fail(msg, cap, "Out of memory");
    size_t at = 0;
    j = 0;
    cJSON_ArrayForEach(p, c) {
        const char *x = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t n = strlen(x);
        if (j++) s[at++] = '\n';
        memcpy(s + at, x, n);
        at += n;
    }
    s[at] = 0;
    *out = s;
    return 0;
}

static int parse_messages(const cJSON *root, const srv_limits_t *lim, srv_request_t *r, char *msg, size_t cap) {
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!ms || cJSON_IsNull(ms)) return fail(msg, cap, "messages: required");
    if (!cJSON_IsArray(ms)) return fail(msg, cap, "messages: must be an array of {\"role\", \"content\"} objects");
    size_t max = lim && lim->max_messages ? lim->max_messages : DEFAULT_MAX_MESSAGES;
    size_t n = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) n++;
    if (n == 0) return fail(msg, cap, "messages: must not be empty");
    if (n > max) return fail(msg, cap, "messages: %zu messages, more than the limit of %zu", n, max);
    r->msgs = calloc(n, sizeof *r->msgs);
    if (!r->msgs) return fail(msg, cap, "Out of memory");
    size_t i = 0;
    cJSON_ArrayForEach(m, ms) {
        if (!cJSON_IsObject(m)) return fail(msg, cap, "messages[%zu]: must be an object", i);
        const cJSON *ro = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!ro || cJSON_IsNull(ro)) return fail(msg, cap, "messages[%zu].role: required", i);
        if (!cJSON_IsString(ro) || !ro->valuestring) return fail(msg, cap, "messages[%zu].role: must be a string", i);
        const char *rn = role_name(ro->valuestring);
        if (!rn) {
            size_t l = strlen(ro->valuestring);
            int show = l <= 32 && srv_utf8_valid(ro->valuestring, l);
            return fail(msg, cap, "messages[%zu].role: unknown role '%s' (system, user, assistant)", i,
                        show ? ro->valuestring : "?");
        }
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (tc && !cJSON_IsNull(tc) && !(cJSON_IsArray(tc) && cJSON_GetArraySize(tc) == 0))
            return fail(msg, cap, "messages[%zu].tool_calls: tool calls are not supported", i);
        char *content = NULL;
        int rc = get_content(cJSON_GetObjectItemCaseSensitive(m, "content"), i, rn, &content, msg, cap);
        if (rc) return rc;
        char *role = strdup(rn);
        if (!role) {
            free(content);
            return fail(msg, cap, "Out of memory");
        }
        r->msgs[i].role = role;
        r->msgs[i].content = content;
        r->n_msgs = ++i;
    }
    return 0;
}

/* A token id written in JSON as a number: 0 .. INT32_MAX (the vocabulary
 * is checked by srv_request_prepare). */
static int token_number(const cJSON *t, int32_t *out) {
    if (!cJSON_IsNumber(t)) return 0;
    double v = t->valuedouble;
    if (!isfinite(v) || v != floor(v) || v < 0 || v > INT32_MAX) return 0;
    *out = (int32_t)v;
    return 1;
}

static int parse_prompt(const cJSON *root, srv_request_t *r, char *msg, size_t cap) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p || cJSON_IsNull(p)) return fail(msg, cap, "prompt: required");
    if (cJSON_IsArray(p)) {
        size_t n = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, p) n++;
        if (n == 0) return fail(msg, cap, "prompt: must not be an empty array");
        const cJSON *first = p->child;
        if (cJSON_IsString(first)) {
            if (n > 1) return fail(msg, cap, "prompt: one prompt per request (an array of %zu strings was sent)", n);
            p = first; /* ["text"] */
        } else {
            if (n > INT32_MAX) return fail(msg, cap, "prompt: too many tokens");
            r->prompt_ids = malloc(n * sizeof *r->prompt_ids);
            if (!r->prompt_ids) return fail(msg, cap, "Out of memory");
            size_t i = 0;
            cJSON_ArrayForEach(e, p) {
                if (!token_number(e, &r->prompt_ids[i]))
                    return fail(msg, cap, "prompt[%zu]: a token id must be an integer from 0 to %d", i, INT32_MAX);
                i++;
            }
            r->n_prompt = (int32_t)n;
            return 0;
        }
    }
    if (!cJSON_IsString(p) || !p->valuestring)
        return fail(msg, cap, "prompt: must be a string or an array of token ids");
    if (!srv_utf8_valid(p->valuestring, strlen(p->valuestring))) return fail(msg, cap, "prompt: not valid UTF-8");
    r->prompt_text = strdup(p->valuestring);
    return r->prompt_text ? 0 : fail(msg, cap, "Out of memory");
}

static int parse_stop(const cJSON *root, srv_request_t *r, char *msg, size_t cap) {
    const cJSON *s = field(root, "stop");
    if (!s) return 0;
    const cJSON *one[1] = {s};
    size_t n = 1;
    if (cJSON_IsArray(s)) {
        n = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, s) n++;
        if (n > SRV_MAX_STOP) return fail(msg, cap, "stop: at most %d strings", SRV_MAX_STOP);
    } else if (!cJSON_IsString(s)) {
        return fail(msg, cap, "stop: must be a string or an array of strings");
    }
    const cJSON *e = cJSON_IsArray(s) ? s->child : one[0];
    for (size_t i = 0; i < n; i++, e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring) return fail(msg, cap, "stop[%zu]: must be a string", i);
        size_t l = strlen(e->valuestring);
        if (l == 0) return fail(msg, cap, "stop[%zu]: must not be empty", i);
        if (l > SRV_MAX_STOP_LEN) return fail(msg, cap, "stop[%zu]: longer than %d bytes", i, SRV_MAX_STOP_LEN);
        if (!srv_utf8_valid(e->valuestring, l)) return fail(msg, cap, "stop[%zu]: not valid UTF-8", i);
        if (!(r->stop[r->n_stop] = strdup(e->valuestring))) return fail(msg, cap, "Out of memory");
        r->n_stop++;
    }
    return 0;
}

static int parse_logit_bias(const cJSON *root, srv_request_t *r, char *msg, size_t cap) {
    const cJSON *b = field(root, "logit_bias");
    if (!b) return 0;
    if (!cJSON_IsObject(b)) return fail(msg, cap, "logit_bias: must be an object of token id -> bias");
    size_t n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, b) n++;
    if (n == 0) return 0;
    if (n > SRV_MAX_LOGIT_BIAS) return fail(msg, cap, "logit_bias: %zu entries, more than %d", n, SRV_MAX_LOGIT_BIAS);
    r->bias = calloc(n, sizeof *r->bias);
    if (!r->bias) return fail(msg, cap, "Out of memory");
    cJSON_ArrayForEach(e, b) {
        const char *k = e->string ? e->string : "";
        size_t kl = strlen(k);
        int64_t id = 0;
        int ok = kl >= 1 && kl <= 10;
        for (size_t i = 0; ok && i < kl; i++) {
            if (k[i] < '0' || k[i] > '9') ok = 0;
            else id = id * 10 + (k[i] - '0');
        }
        if (!ok || id > INT32_MAX) {
            int show = kl <= 16 && srv_utf8_valid(k, kl);
            return fail(msg, cap, "logit_bias: key '%s' is not a token id", show ? k : "?");
        }
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || e->valuedouble < -100 || e->valuedouble > 100)
            return fail(msg, cap, "logit_bias: the bias of token %s must be a number from -100 to 100", k);
        r->bias[r->n_bias].token = (int32_t)id;
        r->bias[r->n_bias].bias = (float)e->valuedouble;
        r->n_bias++;
    }
    return 0;
}

static uint64_t random_seed(void) {
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, GRND_NONBLOCK) != (ssize_t)sizeof s) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        static _Atomic uint64_t ctr;
        s = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ (ctr++ * 0x9e3779b97f4a7c15ull);
    }
    return s;
}

/* Everything but messages/prompt. */
/* r->grammar from a schema value (converted to GBNF). */
static int schema_grammar(const cJSON *schema, srv_request_t *r, char *msg, size_t cap) {
    char *text = cJSON_PrintUnformatted(schema);
    if (!text) return snprintf(msg, cap, "Out of memory"), 500;
    tern_error_t err = {0};
    char *gbnf = NULL;
    int rc = tern_json_schema_to_gbnf(text, strlen(text), &gbnf, &err);
    free(text);
    if (rc == TERN_ENOMEM) return snprintf(msg, cap, "Out of memory"), 500;
    if (rc) return fail(msg, cap, "response_format: %s", err.msg);
    r->grammar = gbnf;
    return 0;
}

static int parse_common(srv_kind_t kind, const cJSON *root, srv_request_t *r, char *msg, size_t cap) {
    int rc;
    double d;
    int64_t i64;
    int b;
    const char *s;

    if ((rc = get_str(root, "model", &s, msg, cap)) > 1) return rc;
    if (rc == 1) {
        if (strlen(s) >= sizeof r->model) return fail(msg, cap, "model: longer than %zu bytes", sizeof r->model - 1);
        snprintf(r->model, sizeof r->model, "%s", s);
    }
    if ((rc = get_bool(root, "stream", &r->stream, msg, cap)) > 1) return rc;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return fail(msg, cap, "stream_options: must be an object");
        if (!r->stream) return fail(msg, cap, "stream_options: only allowed when stream is true");
        if ((rc = get_bool(so, "include_usage", &r->include_usage, msg, cap)) > 1)
            return fail(msg, cap, "stream_options.include_usage: must be true or false");
    }
    if ((rc = get_num(root, "temperature", 0, 2, &d, msg, cap)) > 1) return rc;
    if (rc == 1) r->samp.temp = (float)d;
    if ((rc = get_num(root, "top_p", 0, 1, &d, msg, cap)) > 1) return rc;
    if (rc == 1) r->samp.top_p = (float)d;
    if ((rc = get_num(root, "min_p", 0, 1, &d, msg, cap)) > 1) return rc;
    if (rc == 1) r->samp.min_p = (float)d;
    if ((rc = get_int(root, "top_k", -1, INT32_MAX, &i64, msg, cap)) > 1) return rc;
    if (rc == 1) r->samp.top_k = i64 > 0 ? (int32_t)i64 : 0;
    if ((rc = get_num(root, "presence_penalty", -2, 2, &d, msg, cap)) > 1) return rc;
    if (rc == 1) r->samp.presence_penalty = (float)d;
    if ((rc = get_num(root, "frequency_penalty", -2, 2, &d, msg, cap)) > 1) return rc;
    if (rc == 1) r->samp.frequency_penalty = (float)d;
    if ((rc = get_num(root, "repeat_penalty", 0, 10, &d, msg, cap)) > 1) return rc;
    if (rc == 1) {
        if (!(d > 0)) return fail(msg, cap, "repeat_penalty: must be above 0 (1 is off)");
        r->samp.repeat_penalty = (float)d;
    }
    if ((rc = get_int(root, "repeat_last_n", 0, 4096, &i64, msg, cap)) > 1) return rc;
    if (rc == 1) r->samp.repeat_last_n = (int32_t)i64;
    /* Seeds are integers; beyond 2^53 a JSON number loses bits anyway. */
    const cJSON *sd = field(root, "seed");
    if (sd) {
        double v = cJSON_IsNumber(sd) ? sd->valuedouble : NAN;
        if (!isfinite(v) || v != floor(v) || v < -9223372036854775808.0 || v >= 18446744073709551616.0)
            return fail(msg, cap, "seed: must be an integer (64 bits)");
        r->samp.seed = v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v;
        r->has_seed = 1;
    } else {
        r->samp.seed = random_seed();
    }

    const char *mt = kind == SRV_KIND_CHAT && field(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if ((rc = get_int(root, mt, 1, INT32_MAX, &i64, msg, cap)) > 1) return rc;
    if (rc == 1) r->max_tokens = (int32_t)i64;
    if (kind == SRV_KIND_CHAT && !strcmp(mt, "max_completion_tokens") &&
        (rc = get_int(root, "max_tokens", 1, INT32_MAX, &i64, msg, cap)) > 1)
        return rc;

    if ((rc = parse_stop(root, r, msg, cap))) return rc;
    if ((rc = get_int(root, "n", 1, 1, &i64, msg, cap)) > 1) return fail(msg, cap, "n: only 1 is supported");
    if ((rc = get_int(root, "best_of", 1, 1, &i64, msg, cap)) > 1) return fail(msg, cap, "best_of: only 1 is supported");
    if ((rc = parse_logit_bias(root, r, msg, cap))) return rc;
    if ((rc = get_bool(root, "ignore_eos", &r->ignore_eos, msg, cap)) > 1) return rc;

    if (kind == SRV_KIND_CHAT) {
        if ((rc = get_bool(root, "logprobs", &r->logprobs, msg, cap)) > 1) return rc;
        if ((rc = get_int(root, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &i64, msg, cap)) > 1) return rc;
        if (rc == 1) {
            if (!r->logprobs) return fail(msg, cap, "top_logprobs: needs \"logprobs\": true");
            r->top_logprobs = (int)i64;
        }
        const cJSON *t = field(root, "tools");
        if (t && !(cJSON_IsArray(t) && cJSON_GetArraySize(t) == 0))
            return fail(msg, cap, "tools: tool calls are not supported");
        t = field(root, "functions");
        if (t && !(cJSON_IsArray(t) && cJSON_GetArraySize(t) == 0))
            return fail(msg, cap, "functions: function calls are not supported");
    } else {
        /* The legacy API's logprobs is a count of top tokens (0: only the
         * chosen token's logprob); true/false are taken too. */
        const cJSON *lp = field(root, "logprobs");
        if (lp && cJSON_IsBool(lp)) {
            r->logprobs = cJSON_IsTrue(lp) ? 1 : 0;
        } else {
            if ((rc = get_int(root, "logprobs", 0, SRV_MAX_TOP_LOGPROBS, &i64, msg, cap)) > 1) return rc;
            if (rc == 1) r->logprobs = 1, r->top_logprobs = (int)i64;
        }
        if ((rc = get_bool(root, "echo", &b, msg, cap)) > 1) return rc;
        if (rc == 1 && b) return fail(msg, cap, "echo: not supported");
        if ((rc = get_str(root, "suffix", &s, msg, cap)) > 1) return rc;
        if (rc == 1 && *s) return fail(msg, cap, "suffix: not supported");
    }

    const cJSON *rf = field(root, "response_format");
    if (rf) {
        const cJSON *t = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
        if (!cJSON_IsString(t) || !t->valuestring)
            return fail(msg, cap, "response_format: must be an object with a \"type\"");
        if (!strcmp(t->valuestring, "json_object")) {
            if (!(r->grammar = strdup(tern_json_object_gbnf()))) return snprintf(msg, cap, "Out of memory"), 500;
        } else if (!strcmp(t->valuestring, "json_schema")) {
            /* OpenAI: {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}} */
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
            const cJSON *sc = cJSON_IsObject(js) ? cJSON_GetObjectItemCaseSensitive(js, "schema") : NULL;
            if (!cJSON_IsObject(sc) && !cJSON_IsBool(sc))
                return fail(msg, cap, "response_format: json_schema needs an object \"json_schema\" with a \"schema\"");
            if ((rc = schema_grammar(sc, r, msg, cap))) return rc;
        } else if (strcmp(t->valuestring, "text") != 0) {
            return fail(msg, cap, "response_format: unknown type (text, json_object, json_schema)");
        }
    }
    /* llama-server's fields: "json_schema" (a schema) and "grammar" (GBNF) */
    const cJSON *js = field(root, "json_schema");
    if (js && !cJSON_IsNull(js)) {
        if (r->grammar) return fail(msg, cap, "json_schema: give one of response_format, json_schema and grammar");
        if ((rc = schema_grammar(js, r, msg, cap))) return rc;
    }
    if ((rc = get_str(root, "grammar", &s, msg, cap)) > 1) return rc;
    if (rc == 1 && *s) {
        if (r->grammar) return fail(msg, cap, "grammar: give one of response_format, json_schema and grammar");
        if (!(r->grammar = strdup(s))) return snprintf(msg, cap, "Out of memory"), 500;
    }

    /* llama-server's "speculative.n_max" (a key with a dot): the most drafts
     * per step for this request (0: none), capped by the server's --draft-max */
    if ((rc = get_int(root, "speculative.n_max", 0, TERN_SPEC_DRAFT_MAX, &i64, msg, cap)) > 1) return rc;
    if (rc == 1) {
        r->has_spec_n_max = 1;
        r->spec_n_max = (int32_t)i64;
    }

    if ((rc = get_str(root, "session_id", &s, msg, cap)) > 1) return rc;
    if (rc == 1) {
        if (!srv_session_id_valid(s))
            return fail(msg, cap, "session_id: not a valid session id (want 1 to %d characters of A-Z a-z 0-9 _ -)", SRV_SESSION_ID_MAX);
        snprintf(r->session, sizeof r->session, "%s", s);
    }
    return 0;
}

int srv_request_parse(srv_kind_t kind, const char *body, size_t len, const srv_limits_t *lim, srv_request_t *out,
                      char *msg, size_t msg_cap) {
    if (msg && msg_cap) msg[0] = 0;
    if (!out) return fail(msg, msg_cap, "Internal error: no request");
    memset(out, 0, sizeof *out);
    out->kind = kind;
    /* OpenAI's defaults, not the CLI's: temperature 1, no top-k / top-p /
     * min-p truncation, no penalties. */
    out->samp = tern_sampler_default_params();
    out->samp.temp = 1.0f;
    out->samp.top_k = 0;
    out->samp.top_p = 1.0f;
    out->samp.min_p = 0.0f;
    out->samp.repeat_penalty = 1.0f;
    out->samp.presence_penalty = 0.0f;
    out->samp.frequency_penalty = 0.0f;
    if (kind != SRV_KIND_CHAT && kind != SRV_KIND_COMPLETION) return fail(msg, msg_cap, "Internal error: bad kind");
    if (!body || len == 0) return fail(msg, msg_cap, "The request body is empty; send a JSON object");
    int depth = lim && lim->max_depth > 0 ? lim->max_depth : DEFAULT_MAX_DEPTH;
    int rc = prescan(body, len, depth, msg, msg_cap);
    if (rc) return rc;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        return fail(msg, msg_cap, "Invalid JSON at byte %zu", at);
    }
    for (const char *p = end; p && p < body + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') {
            cJSON_Delete(root);
            return fail(msg, msg_cap, "Invalid JSON: unexpected data after the object at byte %zu", (size_t)(p - body));
        }
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fail(msg, msg_cap, "The request body must be a JSON object");
    }
    rc = kind == SRV_KIND_CHAT ? parse_messages(root, lim, out, msg, msg_cap) : parse_prompt(root, out, msg, msg_cap);
    if (!rc) rc = parse_common(kind, root, out, msg, msg_cap);
    cJSON_Delete(root);
    if (rc) srv_request_free(out);
    return rc;
}

int srv_request_prepare(const tern_model_t *m, srv_request_t *r, const srv_limits_t *lim, char *msg, size_t msg_cap) {
    if (msg && msg_cap) msg[0] = 0;
    if (!m || !r) return fail(msg, msg_cap, "Internal error: no model or request");
    tern_error_t err = {0};
    if (r->grammar && !r->gram) {
        r->gram = tern_grammar_create(m, r->grammar, strlen(r->grammar), NULL, &err);
        if (!r->gram) {
            if (err.code == TERN_ENOMEM) return snprintf(msg, msg_cap, "Out of memory"), 500;
            return fail(msg, msg_cap, "grammar: %s", err.msg);
        }
    }
    int32_t n_vocab = tern_model_n_vocab(m);
    if (r->kind == SRV_KIND_CHAT || r->prompt_text) {
        char *text = NULL;
        int parse_special = 0;
        if (r->kind == SRV_KIND_CHAT) {
            int rc = tern_chat_render(m, NULL, r->msgs, r->n_msgs, 1, &text, &err);
            /* A model without a template tern knows gets ChatML, as other
             * servers do (docs/SERVER.md). */
            if (rc == TERN_EUNSUP) rc = tern_chat_render(m, "chatml", r->msgs, r->n_msgs, 1, &text, &err);
            if (rc == TERN_ENOMEM) return snprintf(msg, msg_cap, "Out of memory"), 500;
            if (rc) return fail(msg, msg_cap, "messages: %s", err.msg);
            parse_special = 1; /* the template's markers are special tokens */
        }
        const char *t = text ? text : r->prompt_text;
        int32_t *ids = NULL;
        size_t n = 0;
        int rc = tern_tokenize(m, t, strlen(t), tern_model_add_bos(m), parse_special, &ids, &n, &err);
        free(text);
        if (rc == TERN_ENOMEM) return snprintf(msg, msg_cap, "Out of memory"), 500;
        if (rc) return snprintf(msg, msg_cap, "The model cannot tokenize text: %s", err.msg), 500;
        if (n > INT32_MAX) {
            free(ids);
            return fail(msg, msg_cap, "prompt: too many tokens");
        }
        free(r->prompt_ids);
        r->prompt_ids = ids;
        r->n_prompt = (int32_t)n;
    } else {
        for (int32_t i = 0; i < r->n_prompt; i++)
            if (r->prompt_ids[i] < 0 || r->prompt_ids[i] >= n_vocab)
                return fail(msg, msg_cap, "prompt[%d]: token id %d is outside the vocabulary (0..%d)", i, r->prompt_ids[i],
                            n_vocab - 1);
    }
    if (r->n_prompt <= 0) return fail(msg, msg_cap, "prompt: empty (no tokens)");
    int32_t max = lim ? lim->max_prompt_tokens : 0;
    if (max > 0 && r->n_prompt > max)
        return fail(msg, msg_cap, "%s: the prompt has %d tokens, more than the limit of %d",
                    r->kind == SRV_KIND_CHAT ? "messages" : "prompt", r->n_prompt, max);
    for (size_t i = 0; i < r->n_bias; i++)
        if (r->bias[i].token < 0 || r->bias[i].token >= n_vocab)
            return fail(msg, msg_cap, "logit_bias: token id %d is outside the vocabulary (0..%d)", r->bias[i].token,
                        n_vocab - 1);
    return 0;
}

void srv_request_free(srv_request_t *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n_msgs; i++) {
        free((char *)r->msgs[i].role);
        free((char *)r->msgs[i].content);
    }
    free(r->msgs);
    free(r->prompt_text);
    free(r->prompt_ids);
    free(r->bias);
    free(r->grammar);
    tern_grammar_free(r->gram);
    for (int i = 0; i < r->n_stop && i < SRV_MAX_STOP; i++) free(r->stop[i]);
    srv_request_t z;
    memset(&z, 0, sizeof z);
    z.kind = r->kind;
    *r = z;
}
