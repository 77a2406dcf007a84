/* Streaming-store copy rate from a 4 KiB-page source into a huge-page ring, in
 * 512 KiB slices spread over N threads, with and without a software prefetch of
 * the source line DIST bytes ahead (T0: into L1, T1: into L2). The hardware
 * prefetchers stop at 4 KiB page boundaries; this shows what asking ahead of
 * them buys a staging thread.
 * Build: gcc -O2 -pthread copy_prefetch.c -o copy_prefetch; run: ./copy_prefetch N [DIST...]
 * (distances in bytes; default 0 512 1024 2048 4096). */
#include <emmintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { SOURCE = 256u << 20, RING = 32u << 20, SLICE = 512u << 10, MAX_THREADS = 64 };

static int prefetch_distance, prefetch_hint, n_threads;
static uint8_t *source, *ring;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void copy_streaming(uint8_t *dst, const uint8_t *src, size_t n)
{
    for (size_t i = 0; i < n / 64; i++, dst += 64, src += 64) {
        if (prefetch_distance && prefetch_hint == 0)
            _mm_prefetch((const char *)src + prefetch_distance, _MM_HINT_T0);
        else if (prefetch_distance)
            _mm_prefetch((const char *)src + prefetch_distance, _MM_HINT_T1);
        for (int k = 0; k < 64; k += 16)
            _mm_stream_si128((__m128i *)(dst + k), _mm_loadu_si128((const __m128i *)(src + k)));
    }
    _mm_sfence();
}

static void *copier(void *arg)
{
    size_t first = (size_t)(uintptr_t)arg * SLICE;
    for (size_t off = first; off < SOURCE; off += (size_t)n_threads * SLICE)
        copy_streaming(ring + off % RING, source + off, SLICE);
    return NULL;
}

int main(int argc, char **argv)
{
    n_threads = argc > 1 ? atoi(argv[1]) : 1;
    if (n_threads < 1 || n_threads > MAX_THREADS)
        return 1;
    source = malloc(SOURCE);
    ring = aligned_alloc(2u << 20, RING);
    if (!source || !ring)
        return 1;
    memset(source, 1, SOURCE);
    memset(ring, 0, RING);
    int distances[16] = {0, 512, 1024, 2048, 4096}, n_distances = 5;
    if (argc > 2) {
        n_distances = argc - 2 < 16 ? argc - 2 : 16;
        for (int d = 0; d < n_distances; d++)
            distances[d] = atoi(argv[d + 2]);
    }
    for (int rep = 0; rep < 3; rep++)
        for (int hint = 0; hint < 2; hint++)
            for (int d = 0; d < n_distances; d++) {
                if (distances[d] == 0 && hint == 1)
                    continue;
                prefetch_distance = distances[d];
                prefetch_hint = hint;
                pthread_t threads[MAX_THREADS];
                double t0 = now_s();
                for (int i = 0; i < n_threads; i++)
                    pthread_create(&threads[i], NULL, copier, (void *)(uintptr_t)i);
                for (int i = 0; i < n_threads; i++)
                    pthread_join(threads[i], NULL);
                double gbps = SOURCE / (now_s() - t0) / 1e9;
                printf("threads %d hint T%d dist %4d: %.1f GB/s (%.1f per thread)\n", n_threads, hint,
                       prefetch_distance, gbps, gbps / n_threads);
            }
    free(source);
    free(ring);
    return 0;
}
