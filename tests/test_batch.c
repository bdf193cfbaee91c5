/* test_batch.c - many sequences in one forward pass (tern_decode), through
 * the public API:
 *  - batch invariance: random batches of 1-16 sequences mixing prompt
 *    chunks and single tokens, entries interleaved in random order, with
 *    TERN_POS_APPEND and explicit positions, give for every logit vector
 *    asked for the bytes of the same sequence evaluated alone (tern_eval in
 *    a fresh context, as one prompt and token by token), at 1, 2, 3 and 4
 *    threads (pool gate 0, so the threads really share the work), with the
 *    batch split over forward blocks (small n_batch) and a KV block size
 *    other than the reference's; on every architecture (llama, qwen2,
 *    qwen3, llama3 RoPE) in several formats and on the trained stories260K;
 *  - fork: shares blocks (tern_kv_stats), copy on write keeps the source's
 *    and the fork's continuations equal to fresh evaluations, at a partial
 *    block, a block boundary, a prefix, into a sequence that held positions,
 *    and after truncating inside a shared block; truncate then re-evaluate;
 *    remove gives blocks back;
 *  - KV memory full: TERN_EKVFULL (and TERN_ECTXFULL) change nothing (every
 *    sequence's position and blocks, the stats), also when an earlier
 *    sequence of the batch needed a copy-on-write block; after removing
 *    another sequence the same batch succeeds with the reference logits;
 *    one budget for all sequences (one takes the whole memory);
 *  - bad entries (sequence, token, position gap, repeat, already
 *    evaluated, negative position) and bad sequence operations: TERN_EINVAL
 *    with nothing changed;
 *  - tern_batch_logits: NULL for entries that did not ask and out of range;
 *  - tern_eval (sequence 0) and tern_decode on the same memory.
 * TERN_TEST_QUICK (sanitizer builds): fewer models, rounds and threads.
 */
// ctest-label: concurrent
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tern.h"

#define MAX_SEQ 16
#define HIST_MAX 160

/* ---- helpers -------------------------------------------------------------- */

static tern_model_t *load(const char *path) {
    tern_error_t err = {0};
    tern_model_t *m = tern_model_load(path, &err);
    if (!m) print_message("tern_model_load %s: %s\n", path, err.msg);
    assert_non_null(m);
    return m;
}

static tern_context_t *mkctx(const tern_model_t *m, int threads, int n_ctx, int n_batch, int n_seq, int kv_block,
                             int kv_f32) {
    tern_error_t err = {0};
    tern_context_params_t p = tern_context_default_params();
    p.n_threads = threads;
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    p.n_seq_max = n_seq;
    p.kv_block = kv_block;
    p.kv_f32 = kv_f32;
    tern_context_t *c = tern_context_create(m, &p, &err);
    if (!c) print_message("tern_context_create: %s\n", err.msg);
    assert_non_null(c);
    assert_int_equal(tern_context_threads(c), threads);
    assert_int_equal(tern_context_n_seq(c), n_seq);
    return c;
}

static uint32_t rnd(uint64_t *s, uint32_t n) { return (uint32_t)(tu_rand(s) % n); }

static void random_tokens(uint64_t *s, int32_t V, int32_t *out, int n) {
    for (int i = 0; i < n; i++) out[i] = (int32_t)rnd(s, (uint32_t)V);
}

/* The logits of every position of ids[0..n) evaluated alone: tern_eval of
 * the whole in a fresh 1-thread context (default KV block size). With
 * both: also token by token in another fresh context, which must give the
 * same bytes. n x V floats, malloc'd. */
static float *ref_logits(const tern_model_t *m, const int32_t *ids, int n, int kv_f32, int both) {
    const int32_t V = tern_model_n_vocab(m);
    tern_error_t err = {0};
    float *all = malloc((size_t)n * (size_t)V * sizeof(float));
    assert_non_null(all);
    tern_context_t *c = mkctx(m, 1, n, 512, 1, 0, kv_f32);
    int rc = tern_eval(c, ids, n, all, &err);
    if (rc) print_message("tern_eval: %s\n", err.msg);
    assert_int_equal(rc, 0);
    tern_context_free(c);
    if (both) {
        c = mkctx(m, 1, n, 512, 1, 0, kv_f32);
        for (int i = 0; i < n; i++) {
            assert_int_equal(tern_eval(c, ids + i, 1, NULL, &err), 0);
            if (memcmp(tern_get_logits(c), all + (size_t)i * (size_t)V, (size_t)V * sizeof(float)))
                fail_msg("reference: position %d token by token differs from the prompt's", i);
        }
        tern_context_free(c);
    }
    /* Not degenerate: consecutive positions' logits differ. */
    for (int i = 1; i < n; i++)
        assert_true(memcmp(all + (size_t)(i - 1) * (size_t)V, all + (size_t)i * (size_t)V, (size_t)V * sizeof(float)));
    return all;
}

/* Everything a failed call must leave as it was. */
typedef struct {
    tern_kv_stats_t st;
    int32_t pos[MAX_SEQ], blocks[MAX_SEQ];
} snap_t;

static void snap(const tern_context_t *c, snap_t *s) {
    memset(s, 0, sizeof *s);
    tern_kv_stats(c, &s->st);
    assert_int_equal(s->st.n_used + s->st.n_free, s->st.n_blocks);
    const int n = tern_context_n_seq(c);
    assert_true(n <= MAX_SEQ);
    for (int i = 0; i < n; i++) {
        s->pos[i] = tern_seq_pos(c, i);
        s->blocks[i] = tern_seq_blocks(c, i);
    }
}

static void check_unchanged(const tern_context_t *c, const snap_t *before, const char *what) {
    snap_t now;
    snap(c, &now);
    if (memcmp(&now, before, sizeof now)) {
        print_message("%s changed the state: used %d -> %d, free %d -> %d, shared %d -> %d\n", what,
                      before->st.n_used, now.st.n_used, before->st.n_free, now.st.n_free, before->st.n_shared,
                      now.st.n_shared);
        for (int i = 0; i < tern_context_n_seq(c); i++)
            if (now.pos[i] != before->pos[i] || now.blocks[i] != before->blocks[i])
                print_message("  sequence %d: pos %d -> %d, blocks %d -> %d\n", i, before->pos[i], now.pos[i],
                              before->blocks[i], now.blocks[i]);
        fail();
    }
}

/* ---- a context and what each of its sequences holds -------------------------
 * sim_decode appends tokens to several sequences in one tern_decode (the
 * entries interleaved at random, every logit asked for) and compares each
 * logit vector with a fresh evaluation of the sequence's tokens. */

typedef struct {
    const tern_model_t *m;
    tern_context_t *c;
    int32_t V;
    int kv_f32;
    int32_t hist[MAX_SEQ][HIST_MAX];
    int n[MAX_SEQ];
    uint64_t rng;
} sim_t;

static void sim_init(sim_t *s, const tern_model_t *m, tern_context_t *c, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->m = m;
    s->c = c;
    s->V = tern_model_n_vocab(m);
    s->rng = seed;
}

/* Build the entries of k sequences' new tokens, each sequence's entries in
 * order, the sequences interleaved at random; positions APPEND or explicit
 * at random. */
static int build_entries(sim_t *s, int k, const int *seqs, const int *cnt, const int32_t *const *toks,
                         tern_batch_entry_t *e, int cap) {
    int next[MAX_SEQ] = {0}, total = 0;
    for (int j = 0; j < k; j++) total += cnt[j];
    assert_true(total <= cap);
    for (int i = 0; i < total; i++) {
        int j;
        do j = (int)rnd(&s->rng, (uint32_t)k);
        while (next[j] == cnt[j]);
        const int q = seqs[j], p = s->n[q] + next[j];
        e[i] = (tern_batch_entry_t){q, toks[j][next[j]], rnd(&s->rng, 2) ? TERN_POS_APPEND : p, 1};
        next[j]++;
    }
    return total;
}

/* Compare entry logits with the references of the sequences as they will
 * be (history + new tokens). */
static void check_entries(sim_t *s, const tern_batch_entry_t *e, int n, int k, const int *seqs, const int *cnt,
                          const int32_t *const *toks) {
    float *ref[MAX_SEQ];
    for (int j = 0; j < k; j++) {
        const int q = seqs[j];
        assert_true(s->n[q] + cnt[j] <= HIST_MAX);
        int32_t all[HIST_MAX];
        memcpy(all, s->hist[q], (size_t)s->n[q] * sizeof *all);
        memcpy(all + s->n[q], toks[j], (size_t)cnt[j] * sizeof *all);
        ref[j] = ref_logits(s->m, all, s->n[q] + cnt[j], s->kv_f32, 0);
    }
    int seen[MAX_SEQ] = {0};
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (seqs[j] != e[i].seq) j++;
        const int p = s->n[e[i].seq] + seen[j]++;
        const float *lg = tern_batch_logits(s->c, i);
        assert_non_null(lg);
        if (memcmp(lg, ref[j] + (size_t)p * (size_t)s->V, (size_t)s->V * sizeof(float)))
            fail_msg("entry %d (sequence %d position %d): logits differ from a fresh evaluation", i, e[i].seq, p);
    }
    assert_null(tern_batch_logits(s->c, n));
    for (int j = 0; j < k; j++) {
        const int q = seqs[j];
        memcpy(s->hist[q] + s->n[q], toks[j], (size_t)cnt[j] * sizeof(int32_t));
        s->n[q] += cnt[j];
        assert_int_equal(tern_seq_pos(s->c, q), s->n[q]);
        free(ref[j]);
    }
}

static void sim_decode(sim_t *s, int k, const int *seqs, const int *cnt, const int32_t *const *toks) {
    tern_batch_entry_t e[4 * HIST_MAX];
    const int n = build_entries(s, k, seqs, cnt, toks, e, 4 * HIST_MAX);
    tern_error_t err = {0};
    const int rc = tern_decode(s->c, e, n, &err);
    if (rc) print_message("tern_decode: %s\n", err.msg);
    assert_int_equal(rc, 0);
    check_entries(s, e, n, k, seqs, cnt, toks);
}

/* One sequence, n new tokens. */
static void sim_decode1(sim_t *s, int seq, int n, const int32_t *toks) {
    const int32_t *t[1] = {toks};
    sim_decode(s, 1, &seq, &n, t);
}

/* Two sequences in one batch. */
static void sim_decode2(sim_t *s, int sa, int na, const int32_t *ta, int sb, int nb, const int32_t *tb) {
    const int seqs[2] = {sa, sb}, cnt[2] = {na, nb};
    const int32_t *t[2] = {ta, tb};
    sim_decode(s, 2, seqs, cnt, t);
}

static void sim_fork(sim_t *s, int dst, int src, int n) {
    tern_error_t err = {0};
    const int rc = tern_seq_fork(s->c, dst, src, n, &err);
    if (rc) print_message("tern_seq_fork: %s\n", err.msg);
    assert_int_equal(rc, 0);
    memcpy(s->hist[dst], s->hist[src], (size_t)n * sizeof(int32_t));
    s->n[dst] = n;
    assert_int_equal(tern_seq_pos(s->c, dst), n);
    assert_int_equal(tern_seq_pos(s->c, src), s->n[src]);
}

static void sim_truncate(sim_t *s, int seq, int n) {
    assert_int_equal(tern_seq_truncate(s->c, seq, n, NULL), 0);
    s->n[seq] = n;
    assert_int_equal(tern_seq_pos(s->c, seq), n);
}

static void sim_remove(sim_t *s, int seq) {
    assert_int_equal(tern_seq_remove(s->c, seq, NULL), 0);
    s->n[seq] = 0;
    assert_int_equal(tern_seq_pos(s->c, seq), 0);
    assert_int_equal(tern_seq_blocks(s->c, seq), 0);
}

static int blocks_for(int n_pos, int block_pos) { return (n_pos + block_pos - 1) / block_pos; }

/* ---- 1. batch invariance ------------------------------------------------------ */

/* Each of MAX_SEQ sequences evaluates its own stream of len tokens over the
 * rounds (restarted, or truncated and re-evaluated, when it reaches the end),
 * a random subset of them per round. */
static void invariance(const char *what, const tern_model_t *m, int kv_f32, uint64_t seed) {
    const int quick = tu_quick();
    const int len = quick ? 24 : 40, rounds = quick ? 5 : 16;
    const int32_t V = tern_model_n_vocab(m);
    uint64_t rng = seed;
    static int32_t stream[MAX_SEQ][64];
    float *ref[MAX_SEQ];
    for (int q = 0; q < MAX_SEQ; q++) {
        random_tokens(&rng, V, stream[q], len);
        /* The references: alone, as one prompt and token by token. */
        ref[q] = ref_logits(m, stream[q], len, kv_f32, 1);
    }
    /* The sequences differ: a mix-up of sequences would show. */
    assert_true(memcmp(ref[0] + (size_t)(len - 1) * (size_t)V, ref[1] + (size_t)(len - 1) * (size_t)V,
                       (size_t)V * sizeof(float)));

    static const int threads_full[] = {1, 2, 3, 4}, threads_quick[] = {1, 3};
    const int *threads = quick ? threads_quick : threads_full;
    const int n_threads = quick ? 2 : 4;
    int64_t compared = 0, entries = 0, nulls = 0, appends = 0, explicit_pos = 0, singles = 0, chunks = 0;
    int max_seqs = 0;
    for (int ti = 0; ti < n_threads; ti++) {
        const int t = threads[ti];
        /* n_batch 5 and 16 split a batch over several forward blocks; KV
         * blocks of 8 positions (the references use 32). */
        const int n_batch = t == 2 ? 16 : t == 3 ? 5 : 512;
        tern_context_t *c = mkctx(m, t, MAX_SEQ * len, n_batch, MAX_SEQ, 8, kv_f32);
        int held[MAX_SEQ] = {0};
        for (int r = 0; r < rounds; r++) {
            /* The thread count changes with the KV memory kept. */
            if (t == 1 && r == rounds / 2) {
                assert_int_equal(tern_context_set_threads(c, 4, NULL), 0);
                assert_int_equal(tern_context_threads(c), 4);
            }
            int order[MAX_SEQ];
            for (int q = 0; q < MAX_SEQ; q++) order[q] = q;
            for (int q = MAX_SEQ - 1; q > 0; q--) {
                const int j = (int)rnd(&rng, (uint32_t)q + 1), x = order[q];
                order[q] = order[j];
                order[j] = x;
            }
            /* The first round takes all 16 sequences. */
            const int k = r == 0 ? MAX_SEQ : 1 + (int)rnd(&rng, MAX_SEQ);
            if (k > max_seqs) max_seqs = k;
            tern_batch_entry_t e[MAX_SEQ * 16];
            int lists[MAX_SEQ][16], cnt[MAX_SEQ], next[MAX_SEQ] = {0}, total = 0;
            for (int j = 0; j < k; j++) {
                const int q = order[j];
                /* At the end of its stream: start over, or truncate and
                 * evaluate the rest again; sometimes truncate earlier. */
                if (held[q] == len || (held[q] > 0 && rnd(&rng, 8) == 0)) {
                    if (rnd(&rng, 2)) {
                        assert_int_equal(tern_seq_remove(c, q, NULL), 0);
                        held[q] = 0;
                    } else {
                        held[q] = (int)rnd(&rng, (uint32_t)held[q]);
                        assert_int_equal(tern_seq_truncate(c, q, held[q], NULL), 0);
                    }
                    assert_int_equal(tern_seq_pos(c, q), held[q]);
                    assert_int_equal(tern_seq_blocks(c, q), blocks_for(held[q], 8));
                }
                int n = rnd(&rng, 2) ? 1 : 2 + (int)rnd(&rng, 11);
                if (n > len - held[q]) n = len - held[q];
                cnt[j] = n;
                if (n > 1)
                    chunks++;
                else
                    singles++;
                /* mode 0: in order, APPEND; 1: in order, APPEND or explicit;
                 * 2: explicit positions, shuffled. */
                const int mode = (int)rnd(&rng, 3);
                for (int i = 0; i < n; i++) lists[j][i] = i;
                if (mode == 2)
                    for (int i = n - 1; i > 0; i--) {
                        const int x = (int)rnd(&rng, (uint32_t)i + 1), y = lists[j][i];
                        lists[j][i] = lists[j][x];
                        lists[j][x] = y;
                    }
                for (int i = 0; i < n; i++) {
                    const int p = held[q] + lists[j][i];
                    const int app = mode == 0 || (mode == 1 && rnd(&rng, 2));
                    lists[j][i] = p | (app << 16); /* position, APPEND flag */
                }
                total += n;
            }
            /* Interleave the sequences' lists at random. */
            for (int i = 0; i < total; i++) {
                int j;
                do j = (int)rnd(&rng, (uint32_t)k);
                while (next[j] == cnt[j]);
                const int q = order[j], v = lists[j][next[j]++], p = v & 0xffff, app = v >> 16;
                e[i] = (tern_batch_entry_t){q, stream[q][p], app ? TERN_POS_APPEND : p, (int32_t)rnd(&rng, 3) != 0};
                if (app)
                    appends++;
                else
                    explicit_pos++;
            }
            tern_error_t err = {0};
            const int rc = tern_decode(c, e, total, &err);
            if (rc) print_message("%s -t %d round %d: tern_decode: %s\n", what, t, r, err.msg);
            assert_int_equal(rc, 0);
            /* Every entry's logits: the reference's bytes, or NULL. The
             * position of an APPEND entry: its sequence's next one in entry
             * order. */
            int seen[MAX_SEQ] = {0};
            for (int i = 0; i < total; i++) {
                const int q = e[i].seq;
                const int p = e[i].pos == TERN_POS_APPEND ? held[q] + seen[q] : e[i].pos;
                seen[q]++;
                const float *lg = tern_batch_logits(c, i);
                entries++;
                if (!e[i].logits) {
                    assert_null(lg);
                    nulls++;
                    continue;
                }
                assert_non_null(lg);
                if (memcmp(lg, ref[q] + (size_t)p * (size_t)V, (size_t)V * sizeof(float)))
                    fail_msg("%s -t %d round %d entry %d of %d (sequence %d position %d): logits differ from the "
                             "sequence alone",
                             what, t, r, i, total, q, p);
                compared++;
            }
            assert_null(tern_batch_logits(c, total));
            assert_null(tern_batch_logits(c, -1));
            for (int j = 0; j < k; j++) {
                const int q = order[j];
                held[q] += cnt[j];
            }
            for (int q = 0; q < MAX_SEQ; q++) assert_int_equal(tern_seq_pos(c, q), held[q]);
        }
        tern_context_free(c);
    }
    /* The run exercised what it claims. */
    assert_true(compared > 0 && nulls > 0 && appends > 0 && explicit_pos > 0 && singles > 0 && chunks > 0);
    assert_int_equal(max_seqs, MAX_SEQ);
    print_message("%s: %lld logit vectors identical to the sequences alone (%lld entries, %d thread counts)\n", what,
                  (long long)compared, (long long)entries, n_threads);
    for (int q = 0; q < MAX_SEQ; q++) free(ref[q]);
}

static void invariance_tiny(const char *shape, const char *type, int kv_f32) {
    tern_model_t *m = load(tu_tiny_model("batch", shape, type, 7));
    char what[96];
    snprintf(what, sizeof what, "%s %s%s (%s)", shape, type, kv_f32 ? " kv f32" : "", tern_model_arch(m));
    invariance(what, m, kv_f32, 0x5eed0000u + (uint64_t)strlen(shape) * 31u + (uint64_t)strlen(type));
    tern_model_free(m);
}

static void test_invariance_tiny(void **state) {
    (void)state;
    invariance_tiny("tiny", "q8_0", 0);
    invariance_tiny("tiny-qwen2", "q8_0", 0);
    invariance_tiny("tiny-qwen3", "q4_k", 0);
    if (tu_quick()) return;
    invariance_tiny("tiny", "f32", 1);
    invariance_tiny("tiny", "q4_k", 0);
    invariance_tiny("tiny-qwen2", "q4_0", 0);
    invariance_tiny("tiny-qwen3", "f16", 0);
    invariance_tiny("tiny-llama3", "q5_k_m", 0);
    invariance_tiny("tiny-qwen3moe", "q8_0", 0); /* Mixture of Experts: experts grouped by token */
    invariance_tiny("tiny-qwen2moe", "q4_k_m", 0);
    invariance_tiny("tiny-olmoe", "f16", 0);
    invariance_tiny("tiny-mixtral", "q4_0", 0);
}

static void test_invariance_stories(void **state) {
    (void)state;
    static const char *const files[] = {"models/stories260K.gguf", "models/stories260K-Q4_K_M.gguf"};
    for (int i = 0; i < 2; i++) {
        if (tu_quick() && i) break;
        const char *path = tu_shared(files[i]);
        if (!path) {
            tu_shared_missing(files[i], "part");
            continue;
        }
        tern_model_t *m = load(path);
        invariance(files[i], m, 0, 0xb47c4 + (uint64_t)i);
        tern_model_free(m);
    }
}

/* ---- 2. fork, copy on write, truncate, remove ------------------------------------ */

static void test_fork(void **state) {
    (void)state;
    tern_model_t *m = load(tu_tiny_model("batch", "tiny", "q8_0", 7));
    const int BP = 16;
    tern_context_t *c = mkctx(m, 2, 256, 512, 4, BP, 0);
    sim_t s;
    sim_init(&s, m, c, 0xf02c);
    int32_t P[20], A[16], B[12], C[8], D[6], E[5], F[6], G[3], H[7], K[10];
    random_tokens(&s.rng, s.V, P, 20);
    random_tokens(&s.rng, s.V, A, 16);
    random_tokens(&s.rng, s.V, B, 12);
    random_tokens(&s.rng, s.V, C, 8);
    random_tokens(&s.rng, s.V, D, 6);
    random_tokens(&s.rng, s.V, E, 5);
    random_tokens(&s.rng, s.V, F, 6);
    random_tokens(&s.rng, s.V, G, 3);
    random_tokens(&s.rng, s.V, H, 7);
    random_tokens(&s.rng, s.V, K, 10);
    tern_kv_stats_t st;

    sim_decode1(&s, 0, 20, P);
    tern_kv_stats(c, &st);
    assert_int_equal(st.block_pos, BP);
    assert_int_equal(st.n_used, 2);
    assert_int_equal(st.n_shared, 0);

    /* Fork inside a block: both blocks shared, none copied. */
    sim_fork(&s, 1, 0, 20);
    tern_kv_stats(c, &st);
    assert_int_equal(tern_seq_blocks(c, 1), 2);
    assert_int_equal(st.n_shared, 2);
    assert_true(st.n_shared > 0);
    assert_true(st.n_used < tern_seq_blocks(c, 0) + tern_seq_blocks(c, 1));
    assert_int_equal(st.n_used, 2);
    assert_int_equal(st.n_used + st.n_free, st.n_blocks);

    /* The fork writes first into the shared block: it gets a copy, the
     * source keeps its rows. */
    sim_decode1(&s, 1, 6, B);
    tern_kv_stats(c, &st);
    assert_int_equal(st.n_used, 3);
    assert_int_equal(st.n_shared, 1);
    /* Both continue differently in one batch (the source's block 1 is its
     * own now), crossing into the next block: each matches its fresh
     * evaluation. */
    sim_decode2(&s, 0, 13, A, 1, 6, B + 6);
    tern_kv_stats(c, &st);
    assert_int_equal(st.n_used, 4); /* block 0 shared, block 1 each, block 2 of the source */
    assert_int_equal(st.n_shared, 1);
    sim_decode1(&s, 0, 3, A + 13);

    /* A fork of a prefix (10 of the source's 36): block 0 now held by three
     * sequences; the new one copies it before writing (and takes a fresh
     * block past it), and the others still match afterwards. */
    sim_fork(&s, 2, 0, 10);
    assert_int_equal(tern_seq_blocks(c, 2), 1);
    tern_kv_stats(c, &st);
    assert_int_equal(st.n_shared, 1);
    const int32_t used_before = st.n_used;
    sim_decode1(&s, 2, 8, C);
    tern_kv_stats(c, &st);
    assert_int_equal(st.n_used, used_before + 2);
    sim_decode2(&s, 0, 1, G, 1, 1, G + 1);

    /* A fork at a block boundary: block 0 shared, the fork's first write
     * takes a fresh block without copying. */
    sim_fork(&s, 3, 1, 16);
    tern_kv_stats(c, &st);
    const int32_t used3 = st.n_used;
    assert_int_equal(tern_seq_blocks(c, 3), 1);
    sim_decode1(&s, 3, 6, D);
    tern_kv_stats(c, &st);
    assert_int_equal(st.n_used, used3 + 1);

    /* A fork into a sequence that holds positions: its own blocks go back. */
    tern_kv_stats(c, &st);
    const int32_t used4 = st.n_used, own2 = tern_seq_blocks(c, 2); /* private: copied block 0 and block 1 */
    assert_int_equal(own2, 2);
    sim_fork(&s, 2, 0, s.n[0]);
    tern_kv_stats(c, &st);
    assert_int_equal(st.n_used, used4 - own2);
    assert_int_equal(tern_seq_blocks(c, 2), tern_seq_blocks(c, 0));
    sim_decode2(&s, 2, 5, E, 0, 2, G + 1);

    /* Truncate inside a block shared with another sequence, then evaluate
     * other tokens: copy on write again, the other sequence undisturbed. */
    sim_fork(&s, 3, 1, s.n[1]);
    sim_truncate(&s, 3, 25);
    sim_decode1(&s, 3, 6, F);
    sim_decode1(&s, 1, 3, G);

    /* Truncate and evaluate other tokens: into a block shared with others
     * (copied), then again into the sequence's own block. */
    sim_truncate(&s, 2, 13);
    sim_decode1(&s, 2, 7, H);
    sim_truncate(&s, 2, 13);
    assert_int_equal(tern_seq_blocks(c, 2), 1);
    sim_decode1(&s, 2, 7, H);

    /* Remove: a sequence's private blocks go back, shared ones stay. */
    tern_kv_stats_t a, b;
    sim_fork(&s, 3, 0, s.n[0]);
    sim_decode1(&s, 3, 10, K); /* one private (copied) block and one fresh past the source */
    tern_kv_stats(c, &a);
    const int32_t blocks3 = tern_seq_blocks(c, 3);
    sim_remove(&s, 3);
    tern_kv_stats(c, &b);
    assert_true(blocks3 > 2);
    assert_int_equal(b.n_free, a.n_free + 2);
    assert_int_equal(b.n_used, a.n_used - 2);
    /* The source still matches. */
    sim_decode1(&s, 0, 1, H);
    for (int q = 0; q < 4; q++) sim_remove(&s, q);
    tern_kv_stats(c, &b);
    assert_int_equal(b.n_used, 0);
    assert_int_equal(b.n_shared, 0);
    assert_int_equal(b.n_free, b.n_blocks);
    assert_int_equal(b.n_blocks, 256 / BP);
    tern_context_free(c);
    tern_model_free(m);
}

/* ---- 3. the KV memory full -------------------------------------------------------- */

static void expect_fail(tern_context_t *c, const tern_batch_entry_t *e, int n, int code, const char *what) {
    snap_t before;
    snap(c, &before);
    tern_error_t err = {0};
    const int rc = tern_decode(c, e, n, &err);
    if (rc != code) print_message("%s: got %d (%s), want %d\n", what, rc, err.msg, code);
    assert_int_equal(rc, code);
    assert_int_equal(err.code, code);
    assert_true(err.msg[0] != 0);
    check_unchanged(c, &before, what);
}

/* Entries appending toks[0..n) to seq. */
static int append_entries(tern_batch_entry_t *e, int seq, const int32_t *toks, int n) {
    for (int i = 0; i < n; i++) e[i] = (tern_batch_entry_t){seq, toks[i], TERN_POS_APPEND, 1};
    return n;
}

static void test_kv_full(void **state) {
    (void)state;
    tern_model_t *m = load(tu_tiny_model("batch", "tiny", "q8_0", 7));
    const int BP = 8, NCTX = 64;
    tern_context_t *c = mkctx(m, 1, NCTX, 512, 4, BP, 0);
    assert_int_equal(tern_context_n_ctx(c), NCTX);
    sim_t s;
    sim_init(&s, m, c, 0xf011);
    int32_t T0[30], T2[20], X[50], Y[12];
    random_tokens(&s.rng, s.V, T0, 30);
    random_tokens(&s.rng, s.V, T2, 20);
    random_tokens(&s.rng, s.V, X, 50);
    random_tokens(&s.rng, s.V, Y, 12);
    tern_batch_entry_t e[128];
    tern_kv_stats_t st;

    sim_decode1(&s, 0, 30, T0); /* 4 blocks */
    sim_fork(&s, 1, 0, 30);     /* the same 4, shared */
    sim_decode1(&s, 2, 20, T2); /* 3 blocks */
    tern_kv_stats(c, &st);
    assert_int_equal(st.n_blocks, 8);
    assert_int_equal(st.n_used, 7);
    assert_int_equal(st.n_free, 1);
    assert_int_equal(st.n_shared, 4);

    /* Sequence 1 needs its shared last block copied (the one free block),
     * then sequence 2 needs a fresh one: too few, nothing may change (the
     * copy included). */
    int n = append_entries(e, 1, X, 1);
    n += append_entries(e + n, 2, X + 1, 10);
    expect_fail(c, e, n, TERN_EKVFULL, "cow + fresh block, one free");
    /* Sequence 2 takes the free block, sequence 3 then finds none. */
    n = append_entries(e, 2, X, 12);
    n += append_entries(e + n, 3, X + 12, 9);
    expect_fail(c, e, n, TERN_EKVFULL, "fresh blocks for two sequences, one free");
    /* The same with sequence 3's entries first in the batch. */
    n = append_entries(e, 3, X + 12, 9);
    n += append_entries(e + n, 2, X, 12);
    expect_fail(c, e, n, TERN_EKVFULL, "fresh blocks for two sequences, one free (reversed)");
    /* A copy on write, then a sequence past n_ctx. */
    n = append_entries(e, 1, X, 1);
    n += append_entries(e + n, 2, X, 45);
    expect_fail(c, e, n, TERN_ECTXFULL, "cow, then a sequence past n_ctx");
    /* A sequence longer than n_ctx by itself. */
    n = append_entries(e, 3, X, 50);
    n += append_entries(e + n, 3, Y, 12);
    n += append_entries(e + n, 3, X, 3);
    expect_fail(c, e, n, TERN_ECTXFULL, "one sequence of n_ctx + 1 positions");

    /* Removing sequence 0 frees no block (sequence 1 holds them all) but
     * leaves sequence 1 their only holder: the batch that found the memory
     * full now fits, with the reference logits. */
    sim_remove(&s, 0);
    tern_kv_stats(c, &st);
    assert_int_equal(st.n_free, 1);
    assert_int_equal(st.n_shared, 0);
    sim_decode2(&s, 1, 1, X, 2, 10, X + 1);
    tern_kv_stats(c, &st);
    assert_int_equal(st.n_free, 0);
    /* Full: any new block fails, a position in a block already held fits. */
    n = append_entries(e, 0, Y, 1);
    expect_fail(c, e, n, TERN_EKVFULL, "memory full");
    sim_decode1(&s, 1, 1, Y); /* position 31 of block 3 */
    n = append_entries(e, 1, Y, 1);
    expect_fail(c, e, n, TERN_EKVFULL, "memory full at a block boundary");
    /* Removing another sequence makes room (its 4 blocks come back). */
    sim_remove(&s, 2);
    tern_kv_stats(c, &st);
    assert_int_equal(st.n_free, 4);
    sim_decode2(&s, 1, 2, Y + 1, 0, 9, X + 20);

    /* One budget: with the others empty, one sequence uses the whole memory. */
    for (int q = 0; q < 4; q++) sim_remove(&s, q);
    sim_decode1(&s, 3, 50, X);
    sim_decode1(&s, 3, 12, Y);
    tern_kv_stats(c, &st);
    assert_int_equal(st.n_used, 8);
    assert_int_equal(st.n_free, 0);
    n = append_entries(e, 0, Y, 1);
    expect_fail(c, e, n, TERN_EKVFULL, "one sequence holds the whole memory");
    sim_decode1(&s, 3, 2, Y + 2); /* 64: the last positions of its last block */
    assert_int_equal(tern_seq_pos(c, 3), NCTX);
    n = append_entries(e, 3, Y, 1);
    expect_fail(c, e, n, TERN_ECTXFULL, "one sequence at n_ctx");
    /* Truncating it gives blocks to the others. */
    sim_truncate(&s, 3, 50);
    tern_kv_stats(c, &st);
    assert_int_equal(st.n_free, 1);
    sim_decode1(&s, 0, 8, Y);
    sim_decode1(&s, 3, 6, Y + 4);
    /* tern_eval of sequence 0 past n_ctx: TERN_ECTXFULL, nothing appended. */
    {
        snap_t before;
        snap(c, &before);
        tern_error_t err = {0};
        assert_int_equal(tern_eval(c, X, 57, NULL, &err), TERN_ECTXFULL);
        check_unchanged(c, &before, "tern_eval past n_ctx");
        assert_int_equal(tern_eval(c, X, 2, NULL, &err), TERN_EKVFULL);
        check_unchanged(c, &before, "tern_eval without free blocks");
    }
    tern_context_free(c);
    tern_model_free(m);
}

/* ---- tern_eval (sequence 0) and tern_decode on one memory ------------------------ */

/* tern_eval of n tokens on sequence 0, every position's logits compared with
 * a fresh evaluation. */
static void sim_eval(sim_t *s, int n, const int32_t *toks) {
    const size_t V = (size_t)s->V;
    float *all = malloc((size_t)n * V * sizeof(float));
    assert_non_null(all);
    tern_error_t err = {0};
    const int rc = tern_eval(s->c, toks, n, all, &err);
    if (rc) print_message("tern_eval: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_true(s->n[0] + n <= HIST_MAX);
    memcpy(s->hist[0] + s->n[0], toks, (size_t)n * sizeof(int32_t));
    s->n[0] += n;
    float *ref = ref_logits(s->m, s->hist[0], s->n[0], s->kv_f32, 0);
    assert_memory_equal(all, ref + (size_t)(s->n[0] - n) * V, (size_t)n * V * sizeof(float));
    assert_memory_equal(tern_get_logits(s->c), ref + (size_t)(s->n[0] - 1) * V, V * sizeof(float));
    assert_int_equal(tern_context_pos(s->c), s->n[0]);
    assert_int_equal(tern_seq_pos(s->c, 0), s->n[0]);
    free(ref);
    free(all);
}

static void test_eval_and_decode(void **state) {
    (void)state;
    tern_model_t *m = load(tu_tiny_model("batch", "tiny-qwen3", "q8_0", 7));
    /* n_batch 4: tern_eval goes block by block. */
    tern_context_t *c = mkctx(m, 2, 128, 4, 3, 8, 0);
    sim_t s;
    sim_init(&s, m, c, 0xe7a1);
    int32_t T[64];
    random_tokens(&s.rng, s.V, T, 64);
    sim_eval(&s, 10, T);
    sim_decode2(&s, 0, 3, T + 10, 1, 5, T + 13);
    sim_eval(&s, 6, T + 18);
    assert_int_equal(tern_seq_pos(c, 1), 5);
    /* tern_context_truncate is sequence 0's, the others stay. */
    assert_int_equal(tern_context_truncate(c, 7, NULL), 0);
    s.n[0] = 7;
    assert_int_equal(tern_seq_pos(c, 0), 7);
    assert_int_equal(tern_seq_pos(c, 1), 5);
    sim_decode1(&s, 0, 2, T + 24);
    /* A fork of sequence 0 inside a block; tern_eval then writes into the
     * shared block (copy on write) while the fork continues by tern_decode. */
    sim_fork(&s, 2, 0, 9);
    sim_eval(&s, 5, T + 26);
    sim_decode2(&s, 2, 4, T + 31, 1, 1, T + 35);
    sim_eval(&s, 1, T + 36);
    /* Sequence 0 removed: tern_eval starts it over. */
    sim_remove(&s, 0);
    assert_int_equal(tern_context_pos(c), 0);
    sim_eval(&s, 9, T + 40);
    sim_decode1(&s, 2, 3, T + 49);
    tern_context_free(c);
    tern_model_free(m);
}

/* ---- 4. bad entries, bad sequence operations; 5. which logits ------------------ */

static void test_bad_entries(void **state) {
    (void)state;
    tern_model_t *m = load(tu_tiny_model("batch", "tiny", "q8_0", 7));
    tern_context_t *c = mkctx(m, 1, 128, 512, 4, 16, 0);
    /* Nothing evaluated yet: no logits. */
    assert_null(tern_batch_logits(c, 0));
    assert_null(tern_batch_logits(c, -1));
    sim_t s;
    sim_init(&s, m, c, 0xbad);
    int32_t T[16];
    random_tokens(&s.rng, s.V, T, 16);
    sim_decode2(&s, 0, 5, T, 1, 3, T + 5);
    const int32_t V = s.V;
    tern_batch_entry_t e[8];
    /* Each case: a valid entry of sequence 1, then the bad one (and for
     * repeats, the first of the two). */
    static const struct {
        int32_t seq, token, pos;
        const char *what;
    } bad[] = {
        {-1, 1, TERN_POS_APPEND, "sequence -1"},
        {4, 1, TERN_POS_APPEND, "sequence n_seq_max"},
        {4096, 1, 0, "sequence 4096"},
        {0, -1, TERN_POS_APPEND, "token -1"},
        {0, -2, 5, "token -2"},
        {0, 0, 6, "position gap (held 5, given 6)"},
        {2, 0, 1, "position gap in an empty sequence"},
        {0, 0, 4, "position already evaluated"},
        {0, 0, 0, "position 0 already evaluated"},
        {0, 0, -2, "negative position"},
        {0, 0, INT32_MIN, "INT32_MIN position"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e[0] = (tern_batch_entry_t){1, T[8], TERN_POS_APPEND, 1};
        e[1] = (tern_batch_entry_t){bad[i].seq, bad[i].token, bad[i].pos, 1};
        expect_fail(c, e, 2, TERN_EINVAL, bad[i].what);
        /* The bad entry first. */
        e[2] = e[0];
        expect_fail(c, e + 1, 2, TERN_EINVAL, bad[i].what);
    }
    /* Token n_vocab. */
    e[0] = (tern_batch_entry_t){0, V, TERN_POS_APPEND, 0};
    expect_fail(c, e, 1, TERN_EINVAL, "token n_vocab");
    /* Repeated positions: twice explicit, APPEND then explicit, explicit
     * then APPEND after a gap-free pair that APPEND resolves into. */
    e[0] = (tern_batch_entry_t){0, 1, 5, 1};
    e[1] = (tern_batch_entry_t){0, 2, 5, 1};
    expect_fail(c, e, 2, TERN_EINVAL, "position 5 twice");
    e[0] = (tern_batch_entry_t){0, 1, TERN_POS_APPEND, 1};
    e[1] = (tern_batch_entry_t){0, 2, 5, 1};
    expect_fail(c, e, 2, TERN_EINVAL, "APPEND (5) then 5");
    e[0] = (tern_batch_entry_t){0, 1, 6, 1};
    e[1] = (tern_batch_entry_t){0, 2, 5, 1};
    e[2] = (tern_batch_entry_t){0, 3, TERN_POS_APPEND, 1}; /* resolves to 7 */
    e[3] = (tern_batch_entry_t){0, 4, 7, 1};
    expect_fail(c, e, 4, TERN_EINVAL, "APPEND resolving onto an explicit position");
    e[0] = (tern_batch_entry_t){0, 1, 5, 1};
    e[1] = (tern_batch_entry_t){0, 2, 7, 1};
    expect_fail(c, e, 2, TERN_EINVAL, "gap inside the batch");
    /* Bad arguments. */
    {
        snap_t before;
        snap(c, &before);
        tern_error_t err = {0};
        assert_int_equal(tern_decode(c, NULL, 1, &err), TERN_EINVAL);
        assert_int_equal(tern_decode(c, e, -1, &err), TERN_EINVAL);
        assert_int_equal(tern_decode(NULL, e, 1, &err), TERN_EINVAL);
        check_unchanged(c, &before, "bad arguments");
    }
    /* Bad sequence operations. */
    {
        snap_t before;
        snap(c, &before);
        tern_error_t err = {0};
        assert_int_equal(tern_seq_pos(c, -1), -1);
        assert_int_equal(tern_seq_pos(c, 4), -1);
        assert_int_equal(tern_seq_blocks(c, -1), -1);
        assert_int_equal(tern_seq_blocks(c, 4), -1);
        assert_int_equal(tern_seq_truncate(c, 0, 6, &err), TERN_EINVAL);
        assert_int_equal(tern_seq_truncate(c, 0, -1, &err), TERN_EINVAL);
        assert_int_equal(tern_seq_truncate(c, 4, 0, &err), TERN_EINVAL);
        assert_int_equal(tern_seq_truncate(c, -1, 0, &err), TERN_EINVAL);
        assert_int_equal(tern_seq_remove(c, 4, &err), TERN_EINVAL);
        assert_int_equal(tern_seq_remove(c, -1, &err), TERN_EINVAL);
        assert_int_equal(tern_seq_fork(c, 0, 0, 1, &err), TERN_EINVAL);
        assert_int_equal(tern_seq_fork(c, 2, 0, 6, &err), TERN_EINVAL);
        assert_int_equal(tern_seq_fork(c, 2, 0, -1, &err), TERN_EINVAL);
        assert_int_equal(tern_seq_fork(c, 4, 0, 1, &err), TERN_EINVAL);
        assert_int_equal(tern_seq_fork(c, 2, 4, 0, &err), TERN_EINVAL);
        /* A failed fork into a sequence that holds positions keeps them. */
        assert_int_equal(tern_seq_fork(c, 1, 0, 6, &err), TERN_EINVAL);
        check_unchanged(c, &before, "bad sequence operations");
    }
    /* After all that, the sequences continue with the reference logits. */
    sim_decode2(&s, 0, 3, T + 8, 1, 2, T + 11);

    /* 5. Only the entries that asked get logits; an empty batch none. */
    {
        const int64_t p0 = tern_seq_pos(c, 0), p2 = tern_seq_pos(c, 2);
        e[0] = (tern_batch_entry_t){2, T[0], TERN_POS_APPEND, 0};
        e[1] = (tern_batch_entry_t){0, T[13], TERN_POS_APPEND, 1};
        e[2] = (tern_batch_entry_t){2, T[1], TERN_POS_APPEND, 0};
        e[3] = (tern_batch_entry_t){0, T[14], TERN_POS_APPEND, 0};
        e[4] = (tern_batch_entry_t){2, T[2], TERN_POS_APPEND, 1};
        assert_int_equal(tern_decode(c, e, 5, NULL), 0);
        assert_int_equal(tern_seq_pos(c, 0), p0 + 2);
        assert_int_equal(tern_seq_pos(c, 2), p2 + 3);
        assert_null(tern_batch_logits(c, 0));
        assert_non_null(tern_batch_logits(c, 1));
        assert_null(tern_batch_logits(c, 2));
        assert_null(tern_batch_logits(c, 3));
        assert_non_null(tern_batch_logits(c, 4));
        assert_null(tern_batch_logits(c, 5));
        assert_null(tern_batch_logits(c, -1));
        assert_null(tern_batch_logits(c, INT32_MAX));
        float *r2 = ref_logits(m, T, 3, 0, 0);
        assert_memory_equal(tern_batch_logits(c, 4), r2 + 2 * (size_t)V, (size_t)V * sizeof(float));
        free(r2);
        /* No entry asks: none. */
        e[0].logits = 0;
        e[0].pos = TERN_POS_APPEND;
        assert_int_equal(tern_decode(c, e, 1, NULL), 0);
        assert_null(tern_batch_logits(c, 0));
        /* An empty batch: nothing, no logits. */
        snap_t before;
        snap(c, &before);
        assert_int_equal(tern_decode(c, e, 0, NULL), 0);
        assert_null(tern_batch_logits(c, 0));
        check_unchanged(c, &before, "an empty batch");
    }
    tern_context_free(c);
    tern_model_free(m);
}

int main(void) {
    /* The tiny models' matrices are below the pool's serial gate: without
     * this the multi-threaded runs would all stay on one thread. */
    setenv("TERN_POOL_GATE", "0", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_entries),
        cmocka_unit_test(test_kv_full),
        cmocka_unit_test(test_fork),
        cmocka_unit_test(test_eval_and_decode),
        cmocka_unit_test(test_invariance_tiny),
        cmocka_unit_test(test_invariance_stories),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
