/* Which driver calls a thread may make while another thread captures a graph
 * in global mode: for each call, made on a second thread in the default
 * (global) capture mode and again in relaxed mode, what it returns and
 * whether the capture survives it (cuStreamEndCapture's answer). Then the
 * same for the CUDA runtime's calls the preload makes or serves, where a
 * libcudart can be loaded (PROBE_CUDART names one; else the toolkit's).
 * gcc -O2 -Ibench/probe -I/usr/local/cuda/include bench/probe/capture_calls.c -lcuda -lpthread -ldl
 * ./probe_capture_calls */
#include <dlfcn.h>
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

/* The runtime's functions, by hand: the probe builds without its headers.
 * Its streams and events are the driver's; errors are ints. */
static struct {
    int (*memcpy_async)(void *, const void *, size_t, int, CUstream);
    int (*memcpy_sync)(void *, const void *, size_t, int);
    int (*pointer_attributes)(void *, const void *);
    int (*get_device)(int *);
    int (*stream_wait_event)(CUstream, CUevent, unsigned);
    int (*stream_synchronize)(CUstream);
    int (*get_last_error)(void);
    const char *(*error_name)(int);
} rt;
enum { HOST_TO_DEVICE = 1, DEVICE_TO_HOST = 2 };

static bool runtime_load(void)
{
    const char *names[] = {getenv("PROBE_CUDART"), "libcudart.so", "libcudart.so.13",
                           "/usr/local/cuda/lib64/libcudart.so"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++)
        if (names[i])
            lib = dlopen(names[i], RTLD_NOW);
    if (!lib)
        return false;
    static const char *const syms[] = {"cudaMemcpyAsync",        "cudaMemcpy",
                                       "cudaPointerGetAttributes", "cudaGetDevice",
                                       "cudaStreamWaitEvent",    "cudaStreamSynchronize",
                                       "cudaGetLastError",       "cudaGetErrorName"};
    void **slots = (void **)&rt;
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (!(slots[i] = dlsym(lib, syms[i])))
            return false;
    return true;
}

/* A runtime error as the driver's result, for one table: 0 stays success,
 * anything else is reported by name through last_runtime_error. */
static int last_runtime_error;
static CUresult runtime_result(int e)
{
    last_runtime_error = e;
    return e == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

static CUresult rt_pageable_async(world *w)
{
    return runtime_result(rt.memcpy_async((void *)w->d, w->pageable, LARGE, HOST_TO_DEVICE, w->mine));
}
static CUresult rt_pageable_dtoh_async(world *w)
{
    return runtime_result(rt.memcpy_async(w->pageable, (void *)w->d, LARGE, DEVICE_TO_HOST, w->mine));
}
static CUresult rt_pageable_small(world *w)
{
    return runtime_result(rt.memcpy_async((void *)w->d, w->pageable, SMALL, HOST_TO_DEVICE, w->mine));
}
static CUresult rt_pageable_sync(world *w)
{
    return runtime_result(rt.memcpy_sync((void *)w->d, w->pageable, LARGE, HOST_TO_DEVICE));
}
static CUresult rt_pointer_attributes(world *w)
{
    unsigned char attr[1024] __attribute__((aligned(16)));
    return runtime_result(rt.pointer_attributes(attr, w->pageable));
}
static CUresult rt_get_device(world *w)
{
    (void)w;
    int dev;
    return runtime_result(rt.get_device(&dev));
}
static CUresult rt_stream_wait_event(world *w)
{
    return runtime_result(rt.stream_wait_event(w->mine, w->done, 0));
}
static CUresult rt_stream_synchronize(world *w) { return runtime_result(rt.stream_synchronize(w->mine)); }

static const struct {
    const char *name;
    call_fn fn;
} runtime_calls[] = {
    {"cudaMemcpyAsync pageable 64 KiB", rt_pageable_small},
    {"cudaMemcpyAsync pageable 64 MiB", rt_pageable_async},
    {"cudaMemcpyAsync to pageable 64 MiB", rt_pageable_dtoh_async},
    {"cudaMemcpy pageable 64 MiB (sync)", rt_pageable_sync},
    {"cudaPointerGetAttributes", rt_pointer_attributes},
    {"cudaGetDevice", rt_get_device},
    {"cudaStreamWaitEvent (own stream)", rt_stream_wait_event},
    {"cudaStreamSynchronize (own stream)", rt_stream_synchronize},
};

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

/* Runs fn on a second thread while this one captures in global mode: its
 * result, and in *end what ending the capture answered. */
static CUresult beside(world *w, CUstream capturing, call_fn fn, int relaxed, CUresult *end)
{
    TRY(cuStreamBeginCapture(capturing, CU_STREAM_CAPTURE_MODE_GLOBAL));
    job j = {w, fn, relaxed, CUDA_SUCCESS};
    pthread_t t;
    pthread_create(&t, NULL, second_thread, &j);
    pthread_join(t, NULL);
    CUgraph g = NULL;
    *end = cuStreamEndCapture(capturing, &g);
    if (g)
        cuGraphDestroy(g);
    cuStreamSynchronize(w->mine);
    cuCtxSynchronize();
    return j.result;
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
    CUresult end;
    printf("%-40s %-8s %-40s %s\n", "call on a second thread", "mode", "its result",
           "the global capture ends with");
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++)
        for (int relaxed = 0; relaxed < 2; relaxed++)
            printf("%-40s %-8s %-40s %s\n", calls[i].name, relaxed ? "relaxed" : "global",
                   name_of(beside(&w, capturing, calls[i].fn, relaxed, &end)), name_of(end));
    if (!runtime_load()) {
        printf("\nno libcudart could be loaded (PROBE_CUDART names one): runtime calls not probed\n");
        return 0;
    }
    printf("\n%-40s %-8s %-40s %s\n", "runtime call on a second thread", "mode", "its result",
           "the global capture ends with");
    for (size_t i = 0; i < sizeof runtime_calls / sizeof runtime_calls[0]; i++)
        for (int relaxed = 0; relaxed < 2; relaxed++) {
            beside(&w, capturing, runtime_calls[i].fn, relaxed, &end);
            printf("%-40s %-8s %-40s %s\n", runtime_calls[i].name, relaxed ? "relaxed" : "global",
                   last_runtime_error ? rt.error_name(last_runtime_error) : "cudaSuccess",
                   name_of(end));
            rt.get_last_error(); /* the next row starts clean */
        }
    return 0;
}
