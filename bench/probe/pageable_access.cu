/* Whether a kernel that reads and writes pageable memory itself beats the
 * driver's pageable copies, on a machine whose GPU can (HMM on a PCIe host,
 * or the host's page tables on Grace Hopper). Staging pays for a CPU copy of
 * every byte; a kernel would not, if the pages stay in host memory and the
 * CPU can write them again at full speed afterwards. Builds for x86-64 and
 * aarch64 alike; on a GPU that cannot read pageable memory it prints the
 * attributes that say so.
 * nvcc -O2 -arch=sm_90 pageable_access.cu -o pageable_access -lcuda */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe.h"
#include "probe_runtime.h"

enum { ROUNDS = 9, THREADS = 256 };

__global__ void move(const int4 *__restrict__ src, int4 *__restrict__ dst, size_t n16)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += stride)
        dst[i] = src[i];
}

static int attribute(cudaDeviceAttr a)
{
    int v = 0;
    TRYRT(cudaDeviceGetAttribute(&v, a, 0));
    return v;
}

typedef struct rates {
    double to, from;    /* GB/s, median of the rounds */
    double first_us;    /* the first kernel's time: pages met for the first time */
    double cpu_rewrite; /* GB/s of the CPU writing the buffer again between rounds */
} rates;

/* Kernels move bytes between host (pageable) and dev; before each round the
 * CPU writes the whole buffer, as a producer would before its next copy. */
static rates kernel_rounds(uint8_t *host, uint8_t *dev, size_t bytes, int blocks, cudaStream_t s)
{
    double to[ROUNDS], from[ROUNDS], cpu[ROUNDS];
    rates r = {0, 0, 0, 0};
    for (int k = 0; k <= ROUNDS; k++) {
        double t0 = now_ms();
        memset(host, 1 + k, bytes);
        double t1 = now_ms();
        move<<<blocks, THREADS, 0, s>>>((const int4 *)host, (int4 *)dev, bytes / 16);
        TRYRT(cudaStreamSynchronize(s));
        double t2 = now_ms();
        move<<<blocks, THREADS, 0, s>>>((const int4 *)dev, (int4 *)host, bytes / 16);
        TRYRT(cudaStreamSynchronize(s));
        double t3 = now_ms();
        if (host[bytes - 1] != (uint8_t)(1 + k)) {
            printf("the kernel's round trip lost bytes\n");
            exit(1);
        }
        if (k == 0) {
            r.first_us = (t2 - t1) * 1e3;
            continue;
        }
        cpu[k - 1] = bytes / (t1 - t0) / 1e6;
        to[k - 1] = bytes / (t2 - t1) / 1e6;
        from[k - 1] = bytes / (t3 - t2) / 1e6;
    }
    r.to = probe_median(to, ROUNDS);
    r.from = probe_median(from, ROUNDS);
    r.cpu_rewrite = probe_median(cpu, ROUNDS);
    return r;
}

/* The DMA engine between dev and host, by the driver's copy calls. */
static rates dma_rounds(uint8_t *host, uint8_t *dev, size_t bytes)
{
    double to[ROUNDS], from[ROUNDS];
    for (int k = 0; k < ROUNDS; k++) {
        double t0 = now_ms();
        TRYRT(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
        double t1 = now_ms();
        TRYRT(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
        double t2 = now_ms();
        to[k] = bytes / (t1 - t0) / 1e6;
        from[k] = bytes / (t2 - t1) / 1e6;
    }
    rates r = {probe_median(to, ROUNDS), probe_median(from, ROUNDS), 0, 0};
    return r;
}

int main(void)
{
    int pageable = attribute(cudaDevAttrPageableMemoryAccess);
    printf("pageable memory access %d, through the host's page tables %d, concurrent managed "
           "access %d, native host atomics %d\n",
           pageable, attribute(cudaDevAttrPageableMemoryAccessUsesHostPageTables),
           attribute(cudaDevAttrConcurrentManagedAccess),
           attribute(cudaDevAttrHostNativeAtomicSupported));
    if (!pageable) {
        printf("this GPU cannot read pageable memory itself (nvidia-smi -q: \"Addressing "
               "Mode\"); nothing to measure\n");
        return 0;
    }
    cudaStream_t s;
    TRYRT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int blocks = 4 * attribute(cudaDevAttrMultiProcessorCount);
    cudaMemLocation on_host = {cudaMemLocationTypeHost, 0};
    printf("GB/s, median of %d rounds; \"first\" is the first kernel's time in us; \"cpu\" is the "
           "CPU writing the buffer again after the GPU touched it\n",
           ROUNDS);
    printf("%8s | %13s | %13s | %25s | %25s\n", "MiB", "pinned to/from", "driver pageable",
           "kernel: to/from first cpu", "host preferred: same");
    for (size_t mib = 1; mib <= 256; mib *= 4) {
        size_t bytes = mib << 20;
        uint8_t *pinned, *dev;
        TRYRT(cudaHostAlloc((void **)&pinned, bytes, 0));
        TRYRT(cudaMalloc((void **)&dev, bytes));
        memset(pinned, 0, bytes);
        rates ceiling = dma_rounds(pinned, dev, bytes);
        uint8_t *plain = (uint8_t *)aligned_alloc(4096, bytes);
        memset(plain, 0, bytes);
        rates driver = dma_rounds(plain, dev, bytes);
        rates direct = kernel_rounds(plain, dev, bytes, blocks, s);
        uint8_t *advised = (uint8_t *)aligned_alloc(4096, bytes);
        memset(advised, 0, bytes);
        TRYRT(cudaMemAdvise(advised, bytes, cudaMemAdviseSetPreferredLocation, on_host));
        rates kept = kernel_rounds(advised, dev, bytes, blocks, s);
        printf("%8zu | %6.1f %6.1f | %6.1f %6.1f | %5.1f %5.1f %6.0f %5.1f | %5.1f %5.1f %6.0f %5.1f\n",
               mib, ceiling.to, ceiling.from, driver.to, driver.from, direct.to, direct.from,
               direct.first_us, direct.cpu_rewrite, kept.to, kept.from, kept.first_us,
               kept.cpu_rewrite);
        free(advised);
        free(plain);
        TRYRT(cudaFree(dev));
        TRYRT(cudaFreeHost(pinned));
    }
    return 0;
}
