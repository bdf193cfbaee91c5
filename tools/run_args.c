/* run_args.c - see run_args.h. */
#include "run_args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TERN_HAVE_SERVER
#include "json_schema.h"
#endif

static void usage(const char *cmd, FILE *out) {
    fprintf(out,
            "usage: tern %s -m FILE [options]\n"
            "  -m, --model FILE          GGUF model\n",
            cmd);
    if (!strcmp(cmd, "run"))
        fprintf(out,
                "  -p, --prompt TEXT         prompt (default: empty, BOS only)\n"
                "  -f, --file FILE           read the prompt from a file\n"
                "  -n, --n-predict N         tokens to generate (-1: until end of text or full context; default -1)\n"
                "  --special                 recognize special tokens in the prompt\n"
                "  --no-bos                  do not prepend BOS\n"
                "  --ids                     print the generated token ids (one line) instead of text\n"
                "  --logits-digest           print on stderr a 64-bit FNV-1a hash of the bytes of every logit\n"
                "                            vector a token was sampled from (thread/batch invariance checks)\n"
                "  --no-display-prompt       do not echo the prompt\n");
    if (!strcmp(cmd, "chat"))
        fprintf(out,
                "  -sys, --system TEXT       system message\n"
                "  --chat-template NAME      chatml, llama3, llama2, mistral, phi3 (default: from the model)\n"
                "  -n, --n-predict N         max tokens per reply (-1: until end of turn; default -1)\n");
    if (!strcmp(cmd, "perplexity"))
        fprintf(out, "  -f, --file FILE           text to score\n");
    if (strcmp(cmd, "perplexity"))
        fprintf(out,
                "  --spec MODE               speculative decoding: ngram (drafts looked up in the text so far,\n"
                "                            draft length adapted to the acceptance and the measured cost),\n"
                "                            ngram-fixed (always --draft-max drafts), off (default); the output\n"
                "                            is the same as without it\n"
                "  --draft-max N             most drafts per pass, 1..%d (default 8)\n"
                "  --spec-ngram N            longest n-gram looked up, 1..%d (default 4)\n",
                TERN_SPEC_DRAFT_MAX, TERN_SPEC_NGRAM_MAX);
    fprintf(out,
            "  -t, --threads N           threads in all (default: physical performance cores)\n"
            "  -c, --ctx-size N          context size (default: %s)\n"
            "  -b, --batch-size N        prompt positions per forward block (default 512)\n"
            "  --kv-f32                  F32 KV cache (default F16); also -ctk f32\n"
            "  --session FILE            run, chat: keep the sequence (tokens and KV cache) in FILE, created\n"
            "                            when absent; the prompt's longest prefix already there is restored,\n"
            "                            not evaluated, and FILE is extended with what was evaluated\n"
            "  --profile                 per-op time split with the timings\n",
            strcmp(cmd, "perplexity") ? "the model's, capped to fit memory" : "512");
    model_args_usage(out, 0, 28);
    if (strcmp(cmd, "perplexity"))
        fprintf(out,
                "sampling (applied in this order: penalties, top-k, top-p, min-p, temperature):\n"
                "  --repeat-penalty F        (default 1.0, off)   --repeat-last-n N (default 64)\n"
                "  --presence-penalty F      (default 0)          --frequency-penalty F (default 0)\n"
                "  --top-k N                 (default 40, 0 off)  --top-p F (default 0.95, 1 off)\n"
                "  --min-p F                 (default 0.05, 0 off)\n"
                "  --temp F                  (default 0.8; 0 = greedy)\n"
                "  -s, --seed N              RNG seed (default 0x7e57); the same seed reproduces a run\n"
                "constrained output (tern run):\n"
                "  --grammar TEXT            GBNF grammar the output must match (start rule: root)\n"
                "  --grammar-file FILE       the same, from a file\n"
                "  --json-schema FILE|TEXT   JSON schema the output must follow (TEXT when it starts with '{')\n");
}

static int parse_i32(const char *s, const char *flag, int32_t lo, int32_t hi, int32_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "tern: %s wants an integer in [%d, %d], got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

static int parse_f32(const char *s, const char *flag, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        fprintf(stderr, "tern: %s wants a number, got '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

int run_opts_parse(run_opts_t *o, int argc, char **argv, const char *cmd) {
    memset(o, 0, sizeof *o);
    o->n_predict = -1;
    o->n_batch = 512;
    o->sp = tern_sampler_default_params();
    o->spec = tern_spec_default_params();
    int spec_on = 0;
    int32_t draft_max = o->spec.n_draft_max;
    if (!strcmp(cmd, "perplexity")) o->n_ctx = 512;
    model_args_init(&o->ma);
    for (int i = 1; i < argc; i++) {
        const int mr = model_args_take(&o->ma, cmd, argc, argv, &i);
        if (mr < 0) return 2;
        if (mr > 0) continue;
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define IS(x) (!strcmp(a, x))
#define NEED()                                                            \
    do {                                                                  \
        if (!v) {                                                         \
            fprintf(stderr, "tern %s: %s needs a value\n", cmd, a);       \
            return 2;                                                     \
        }                                                                 \
        i++;                                                              \
    } while (0)
        if (IS("-h") || IS("--help")) {
            usage(cmd, stdout);
            return 1;
        } else if (IS("-m") || IS("--model")) {
            NEED();
            o->model = v;
        } else if (IS("-p") || IS("--prompt")) {
            NEED();
            o->prompt = v;
        } else if (IS("-f") || IS("--file")) {
            NEED();
            o->prompt_file = v;
        } else if (IS("-sys") || IS("--system") || IS("--system-prompt")) {
            NEED();
            o->sys = v;
        } else if (IS("--chat-template")) {
            NEED();
            o->chat_template = v;
        } else if (IS("-n") || IS("--n-predict") || IS("--predict")) {
            NEED();
            if (parse_i32(v, a, -1, INT32_MAX, &o->n_predict)) return 2;
        } else if (IS("-t") || IS("--threads")) {
            NEED();
            if (parse_i32(v, a, 1, 1024, &o->n_threads)) return 2;
        } else if (IS("-c") || IS("--ctx-size")) {
            NEED();
            if (parse_i32(v, a, 0, 1 << 24, &o->n_ctx)) return 2;
        } else if (IS("-b") || IS("--batch-size") || IS("-ub") || IS("--ubatch-size")) {
            NEED();
            if (parse_i32(v, a, 1, 1 << 16, &o->n_batch)) return 2;
        } else if (IS("--session")) {
            NEED();
            o->session = v;
        } else if (IS("--kv-f32")) {
            o->kv_f32 = 1;
        } else if (IS("-ctk") || IS("--cache-type-k") || IS("-ctv") || IS("--cache-type-v")) {
            NEED();
            if (!strcmp(v, "f32")) o->kv_f32 = 1;
            else if (!strcmp(v, "f16")) o->kv_f32 = 0;
            else {
                fprintf(stderr, "tern %s: %s: only f16 and f32 caches are supported, got '%s'\n", cmd, a, v);
                return 2;
            }
        } else if (IS("--temp") || IS("--temperature")) {
            NEED();
            if (parse_f32(v, a, &o->sp.temp)) return 2;
        } else if (IS("--top-k")) {
            NEED();
            if (parse_i32(v, a, 0, INT32_MAX, &o->sp.top_k)) return 2;
        } else if (IS("--top-p")) {
            NEED();
            if (parse_f32(v, a, &o->sp.top_p)) return 2;
        } else if (IS("--min-p")) {
            NEED();
            if (parse_f32(v, a, &o->sp.min_p)) return 2;
        } else if (IS("--repeat-penalty")) {
            NEED();
            if (parse_f32(v, a, &o->sp.repeat_penalty)) return 2;
        } else if (IS("--repeat-last-n")) {
            NEED();
            if (parse_i32(v, a, 0, 1 << 20, &o->sp.repeat_last_n)) return 2;
        } else if (IS("--presence-penalty")) {
            NEED();
            if (parse_f32(v, a, &o->sp.presence_penalty)) return 2;
        } else if (IS("--frequency-penalty")) {
            NEED();
            if (parse_f32(v, a, &o->sp.frequency_penalty)) return 2;
        } else if (IS("-s") || IS("--seed")) {
            NEED();
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 0);
            if (errno || end == v || *end) {
                fprintf(stderr, "tern %s: %s wants an unsigned integer, got '%s'\n", cmd, a, v);
                return 2;
            }
            o->sp.seed = s;
            o->seed_given = 1;
        } else if (strcmp(cmd, "perplexity") && IS("--spec")) {
            NEED();
            if (!strcmp(v, "ngram") || !strcmp(v, "ngram-fixed")) {
                spec_on = 1;
                o->spec.adaptive = !strcmp(v, "ngram");
            } else if (!strcmp(v, "off")) {
                spec_on = 0;
            } else {
                fprintf(stderr, "tern %s: %s wants ngram, ngram-fixed or off, got '%s'\n", cmd, a, v);
                return 2;
            }
        } else if (strcmp(cmd, "perplexity") && IS("--draft-max")) {
            NEED();
            if (parse_i32(v, a, 1, TERN_SPEC_DRAFT_MAX, &draft_max)) return 2;
        } else if (strcmp(cmd, "perplexity") && IS("--spec-ngram")) {
            NEED();
            if (parse_i32(v, a, 1, TERN_SPEC_NGRAM_MAX, &o->spec.ngram_max)) return 2;
            if (o->spec.ngram_min > o->spec.ngram_max) o->spec.ngram_min = o->spec.ngram_max;
        } else if (IS("--special")) {
            o->special = 1;
        } else if (IS("--no-bos")) {
            o->no_bos = 1;
        } else if (IS("--logits-digest")) {
            o->logits_digest = 1;
        } else if (IS("--ids")) {
            o->print_ids = 1;
        } else if (IS("--no-display-prompt") || IS("--no-display")) {
            o->no_display_prompt = 1;
        } else if (IS("--profile")) {
            o->profile = 1;
        } else if (IS("--grammar")) {
            NEED();
            o->grammar = v;
        } else if (IS("--grammar-file")) {
            NEED();
            o->grammar_file = v;
        } else if (IS("--json-schema")) {
            NEED();
            o->json_schema = v;
        } else {
            fprintf(stderr, "tern %s: unknown option '%s' (see tern %s --help)\n", cmd, a, cmd);
            return 2;
        }
#undef IS
#undef NEED
    }
    if (!o->model) {
        fprintf(stderr, "tern %s: -m FILE is required (see tern %s --help)\n", cmd, cmd);
        return 2;
    }
    if (o->prompt && o->prompt_file) {
        fprintf(stderr, "tern %s: give -p or -f, not both\n", cmd);
        return 2;
    }
    o->spec.n_draft_max = spec_on ? draft_max : 0;
    if (spec_on && o->logits_digest) {
        /* The digest hashes tern_get_logits in the callback, which a pass
         * with drafts has not set to the reported token's logits yet. */
        fprintf(stderr, "tern %s: --logits-digest needs --spec off\n", cmd);
        return 2;
    }
    return 0;
}

char *run_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "tern: cannot open '%s': %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            if (cap > (SIZE_MAX >> 2)) {
                free(buf);
                buf = NULL;
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - 1 - n, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "tern: cannot read '%s'\n", path);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

void run_mark_generation(run_gen_mark_t *mk, const tern_model_t *m, const tern_context_t *c) {
    if (mk->taken) return;
    tern_model_expert_stats(m, &mk->es);
    tern_context_timings(c, &mk->t);
    mk->taken = 1;
}

/* "1.5 GiB", "340.0 KiB" ... */
static const char *fmt_bytes(double b, char *buf, size_t cap) {
    static const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, u++;
    snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
    return buf;
}

/* The expert cache line of run_print_timings. */
static void print_expert_cache(const tern_model_t *m, const tern_timings_t *t, const run_opts_t *o,
                               const run_gen_mark_t *mk) {
    tern_expert_stats_t st;
    tern_model_expert_stats(m, &st);
    if (!st.active) return;
    /* The window: the generation after the mark, or everything. */
    int64_t n_tok = t->n_prompt + t->n_gen + t->n_decode;
    uint64_t ns = t->prompt_ns + t->gen_ns + t->decode_ns;
    const char *over = "evaluated tokens (prompt and generation)";
    if (mk && mk->taken && t->n_gen > mk->t.n_gen && mk->es.active) {
        const tern_expert_stats_t *a = &mk->es;
        st.hits -= a->hits;
        st.misses -= a->misses;
        st.pred_hits -= a->pred_hits;
        st.pred_total -= a->pred_total;
        st.bytes_read -= a->bytes_read;
        st.wait_ns -= a->wait_ns;
        n_tok = t->n_gen - mk->t.n_gen;
        ns = t->gen_ns - mk->t.gen_ns;
        over = "generated tokens";
    }
    char b1[32], b2[32];
    const uint64_t asked = st.hits + st.misses;
    const double s = (double)ns / 1e9;
    fprintf(stderr, "tern: expert cache     = %s in %d slots of %s (%s reads, %s)",
            fmt_bytes((double)st.cache_bytes, b1, sizeof b1), st.n_slots, fmt_bytes((double)st.slot_bytes, b2, sizeof b2), st.direct ? "direct" : "buffered",
            o->ma.prefetch != 0 ? "prefetch on" : "prefetch off");
    if (st.n_pinned) fprintf(stderr, ", %d pinned", st.n_pinned);
    /* GB read per token, in MB when under 0.01 GB (a small model, a warm cache) */
    const double gb_tok = n_tok ? (double)st.bytes_read / 1e9 / (double)n_tok : 0.0;
    fprintf(stderr, "; over %lld %s: hit rate %.1f%% (%llu of %llu), %.3f %s read per token, I/O %.2f GB/s, waiting "
                    "on I/O %.1f%% of the time",
            (long long)n_tok, over, asked ? 100.0 * (double)st.hits / (double)asked : 0.0, (unsigned long long)st.hits,
            (unsigned long long)asked, gb_tok >= 0.01 || gb_tok == 0 ? gb_tok : gb_tok * 1e3,
            gb_tok >= 0.01 || gb_tok == 0 ? "GB" : "MB", s > 0 ? (double)st.bytes_read / 1e9 / s : 0.0,
            s > 0 ? 100.0 * (double)st.wait_ns / 1e9 / s : 0.0);
    if (st.pred_total)
        fprintf(stderr, ", prefetch prediction %.1f%% (%llu of %llu)",
                100.0 * (double)st.pred_hits / (double)st.pred_total, (unsigned long long)st.pred_hits, (unsigned long long)st.pred_total);
    fprintf(stderr, "\n");
}

void run_print_timings(const tern_model_t *m, const tern_context_t *c, const run_opts_t *o, double total_ms,
                       const run_gen_mark_t *mk) {
    tern_timings_t t;
    tern_context_timings(c, &t);
    const double pms = (double)t.prompt_ns / 1e6, gms = (double)t.gen_ns / 1e6, sms = (double)t.sample_ns / 1e6;
    const int nl = tern_model_n_layer(m);
    fprintf(stderr, "\n");
    fprintf(stderr, "tern: load time        = %10.2f ms (%s, %s %s, %.1f MiB)\n", tern_model_load_ms(m),
            tern_model_name(m), tern_model_arch(m), tern_model_type_name(m),
            (double)tern_model_file_size(m) / 1048576.0);
    fprintf(stderr, "tern: sampling time    = %10.2f ms / %5lld runs   (%8.2f ms per token, %8.2f tokens per second)\n",
            sms, (long long)t.n_sample, t.n_sample ? sms / (double)t.n_sample : 0.0,
            sms > 0 ? 1e3 * (double)t.n_sample / sms : 0.0);
    fprintf(stderr, "tern: prompt eval time = %10.2f ms / %5lld tokens (%8.2f ms per token, %8.2f tokens per second)\n",
            pms, (long long)t.n_prompt, t.n_prompt ? pms / (double)t.n_prompt : 0.0,
            pms > 0 ? 1e3 * (double)t.n_prompt / pms : 0.0);
    fprintf(stderr, "tern:        eval time = %10.2f ms / %5lld runs   (%8.2f ms per token, %8.2f tokens per second)\n",
            gms, (long long)t.n_gen, t.n_gen ? gms / (double)t.n_gen : 0.0, gms > 0 ? 1e3 * (double)t.n_gen / gms : 0.0);
    fprintf(stderr, "tern:       total time = %10.2f ms\n", total_ms);
    double dpt = t.n_gen ? (double)t.gen_dispatches / (double)t.n_gen : 0.0;
    fprintf(stderr,
            "tern: dispatches: %.1f per generated token (%.2f per layer), %llu for %lld prompt tokens; "
            "threads %d; ISA %s; KV cache %s, %d positions\n",
            dpt, nl ? dpt / nl : 0.0, (unsigned long long)t.prompt_dispatches, (long long)t.n_prompt,
            tern_context_threads(c), tern_isa_name(), o->kv_f32 ? "f32" : "f16", tern_context_n_ctx(c));
    print_expert_cache(m, &t, o, mk);
    if (o->profile) {
        tern_profile_t p;
        tern_context_profile(c, &p);
        double all = (double)(p.qkv + p.attn + p.wo + p.ffn_up + p.ffn_down + p.output + p.small);
        if (all <= 0) all = 1;
#define PCT(x) (double)(x) / 1e6, 100.0 * (double)(x) / all
        fprintf(stderr,
                "tern: profile over %lld tokens: qkv %.1f ms (%.1f%%), attention %.1f ms (%.1f%%), o %.1f ms (%.1f%%), "
                "gate/up %.1f ms (%.1f%%), down %.1f ms (%.1f%%), output %.1f ms (%.1f%%), small ops %.1f ms (%.1f%%)\n",
                (long long)p.n_tokens, PCT(p.qkv), PCT(p.attn), PCT(p.wo), PCT(p.ffn_up), PCT(p.ffn_down), PCT(p.output),
                PCT(p.small));
#undef PCT
    }
}

void run_print_spec(const run_opts_t *o, const tern_spec_stats_t *st) {
    if (o->spec.n_draft_max <= 0) return;
    fprintf(stderr,
            "tern: speculative      = %s, drafts up to %d, n-grams %d..%d: %lld drafted, %lld accepted (%.1f%%); "
            "%lld passes (%lld with drafts) for %lld tokens, %.2f tokens per pass\n",
            o->spec.adaptive ? "ngram (adaptive)" : "ngram (fixed)", o->spec.n_draft_max, o->spec.ngram_min,
            o->spec.ngram_max, (long long)st->n_drafted, (long long)st->n_accepted,
            st->n_drafted ? 100.0 * (double)st->n_accepted / (double)st->n_drafted : 0.0, (long long)st->n_passes,
            (long long)st->n_spec_passes, (long long)st->n_generated,
            st->n_passes ? (double)st->n_generated / (double)st->n_passes : 0.0);
}

tern_model_t *run_load_model(const run_opts_t *o, const char *cmd) { return model_args_load(o->model, &o->ma, cmd); }

char *run_grammar_text(const run_opts_t *o, int *none) {
    *none = 0;
    int n = !!o->grammar + !!o->grammar_file + !!o->json_schema;
    if (n == 0) {
        *none = 1;
        return NULL;
    }
    if (n > 1) {
        fprintf(stderr, "tern: give one of --grammar, --grammar-file and --json-schema\n");
        return NULL;
    }
    if (o->grammar) return strdup(o->grammar);
    if (o->grammar_file) return run_read_file(o->grammar_file, NULL);
#ifdef TERN_HAVE_SERVER
    size_t len = 0;
    const char *p = o->json_schema;
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    char *file = NULL;
    if (*p != '{' && !(file = run_read_file(o->json_schema, &len))) return NULL;
    const char *schema = file ? file : p;
    if (!file) len = strlen(schema);
    char *gbnf = NULL;
    tern_error_t err = {0};
    if (tern_json_schema_to_gbnf(schema, len, &gbnf, &err)) {
        fprintf(stderr, "tern: %s\n", err.msg);
        gbnf = NULL;
    }
    free(file);
    return gbnf;
#else
    fprintf(stderr, "tern: --json-schema needs a build with cJSON (the server's build)\n");
    return NULL;
#endif
}
