/* The staging engine's timeline (trace.h). */
#include "trace.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "../clock.h"
#include "../options.h"

_Thread_local unsigned pm__trace_thread;

static pm__trace trace;
static pm__trace *made;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const char *const names[] = {"job_start",  "job_end",    "claim",    "slice_done",
                                    "dma_queued", "wait_begin", "wait_end", "wake"};

/* Every note made by then; a worker still noting is not waited for, so the
 * last records may be missing. */
static void print_at_exit(void)
{
    size_t n = atomic_load(&trace.next);
    n = n < trace.cap ? n : trace.cap;
    for (size_t i = 0; i < n; i++) {
        const pm__trace_record *r = &trace.records[i];
        if (r->ns)
            fprintf(stderr, "trace %llu %u %u %s %u\n", r->ns, r->job, r->thread,
                    names[r->event], r->arg);
    }
}

static void make(void)
{
    unsigned long long cap = pm__option_value(PM__OPT_COPY_TRACE);
    if (cap == 0 || !(trace.records = calloc((size_t)cap, sizeof *trace.records)))
        return;
    trace.cap = (size_t)cap;
    if (atexit(print_at_exit) == 0)
        made = &trace;
}

pm__trace *pm__trace_get(void)
{
    pthread_once(&once, make);
    return made;
}

void pm__trace_add(pm__trace *t, pm__trace_event e, unsigned job, unsigned arg)
{
    size_t i = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
    if (i < t->cap)
        t->records[i] =
            (pm__trace_record){pm__now_ns(), job, arg, (uint16_t)pm__trace_thread, (uint8_t)e};
}
