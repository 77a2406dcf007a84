/* How fast the DMA engine reads page-locked memory while CPU threads copy
 * through host memory, as the staging fillers do, with the DMAs queued on one
 * stream or spread over several (the driver may give each stream its own copy
 * engine, each with its own reads in flight).
 * gcc -O2 -mavx2 -pthread -I/usr/local/cuda/include dma_load.c -lcuda */
#include <cuda.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "probe.h"

enum { PIECE = 4 << 20, TOTAL = 256 << 20, LOAD_SRC = 1 << 30, LOAD_DST = 64 << 20, REPS = 5 };

static atomic_bool stop_load;
static uint8_t *load_src, *load_dst;

/* Copies 512 KiB slices from a large pageable buffer into a pinned one with
 * streaming stores, round and round, as a filler does. */
static void *load_main(void *arg)
{
    size_t k = (size_t)(uintptr_t)arg * 97;
    const size_t slice = 512 << 10;
    while (!atomic_load_explicit(&stop_load, memory_order_relaxed)) {
        const __m256i *s = (const __m256i *)(load_src + (k * slice) % LOAD_SRC);
        __m256i *d = (__m256i *)(load_dst + (k * slice) % LOAD_DST);
        for (size_t i = 0; i < slice / 32; i += 4) {
            __m256i a = _mm256_loadu_si256(s + i), b = _mm256_loadu_si256(s + i + 1);
            __m256i c = _mm256_loadu_si256(s + i + 2), e = _mm256_loadu_si256(s + i + 3);
            _mm256_stream_si256(d + i, a);
            _mm256_stream_si256(d + i + 1, b);
            _mm256_stream_si256(d + i + 2, c);
            _mm256_stream_si256(d + i + 3, e);
        }
        k++;
    }
    _mm_sfence();
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void)
{
    probe_context();
    void *pinned;
    CUdeviceptr d;
    TRY(cuMemHostAlloc(&pinned, TOTAL, 0));
    TRY(cuMemHostAlloc((void **)&load_dst, LOAD_DST, 0));
    TRY(cuMemAlloc(&d, TOTAL));
    load_src = malloc(LOAD_SRC);
    memset(load_src, 1, LOAD_SRC);
    memset(pinned, 2, TOTAL);
    memset(load_dst, 3, LOAD_DST);
    CUstream streams[4];
    for (int i = 0; i < 4; i++)
        TRY(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING));
    printf("DMA host to device of %d MiB in %d MiB pieces from cuMemHostAlloc memory, while "
           "threads copy with streaming stores (median of %d)\n",
           TOTAL >> 20, PIECE >> 20, REPS);
    static const int loads[] = {0, 4, 8, 12};
    static const int stream_counts[] = {1, 2, 4};
    for (size_t li = 0; li < sizeof loads / sizeof *loads; li++) {
        pthread_t th[16];
        atomic_store(&stop_load, false);
        for (int t = 0; t < loads[li]; t++)
            pthread_create(&th[t], NULL, load_main, (void *)(uintptr_t)t);
        double gb[3][REPS];
        for (int k = 0; k < REPS; k++)
            for (size_t si = 0; si < 3; si++) {
                int ns = stream_counts[si];
                double t0 = now_ms();
                for (size_t off = 0, p = 0; off < TOTAL; off += PIECE, p++)
                    TRY(cuMemcpyHtoDAsync(d + off, (uint8_t *)pinned + off, PIECE, streams[p % ns]));
                for (int i = 0; i < ns; i++)
                    TRY(cuStreamSynchronize(streams[i]));
                gb[si][k] = TOTAL / (now_ms() - t0) / 1e6;
            }
        atomic_store(&stop_load, true);
        for (int t = 0; t < loads[li]; t++)
            pthread_join(th[t], NULL);
        printf("%2d loading threads:", loads[li]);
        for (size_t si = 0; si < 3; si++) {
            qsort(gb[si], REPS, sizeof(double), cmp);
            printf("  %d stream%s %5.1f GB/s", stream_counts[si], stream_counts[si] > 1 ? "s" : " ",
                   gb[si][REPS / 2]);
        }
        printf("\n");
    }
    return 0;
}
