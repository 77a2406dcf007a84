/* Calls made inside a host function (pm_stream_launch_host_func) answer as
 * the driver's do there: it refuses every call that allocates, frees,
 * registers, asks about or copies memory, makes or destroys a stream, event
 * or pool, or uses the legacy or per-thread default stream, with
 * NOT_PERMITTED, and lets queries, waits and records on other streams through
 * (docs/driver-behavior.md, "Calls inside a host function"). */
#ifndef PINMEM_HOST_FUNC_H
#define PINMEM_HOST_FUNC_H

#include <stdbool.h>

#include "pinmem.h"

/* Whether the calling thread runs a user's host function now. */
extern _Thread_local bool pm__in_host_func __attribute__((tls_model("initial-exec")));

/* Runs the user's fn(arg) with pm__in_host_func set; arg is a pm__host_func
 * from pm__host_func_wrap, which it frees. */
void pm__host_func_run(void *wrapped);
/* The user's function and argument for pm__host_func_run; NULL when out of memory. */
void *pm__host_func_wrap(void (*fn)(void *arg), void *arg);

/* NOT_PERMITTED, its detail naming call. */
pm_result pm__host_func_refusal(const char *call);

/* The first statement of a call the driver refuses inside a host function. */
#define PM__REFUSED_IN_HOST_FUNC(call)                \
    do {                                              \
        if (pm__in_host_func)                         \
            return pm__host_func_refusal(call);       \
    } while (0)

#endif
