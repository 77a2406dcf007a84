/* What the driver probes share: a millisecond clock, a median, a check that
 * stops the probe on the first failing driver call, and device 0's primary
 * context made current. Header-only, so each probe still builds alone with
 * gcc ... FILE.c -lcuda. */
#ifndef PINMEM_PROBE_H
#define PINMEM_PROBE_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static inline int probe_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of n values (reorders them). */
static inline double probe_median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, probe_cmp_double);
    return v[n / 2];
}

#define TRY(call)                                                    \
    do {                                                             \
        CUresult r_ = (call);                                        \
        if (r_ != CUDA_SUCCESS) {                                    \
            const char *n_ = "?";                                    \
            cuGetErrorName(r_, &n_);                                 \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #call, n_); \
            exit(1);                                                 \
        }                                                            \
    } while (0)

/* Device 0's primary context, current on the calling thread. */
static inline CUcontext probe_context(void)
{
    CUdevice dev;
    CUcontext ctx;
    TRY(cuInit(0));
    TRY(cuDeviceGet(&dev, 0));
    TRY(cuDevicePrimaryCtxRetain(&ctx, dev));
    TRY(cuCtxSetCurrent(ctx));
    return ctx;
}

#endif
