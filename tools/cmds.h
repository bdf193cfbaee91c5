/* cmds.h - the subcommands of the tern binary. Each lives in its own file
 * under tools/ or bench/; argv[0] is the subcommand name. Return the process
 * exit status. */
#ifndef TERN_CMDS_H
#define TERN_CMDS_H

int cmd_info(int argc, char **argv);        /* tools/cmd_info.c */
int cmd_threads(int argc, char **argv);     /* tools/cmd_threads.c: tern info --threads */
int cmd_mkmodel(int argc, char **argv);     /* tools/cmd_mkmodel.c */
int cmd_quantize(int argc, char **argv);    /* tools/cmd_quantize.c */
int cmd_tokenize(int argc, char **argv);    /* tools/cmd_tokenize.c */
int cmd_detokenize(int argc, char **argv);  /* tools/cmd_tokenize.c */
int cmd_run(int argc, char **argv);         /* tools/cmd_run.c */
int cmd_chat(int argc, char **argv);        /* tools/cmd_run.c */
int cmd_perplexity(int argc, char **argv);  /* tools/cmd_perplexity.c */
int cmd_bench_model(int argc, char **argv); /* tools/cmd_bench.c: tern bench -m ... */
int bench_pool_main(int argc, char **argv);    /* bench/bench_pool.c: tern bench pool */
int bench_kernels_main(int argc, char **argv); /* bench/bench_kernels.c: tern bench kernels */

#endif
