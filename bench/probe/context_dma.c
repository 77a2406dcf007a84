/* What a DMA into another context's device memory costs. On a stream of a
 * context made with cuCtxCreate, rounds of page-locked -> device copies
 * (cuMemcpyHtoDAsync) go in turn into memory allocated in that context and
 * into memory of device 0's primary context; each call and each round
 * (until the stream is done) is timed. Pieces of 512 KiB (as a staged copy
 * queues) and of 4 MiB tell a cost a DMA from a cost a byte.
 * gcc -O2 -Ibench/probe -I/usr/local/cuda/include bench/probe/context_dma.c -lcuda
 * ./probe_context_dma */
#include "probe.h"

enum { ROUNDS = 200, MOST_PIECES = 8, BYTES = 4 << 20 };

typedef struct { double call[ROUNDS * MOST_PIECES], round[ROUNDS]; } timings;

static void report(const char *into, size_t piece, int pieces, timings *t)
{
    double call = probe_median(t->call, (size_t)ROUNDS * (size_t)pieces);
    double round = probe_median(t->round, ROUNDS);
    printf("%-26s %8zu KiB x %d | %8.2f us %10.1f us %8.1f GB/s\n", into, piece >> 10, pieces,
           call * 1e3, round * 1e3, (double)BYTES / (round * 1e6));
}

int main(void)
{
    CUcontext primary = probe_context();
    CUdevice dev;
    TRY(cuCtxGetDevice(&dev));
    void *host;
    TRY(cuMemHostAlloc(&host, BYTES, CU_MEMHOSTALLOC_PORTABLE));
    CUdeviceptr in_primary, in_own;
    TRY(cuMemAlloc(&in_primary, BYTES));
    CUcontext own;
    TRY(cuCtxCreate(&own, NULL, 0, dev));
    TRY(cuMemAlloc(&in_own, BYTES));
    CUstream s;
    TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    static timings t[2];
    printf("a stream of a cuCtxCreate context, page-locked -> device, median of %d rounds\n",
           ROUNDS);
    printf("%-26s %16s | %11s %13s %11s\n", "into memory of", "pieces", "a call", "a round",
           "rate");
    for (size_t piece = 512 << 10; piece <= BYTES; piece *= 8) {
        const int pieces = (int)(BYTES / piece);
        for (int r = 0; r < ROUNDS; r++)
            for (int k = 0; k < 2; k++) {
                const int which = (k + r) % 2; /* each goes first in every other round */
                const CUdeviceptr dst = which ? in_primary : in_own;
                const double t0 = now_ms();
                for (int i = 0; i < pieces; i++) {
                    const double c0 = now_ms();
                    TRY(cuMemcpyHtoDAsync(dst + (size_t)i * piece, (char *)host + (size_t)i * piece,
                                          piece, s));
                    t[which].call[r * pieces + i] = now_ms() - c0;
                }
                TRY(cuStreamSynchronize(s));
                t[which].round[r] = now_ms() - t0;
            }
        report("its own context", piece, pieces, &t[0]);
        report("the primary context", piece, pieces, &t[1]);
    }
    TRY(cuStreamDestroy(s));
    TRY(cuMemFree(in_own));
    TRY(cuCtxDestroy(own));
    TRY(cuCtxSetCurrent(primary));
    TRY(cuMemFree(in_primary));
    TRY(cuMemFreeHost(host));
    return 0;
}
