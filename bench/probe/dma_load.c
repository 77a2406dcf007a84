/* How fast the DMA engine reads page-locked memory while CPU threads copy
 * through host memory, as the staging fillers do, with the DMAs queued on one
 * stream or spread over several (the driver may give each stream its own copy
 * engine, each with its own reads in flight); how fast both directions run at
 * once under the same load; and the threads' own copy rate meanwhile. A
 * staged copy both ways at once needs the threads to copy every byte and
 * the DMA engines to move it, so the lesser of the last two bounds it.
 * `./probe_dma_load wc` makes the memory the DMA engine reads and the threads
 * write write-combined (CU_MEMHOSTALLOC_WRITECOMBINED), which the bus reads
 * without snooping the CPUs' caches, as a ring for copies to the device
 * could be.
 * gcc -O2 -mavx2 -pthread -I/usr/local/cuda/include dma_load.c -lcuda */
#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "copy_load.h"
#include "probe.h"

enum { PIECE = 4 << 20, TOTAL = 256 << 20, REPS = 5 };

/* Both directions at once: TOTAL bytes each way in PIECE DMAs, the two
 * streams fed in turn; both ways' bytes over the time until both are done. */
static double both_ways(CUdeviceptr d, CUdeviceptr d_src, void *pinned, void *pinned_dst,
                        CUstream up, CUstream down)
{
    double t0 = now_ms();
    for (size_t off = 0; off < TOTAL; off += PIECE) {
        TRY(cuMemcpyHtoDAsync(d + off, (uint8_t *)pinned + off, PIECE, up));
        TRY(cuMemcpyDtoHAsync((uint8_t *)pinned_dst + off, d_src + off, PIECE, down));
    }
    TRY(cuStreamSynchronize(up));
    TRY(cuStreamSynchronize(down));
    return 2.0 * TOTAL / (now_ms() - t0) / 1e6;
}

int main(int argc, char **argv)
{
    probe_context();
    const bool wc = argc > 1 && strcmp(argv[1], "wc") == 0;
    const unsigned flags = wc ? CU_MEMHOSTALLOC_WRITECOMBINED : 0;
    void *pinned, *pinned_dst;
    CUdeviceptr d, d_src;
    TRY(cuMemHostAlloc(&pinned, TOTAL, flags));
    TRY(cuMemHostAlloc(&pinned_dst, TOTAL, 0));
    void *load_pinned;
    TRY(cuMemHostAlloc(&load_pinned, LOAD_DST, flags));
    load_prepare(load_pinned);
    TRY(cuMemAlloc(&d, TOTAL));
    TRY(cuMemAlloc(&d_src, TOTAL));
    memset(pinned, 2, TOTAL);
    memset(pinned_dst, 4, TOTAL);
    TRY(cuMemsetD8(d_src, 5, TOTAL));
    CUstream streams[4];
    for (int i = 0; i < 4; i++)
        TRY(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING));
    printf("DMA host to device of %d MiB in %d MiB pieces from cuMemHostAlloc memory%s, while "
           "threads copy with streaming stores (median of %d); both ways: as much again from "
           "the device at once, on a second stream; threads: their own copy rate meanwhile\n",
           TOTAL >> 20, PIECE >> 20, wc ? " (write-combined, as the threads' destination)" : "",
           REPS);
    static const int loads[] = {0, 4, 8, 12, 15};
    static const int stream_counts[] = {1, 2, 4};
    for (size_t li = 0; li < sizeof loads / sizeof *loads; li++) {
        pthread_t th[LOAD_MAX_THREADS];
        load_start(th, loads[li]);
        double gb[3][REPS], both[REPS];
        unsigned long long copied0 = __atomic_load_n(&load_copied, __ATOMIC_RELAXED);
        double t_load = now_ms();
        for (int k = 0; k < REPS; k++) {
            for (size_t si = 0; si < 3; si++) {
                int ns = stream_counts[si];
                double t0 = now_ms();
                for (size_t off = 0, p = 0; off < TOTAL; off += PIECE, p++)
                    TRY(cuMemcpyHtoDAsync(d + off, (uint8_t *)pinned + off, PIECE, streams[p % ns]));
                for (int i = 0; i < ns; i++)
                    TRY(cuStreamSynchronize(streams[i]));
                gb[si][k] = TOTAL / (now_ms() - t0) / 1e6;
            }
            both[k] = both_ways(d, d_src, pinned, pinned_dst, streams[0], streams[1]);
        }
        double threads_gb = (double)(__atomic_load_n(&load_copied, __ATOMIC_RELAXED) - copied0) /
                            (now_ms() - t_load) / 1e6;
        load_stop(th, loads[li]);
        printf("%2d loading threads:", loads[li]);
        for (size_t si = 0; si < 3; si++) {
            printf("  %d stream%s %5.1f GB/s", stream_counts[si], stream_counts[si] > 1 ? "s" : " ",
                   probe_median(gb[si], REPS));
        }
        printf("  both ways %5.1f GB/s  threads %5.1f GB/s\n", probe_median(both, REPS),
               threads_gb);
    }
    return 0;
}
