/* cmd_perplexity.c - `tern perplexity`: perplexity of a text, computed the
 * way llama-perplexity computes it so the numbers compare one to one:
 *   - the whole text is tokenized once (BOS prepended when the model adds one);
 *   - it is cut into non-overlapping chunks of CTX tokens (a remainder shorter
 *     than CTX is dropped; at least 2 * CTX tokens are required);
 *   - each chunk starts a fresh context, its first token replaced by BOS
 *     (when the model adds one), evaluated in blocks of BATCH;
 *   - only the second half is scored: positions j = CTX/2 .. CTX-2 predict
 *     token j+1, nll = -log softmax(logits_j)[token_{j+1}] (log-sum-exp in
 *     double after subtracting the max);
 *   - after each chunk "[i]PPL," with the running exp(mean nll); at the end
 *     "Final estimate: PPL = P +/- E" with E = P * sqrt(var(nll) / (N - 1)).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmds.h"
#include "run_args.h"
#include "tern.h"

/* -log p(tok) from a row of logits. */
static double nll_of(const float *logits, int32_t n_vocab, int32_t tok) {
    float mx = logits[0];
    for (int32_t i = 1; i < n_vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int32_t i = 0; i < n_vocab; i++) sum += expf(logits[i] - mx);
    return -((double)(logits[tok] - mx) - log(sum));
}

int cmd_perplexity(int argc, char **argv) {
    run_opts_t o;
    int prc = run_opts_parse(&o, argc, argv, "perplexity");
    if (prc) return prc == 1 ? 0 : 2;
    if (!o.prompt_file && !o.prompt) {
        fprintf(stderr, "tern perplexity: -f TEXT_FILE is required\n");
        return 2;
    }
    struct timespec ts_start;
    clock_gettime(CLOCK_MONOTONIC, &ts_start);
    tern_error_t err = {0};
    tern_model_t *m = run_load_model(&o, "perplexity");
    if (!m) return 1;
    int rc = 1;
    char *text = NULL;
    int32_t *toks = NULL;
    float *logits = NULL;
    tern_context_t *c = NULL;
    size_t len = 0, n_tok = 0;
    if (o.prompt_file) {
        if (!(text = run_read_file(o.prompt_file, &len))) goto out;
    } else {
        len = strlen(o.prompt);
    }
    const int add_bos = !o.no_bos && tern_model_add_bos(m) && tern_token_bos(m) >= 0;
    struct timespec ts0, ts1;
    clock_gettime(CLOCK_MONOTONIC, &ts0);
    if (tern_tokenize(m, text ? text : o.prompt, len, add_bos, 0, &toks, &n_tok, &err)) {
        fprintf(stderr, "tern: %s\n", err.msg);
        goto out;
    }
    clock_gettime(CLOCK_MONOTONIC, &ts1);
    const int32_t n_ctx = o.n_ctx > 0 ? o.n_ctx : 512;
    if (n_ctx < 4) {
        fprintf(stderr, "tern perplexity: -c must be at least 4\n");
        goto out;
    }
    fprintf(stderr, "tern perplexity: tokenized %zu bytes into %zu tokens in %.1f ms\n", len, n_tok,
            (double)(ts1.tv_sec - ts0.tv_sec) * 1e3 + (double)(ts1.tv_nsec - ts0.tv_nsec) / 1e6);
    if (n_tok < 2 * (size_t)n_ctx) {
        fprintf(stderr, "tern perplexity: need at least 2 * %d = %d tokens, the text has %zu (use a smaller -c)\n", n_ctx,
                2 * n_ctx, n_tok);
        goto out;
    }
    const size_t n_chunk = n_tok / (size_t)n_ctx;
    const int32_t V = tern_model_n_vocab(m);
    logits = malloc((size_t)n_ctx * (size_t)V * sizeof(float));
    if (!logits) {
        fprintf(stderr, "tern perplexity: out of memory for %d x %d logits\n", n_ctx, V);
        goto out;
    }
    o.n_ctx = n_ctx;
    tern_context_params_t cp = tern_context_default_params();
    cp.n_threads = o.n_threads;
    cp.n_ctx = n_ctx;
    cp.n_batch = o.n_batch;
    cp.kv_f32 = o.kv_f32;
    cp.profile = o.profile;
    if (!(c = tern_context_create(m, &cp, &err))) {
        fprintf(stderr, "tern: %s\n", err.msg);
        goto out;
    }
    if (tern_context_note(c)[0]) fprintf(stderr, "tern: %s\n", tern_context_note(c));
    fprintf(stderr, "tern perplexity: %zu chunks of %d tokens, batch %d, %d threads, ISA %s\n", n_chunk, n_ctx,
            o.n_batch, tern_context_threads(c), tern_isa_name());
    const int32_t first = n_ctx / 2;
    double nll = 0, nll2 = 0;
    int64_t count = 0;
    for (size_t i = 0; i < n_chunk; i++) {
        int32_t *chunk = toks + i * (size_t)n_ctx;
        int32_t saved = chunk[0];
        if (add_bos) chunk[0] = tern_token_bos(m);
        tern_context_truncate(c, 0, NULL);
        int erc = tern_eval(c, chunk, n_ctx, logits, &err);
        chunk[0] = saved;
        if (erc) {
            fprintf(stderr, "\ntern: %s\n", err.msg);
            goto out;
        }
        for (int32_t j = first; j < n_ctx - 1; j++) {
            double v = nll_of(logits + (size_t)j * (size_t)V, V, chunk[j + 1]);
            nll += v;
            nll2 += v * v;
        }
        count += n_ctx - 1 - first;
        printf("[%zu]%.4f,", i + 1, exp(nll / (double)count));
        fflush(stdout);
    }
    printf("\n");
    double mean = nll / (double)count, ppl = exp(mean);
    double var = nll2 / (double)count - mean * mean;
    if (var > 0 && count > 1)
        printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, sqrt(var / (double)(count - 1)) * ppl);
    else
        printf("Final estimate: PPL = %.4f (no error estimate: zero variance)\n", ppl);
    clock_gettime(CLOCK_MONOTONIC, &ts1);
    run_print_timings(m, c, &o,
                      (double)(ts1.tv_sec - ts_start.tv_sec) * 1e3 + (double)(ts1.tv_nsec - ts_start.tv_nsec) / 1e6, NULL);
    rc = 0;
out:
    free(text);
    free(toks);
    free(logits);
    tern_context_free(c);
    tern_model_free(m);
    return rc;
}
