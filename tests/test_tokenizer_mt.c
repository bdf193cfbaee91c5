/*
 * test_tokenizer_mt.c - one tokenizer shared by several threads: tokenizer.h
 * promises that encode and decode may run concurrently on it. Each thread
 * encodes and decodes its own texts and must get exactly the ids a single
 * thread gets. Runs under ThreadSanitizer in `make test`.
 */
// ctest-label: concurrent
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "format/gguf.h"
#include "text/tokenizer.h"

#define N_THREADS 4

typedef struct {
    const tokenizer_t *t;
    const char *text;
    size_t len;
    const int32_t *want;
    size_t n_want;
    int rounds;
    int bad;
} job_t;

static void *worker(void *arg) {
    job_t *j = arg;
    for (int r = 0; r < j->rounds; r++) {
        int32_t *ids;
        size_t n;
        tern_error_t err;
        if (tok_encode(j->t, j->text, j->len, false, false, &ids, &n, &err)) {
            j->bad++;
            continue;
        }
        if (n != j->n_want || memcmp(ids, j->want, n * sizeof *ids)) j->bad++;
        char *dec;
        size_t dl;
        if (tok_decode(j->t, ids, n, false, &dec, &dl, &err) || dl != j->len || memcmp(dec, j->text, dl)) j->bad++;
        if (dec) free(dec);
        free(ids);
    }
    return NULL;
}

static void run_vocab(const char *rel) {
    const char *path = tu_shared(rel);
    if (!path) {
        tu_shared_missing(rel, "part");
        return;
    }
    tern_error_t err;
    tokenizer_t *t = tu_tokenizer_load(path);
    static const char *texts[N_THREADS] = {
        "Hello world, this is thread one. 12345 numbers and CAPS.",
        "Zweiter Faden: \xc3\xa4\xc3\xb6\xc3\xbc \xc3\x9f und \xe2\x82\xac 3,50",
        "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\xa6\x99 emoji   spaces\n\ttabs",
        "def f(x):\n    return x ** 2  # code\n",
    };
    job_t jobs[N_THREADS];
    pthread_t th[N_THREADS];
    int32_t *want[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        size_t n;
        assert_int_equal(tok_encode(t, texts[i], strlen(texts[i]), false, false, &want[i], &n, &err), 0);
        jobs[i] = (job_t){t, texts[i], strlen(texts[i]), want[i], n, tu_quick() ? 20 : 200, 0};
    }
    for (int i = 0; i < N_THREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, worker, &jobs[i]), 0);
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].bad, 0);
        free(want[i]);
    }
    tok_free(t);
}

static void test_concurrent_encode(void **state) {
    (void)state;
    TU_REQUIRE_SHARED(dir, "reference/vocab");
    (void)dir;
    run_vocab("reference/vocab/ggml-vocab-llama-spm.gguf"); /* SPM */
    run_vocab("reference/vocab/ggml-vocab-qwen2.gguf");     /* BPE + PCRE2 pre-tokenizer */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_encode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
