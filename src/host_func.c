#include "host_func.h"

#include <stdlib.h>

#include "errors.h"

_Thread_local unsigned char pm__thread_calls __attribute__((tls_model("initial-exec")));

typedef struct pm__host_func {
    void (*fn)(void *arg);
    void *arg;
} pm__host_func;

void *pm__host_func_wrap(void (*fn)(void *arg), void *arg)
{
    pm__host_func *h = malloc(sizeof *h);
    if (h)
        *h = (pm__host_func){fn, arg};
    return h;
}

void pm__host_func_run(void *wrapped)
{
    pm__host_func h = *(pm__host_func *)wrapped;
    free(wrapped);
    /* A host function that launches another runs the inner one later, on
     * its own; the mark is the thread's, for the length of this one. */
    unsigned char outer = pm__thread_calls;
    pm__thread_calls = PM__THREAD_IN_HOST_FUNC;
    h.fn(h.arg);
    pm__thread_calls = outer;
}

__attribute__((cold, noinline)) pm_result pm__host_func_refusal(const char *call)
{
    return pm__fail(PM_ERROR_NOT_PERMITTED,
                    "%s: called inside a host function (pm_stream_launch_host_func or "
                    "cuLaunchHostFunc), where the driver permits no call that allocates, frees, "
                    "registers, asks about or copies memory, makes or destroys streams, events "
                    "or pools, asks about devices or uses the legacy or per-thread default "
                    "stream, and pinmem none that reads or changes the copy engine's settings, "
                    "which may wait for copies waiting for the function",
                    call);
}
