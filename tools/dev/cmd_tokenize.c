/*
 * cmd_tokenize.c - `tern tokenize` and `tern detokenize`: text to token ids
 * and back with the tokenizer stored in a GGUF file (a model or a vocab-only
 * file). Uses the GGUF reader and the tokenizer only, so it works on files
 * whose architecture the model layer does not know.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "format/gguf.h"
#include "text/tokenizer.h"

static void tokenize_usage(FILE *out) {
    fprintf(out,
            "usage: tern tokenize -m FILE (-p TEXT | -f TEXTFILE) [--ids] [--special] [--no-bos]\n"
            "  -m FILE      GGUF file with a tokenizer (model or vocab-only)\n"
            "  -p TEXT      text to tokenize\n"
            "  -f TEXTFILE  read the text from a file (byte for byte)\n"
            "  --ids        print only the ids, as [1, 2, 3]\n"
            "  --special    recognize special tokens (<|im_start|> ...) in the text\n"
            "  --no-bos     do not add BOS even if the model asks for it\n");
}

static void detokenize_usage(FILE *out) {
    fprintf(out,
            "usage: tern detokenize -m FILE [--special] IDS...\n"
            "  IDS may be separate arguments or one list such as \"[1, 2, 3]\"\n"
            "  --special    write control tokens (BOS, <|im_end|> ...) as their text\n");
}

static tokenizer_t *open_tok(const char *path) {
    tern_error_t err;
    gguf_file_t *f = gguf_open(path, &err);
    if (!f) {
        fprintf(stderr, "tern: %s\n", err.msg);
        return NULL;
    }
    tokenizer_t *t = tok_load(f, &err);
    gguf_close(f);
    if (!t) fprintf(stderr, "tern: %s: %s\n", path, err.msg);
    return t;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "tern: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "tern: cannot read %s\n", path);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* A piece as printable text: control bytes and bytes of invalid UTF-8
 * escaped, so a token holding half a character stays visible. */
static void print_piece(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') {
            fputs("\\n", stdout);
        } else if (c == '\t') {
            fputs("\\t", stdout);
        } else if (c == '\'' || c == '\\') {
            printf("\\%c", c);
        } else if (c < 0x20 || c == 0x7f) {
            printf("\\x%02x", c);
        } else if (c >= 0x80) {
            /* keep a whole valid UTF-8 sequence, escape anything else */
            size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
            size_t k = 1;
            while (need && k < need && i + k < n && ((unsigned char)s[i + k] & 0xC0) == 0x80) k++;
            if (need && k == need) {
                fwrite(s + i, 1, need, stdout);
                i += need - 1;
            } else {
                printf("\\x%02x", c);
            }
        } else {
            putchar(c);
        }
    }
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *file = NULL;
    bool ids_only = false, special = false, no_bos = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tokenize_usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) {
            model = argv[++i];
        } else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && i + 1 < argc) {
            prompt = argv[++i];
        } else if ((!strcmp(a, "-f") || !strcmp(a, "--file")) && i + 1 < argc) {
            file = argv[++i];
        } else if (!strcmp(a, "--ids")) {
            ids_only = true;
        } else if (!strcmp(a, "--special")) {
            special = true;
        } else if (!strcmp(a, "--no-bos")) {
            no_bos = true;
        } else {
            fprintf(stderr, "tern tokenize: unknown or incomplete option '%s'\n", a);
            tokenize_usage(stderr);
            return 2;
        }
    }
    if (!model || (!prompt == !file)) {
        fprintf(stderr, "tern tokenize: need -m FILE and exactly one of -p TEXT or -f TEXTFILE\n");
        tokenize_usage(stderr);
        return 2;
    }
    size_t len = 0;
    char *text = NULL;
    if (file) {
        if (!(text = read_all(file, &len))) return 1;
    } else {
        len = strlen(prompt);
    }
    tokenizer_t *t = open_tok(model);
    if (!t) {
        free(text);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    tern_error_t err;
    int rc = tok_encode(t, file ? text : prompt, len, tok_add_bos(t) && !no_bos, special, &ids, &n, &err);
    if (rc) {
        fprintf(stderr, "tern tokenize: %s\n", err.msg);
    } else if (ids_only) {
        putchar('[');
        for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", (int)ids[i]);
        puts("]");
    } else {
        for (size_t i = 0; i < n; i++) {
            size_t pl;
            const char *p = tok_piece(t, ids[i], &pl);
            printf("%7d -> '", (int)ids[i]);
            print_piece(p, pl);
            puts("'");
        }
    }
    free(ids);
    free(text);
    tok_free(t);
    return rc ? 1 : 0;
}

int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL;
    bool special = false;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int status = 0;
    for (int i = 1; i < argc && status == 0; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            detokenize_usage(stdout);
            free(ids);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) {
            model = argv[++i];
        } else if (!strcmp(a, "--special")) {
            special = true;
        } else {
            /* ids: digits separated by spaces, commas or brackets */
            for (const char *p = a; *p && status == 0;) {
                if (*p == ' ' || *p == ',' || *p == '[' || *p == ']' || *p == '\t' || *p == '\n') {
                    p++;
                    continue;
                }
                char *end;
                errno = 0;
                long v = strtol(p, &end, 10);
                if (end == p || errno || v < 0 || v > INT32_MAX || (*end && !strchr(" ,[]\t\n", *end))) {
                    fprintf(stderr, "tern detokenize: '%s' is not a list of token ids\n", a);
                    status = 2;
                    break;
                }
                if (n == cap) {
                    cap = cap ? 2 * cap : 64;
                    int32_t *ni = realloc(ids, cap * sizeof *ids);
                    if (!ni) {
                        fprintf(stderr, "tern detokenize: out of memory\n");
                        status = 1;
                        break;
                    }
                    ids = ni;
                }
                ids[n++] = (int32_t)v;
                p = end;
            }
        }
    }
    if (status == 0 && !model) {
        fprintf(stderr, "tern detokenize: need -m FILE\n");
        detokenize_usage(stderr);
        status = 2;
    }
    tokenizer_t *t = status == 0 ? open_tok(model) : NULL;
    if (status == 0 && !t) status = 1;
    if (status == 0) {
        char *out;
        size_t len;
        tern_error_t err;
        if (tok_decode(t, ids, n, special, &out, &len, &err)) {
            fprintf(stderr, "tern detokenize: %s\n", err.msg);
            status = 1;
        } else {
            fwrite(out, 1, len, stdout);
            putchar('\n');
            free(out);
        }
    }
    tok_free(t);
    free(ids);
    return status;
}
