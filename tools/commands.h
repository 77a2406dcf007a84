/* The pinmem command's subcommands. Each returns a process exit status. */
#ifndef PINMEM_TOOL_COMMANDS_H
#define PINMEM_TOOL_COMMANDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "baseline.h"
#include "pinmem.h"

int cmd_info(void);
int bench_host(bool quick);
int bench_registry(bool quick);
int bench_pool(bool quick);
/* The pool steady states alone: reserved over used, and where the rest lies. */
int bench_footprint(void);
/* plot_file: where --plot draws bandwidth against size, or NULL. */
int bench_copy(bool quick, const char *plot_file);
/* Copies to and from each device of list ("all", or ordinals such as "0,1"),
 * each alone and all at once (bench_copy_devices.c). */
int bench_copy_devices(bool quick, const char *list);
/* Staged copies alone: the DMA rate for pieces queued from pinned memory, and
 * staged copies of 16 MiB and up, cached against streaming stores, with the
 * engine's time counters. */
int bench_staging(bool quick);

/* The copy benchmarks' buffers: pageable, page-locked and device memory of
 * max bytes each (64 MiB quick, else 1 GiB), and the baseline to compare
 * with. open prints why it failed, as who, and leaves nothing allocated
 * then. */
typedef struct copy_buffers {
    const baseline *bl;
    uint8_t *pageable, *pinned;
    pm_deviceptr dev;
    size_t max;
} copy_buffers;
bool copy_buffers_open(copy_buffers *cb, const char *who, bool quick);
void copy_buffers_close(copy_buffers *cb);

/* Shared by the benchmarks. */
double now_ns(void);
double median(double *v, size_t n);
const char *human_size(size_t bytes, char *buf, size_t cap);
const char *human_time(double ns, char *buf, size_t cap);

#endif
