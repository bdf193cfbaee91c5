/* tern.c - the command-line front end: dispatches to the subcommands. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "cmds.h"
#include "tern.h"

/* Weak fallbacks so the binary links while a subcommand is not built in. */
#define WEAK_CMD(fn)                                                              \
    __attribute__((weak)) int fn(int argc, char **argv) {                         \
        (void)argc;                                                               \
        fprintf(stderr, "tern %s: not available in this build\n", argv[0]);      \
        return 2;                                                                 \
    }
WEAK_CMD(cmd_info)
WEAK_CMD(cmd_threads)
WEAK_CMD(cmd_mkmodel)
WEAK_CMD(cmd_quantize)
WEAK_CMD(cmd_tokenize)
WEAK_CMD(cmd_detokenize)
WEAK_CMD(cmd_run)
WEAK_CMD(cmd_chat)
WEAK_CMD(cmd_perplexity)
WEAK_CMD(cmd_bench_model)
WEAK_CMD(cmd_bench_spec)
WEAK_CMD(cmd_serve)
WEAK_CMD(cmd_bench_grammar)
WEAK_CMD(bench_pool_main)
WEAK_CMD(bench_kernels_main)

static void usage(FILE *out) {
    fprintf(out,
            "tern %s - CPU inference for LLMs in GGUF files\n"
            "\n"
            "usage: tern COMMAND [options]\n"
            "  run -m FILE -p TEXT       generate text\n"
            "  chat -m FILE              interactive chat with the model's template\n"
            "  serve -m FILE             OpenAI-compatible HTTP server (continuous batching)\n"
            "  bench -m FILE[,FILE]      llama-bench style speed table with roofline\n"
            "  bench pool | kernels      micro-benchmarks of the pool and the kernels\n"
            "  bench grammar             grammar mask time per token on large vocabularies\n"
            "  bench spec [-m FILE]      speculative decoding: verify cost, plain vs speculative t/s\n"
            "  perplexity -m FILE -f TXT perplexity of a text\n"
            "  info FILE                 what a GGUF file holds (--tensors, --json)\n"
            "  info --threads            the thread count tern uses and why, the last-level cache\n"
            "  tokenize -m FILE -p TEXT  text to token ids\n"
            "  detokenize -m FILE IDS    token ids to text\n"
            "  mkmodel --shape S --type T -o FILE   synthetic model with random weights\n"
            "  quantize IN OUT TYPE      re-quantize a model file\n"
            "Run 'tern COMMAND --help' for a command's options.\n",
            TERN_VERSION);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("tern %s\n", TERN_VERSION);
        return 0;
    }
    const char *c = argv[1];
    int sub_argc = argc - 1;
    char **sub_argv = argv + 1;
    if (!strcmp(c, "info")) {
        for (int i = 2; i < argc; i++)
            if (!strcmp(argv[i], "--threads")) return cmd_threads(sub_argc, sub_argv);
        return cmd_info(sub_argc, sub_argv);
    }
    if (!strcmp(c, "bench")) {
        if (argc >= 3 && !strcmp(argv[2], "pool")) return bench_pool_main(argc - 2, argv + 2);
        if (argc >= 3 && !strcmp(argv[2], "kernels")) return bench_kernels_main(argc - 2, argv + 2);
        if (argc >= 3 && !strcmp(argv[2], "grammar")) return cmd_bench_grammar(argc - 2, argv + 2);
        if (argc >= 3 && !strcmp(argv[2], "spec")) return cmd_bench_spec(argc - 2, argv + 2);
        return cmd_bench_model(sub_argc, sub_argv);
    }
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {
        {"run", cmd_run},           {"chat", cmd_chat},         {"perplexity", cmd_perplexity},
        {"tokenize", cmd_tokenize}, {"detokenize", cmd_detokenize}, {"mkmodel", cmd_mkmodel},
        {"quantize", cmd_quantize}, {"serve", cmd_serve},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(c, cmds[i].name)) return cmds[i].fn(sub_argc, sub_argv);
    fprintf(stderr, "tern: unknown command '%s'\n\n", c);
    usage(stderr);
    return 2;
}
