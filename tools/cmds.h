/* cmds.h - the subcommands of the tern binary. Each lives in its own file
 * under tools/ (public API only) or tools/dev/ (internals on purpose);
 * bench/bench.h declares the benchmarks. argv[0] is the subcommand name.
 * Return the process exit status. */
#ifndef TERN_CMDS_H
#define TERN_CMDS_H

int cmd_info(int argc, char **argv);        /* tools/dev/cmd_info.c */
int cmd_threads(int argc, char **argv);     /* tools/dev/cmd_threads.c: tern info --threads */
int cmd_mkmodel(int argc, char **argv);     /* tools/dev/cmd_mkmodel.c */
int cmd_quantize(int argc, char **argv);    /* tools/dev/cmd_quantize.c */
int cmd_tokenize(int argc, char **argv);    /* tools/dev/cmd_tokenize.c */
int cmd_detokenize(int argc, char **argv);  /* tools/dev/cmd_tokenize.c */
int cmd_run(int argc, char **argv);         /* tools/cmd_run.c */
int cmd_chat(int argc, char **argv);        /* tools/cmd_run.c */
int cmd_perplexity(int argc, char **argv);  /* tools/cmd_perplexity.c */
int cmd_bench_model(int argc, char **argv); /* tools/cmd_bench.c: tern bench -m ... */
int cmd_bench_grammar(int argc, char **argv); /* tools/dev/cmd_grammar.c: tern bench grammar */
int cmd_bench_spec(int argc, char **argv);  /* tools/cmd_bench_spec.c: tern bench spec */
int cmd_serve(int argc, char **argv);       /* tools/server/cmd_serve.c: tern serve */

#endif
