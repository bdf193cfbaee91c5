/* bench.h - the benchmarks' entry points, subcommands of the tern binary
 * (tools/tern.c): argv[0] is the subcommand name; they return the process
 * exit status. bench/probe.h is the read-bandwidth probe they share with
 * `tern bench -m` (tools/cmd_bench.c). */
#ifndef TERN_BENCH_H
#define TERN_BENCH_H

int bench_pool_main(int argc, char **argv);    /* bench/bench_pool.c: tern bench pool */
int bench_kernels_main(int argc, char **argv); /* bench/bench_kernels.c: tern bench kernels */

#endif
