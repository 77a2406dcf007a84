/* Calls made inside a host function (pm_stream_launch_host_func, or the
 * driver's cuLaunchHostFunc called by another library) answer as
 * the driver's do there: it refuses every call that allocates, frees,
 * registers, asks about or copies memory, makes or destroys a stream, event
 * or pool, asks about devices, or uses the legacy or per-thread default
 * stream, with NOT_PERMITTED, and lets queries, waits and records on other
 * streams through (docs/driver-behavior.md, "Calls inside a host function");
 * pinmem also refuses there the calls that read or change the copy engine's
 * settings, which may wait for copies waiting for the function. */
#ifndef PINMEM_HOST_FUNC_H
#define PINMEM_HOST_FUNC_H

#include <stdbool.h>

#include "pinmem.h"

/* What the calling thread is known to be. A thread the program made is
 * asked about once, at its first call the driver refuses inside host
 * functions, and is then FREE for good. The driver's thread that runs host
 * functions is never FREE: inside pinmem's own host functions it is
 * IN_HOST_FUNC, and inside another library's it stays UNASKED and is asked
 * again at each such call. */
typedef enum pm__thread_kind {
    PM__THREAD_UNASKED = 0,
    PM__THREAD_FREE,
    PM__THREAD_IN_HOST_FUNC,
} pm__thread_kind;
extern _Thread_local unsigned char pm__thread_calls __attribute__((tls_model("initial-exec")));

/* Whether the calling thread is known to run no host function: the pools'
 * fast paths take only such threads, the rest go the way that checks. */
static inline bool pm__thread_calls_free(void) { return pm__thread_calls == PM__THREAD_FREE; }

/* Whether the calling thread is running a host function: the thread's mark,
 * else the backend's answer (cuda: the driver refuses cuCtxGetCurrent on
 * its thread that runs host functions), which marks a thread of the
 * program FREE. Defined by the instance, which holds the backend. */
bool pm__host_func_thread_check(void);

/* Runs the user's fn(arg) with the thread marked IN_HOST_FUNC; arg is a
 * pm__host_func from pm__host_func_wrap, which it frees. */
void pm__host_func_run(void *wrapped);
/* The user's function and argument for pm__host_func_run; NULL when out of memory. */
void *pm__host_func_wrap(void (*fn)(void *arg), void *arg);

/* NOT_PERMITTED, its detail naming call. */
pm_result pm__host_func_refusal(const char *call);

/* The first statement of a call the driver refuses inside a host function. */
#define PM__REFUSED_IN_HOST_FUNC(call)                \
    do {                                              \
        if (!pm__thread_calls_free() &&               \
            pm__host_func_thread_check())             \
            return pm__host_func_refusal(call);       \
    } while (0)

#endif
