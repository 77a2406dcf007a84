/* Whether making an event waits for a host function running on another
 * stream. While a host function holds stream s up (it returns after 500 ms
 * at the latest), the main thread creates events, on its own stream records
 * them and destroys them, and notes every call that took 300 ms or more:
 * such a call waited for the host function. Then the same with events kept
 * (created and never destroyed), so that the driver must find room for more,
 * and, for a baseline, with no host function running.
 * gcc -O2 -Ibench/probe -I/usr/local/cuda/include bench/probe/event_create.c -lcuda -lpthread
 * ./probe_event_create */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include "probe.h"

enum { CALLS = 20000, MOST_WAITS = 4 };

static atomic_int gate_open;

static void CUDA_CB hold_up(void *arg)
{
    (void)arg;
    for (int ms = 0; ms < 500 && !atomic_load(&gate_open); ms++)
        usleep(1000);
}

static void close_gate(CUstream s)
{
    atomic_store(&gate_open, 0);
    TRY(cuLaunchHostFunc(s, hold_up, NULL));
    usleep(2000); /* the host function is running */
}

static void open_gate(CUstream s)
{
    atomic_store(&gate_open, 1);
    TRY(cuStreamSynchronize(s));
}

/* calls rounds of create (and record, and destroy unless keep), each timed. */
static void run(const char *what, CUstream held, CUstream mine, bool hold, bool keep)
{
    static CUevent kept[CALLS];
    int waits = 0, first_wait = -1;
    double slowest = 0, total = 0;
    if (hold)
        close_gate(held);
    int i = 0;
    for (; i < CALLS && waits < MOST_WAITS; i++) {
        CUevent ev;
        double t0 = now_ms();
        TRY(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
        TRY(cuEventRecord(ev, mine));
        if (keep)
            kept[i] = ev;
        else
            TRY(cuEventDestroy(ev));
        double took = now_ms() - t0;
        total += took;
        slowest = took > slowest ? took : slowest;
        if (took >= 300) {
            if (first_wait < 0)
                first_wait = i;
            waits++;
            if (hold)
                close_gate(held); /* it ran out: hold the stream up again */
        }
    }
    if (hold)
        open_gate(held);
    TRY(cuStreamSynchronize(mine));
    if (keep)
        for (int k = 0; k < i; k++)
            TRY(cuEventDestroy(kept[k]));
    printf("%-44s %6d calls  %d waited (first at call %d)  mean %.4f ms  slowest %.1f ms\n", what,
           i, waits, first_wait, total / i, slowest);
}

int main(void)
{
    probe_context();
    CUstream held, mine;
    TRY(cuStreamCreate(&held, CU_STREAM_NON_BLOCKING));
    TRY(cuStreamCreate(&mine, CU_STREAM_NON_BLOCKING));
    run("create, record, destroy; nothing held up", held, mine, false, false);
    run("create, record, destroy; a host function", held, mine, true, false);
    run("create, record, keep; nothing held up", held, mine, false, true);
    run("create, record, keep; a host function", held, mine, true, true);
    TRY(cuStreamDestroy(held));
    TRY(cuStreamDestroy(mine));
    return 0;
}
