/* The sections of pinmem bench copy: copies by size in each direction
 * (bench_copy.c), both directions at once (bench_copy_both.c), batches
 * of scattered blocks (bench_copy_batch.c) and copies on the thread's own
 * stream (bench_copy_streams.c). Each prints its table, adds its
 * main figures to a one-line summary (for scripts that compare settings)
 * and, for --plot, its rows. */
#ifndef PINMEM_TOOL_BENCH_COPY_H
#define PINMEM_TOOL_BENCH_COPY_H

#include <stdbool.h>
#include <stddef.h>

#include "commands.h"

/* The longest --plot name: FILE.dat and FILE.gp must fit a path. */
enum { PLOT_NAME_MAX = 4096 - sizeof ".dat" };

/* "summary: key=value ...", filled as the sections run. */
typedef struct copy_summary {
    char text[4096];
} copy_summary;
void summary_add(copy_summary *s, const char *key, double value);

/* A size as the summary and the plot's labels write it: 4K, 256K, 1M, 1G. */
const char *short_size(size_t bytes, char *buf, size_t cap);

/* Each returns whether a copy failed. */
bool bench_copy_both(const copy_buffers *cb, bool quick, bool own_streams, copy_summary *sum);
/* Pageable copies on PM_STREAM_PER_THREAD against a stream of its own
 * (bench_copy_streams.c). */
bool bench_copy_streams(const copy_buffers *cb, bool quick, copy_summary *sum);
/* rows: for the plot, one line a row: label, then GB/s of pinmem's batch
 * from pageable blocks, the driver's copy a block, one contiguous pinned
 * copy, pinmem's batch from pinned blocks. */
bool bench_copy_batch(const copy_buffers *cb, bool quick, copy_summary *sum, char *rows,
                      size_t cap);

#endif
