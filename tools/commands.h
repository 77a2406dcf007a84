/* The pinmem command's subcommands. Each returns a process exit status. */
#ifndef PINMEM_TOOL_COMMANDS_H
#define PINMEM_TOOL_COMMANDS_H

#include <stdbool.h>
#include <stddef.h>

int cmd_info(void);
int bench_host(bool quick);
int bench_registry(bool quick);
int bench_pool(bool quick);
/* plot_file: where --plot draws bandwidth against size, or NULL. */
int bench_copy(bool quick, const char *plot_file);
/* Staged copies alone: the DMA rate for pieces queued from pinned memory, and
 * staged copies of 16 MiB and up, cached against streaming stores, with the
 * engine's time counters. */
int bench_staging(bool quick);

/* Shared by the benchmarks. */
double now_ns(void);
double median(double *v, size_t n);
const char *human_size(size_t bytes, char *buf, size_t cap);
const char *human_time(double ns, char *buf, size_t cap);

#endif
