/*
 * cmd_mkmodel.c - `tern mkmodel --shape NAME --type TYPE -o FILE
 * [--vocab-from FILE.gguf] [--seed N] [--pure] [--split-experts]
 * [--router-skew A] [--threads N] [--quiet | --verbose]`: a model file with
 * random weights in llama.cpp's exact layout (see tools/dev/mkmodel.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "core/common.h"
#include "dev/mkmodel.h"

static void usage(FILE *o) {
    fprintf(o, "usage: tern mkmodel --shape NAME --type TYPE -o FILE [--vocab-from FILE.gguf] [--seed N]\n"
               "                    [--pure] [--split-experts] [--router-skew A] [--threads N] [--quiet | --verbose]\n"
               "  shapes:");
    for (int i = 0; mk_shape_at(i); i++) {
        const mk_shape_t *s = mk_shape_at(i);
        fprintf(o, "\n    %-17s %-8s dim %" PRId64 ", %" PRId64 " layers, %" PRId64 " heads, %" PRId64
                   " kv heads, ffn %" PRId64 ", vocab %" PRId64,
                s->name, s->arch, s->n_embd, s->n_layer, s->n_head, s->n_head_kv, s->n_ff, s->n_vocab);
        if (s->n_expert)
            fprintf(o, "\n%31s%" PRId64 " experts (%" PRId64 " used) of ffn %" PRId64, "", s->n_expert,
                    s->n_expert_used, s->n_ff_exp);
        if (s->n_ff_shexp) fprintf(o, " + shared ffn %" PRId64, s->n_ff_shexp);
    }
    fprintf(o, "\n  types: %s\n"
               "  --vocab-from F    copy the tokenizer.* keys of F (vocab size follows its token list)\n"
               "  --seed N          weight seed (default 1)\n"
               "  --pure            every quantizable weight in TYPE (no llama.cpp per-tensor rules;\n"
               "                    rows that do not fit the block size still fall back)\n"
               "  --split-experts   Mixtral (arch llama with experts) only: the older per-expert 2-D tensors\n"
               "                    blk.N.ffn_{gate,up,down}.E.weight instead of the 3-D ffn_*_exps\n"
               "  --router-skew A   experts with a Zipf-like popularity: layer l's router row of the expert\n"
               "                    ranked r (a random ranking per layer) is scaled by (1 + r)^-A;\n"
               "                    0 = uniform (default); at 1 the top quarter of 64 or 128 experts\n"
               "                    takes about 70-90%% of the top-8 selections\n"
               "  --quiet           nothing on stderr; --verbose: each tensor as it is written\n"
               "  On a terminal a progress line shows bytes written, MB/s and the time left.\n",
            mk_target_names());
}

int cmd_mkmodel(int argc, char **argv) {
    mk_opts_t o = {.seed = 1, .verbose = 1};
    bool quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            quiet = true;
            o.verbose = 0;
            continue;
        } else if (!strcmp(a, "--pure")) {
            o.pure = true;
            continue;
        } else if (!strcmp(a, "--split-experts")) {
            o.split_experts = true;
            continue;
        } else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
            o.verbose = 2;
            continue;
        }
        if (!v) {
            fprintf(stderr, "tern mkmodel: '%s' needs a value (or is unknown)\n", a);
            usage(stderr);
            return 2;
        }
        if (!strcmp(a, "--shape"))
            o.shape = v;
        else if (!strcmp(a, "--type"))
            o.type = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output"))
            o.out = v;
        else if (!strcmp(a, "--vocab-from"))
            o.vocab_from = v;
        else if (!strcmp(a, "--seed")) {
            char *end;
            o.seed = strtoull(v, &end, 0);
            if (*end || !*v) {
                fprintf(stderr, "tern mkmodel: bad seed '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--router-skew")) {
            char *end;
            o.router_skew = strtof(v, &end);
            if (*end || !*v || !(o.router_skew >= 0)) {
                fprintf(stderr, "tern mkmodel: bad router skew '%s' (a number >= 0)\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t"))
            o.n_threads = atoi(v);
        else {
            fprintf(stderr, "tern mkmodel: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (!o.shape || !o.type || !o.out) {
        fprintf(stderr, "tern mkmodel: --shape, --type and -o are required\n");
        usage(stderr);
        return 2;
    }
    tern_error_t err = {0};
    uint64_t t0 = tern_now_ns();
    if (mk_model_write(&o, &err) != 0) {
        fprintf(stderr, "tern mkmodel: %s\n", err.msg);
        return 1;
    }
    if (!quiet) fprintf(stderr, "tern mkmodel: wrote %s (%s, %s) in %.1f s\n", o.out, o.shape, o.type,
                        (double)(tern_now_ns() - t0) / 1e9);
    return 0;
}
