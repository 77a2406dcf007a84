/* Which driver calls a thread may make while another thread captures a graph
 * in global mode: for each call, made on a second thread in the default
 * (global) capture mode and again in relaxed mode, what it returns and
 * whether the capture survives it (cuStreamEndCapture's answer).
 * gcc -O2 -Ibench/probe -I/usr/local/cuda/include bench/probe/capture_calls.c -lcuda -lpthread
 * ./probe_capture_calls */
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "probe.h"

enum { SMALL = 64 << 10, LARGE = 64 << 20 };

typedef struct world {
    CUcontext ctx;
    CUstream mine; /* the second thread's own stream, never capturing */
    CUevent done;  /* recorded and complete before any capture starts */
    CUdeviceptr d;
    void *pageable, *pinned, *to_register;
} world;

typedef CUresult (*call_fn)(world *w);

static CUresult event_query(world *w) { return cuEventQuery(w->done); }
static CUresult event_sync(world *w) { return cuEventSynchronize(w->done); }
static CUresult event_record(world *w) { return cuEventRecord(w->done, w->mine); }
static CUresult stream_query(world *w) { return cuStreamQuery(w->mine); }
static CUresult stream_sync(world *w) { return cuStreamSynchronize(w->mine); }
static CUresult legacy_is_capturing(world *w)
{
    (void)w;
    CUstreamCaptureStatus st;
    return cuStreamIsCapturing(NULL, &st);
}
static CUresult pageable_small(world *w) { return cuMemcpyHtoDAsync(w->d, w->pageable, SMALL, w->mine); }
static CUresult pageable_large(world *w) { return cuMemcpyHtoDAsync(w->d, w->pageable, LARGE, w->mine); }
static CUresult pageable_dtoh(world *w) { return cuMemcpyDtoHAsync(w->pageable, w->d, LARGE, w->mine); }
static CUresult pinned_async(world *w) { return cuMemcpyHtoDAsync(w->d, w->pinned, LARGE, w->mine); }
static CUresult pageable_sync(world *w) { return cuMemcpyHtoD(w->d, w->pageable, LARGE); }
static CUresult host_register(world *w)
{
    CUresult r = cuMemHostRegister(w->to_register, SMALL, 0);
    if (r == CUDA_SUCCESS)
        cuMemHostUnregister(w->to_register);
    return r;
}

static const struct {
    const char *name;
    call_fn fn;
} calls[] = {
    {"cuEventQuery (complete event)", event_query},
    {"cuEventSynchronize (complete event)", event_sync},
    {"cuEventRecord (own stream)", event_record},
    {"cuStreamQuery (own stream)", stream_query},
    {"cuStreamSynchronize (own stream)", stream_sync},
    {"cuStreamIsCapturing (legacy stream)", legacy_is_capturing},
    {"cuMemcpyHtoDAsync pageable 64 KiB", pageable_small},
    {"cuMemcpyHtoDAsync pageable 64 MiB", pageable_large},
    {"cuMemcpyDtoHAsync pageable 64 MiB", pageable_dtoh},
    {"cuMemcpyHtoDAsync pinned 64 MiB", pinned_async},
    {"cuMemcpyHtoD pageable 64 MiB (sync)", pageable_sync},
    {"cuMemHostRegister 64 KiB", host_register},
};

typedef struct job {
    world *w;
    call_fn fn;
    bool relaxed;
    CUresult result;
} job;

static void *second_thread(void *arg)
{
    job *j = arg;
    cuCtxSetCurrent(j->w->ctx);
    if (j->relaxed) {
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        cuThreadExchangeStreamCaptureMode(&mode);
    }
    j->result = j->fn(j->w);
    return NULL;
}

static const char *name_of(CUresult r)
{
    const char *n = "?";
    cuGetErrorName(r, &n);
    return n;
}

int main(void)
{
    world w;
    memset(&w, 0, sizeof w);
    w.ctx = probe_context();
    TRY(cuStreamCreate(&w.mine, CU_STREAM_NON_BLOCKING));
    TRY(cuEventCreate(&w.done, CU_EVENT_DISABLE_TIMING));
    TRY(cuEventRecord(w.done, w.mine));
    TRY(cuEventSynchronize(w.done));
    TRY(cuMemAlloc(&w.d, LARGE));
    TRY(cuMemHostAlloc(&w.pinned, LARGE, 0));
    w.pageable = malloc(LARGE);
    w.to_register = aligned_alloc(4096, SMALL);
    if (!w.pageable || !w.to_register)
        return 1;
    memset(w.pageable, 1, LARGE);
    CUstream capturing;
    TRY(cuStreamCreate(&capturing, CU_STREAM_NON_BLOCKING));
    printf("%-40s %-8s %-40s %s\n", "call on a second thread", "mode", "its result",
           "the global capture ends with");
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        for (int relaxed = 0; relaxed < 2; relaxed++) {
            TRY(cuStreamBeginCapture(capturing, CU_STREAM_CAPTURE_MODE_GLOBAL));
            job j = {&w, calls[i].fn, relaxed, CUDA_SUCCESS};
            pthread_t t;
            pthread_create(&t, NULL, second_thread, &j);
            pthread_join(t, NULL);
            CUgraph g = NULL;
            CUresult end = cuStreamEndCapture(capturing, &g);
            if (g)
                cuGraphDestroy(g);
            printf("%-40s %-8s %-40s %s\n", calls[i].name, relaxed ? "relaxed" : "global",
                   name_of(j.result), name_of(end));
            cuStreamSynchronize(w.mine);
            cuCtxSynchronize();
        }
    }
    return 0;
}
