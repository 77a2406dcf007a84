/* What a cuEventSynchronize already waiting does when another thread
 * records its event again. Stream s is held up by a host function (500 ms
 * at most); event e is recorded behind it and a thread waits in
 * cuEventSynchronize(e). The main thread then records e on an idle stream
 * and notes whether the waiting thread returns before s's work is done
 * (it followed the new capture) or only after (it kept the one it began
 * with); then the same with the record made inside the host function, as
 * pinmem's test_host_func_calls does.
 * gcc -O2 -Ibench/probe -I/usr/local/cuda/include bench/probe/event_rerecord_wait.c -lcuda -lpthread
 * ./probe_event_rerecord_wait */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include "probe.h"

static atomic_int gate_open, waiter_done, waiting;
static CUevent e;
static CUstream idle;
static CUresult inside;

static void CUDA_CB hold_up(void *record_inside)
{
    while (!atomic_load(&waiting))
        usleep(1000);
    usleep(50000); /* the waiter is in cuEventSynchronize by now */
    if (record_inside)
        inside = cuEventRecord(e, idle);
    for (int ms = 0; ms < 500 && !atomic_load(&gate_open); ms++)
        usleep(1000);
}

static void *wait_event(void *arg)
{
    CUcontext ctx = arg;
    TRY(cuCtxSetCurrent(ctx));
    atomic_store(&waiting, 1);
    CUresult rc = cuEventSynchronize(e);
    atomic_store(&waiter_done, rc == CUDA_SUCCESS ? 1 : -1);
    return NULL;
}

static void run(const char *what, CUcontext ctx, CUstream s, bool record_inside)
{
    atomic_store(&gate_open, 0);
    atomic_store(&waiter_done, 0);
    atomic_store(&waiting, 0);
    TRY(cuLaunchHostFunc(s, hold_up, record_inside ? (void *)1 : NULL));
    TRY(cuEventRecord(e, s));
    pthread_t t;
    if (pthread_create(&t, NULL, wait_event, ctx) != 0)
        exit(1);
    while (!atomic_load(&waiting))
        usleep(1000);
    usleep(100000);
    double t0 = now_ms();
    if (!record_inside)
        TRY(cuEventRecord(e, idle));
    TRY(cuStreamSynchronize(idle));
    while (!atomic_load(&waiter_done) && now_ms() - t0 < 300)
        usleep(1000);
    int before_work = atomic_load(&waiter_done);
    atomic_store(&gate_open, 1);
    pthread_join(t, NULL);
    TRY(cuStreamSynchronize(s));
    printf("%-40s the waiting cuEventSynchronize %s%s\n", what,
           before_work == 1   ? "returned before s's work was done (followed the new record)"
           : before_work == 0 ? "returned only after s's work (kept its capture)"
                              : "failed",
           record_inside && inside != CUDA_SUCCESS ? " (the record inside failed)" : "");
}

int main(void)
{
    CUcontext ctx = probe_context();
    CUstream s;
    TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    TRY(cuStreamCreate(&idle, CU_STREAM_NON_BLOCKING));
    TRY(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    run("recorded again by another thread:", ctx, s, false);
    run("recorded again inside the host function:", ctx, s, true);
    TRY(cuEventDestroy(e));
    TRY(cuStreamDestroy(s));
    TRY(cuStreamDestroy(idle));
    return 0;
}
