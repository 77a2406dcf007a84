/* Whether a call that queues work behind a host function waits, in the
 * call, for that function: cuStreamWriteValue32 (pinmem's markers in a
 * context the user made) and cuEventRecord (its markers elsewhere), on the
 * legacy stream and on a stream of its own, in a context made with
 * cuCtxCreate and in the primary context: 3,000 calls in a row behind a
 * host function that sleeps 200 ms, the first and the slowest of them.
 * gcc -O2 -Ibench/probe -I/usr/local/cuda/include bench/probe/host_func_write.c -lcuda
 * ./probe_host_func_write */
#include <unistd.h>

#include "probe.h"

enum { HOST_FUNC_MS = 200, OPS = 3000 };

static void CUDA_CB sleep_a_while(void *arg)
{
    (void)arg;
    usleep(HOST_FUNC_MS * 1000);
}

/* The slowest of OPS calls in a row behind one host function, and which. */
static void time_behind(const char *where, CUstream s, CUdeviceptr word, CUevent ev)
{
    const char *names[2] = {"cuStreamWriteValue32", "cuEventRecord"};
    for (int kind = 0; kind < 2; kind++) {
        TRY(cuLaunchHostFunc(s, sleep_a_while, NULL));
        double slowest = 0, first = 0;
        int which = 0;
        for (int i = 0; i < OPS; i++) {
            double t0 = now_ms();
            if (kind == 0)
                TRY(cuStreamWriteValue32(s, word, (cuuint32_t)(i + 1), 0));
            else
                TRY(cuEventRecord(ev, s));
            const double ms = now_ms() - t0;
            if (i == 0)
                first = ms;
            if (ms > slowest) {
                slowest = ms;
                which = i;
            }
        }
        TRY(cuStreamSynchronize(s));
        printf("%-40s %-22s first %7.3f ms, slowest of %d: #%d, %7.3f ms\n", where, names[kind],
               first, OPS, which, slowest);
    }
}

static void in_context(const char *name, CUcontext ctx, CUdeviceptr word)
{
    char where[64];
    CUstream own;
    CUevent ev;
    TRY(cuCtxPushCurrent(ctx));
    TRY(cuStreamCreate(&own, CU_STREAM_NON_BLOCKING));
    TRY(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    snprintf(where, sizeof where, "%s, legacy stream", name);
    time_behind(where, CU_STREAM_LEGACY, word, ev);
    snprintf(where, sizeof where, "%s, a stream of its own", name);
    time_behind(where, own, word, ev);
    TRY(cuEventDestroy(ev));
    TRY(cuStreamDestroy(own));
    CUcontext popped;
    TRY(cuCtxPopCurrent(&popped));
}

int main(void)
{
    CUcontext primary = probe_context();
    CUdevice dev;
    TRY(cuCtxGetDevice(&dev));
    void *host;
    CUdeviceptr word;
    TRY(cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    TRY(cuMemHostGetDevicePointer(&word, host, 0));
    CUcontext theirs;
    CUctxCreateParams params = {0};
    TRY(cuCtxCreate(&theirs, &params, 0, dev));
    CUcontext popped;
    TRY(cuCtxPopCurrent(&popped));
    printf("each host function sleeps %d ms\n", HOST_FUNC_MS);
    in_context("cuCtxCreate context", theirs, word);
    in_context("primary context", primary, word);
    TRY(cuCtxDestroy(theirs));
    TRY(cuMemFreeHost(host));
    return 0;
}
