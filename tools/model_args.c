/* model_args.c - see model_args.h. */
#include "model_args.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void model_args_init(model_args_t *a) {
    memset(a, 0, sizeof *a);
    a->cache.kind = MA_CACHE_AUTO;
    snprintf(a->cache.text, sizeof a->cache.text, "auto");
    a->prefetch = -1;
    a->pin = -1;
}

static void cache_error(const char *cmd, const char *opt, const char *s, const char *why) {
    fprintf(stderr,
            "tern %s: %s: '%s' %s; give auto, off (or mmap), a size with a binary unit (512M, 12G, 12GB, 1500MB, "
            "2GiB: K/M/G/T = 2^10/2^20/2^30/2^40 bytes) or a share of the model's routed experts (25%%)\n",
            cmd, opt, s, why);
}

int model_args_parse_cache(const char *s, const char *cmd, const char *opt, ma_cache_t *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->text, sizeof out->text, "%s", s);
    if (!strcasecmp(s, "auto")) {
        out->kind = MA_CACHE_AUTO;
        return 0;
    }
    if (!strcasecmp(s, "off") || !strcasecmp(s, "mmap")) {
        out->kind = MA_CACHE_MMAP;
        return 0;
    }
    /* A number, then "%" or a unit; no sign, no hex, no exponent. */
    const char *p = s;
    while (isdigit((unsigned char)*p) || *p == '.') p++;
    if (p == s) {
        cache_error(cmd, opt, s, "is not a cache setting");
        return -1;
    }
    char num[64];
    const size_t nl = (size_t)(p - s);
    if (nl >= sizeof num) {
        cache_error(cmd, opt, s, "is too long");
        return -1;
    }
    memcpy(num, s, nl);
    num[nl] = 0;
    char *end;
    errno = 0;
    const double v = strtod(num, &end);
    if (errno || *end || !isfinite(v) || !(v > 0)) {
        cache_error(cmd, opt, s, "is not a positive number");
        return -1;
    }
    if (!strcmp(p, "%")) {
        if (v > 1000) {
            cache_error(cmd, opt, s, "is more than 1000%");
            return -1;
        }
        out->kind = MA_CACHE_SHARE;
        out->share = v / 100.0;
        return 0;
    }
    int shift = -1;
    switch (toupper((unsigned char)*p)) {
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case 'T': shift = 40; break;
    }
    const char *rest = shift >= 0 ? p + 1 : p;
    if (shift < 0 || !(!*rest || !strcasecmp(rest, "B") || !strcasecmp(rest, "iB"))) {
        cache_error(cmd, opt, s, *p ? "has an unknown unit" : "has no unit");
        return -1;
    }
    const double bytes = ldexp(v, shift);
    if (bytes < 1 || bytes >= 0x1p62) {
        cache_error(cmd, opt, s, bytes < 1 ? "is less than a byte" : "is too large");
        return -1;
    }
    out->kind = MA_CACHE_BYTES;
    out->bytes = (uint64_t)bytes;
    return 0;
}

int model_args_parse_onoff(const char *s, const char *cmd, const char *opt, int *out) {
    if (!strcasecmp(s, "on") || !strcmp(s, "1")) *out = 1;
    else if (!strcasecmp(s, "off") || !strcmp(s, "0")) *out = 0;
    else {
        fprintf(stderr, "tern %s: %s wants on or off, got '%s'\n", cmd, opt, s);
        return -1;
    }
    return 0;
}

int model_args_parse_io_threads(const char *s, const char *cmd, const char *opt, int *out) {
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > MA_IO_THREADS_MAX) {
        fprintf(stderr, "tern %s: %s wants an integer from 1 to %d, got '%s'\n", cmd, opt, MA_IO_THREADS_MAX, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int model_args_take(model_args_t *a, const char *cmd, int argc, char **argv, int *i) {
    const char *opt = argv[*i];
    const int known = !strcmp(opt, "--expert-cache") || !strcmp(opt, "--expert-prefetch") ||
                      !strcmp(opt, "--expert-pin") || !strcmp(opt, "--io-threads");
    if (!known) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "tern %s: %s needs a value (see tern %s --help)\n", cmd, opt, cmd);
        return -1;
    }
    const char *v = argv[++*i];
    int rc;
    if (!strcmp(opt, "--expert-cache")) rc = model_args_parse_cache(v, cmd, opt, &a->cache);
    else if (!strcmp(opt, "--expert-prefetch")) rc = model_args_parse_onoff(v, cmd, opt, &a->prefetch);
    else if (!strcmp(opt, "--expert-pin")) rc = model_args_parse_onoff(v, cmd, opt, &a->pin);
    else rc = model_args_parse_io_threads(v, cmd, opt, &a->io_threads);
    return rc ? -1 : 1;
}

/* One option's help: the flag in a column of width col - 2 after two
 * spaces, then its lines (the first after the flag, the others indented to
 * col); a flag as wide as the column or wider gets one space. */
static void help_item(FILE *out, int col, const char *flag, const char *const *lines) {
    const int w = col - 2, fl = (int)strlen(flag);
    fprintf(out, "  %s%*s%s\n", flag, fl < w ? w - fl : 1, "", lines[0]);
    for (int i = 1; lines[i]; i++) fprintf(out, "%*s%s\n", col, "", lines[i]);
}

void model_args_usage(FILE *out, int lists, int col) {
    fprintf(out, "Mixture-of-Experts models (accepted and ignored for a dense model):\n");
    const char *cache[] = {
        lists ? "comma-separated settings, one row each (the model is loaded"
              : "where the routed experts come from:",
        lists ? "again for each), e.g. 25%,50%,100%,mmap; a setting is one of:" : "",
        "auto: through the mapping when the file fits in memory, else a",
        "  cache of what fits (the default); off or mmap: always through",
        "  the mapping and the page cache; a cache of a size with a binary",
        "  unit: 512M, 12G, 12GB, 1500MB, 2GiB (K, M, G, T = 2^10, 2^20,",
        "  2^30, 2^40 bytes); or a share of the model's routed experts",
        "  (25%: slots for a quarter of them; 100% holds them all)",
        NULL};
    help_item(out, col, lists ? "--expert-cache LIST" : "--expert-cache SIZE", lists ? cache : (const char *[]){
        cache[0], cache[2], cache[3], cache[4], cache[5], cache[6], cache[7], NULL});
    const char *pf[] = {lists ? "on, off or on,off (a row each): read the experts the next layer"
                              : "read the experts the next layer will likely want ahead of it",
                        lists ? "will likely want ahead of it (default on)" : "(default on)", NULL};
    help_item(out, col, lists ? "--expert-prefetch LIST" : "--expert-prefetch on|off", pf);
    const char *pin[] = {lists ? "on, off or on,off (a row each): keep the most used experts in"
                               : "keep the most used experts in the cache for good (default on;",
                         lists ? "the cache for good (default on; counted by this run's earlier"
                               : "the uses are counted per model file under ~/.cache/tern)",
                         lists ? "rows, in a file of its own)" : NULL, NULL};
    help_item(out, col, lists ? "--expert-pin LIST" : "--expert-pin on|off", pin);
    const char *io[] = {lists ? "readers of the expert cache and of the disk probe (default 8)"
                              : "readers of the expert cache (default 8)",
                        NULL};
    help_item(out, col, "--io-threads N", io);
}

int model_args_expert_bytes(const char *path, uint64_t *bytes, tern_error_t *err) {
    tern_model_params_t p = tern_model_default_params();
    p.expert_cache_bytes = TERN_EXPERTS_MMAP;
    tern_model_t *m = tern_model_load_ex(path, &p, err);
    if (!m) return err && err->code ? err->code : TERN_EIO;
    tern_expert_stats_t st;
    tern_model_expert_stats(m, &st);
    *bytes = st.n_experts * st.slot_bytes; /* a cache holding every expert (slots have room for alignment) */
    tern_model_free(m);
    return 0;
}

int64_t model_args_cache_bytes(const ma_cache_t *c, uint64_t expert_bytes) {
    switch (c->kind) {
    case MA_CACHE_AUTO: return TERN_EXPERTS_AUTO;
    case MA_CACHE_MMAP: return TERN_EXPERTS_MMAP;
    case MA_CACHE_BYTES: return (int64_t)c->bytes;
    case MA_CACHE_SHARE: {
        const double b = ceil(c->share * (double)expert_bytes);
        return b >= 1 ? (int64_t)b : TERN_EXPERTS_MMAP;
    }
    }
    return TERN_EXPERTS_AUTO;
}

int model_args_params(const char *path, const model_args_t *a, tern_model_params_t *p, tern_error_t *err) {
    *p = tern_model_default_params();
    uint64_t eb = 0;
    if (a->cache.kind == MA_CACHE_SHARE) {
        int rc = model_args_expert_bytes(path, &eb, err);
        if (rc) return rc;
    }
    p->expert_cache_bytes = model_args_cache_bytes(&a->cache, eb);
    p->expert_prefetch = a->prefetch;
    p->expert_pin = a->pin;
    p->io_threads = a->io_threads;
    return 0;
}

tern_model_t *model_args_load(const char *path, const model_args_t *a, const char *cmd) {
    tern_error_t err = {0};
    tern_model_params_t p;
    tern_model_t *m = NULL;
    if (model_args_params(path, a, &p, &err) == 0) m = tern_model_load_ex(path, &p, &err);
    if (!m) fprintf(stderr, "tern %s: %s\n", cmd, err.msg);
    return m;
}
