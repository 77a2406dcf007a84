/* A timeline of the staging engine, for finding where a copy's time goes:
 * with PINMEM_COPY_TRACE=N the engine notes its first N events (a job's
 * start and end, each slice claimed and done, each DMA queued, each wait for
 * a DMA, each worker woken) with a clock reading, and prints them to stderr
 * at exit ("trace NS JOB THREAD EVENT ARG"; thread 0 is a copy's caller,
 * e * 1000 + k with k > 0 worker k - 1 of engine e, and a job's number holds
 * its engine's in its top 8 bits). bench/probe/trace_summary.py reads them.
 * Off (the default), a note costs one predictable branch. */
#ifndef PINMEM_COPY_TRACE_H
#define PINMEM_COPY_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    PM__TRACE_JOB_START, /* arg: KiB, and the direction in the top bit */
    PM__TRACE_JOB_END,
    PM__TRACE_CLAIM,      /* arg: the buffer's index << 16 | the slice's index */
    PM__TRACE_SLICE_DONE, /* arg: as CLAIM */
    PM__TRACE_DMA_QUEUED, /* arg: the buffer's index */
    PM__TRACE_WAIT_BEGIN, /* arg: the buffer's index */
    PM__TRACE_WAIT_END,
    PM__TRACE_WAKE, /* a worker back from sleeping */
} pm__trace_event;

typedef struct pm__trace_record {
    unsigned long long ns;
    uint32_t job, arg;
    uint16_t thread;
    uint8_t event;
} pm__trace_record;

typedef struct pm__trace {
    _Atomic size_t next;
    size_t cap;
    pm__trace_record *records;
} pm__trace;

/* The process's trace, made on the first call when PINMEM_COPY_TRACE asks
 * for one (the records printed at exit); NULL when off. */
pm__trace *pm__trace_get(void);

/* The calling thread in the trace: 0 for a copy's caller (the default),
 * e * 1000 + k for worker k - 1 of engine e, which sets it as it starts. */
extern _Thread_local unsigned pm__trace_thread;

void pm__trace_add(pm__trace *t, pm__trace_event e, unsigned job, unsigned arg);

static inline void pm__trace_note(pm__trace *t, pm__trace_event e, unsigned job, unsigned arg)
{
    if (__builtin_expect(t != NULL, 0))
        pm__trace_add(t, e, job, arg);
}

#endif
