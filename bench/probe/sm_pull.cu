/* Whether the GPU's own threads read page-locked host memory faster than the
 * DMA engine does while CPU threads copy through host memory, as the staging
 * fillers do. The DMA engine slows under such copies (dma_load.c); if the
 * slowdown is the reads it keeps in flight waiting longer, a kernel with tens
 * of thousands of loads in flight through the mapped pointer may keep more of
 * the link busy.
 * nvcc -O2 -arch=sm_90 -Xcompiler -mavx2 sm_pull.cu -o sm_pull -lcuda */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "copy_load.h"
#include "probe.h"
#include "probe_runtime.h"

enum { PIECE = 4 << 20, TOTAL = 256 << 20, REPS = 5, THREADS = 256, UNROLL = 4 };

/* Each thread keeps UNROLL 16-byte loads in flight; a warp's loads of one
 * round cover UNROLL whole 512-byte runs. */
__global__ void pull(const int4 *__restrict__ src, int4 *__restrict__ dst, size_t n16)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < n16; i += UNROLL * stride) {
        int4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            v[u] = src[i + u * stride];
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            dst[i + u * stride] = v[u];
    }
    for (; i < n16; i += stride)
        dst[i] = src[i];
}

/* Ways to move TOTAL bytes: the DMA engine in PIECE DMAs, or kernels of
 * `blocks` blocks pulling PIECE bytes each (blocks 0: one DMA per piece). */
static const int ways[] = {0, 16, 33, 66, 132, 264};
enum { WAYS = sizeof ways / sizeof *ways };

static double move_once(int blocks, uint8_t *host, uint8_t *dev_of_host, uint8_t *dev,
                        cudaStream_t s)
{
    double t0 = now_ms();
    for (size_t off = 0; off < TOTAL; off += PIECE) {
        if (blocks == 0)
            TRYRT(cudaMemcpyAsync(dev + off, host + off, PIECE, cudaMemcpyHostToDevice, s));
        else
            pull<<<blocks, THREADS, 0, s>>>((const int4 *)(dev_of_host + off), (int4 *)(dev + off),
                                            PIECE / 16);
    }
    TRYRT(cudaStreamSynchronize(s));
    return TOTAL / (now_ms() - t0) / 1e6;
}

int main(void)
{
    uint8_t *host, *dev_of_host, *dev;
    TRYRT(cudaHostAlloc((void **)&host, TOTAL, cudaHostAllocMapped));
    TRYRT(cudaHostGetDevicePointer((void **)&dev_of_host, host, 0));
    uint8_t *load_pinned;
    TRYRT(cudaHostAlloc((void **)&load_pinned, LOAD_DST, 0));
    load_prepare(load_pinned);
    TRYRT(cudaMalloc((void **)&dev, TOTAL));
    for (size_t i = 0; i < TOTAL; i++)
        host[i] = (uint8_t)(i * 131 + 7);
    cudaStream_t s;
    TRYRT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int sms = 0;
    TRYRT(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

    /* The kernel must move the bytes it is timed on. */
    TRYRT(cudaMemset(dev, 0, TOTAL));
    move_once(132, host, dev_of_host, dev, s);
    uint8_t *back = (uint8_t *)malloc(TOTAL);
    TRYRT(cudaMemcpy(back, dev, TOTAL, cudaMemcpyDeviceToHost));
    printf("kernel copy %s; %d SMs\n", memcmp(back, host, TOTAL) == 0 ? "checked" : "WRONG", sms);
    free(back);

    printf("host to device of %d MiB in %d MiB pieces from cudaHostAlloc memory, while threads "
           "copy with streaming stores (GB/s, median of %d)\n",
           TOTAL >> 20, PIECE >> 20, REPS);
    printf("%-8s %9s", "copiers", "DMA");
    for (int w = 1; w < WAYS; w++)
        printf("  %4d blocks", ways[w]);
    printf("\n");
    static const int loads[] = {0, 4, 8, 12};
    for (size_t li = 0; li < sizeof loads / sizeof *loads; li++) {
        pthread_t th[LOAD_MAX_THREADS];
        load_start(th, loads[li]);
        double gb[WAYS][REPS];
        for (int k = 0; k < REPS; k++)
            for (int w = 0; w < WAYS; w++)
                gb[w][k] = move_once(ways[w], host, dev_of_host, dev, s);
        load_stop(th, loads[li]);
        printf("%-8d", loads[li]);
        for (int w = 0; w < WAYS; w++) {
            printf(w == 0 ? " %9.1f" : "  %11.1f", probe_median(gb[w], REPS));
        }
        printf("\n");
    }
    return 0;
}
