/* What the probes written against the CUDA runtime (the .cu ones) share
 * besides probe.h: a check that stops the probe on the first failing
 * runtime call. */
#ifndef PINMEM_PROBE_RUNTIME_H
#define PINMEM_PROBE_RUNTIME_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define TRYRT(call)                                                                      \
    do {                                                                                 \
        cudaError_t r_ = (call);                                                         \
        if (r_ != cudaSuccess) {                                                         \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(r_)); \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#endif
