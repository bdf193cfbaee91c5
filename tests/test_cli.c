/* test_cli.c - the tern binary's model-loading options as a user types
 * them (tools/model_args.c): --expert-cache, --expert-prefetch, --expert-pin
 * and --io-threads on tern run, bench and serve; the expert cache line of
 * tern run's timings; tern bench's expert rows (one per cache setting, the
 * cache's figures, the disk probe) in -o json; tern bench's LLC-resident
 * rule (--llc-mb) and --busy; the last-level cache in tern info --threads.
 * On a tiny MoE made by `tern mkmodel` in a temporary folder; nothing is
 * timed, only the shape and the ranges of what is printed are checked. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

static char g_dir[256];
static char g_tern[1024];
static char g_moe[512], g_dense[512];

/* Run a shell command line, stdout into *out and stderr into *err (malloc'd,
 * NUL-terminated; either may be NULL); the exit status, or -1. The usage
 * counts of the expert cache go to the temporary folder, not ~/.cache. */
static int sh(const char *cmd, char **out, char **err) {
    char line[8192], of[512], ef[512];
    snprintf(of, sizeof of, "%s/out.txt", g_dir);
    snprintf(ef, sizeof ef, "%s/err.txt", g_dir);
    snprintf(line, sizeof line, "XDG_CACHE_HOME='%s' %s >'%s' 2>'%s'", g_dir, cmd, of, ef);
    const int st = system(line);
    if (out) *out = tu_read_file(of, NULL);
    if (err) *err = tu_read_file(ef, NULL);
    return st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}

static int setup(void **state) {
    (void)state;
    snprintf(g_tern, sizeof g_tern, "%s/tern", TERN_BUILD_DIR);
    if (access(g_tern, X_OK) != 0) {
        print_message("%s is not built\n", g_tern);
        return -1;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/tern_cli_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_moe, sizeof g_moe, "%s/moe.gguf", g_dir);
    snprintf(g_dense, sizeof g_dense, "%s/dense.gguf", g_dir);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' mkmodel --shape tiny-qwen3moe --type q8_0 --quiet -o '%s'", g_tern, g_moe);
    if (sh(cmd, NULL, NULL) != 0) return -1;
    snprintf(cmd, sizeof cmd, "'%s' mkmodel --shape tiny --type q8_0 --quiet -o '%s'", g_tern, g_dense);
    return sh(cmd, NULL, NULL) != 0 ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) != 0 ? -1 : 0;
}

/* ---- bad values: exit 2, a message naming the option --------------------- */

typedef struct {
    const char *args; /* after "tern " */
    const char *piece; /* in the message */
} bad_t;

static void test_bad_values(void **state) {
    (void)state;
    static const bad_t BAD[] = {
        {"run -m M --expert-cache 12", "--expert-cache: '12' has no unit"},
        {"run -m M --expert-cache abc", "--expert-cache: 'abc' is not a cache setting"},
        {"run -m M --expert-cache 0%", "--expert-cache: '0%' is not a positive number"},
        {"run -m M --expert-cache 1.5X", "--expert-cache: '1.5X' has an unknown unit"},
        {"run -m M --expert-cache 2000%", "more than 1000%"},
        {"run -m M --expert-cache", "--expert-cache needs a value"},
        {"chat -m M --expert-prefetch maybe", "--expert-prefetch wants on or off, got 'maybe'"},
        {"perplexity -m M --expert-pin 2", "--expert-pin wants on or off"},
        {"run -m M --io-threads 0", "--io-threads wants an integer from 1 to 256"},
        {"bench -m M --expert-cache 25%,x", "--expert-cache: 'x' is not a cache setting"},
        {"bench -m M --expert-prefetch on,maybe", "--expert-prefetch wants on or off, got 'maybe'"},
        {"bench -m M --io-threads 999", "--io-threads wants an integer from 1 to 256"},
        {"bench -m M --disk-probe-s -1", "--disk-probe-s wants seconds"},
        {"bench -m M --expert-cache 25% -np 1,2", "do not combine with -np"},
        {"run -m M --spec maybe", "--spec wants ngram, ngram-fixed or off, got 'maybe'"},
        {"chat -m M --draft-max 0", "--draft-max wants an integer in [1, 32]"},
        {"run -m M --spec-ngram 17", "--spec-ngram wants an integer in [1, 16]"},
        {"run -m M --spec ngram --logits-digest", "--logits-digest needs --spec off"},
        {"bench spec -m M --part x", "--part wants cost, work or all, got 'x'"},
        {"bench -m M --llc-mb -1", "--llc-mb wants MiB from 0 to 1048576, got '-1'"},
        {"bench -m M --llc-mb 3x", "--llc-mb wants MiB from 0 to 1048576, got '3x'"},
        {"bench -m M --busy 0", "--busy wants an integer from 1 to 64, got '0'"},
        {"bench -m M --busy 65", "--busy wants an integer from 1 to 64, got '65'"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        char cmd[2048], *err = NULL;
        /* M: the model (the options are checked before it is opened) */
        snprintf(cmd, sizeof cmd, "'%s' %s", g_tern, BAD[i].args);
        char *m = strstr(cmd, " M");
        assert_non_null(m);
        char rest[1024];
        snprintf(rest, sizeof rest, "%s", m + 2);
        snprintf(m, sizeof cmd - (size_t)(m - cmd), " '%s'%s", g_moe, rest);
        const int rc = sh(cmd, NULL, &err);
        if (rc != 2 || !err || !strstr(err, BAD[i].piece))
            fail_msg("tern %s: exit %d, stderr '%s', wanted exit 2 and '%s'", BAD[i].args, rc, err ? err : "",
                     BAD[i].piece);
        free(err);
    }
    /* serve (where it is built): the same parser */
    char cmd[2048], *err = NULL;
    snprintf(cmd, sizeof cmd, "'%s' serve --help", g_tern);
    if (sh(cmd, NULL, NULL) == 0) {
        snprintf(cmd, sizeof cmd, "'%s' serve -m '%s' --expert-cache 5Q --port 0", g_tern, g_moe);
        assert_int_equal(sh(cmd, NULL, &err), 2);
        assert_non_null(strstr(err, "tern serve: --expert-cache: '5Q' has an unknown unit"));
        free(err);
    }
}

/* ---- tern run ------------------------------------------------------------- */

static void test_run_cache_line(void **state) {
    (void)state;
    char cmd[2048], *err = NULL, *out = NULL;
    /* a cache of 1 MiB (whole slots: 8 of 120 KiB here): the timings end with its line, over the generation */
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p 'hello there' -n 8 --temp 0 -t 2 --expert-cache 1M --expert-prefetch off",
             g_tern, g_moe);
    assert_int_equal(sh(cmd, &out, &err), 0);
    const char *line = strstr(err, "tern: expert cache     = ");
    if (!line) fail_msg("no expert cache line in:\n%s", err);
    double kib, slot_kib;
    int slots;
    assert_int_equal(sscanf(line, "tern: expert cache     = %lf KiB in %d slots of %lf KiB", &kib, &slots, &slot_kib), 3);
    assert_true(slots >= 1 && kib <= 1024 && kib > 1024 - slot_kib - 0.1 &&
                fabs(kib - slots * slot_kib) < 0.1 * slots);
    assert_non_null(strstr(line, "over 8 generated tokens: hit rate "));
    assert_true(strstr(line, " GB read per token, I/O ") || strstr(line, " MB read per token, I/O "));
    assert_non_null(strstr(line, "GB/s, waiting on I/O "));
    assert_null(strstr(line, "prefetch prediction")); /* prefetch off */
    char *greedy = out;
    out = NULL;
    free(err);
    /* with prefetch: the prediction too; the same text (the cache never changes the logits) */
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p 'hello there' -n 8 --temp 0 -t 2 --expert-cache 25%% "
             "--expert-prefetch on --io-threads 2", g_tern, g_moe);
    assert_int_equal(sh(cmd, &out, &err), 0);
    line = strstr(err, "tern: expert cache     = ");
    assert_non_null(line);
    assert_non_null(strstr(line, "prefetch on"));
    assert_non_null(strstr(line, "prefetch prediction "));
    assert_string_equal(out, greedy);
    free(out);
    free(err);
    /* through the mapping, and a dense model with the options: no line, same text */
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p 'hello there' -n 8 --temp 0 --expert-cache mmap", g_tern, g_moe);
    assert_int_equal(sh(cmd, &out, &err), 0);
    assert_null(strstr(err, "expert cache"));
    assert_string_equal(out, greedy);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -n 4 --expert-cache 25%% --expert-pin on --io-threads 3", g_tern, g_dense);
    assert_int_equal(sh(cmd, NULL, &err), 0);
    assert_null(strstr(err, "expert cache"));
    free(err);
    free(greedy);
}

/* tern run --spec: the same tokens as without it, greedy and sampled, and a
 * line with the counters. */
static void test_run_spec(void **state) {
    (void)state;
    static const char *const samp[] = {"--temp 0", "--temp 0.8 --seed 5 --repeat-penalty 1.1"};
    for (int i = 0; i < 2; i++) {
        char cmd[2048], *err = NULL, *plain = NULL, *out = NULL;
        snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p 'hello there' -n 40 --ids -t 2 %s", g_tern, g_dense, samp[i]);
        assert_int_equal(sh(cmd, &plain, &err), 0);
        assert_null(strstr(err, "speculative"));
        free(err);
        static const char *const modes[] = {"ngram", "ngram-fixed --draft-max 5 --spec-ngram 3"};
        for (int k = 0; k < 2; k++) {
            snprintf(cmd, sizeof cmd, "'%s' run -m '%s' -p 'hello there' -n 40 --ids -t 2 %s --spec %s", g_tern,
                     g_dense, samp[i], modes[k]);
            assert_int_equal(sh(cmd, &out, &err), 0);
            assert_string_equal(out, plain);
            const char *line = strstr(err, "tern: speculative      = ngram (");
            if (!line) fail_msg("no speculative line in:\n%s", err);
            assert_non_null(strstr(line, k ? "(fixed), drafts up to 5, n-grams 1..3: " : "(adaptive), drafts up to 8"));
            assert_non_null(strstr(line, " tokens per pass"));
            free(out);
            free(err);
        }
        free(plain);
    }
}

/* ---- tern bench -o json ------------------------------------------------------ */

/* The number after "key": in row (NULL: the key is absent); *is_null for null. */
static const char *field(const char *row, const char *key, double *v, int *is_null) {
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(row, pat);
    if (!p) return NULL;
    p += strlen(pat);
    *is_null = !strncmp(p, "null", 4);
    *v = *is_null ? 0 : strtod(p, NULL);
    return p;
}

static double num(const char *row, const char *key) {
    double v;
    int is_null;
    if (!field(row, key, &v, &is_null) || is_null) fail_msg("row has no number \"%s\": %s", key, row);
    return v;
}

/* Calls fn(row, arg) on each {...} of a json array; the number of rows. */
static int each_row(const char *out, void (*fn)(const char *row, void *arg), void *arg) {
    const char *p = out;
    assert_true(p && p[0] == '[');
    int n = 0;
    while ((p = strchr(p, '{'))) {
        const char *end = strchr(p, '}');
        assert_non_null(end);
        char row[4096];
        assert_true((size_t)(end - p) < sizeof row);
        memcpy(row, p, (size_t)(end - p + 1));
        row[end - p + 1] = 0;
        p = end + 1;
        fn(row, arg);
        n++;
    }
    return n;
}

/* One row of the --expert-cache 25%,100%,mmap run; *arg counts the rows. */
static void expert_row(const char *row, void *arg) {
    int n = (*(int *)arg)++;
    static const char *const settings[] = {"25%", "100%", "mmap"};
    static const char *const fields[] = {
        "tok_s", "tok_s_cold", "hit_rate", "gb_per_token", "io_gbps", "io_wait_share", "prediction_accuracy",
        "cold_hit_rate", "cold_gb_per_token", "cold_io_gbps", "cold_io_wait_share", "expert_bytes", "cache_bytes",
        "cache_slots", "slot_bytes", "disk_seq_gbps", "disk_rand_gbps", "disk_rand_gbps_before",
        "disk_rand_gbps_after", "io_roofline_tok_s", "io_roofline_pct", "compute_ms_per_token", "io_ms_per_token"};
    assert_true(n < 3);
    char want[64];
    snprintf(want, sizeof want, "\"expert_cache\": \"%s\"", settings[n]);
    if (!strstr(row, want)) fail_msg("row %d is not %s: %s", n, settings[n], row);
    assert_non_null(strstr(row, "\"test\": \"tg4\""));
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        double v;
        int is_null;
        if (!field(row, fields[f], &v, &is_null)) fail_msg("row %s lacks \"%s\"", settings[n], fields[f]);
    }
    assert_true(num(row, "tok_s") > 0 && num(row, "tok_s_cold") > 0);
    assert_true(num(row, "disk_seq_gbps") > 0 && num(row, "disk_rand_gbps") > 0);
    /* the tg row's own probes, right before and after its repetitions */
    assert_true(num(row, "disk_rand_gbps_before") > 0 && num(row, "disk_rand_gbps_after") > 0);
    assert_true(num(row, "expert_bytes") > 0);
    double hr;
    int hr_null;
    field(row, "hit_rate", &hr, &hr_null);
    if (n < 2) {
        /* a cache of its own: the share of the expert bytes, whole slots, at least one */
        assert_non_null(strstr(row, "\"cache_active\": true"));
        const double share = n == 0 ? 0.25 : 1.0, eb = num(row, "expert_bytes"), sb = num(row, "slot_bytes");
        const double cb = num(row, "cache_bytes");
        assert_true(cb >= sb && cb <= share * eb + 1 && cb > share * eb - sb);
        assert_false(hr_null);
        if (!(hr >= 0 && hr <= 1)) fail_msg("hit rate %g of %s outside [0, 1]", hr, settings[n]);
        const double ws = num(row, "io_wait_share");
        assert_true(ws >= 0 && ws <= 1.0001);
        assert_true(num(row, "gb_per_token") >= 0);
        double ph;
        int ph_null;
        field(row, "prediction_accuracy", &ph, &ph_null);
        assert_true(ph_null); /* prefetch off */
    } else {
        /* through the mapping: no cache, no hit rate */
        assert_non_null(strstr(row, "\"cache_active\": false"));
        assert_true(hr_null);
    }
}

static void test_bench_json(void **state) {
    (void)state;
    char cmd[2048], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd,
             "'%s' bench -m '%s' --expert-cache 25%%,100%%,mmap --expert-prefetch off -n 4 -p 0 -r 1 -o json -t 2 --probe-mb 16 "
             "--disk-probe-s 0.2 --check 3",
             g_tern, g_moe);
    const int rc = sh(cmd, &out, &err);
    if (rc != 0) fail_msg("exit %d:\n%s", rc, err ? err : "");
    /* the greedy tokens are the same with every cache setting */
    assert_non_null(strstr(err, "greedy tokens IDENTICAL at threads 2 and 3 expert settings"));
    int n = each_row(out, expert_row, &(int){0});
    const char *p;
    assert_int_equal(n, 3);
    free(out);
    free(err);

    /* prefetch and pin lists: a row per combination with a cache, one through the mapping */
    snprintf(cmd, sizeof cmd,
             "'%s' bench -m '%s' --expert-cache 50%%,mmap --expert-prefetch off,on --expert-pin off,on -n 4 -p 0 -r 1 "
             "-o json -t 1 --probe-mb 16 --disk-probe-s 0",
             g_tern, g_moe);
    assert_int_equal(sh(cmd, &out, &err), 0);
    n = 0;
    for (p = out; (p = strstr(p, "\"expert_cache\": ")); p++) n++;
    assert_int_equal(n, 5);
    assert_non_null(strstr(out, "\"prefetch\": true, \"pin\": true"));
    assert_non_null(strstr(out, "\"disk_seq_gbps\": null")); /* no probe */
    /* prediction accuracy only where prefetch is on */
    for (p = out; (p = strstr(p, "\"prefetch\": true")); p++) {
        const char *q = strstr(p, "\"prediction_accuracy\": ");
        assert_non_null(q);
        assert_true(strncmp(q + 23, "null", 4) != 0);
    }
    free(out);
    free(err);
}

/* ---- tern bench: LLC-resident rows, --busy ----------------------------------- */


/* want: 1 = every generation row LLC-resident, 0 = none. */
static void check_llc_row(const char *row, void *arg) {
    const int want = *(const int *)arg;
    if (!strstr(row, "\"test\": \"tg")) { /* a pp row: no roofline at all */
        assert_null(strstr(row, "llc_resident"));
        assert_null(strstr(row, "roofline_pct"));
        return;
    }
    assert_true(num(row, "weight_bytes_per_token") > 0);
    if (want) {
        if (!strstr(row, "\"llc_resident\": true")) fail_msg("not LLC-resident: %s", row);
        if (strstr(row, "roofline_pct")) fail_msg("an LLC-resident row with a roofline %%: %s", row);
    } else {
        if (!strstr(row, "\"llc_resident\": false")) fail_msg("LLC-resident: %s", row);
        assert_true(num(row, "roofline_pct") >= 0);
        assert_true(num(row, "roofline_pct_now") >= 0); /* --probe-mb: the paired passes ran */
    }
    assert_true(num(row, "busy") == 0);
}

static void bench_llc_json(const char *extra, double llc_mb, int want, int want_rows) {
    char cmd[2048], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "'%s' bench -m '%s' -r 1 -t 1 --probe-mb 16 -o json --llc-mb %.6f %s", g_tern, g_dense,
             llc_mb, extra);
    const int rc = sh(cmd, &out, &err);
    if (rc != 0) fail_msg("%s: exit %d:\n%s", cmd, rc, err ? err : "");
    assert_int_equal(each_row(out, check_llc_row, &want), want_rows);
    free(out);
    free(err);
}

static void test_bench_llc(void **state) {
    (void)state;
    /* a cache far larger than the tiny model: every generation row, pp/tg and -np, is LLC-resident */
    bench_llc_json("-p 4 -n 4", 1024, 1, 2);
    bench_llc_json("-np 1,2 -p 2 -n 3", 1024, 1, 2);
    /* 0: unknown, never labelled */
    bench_llc_json("-p 4 -n 4", 0, 0, 2);
    bench_llc_json("-np 1,2 -p 2 -n 3", 0, 0, 2);
    /* the rule's edge: the weight bytes per token against the size given */
    char cmd[2048], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "'%s' bench -m '%s' -p 0 -n 2 -r 1 -t 1 --probe-mb 16 -o json --llc-mb 0", g_tern,
             g_dense);
    assert_int_equal(sh(cmd, &out, &err), 0);
    const char *row = strstr(out, "{");
    assert_non_null(row);
    const double bpt = num(row, "weight_bytes_per_token");
    free(out);
    free(err);
    bench_llc_json("-p 0 -n 2", bpt * 0.9 / 1048576.0, 0, 1);
    bench_llc_json("-p 0 -n 2", bpt * 1.1 / 1048576.0, 1, 1);

    /* md: the cell says LLC-resident, no percentage in the row; the header names the size and its source */
    snprintf(cmd, sizeof cmd, "'%s' bench -m '%s' -p 0 -n 2 -r 1 -t 1 --probe-mb 16 --llc-mb 1024", g_tern, g_dense);
    assert_int_equal(sh(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "last-level cache: 1024.0 MiB (--llc-mb 1024; detected "));
    const char *tg = strstr(out, "| tg2 |");
    if (!tg) fail_msg("no tg2 row in:\n%s", out);
    const char *eol = strchr(tg, '\n');
    assert_non_null(eol);
    char line[1024];
    snprintf(line, sizeof line, "%.*s", (int)(eol - tg), tg);
    assert_non_null(strstr(line, "| LLC-resident |"));
    assert_null(strchr(line, '%'));
    free(out);
    free(err);

    /* csv: llc_resident 1 and an empty roofline_pct cell; 0 and a number with --llc-mb 0 */
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "'%s' bench -m '%s' -p 0 -n 2 -r 1 -t 1 --probe-mb 16 -o csv --llc-mb %d", g_tern,
                 g_dense, k ? 0 : 1024);
        assert_int_equal(sh(cmd, &out, &err), 0);
        char *save = NULL, *head = strtok_r(out, "\n", &save), *data = strtok_r(NULL, "\n", &save);
        assert_non_null(head);
        assert_non_null(data);
        /* the column indexes of roofline_pct and llc_resident in the header */
        int col_roof = -1, col_llc = -1, i = 0;
        for (const char *c = head; c; c = strchr(c, ','), c = c ? c + 1 : NULL, i++) {
            if (!strncmp(c, "roofline_pct,", 13)) col_roof = i;
            if (!strncmp(c, "llc_resident,", 13)) col_llc = i;
        }
        assert_true(col_roof >= 0 && col_llc >= 0);
        char cell_roof[32] = "", cell_llc[32] = "";
        i = 0;
        for (const char *c = data; c; i++) {
            const char *e = strchr(c, ',');
            const size_t len = e ? (size_t)(e - c) : strlen(c);
            if (i == col_roof) snprintf(cell_roof, sizeof cell_roof, "%.*s", (int)len, c);
            if (i == col_llc) snprintf(cell_llc, sizeof cell_llc, "%.*s", (int)len, c);
            c = e ? e + 1 : NULL;
        }
        if (k == 0) {
            assert_string_equal(cell_llc, "1");
            assert_string_equal(cell_roof, "");
        } else {
            assert_string_equal(cell_llc, "0");
            assert_true(cell_roof[0] != 0 && strtod(cell_roof, NULL) >= 0);
        }
        free(out);
        free(err);
    }

}

/* tern info --threads: the last-level cache and where it comes from, on
 * topologies hwloc makes up (HWLOC_SYNTHETIC): two packages of two L3s of
 * 16 MB with a core each, so the process's package holds two instances; and
 * one without caches, where the figure comes from sysfs (or is unknown). */
static void test_info_llc(void **state) {
    (void)state;
    char cmd[2048], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "HWLOC_SYNTHETIC='pack:2 l3:2(size=16MB) core:1 pu:1' '%s' info --threads --json",
             g_tern);
    assert_int_equal(sh(cmd, &out, &err), 0);
    if (num(out, "llc_bytes") != 2 * 16e6) fail_msg("two L3s of 16 MB: %s", out);
    assert_non_null(strstr(out, "\"llc_source\": \"hwloc: L3 unified, 2 instances over the allowed CPUs\""));
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "HWLOC_SYNTHETIC='pack:1 core:2 pu:1' '%s' info --threads --json", g_tern);
    assert_int_equal(sh(cmd, &out, &err), 0);
    const double llc = num(out, "llc_bytes");
    if (strstr(out, "\"llc_source\": \"sysfs: L")) assert_true(llc > 0);
    else if (strstr(out, "\"llc_source\": \"unknown: ")) assert_true(llc == 0);
    else fail_msg("no cache in hwloc's view, and neither sysfs nor unknown: %s", out);
    free(out);
    free(err);
    /* the text form names it too */
    snprintf(cmd, sizeof cmd, "HWLOC_SYNTHETIC='pack:1 l3:1(size=64MB) core:2 pu:1' '%s' info --threads", g_tern);
    assert_int_equal(sh(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "last-level cache: 61.0 MiB (hwloc: L3 unified, 1 instance over the allowed CPUs)"));
    free(out);
    free(err);
}

/* tern info --threads names the AMX state: with no amx_tile in
 * /proc/cpuinfo, the CPU has none; with it, a "no: " with another reason
 * (the OS refused, or no AMX GEMM in this build) or "yes". */
static void test_info_amx(void **state) {
    (void)state;
    char cmd[2048], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "'%s' info --threads", g_tern);
    assert_int_equal(sh(cmd, &out, &err), 0);
    const char *a = strstr(out, "\nAMX: ");
    if (!a) fail_msg("no AMX line: %s", out);
    size_t n = 0;
    char *cpuinfo = tu_read_file("/proc/cpuinfo", &n);
    if (cpuinfo) {
        const bool has = strstr(cpuinfo, " amx_tile") != NULL;
        static const char none[] = "\nAMX: no: this CPU has no AMX tiles", yes[] = "\nAMX: yes",
                          other[] = "\nAMX: no: the";
        if (!has && strncmp(a, none, sizeof none - 1)) fail_msg("no amx_tile, but: %s", a + 1);
        if (has && strncmp(a, yes, sizeof yes - 1) && strncmp(a, other, sizeof other - 1))
            fail_msg("amx_tile, but: %s", a + 1);
        free(cpuinfo);
    }
    free(out);
    free(err);
}

static void busy_row(const char *row, void *arg) {
    if (num(row, "busy") != *(const int *)arg) fail_msg("row without \"busy\": %d: %s", *(const int *)arg, row);
}

static void test_bench_busy(void **state) {
    (void)state;
    char cmd[2048], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "'%s' bench -m '%s' -p 4 -n 4 -r 1 -t 1 --probe-mb 16 --busy 1", g_tern, g_dense);
    int rc = sh(cmd, &out, &err);
    if (rc != 0) fail_msg("exit %d:\n%s", rc, err ? err : "");
    const char *line = strstr(out, "busy: 1 spinning thread in another process (pid ");
    if (!line) fail_msg("no busy line in:\n%s", out);
    long pid = 0;
    assert_int_equal(sscanf(line, "busy: 1 spinning thread in another process (pid %ld)", &pid), 1);
    assert_true(pid > 1 && pid != (long)getpid());
    /* tern has exited: its spinning child was killed and reaped with it */
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) {
        char stat_path[80];
        snprintf(stat_path, sizeof stat_path, "/proc/%ld/stat", pid);
        char *ps = tu_read_file(stat_path, NULL);
        fail_msg("the busy process %ld outlived tern bench: %s", pid, ps ? ps : "(no /proc entry)");
    }
    assert_non_null(strstr(err, "tern bench: busy: 1 spinning thread in another process (pid "));
    free(out);
    free(err);
    /* json rows carry it; -np rows too */
    int want = 2;
    snprintf(cmd, sizeof cmd, "'%s' bench -m '%s' -p 0 -n 2 -r 1 -t 1 --probe-mb 16 --busy 2 -o json", g_tern, g_dense);
    assert_int_equal(sh(cmd, &out, &err), 0);
    assert_int_equal(each_row(out, busy_row, &want), 1);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "'%s' bench -m '%s' -np 1,2 -p 2 -n 2 -r 1 -t 1 --probe-mb 16 --busy 2 -o json", g_tern,
             g_dense);
    assert_int_equal(sh(cmd, &out, &err), 0);
    assert_int_equal(each_row(out, busy_row, &want), 2);
    free(out);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_run_cache_line),
        cmocka_unit_test(test_run_spec),
        cmocka_unit_test(test_bench_json),
        cmocka_unit_test(test_bench_llc),
        cmocka_unit_test(test_info_llc),
        cmocka_unit_test(test_info_amx),
        cmocka_unit_test(test_bench_busy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
