/*
 * cmd_quantize.c - `tern quantize IN OUT TYPE [--pure] [--threads N] [--quiet | --verbose]`:
 * re-quantize a model file with llama.cpp's per-tensor rules (see
 * tools/dev/mkmodel.h, mk_plan).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "dev/mkmodel.h"

static void usage(FILE *o) {
    fprintf(o,
            "usage: tern quantize IN.gguf OUT.gguf TYPE [--pure] [--threads N] [--quiet | --verbose]\n"
            "  types: %s\n"
            "  llama.cpp's per-tensor rules, mixtures of experts included (the router stays F32);\n"
            "  on a terminal a progress line shows bytes written, MB/s and the time left.\n",
            mk_target_names());
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[3] = {0};
    int npos = 0, threads = 0;
    int verbose = 1;
    bool pure = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v")) {
            verbose = 2;
        } else if (!strcmp(argv[i], "--pure")) {
            pure = true;
        } else if (!strcmp(argv[i], "--quiet") || !strcmp(argv[i], "-q")) {
            verbose = 0;
        } else if ((!strcmp(argv[i], "--threads") || !strcmp(argv[i], "-t")) && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (argv[i][0] == '-' || npos == 3) {
            fprintf(stderr, "tern quantize: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            pos[npos++] = argv[i];
        }
    }
    if (npos != 3) {
        usage(stderr);
        return 2;
    }
    tern_error_t err = {0};
    if (mk_quantize_file(pos[0], pos[1], pos[2], pure, threads, verbose, &err) != 0) {
        fprintf(stderr, "tern quantize: %s\n", err.msg);
        return 1;
    }
    return 0;
}
