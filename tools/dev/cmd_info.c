/*
 * cmd_info.c - `tern info FILE [--tensors] [--kv] [--json]`: what a GGUF file
 * holds. A summary (architecture, shapes, tokenizer, tensor bytes per type),
 * optionally every tensor and every metadata entry, as text or JSON. Uses only
 * the GGUF reader, so it works on vocab-only files and on architectures the
 * model layer does not know.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "format/gguf.h"
#include "format/quant.h"

typedef struct {
    bool json;
    bool first; /* JSON: no comma before the next member */
} emit_t;

static void json_str(const char *s, uint64_t n) {
    putchar('"');
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\u%04x", c);
        else
            putchar(c); /* UTF-8 passes through; invalid bytes stay as they are */
    }
    putchar('"');
}

/* Text output of a string value: control characters escaped, long ones cut. */
static void text_str(const char *s, uint64_t n, uint64_t max) {
    putchar('"');
    for (uint64_t i = 0; i < n && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    putchar('"');
    if (n > max) printf("... (%" PRIu64 " bytes)", n);
}

static void scalar(gguf_vtype_t t, const void *p) {
    switch (t) {
    case GGUF_UINT8: printf("%u", *(const uint8_t *)p); break;
    case GGUF_INT8: printf("%d", *(const int8_t *)p); break;
    case GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); printf("%u", v); break; }
    case GGUF_INT16: { int16_t v; memcpy(&v, p, 2); printf("%d", v); break; }
    case GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); printf("%" PRIu32, v); break; }
    case GGUF_INT32: { int32_t v; memcpy(&v, p, 4); printf("%" PRId32, v); break; }
    case GGUF_UINT64: { uint64_t v; memcpy(&v, p, 8); printf("%" PRIu64, v); break; }
    case GGUF_INT64: { int64_t v; memcpy(&v, p, 8); printf("%" PRId64, v); break; }
    case GGUF_FLOAT32: { float v; memcpy(&v, p, 4); printf("%.9g", (double)v); break; }
    case GGUF_FLOAT64: { double v; memcpy(&v, p, 8); printf("%.17g", v); break; }
    case GGUF_BOOL: fputs(*(const uint8_t *)p ? "true" : "false", stdout); break;
    default: fputs("null", stdout); break;
    }
}

/* One metadata value; arrays show their first few elements. */
static void value(const gguf_kv_t *kv, bool json) {
    gguf_vtype_t t = gguf_kv_type(kv);
    if (t == GGUF_STRING) {
        gguf_str_t s = gguf_kv_str(kv);
        if (json)
            json_str(s.data, s.len);
        else
            text_str(s.data, s.len, 120);
        return;
    }
    if (t != GGUF_ARRAY) {
        scalar(t, gguf_kv_data(kv));
        return;
    }
    gguf_vtype_t et = gguf_arr_type(kv);
    uint64_t n = gguf_arr_len(kv);
    const uint64_t show = 8;
    if (json) {
        printf("{\"type\": \"%s\", \"length\": %" PRIu64 ", \"head\": [", gguf_vtype_name(et), n);
    } else {
        printf("%s[%" PRIu64 "] [", gguf_vtype_name(et), n);
    }
    if (et != GGUF_ARRAY) {
        for (uint64_t i = 0; i < n && i < show; i++) {
            if (i) fputs(", ", stdout);
            if (et == GGUF_STRING) {
                gguf_str_t s = gguf_arr_str(kv, i);
                if (json)
                    json_str(s.data, s.len);
                else
                    text_str(s.data, s.len, 40);
            } else {
                scalar(et, (const uint8_t *)gguf_arr_data(kv) + i * gguf_vtype_size(et));
            }
        }
    }
    if (json)
        fputs("]}", stdout);
    else
        printf("%s]", n > show && et != GGUF_ARRAY ? ", ..." : et == GGUF_ARRAY ? "nested" : "");
}

static bool get_u64(const gguf_file_t *f, const char *suffix, uint64_t *v) {
    return gguf_get_arch_u64(f, suffix, v, NULL) == 0;
}

static void field_u64(emit_t *e, const char *label, const char *jkey, bool have, uint64_t v) {
    if (e->json) {
        printf("%s\n  \"%s\": ", e->first ? "" : ",", jkey);
        if (have)
            printf("%" PRIu64, v);
        else
            fputs("null", stdout);
    } else if (have) {
        printf("  %-18s %" PRIu64 "\n", label, v);
    }
    e->first = false;
}

static void field_str(emit_t *e, const char *label, const char *jkey, const char *s, uint64_t n) {
    if (e->json) {
        printf("%s\n  \"%s\": ", e->first ? "" : ",", jkey);
        if (s)
            json_str(s, n);
        else
            fputs("null", stdout);
    } else if (s) {
        printf("  %-18s %.*s\n", label, (int)(n > 200 ? 200 : n), s);
    }
    e->first = false;
}

static void field_kv_str(emit_t *e, const gguf_file_t *f, const char *label, const char *jkey, const char *key) {
    gguf_str_t s = {0, NULL};
    gguf_get_str(f, key, &s, NULL);
    field_str(e, label, jkey, s.data, s.len);
}

static void usage(FILE *o) {
    fprintf(o, "usage: tern info FILE [--tensors] [--kv] [--json]\n"
               "  --tensors  list every tensor (name, type, shape, offset, bytes)\n"
               "  --kv       list every metadata entry (arrays abbreviated)\n"
               "  --json     machine-readable output\n");
}

int cmd_info(int argc, char **argv) {
    const char *path = NULL;
    bool tensors = false, kvs = false, json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tensors"))
            tensors = true;
        else if (!strcmp(argv[i], "--kv"))
            kvs = true;
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "tern info: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else
            path = argv[i];
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    tern_error_t err = {0};
    gguf_file_t *f = gguf_open(path, &err);
    if (!f) {
        fprintf(stderr, "tern info: %s\n", err.msg);
        return 1;
    }

    emit_t e = {json, true};
    const char *arch = gguf_arch(f);
    if (json) {
        fputs("{", stdout);
        field_str(&e, "", "file", path, strlen(path));
    } else {
        printf("%s\n", path);
    }
    field_u64(&e, "GGUF version", "gguf_version", true, gguf_version(f));
    field_u64(&e, "file size", "file_size", true, gguf_file_size(f));
    field_u64(&e, "alignment", "alignment", true, gguf_alignment(f));
    field_str(&e, "architecture", "architecture", arch, arch ? strlen(arch) : 0);
    field_kv_str(&e, f, "name", "name", "general.name");
    uint64_t ft;
    bool have_ft = gguf_get_u64(f, "general.file_type", &ft, NULL) == 0;
    field_u64(&e, "file type", "file_type", have_ft, ft);

    static const struct {
        const char *suffix, *label, *jkey;
    } shape[] = {
        {"block_count", "layers", "n_layer"},
        {"embedding_length", "dim", "n_embd"},
        {"attention.head_count", "heads", "n_head"},
        {"attention.head_count_kv", "kv heads", "n_head_kv"},
        {"attention.key_length", "head dim (k)", "head_dim_k"},
        {"feed_forward_length", "ffn", "n_ff"},
        {"context_length", "context", "n_ctx_train"},
        {"rope.dimension_count", "rope dims", "n_rot"},
    };
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++) {
        uint64_t v = 0;
        bool have = arch && get_u64(f, shape[i].suffix, &v);
        if (!have && !strcmp(shape[i].suffix, "attention.key_length")) continue; /* optional, derived otherwise */
        field_u64(&e, shape[i].label, shape[i].jkey, have, v);
    }
    float fb;
    bool have_fb = arch && gguf_get_arch_f32(f, "rope.freq_base", &fb, NULL) == 0;
    float eps;
    bool have_eps = arch && gguf_get_arch_f32(f, "attention.layer_norm_rms_epsilon", &eps, NULL) == 0;
    if (json) {
        printf(",\n  \"rope_freq_base\": ");
        if (have_fb) printf("%.9g", (double)fb); else fputs("null", stdout);
        printf(",\n  \"rms_eps\": ");
        if (have_eps) printf("%.9g", (double)eps); else fputs("null", stdout);
    } else {
        if (have_fb) printf("  %-18s %g\n", "rope freq base", (double)fb);
        if (have_eps) printf("  %-18s %g\n", "rms eps", (double)eps);
    }

    /* Vocabulary: the arch key when present, else the token list. */
    const gguf_kv_t *toks = gguf_find(f, "tokenizer.ggml.tokens");
    uint64_t n_vocab = 0;
    bool have_vocab = arch && get_u64(f, "vocab_size", &n_vocab);
    if (!have_vocab && toks && gguf_kv_type(toks) == GGUF_ARRAY) {
        n_vocab = gguf_arr_len(toks);
        have_vocab = true;
    }
    field_u64(&e, "vocab", "n_vocab", have_vocab, n_vocab);
    field_kv_str(&e, f, "tokenizer", "tokenizer", "tokenizer.ggml.model");
    field_kv_str(&e, f, "pre-tokenizer", "pre_tokenizer", "tokenizer.ggml.pre");
    bool tmpl = gguf_find(f, "tokenizer.chat_template") != NULL;
    if (json)
        printf(",\n  \"chat_template\": %s", tmpl ? "true" : "false");
    else
        printf("  %-18s %s\n", "chat template", tmpl ? "yes" : "no");

    /* Tensors per type. */
    uint64_t count[TYPE_COUNT] = {0}, bytes[TYPE_COUNT] = {0}, params = 0, total = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        count[t->type]++;
        bytes[t->type] += t->size;
        total += t->size;
        params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    }
    if (json) {
        printf(",\n  \"n_kv\": %" PRId64 ",\n  \"n_tensors\": %" PRId64 ",\n  \"n_params\": %" PRIu64
               ",\n  \"tensor_bytes\": %" PRIu64 ",\n  \"types\": {",
               gguf_n_kv(f), gguf_n_tensors(f), params, total);
        bool first = true;
        for (int t = 0; t < TYPE_COUNT; t++)
            if (count[t]) {
                printf("%s\"%s\": {\"count\": %" PRIu64 ", \"bytes\": %" PRIu64 "}", first ? "" : ", ", quant_name(t),
                       count[t], bytes[t]);
                first = false;
            }
        fputs("}", stdout);
    } else {
        printf("  %-18s %" PRId64 "\n", "metadata entries", gguf_n_kv(f));
        printf("  %-18s %" PRId64 " (%" PRIu64 " parameters, %" PRIu64 " bytes, %.2f bits/weight)\n", "tensors",
               gguf_n_tensors(f), params, total, params ? 8.0 * (double)total / (double)params : 0.0);
        for (int t = 0; t < TYPE_COUNT; t++)
            if (count[t])
                printf("    %-6s %6" PRIu64 " tensors %14" PRIu64 " bytes\n", quant_name(t), count[t], bytes[t]);
    }

    if (kvs) {
        if (json)
            fputs(",\n  \"metadata\": {", stdout);
        else
            printf("metadata:\n");
        for (int64_t i = 0; i < gguf_n_kv(f); i++) {
            const gguf_kv_t *kv = gguf_kv_at(f, i);
            const char *k = gguf_kv_key(kv);
            if (json) {
                printf("%s\n    ", i ? "," : "");
                json_str(k, strlen(k));
                fputs(": ", stdout);
            } else {
                printf("  %-40s %-7s ", k, gguf_vtype_name(gguf_kv_type(kv)));
            }
            value(kv, json);
            if (!json) putchar('\n');
        }
        if (json) fputs("\n  }", stdout);
    }

    if (tensors) {
        if (json)
            fputs(",\n  \"tensors\": [", stdout);
        else
            printf("tensors:\n  %-40s %-6s %-28s %12s %12s\n", "name", "type", "shape", "offset", "bytes");
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor_t *t = gguf_tensor_at(f, i);
            char sh[96], br[100];
            int k = 0;
            for (int d = 0; d < t->n_dims; d++)
                k += snprintf(sh + k, sizeof sh - (size_t)k, "%s%" PRId64, d ? ", " : "", t->ne[d]);
            snprintf(br, sizeof br, "[%s]", sh);
            if (json) {
                printf("%s\n    {\"name\": ", i ? "," : "");
                json_str(t->name, strlen(t->name));
                printf(", \"type\": \"%s\", \"shape\": [%s], \"offset\": %" PRIu64 ", \"bytes\": %" PRIu64 "}",
                       quant_name(t->type), sh, t->offset, t->size);
            } else {
                printf("  %-40s %-6s %-28s %12" PRIu64 " %12" PRIu64 "\n", t->name, quant_name(t->type), br,
                       t->offset, t->size);
            }
        }
        if (json) fputs("\n  ]", stdout);
    }
    if (json) fputs("\n}\n", stdout);
    gguf_close(f);
    return 0;
}
