/* Whether a staging ring small enough to stay in the CPU's caches spares the
 * DMA engine the slowdown it suffers while threads copy through memory.
 * Threads copy 512 KiB slices from a 1 GiB pageable buffer into a pinned ring,
 * in ring order; the DMA engine reads the same ring in 4 MiB pieces, in ring
 * order, at its own pace (the bytes race: only the rates matter). For each
 * ring size, store kind and thread count: the DMA's rate and the threads'.
 * With streaming stores every byte crosses memory three times (source read,
 * ring write, DMA read); with cached stores into a ring that stays in the
 * cache, only the source read would, if the DMA's reads hit the cache.
 * Then the same with several ways to store and demote (one ring size), from a
 * source that stays in the cache and from one that does not.
 * gcc -O2 -mavx2 -mprfchw -pthread -I/usr/local/cuda/include ring_cache.c -lcuda
 * (argument "ways": only the ways to store) */
#include <cuda.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "probe.h"

enum { PIECE = 4 << 20, SLICE = 512 << 10, DMAS = 96, REPS = 3, MAX_THREADS = 16 };
static const size_t SRC_BYTES = (size_t)1 << 30;

typedef enum {
    STREAMING,
    CACHED,
    CACHED_DEMOTE,
    SSE_DEMOTE,
    AVX512_DEMOTE,
    MOVSB_DEMOTE,
    PREFETCHW_512_DEMOTE,
    PREFETCHW_4K_DEMOTE,
    LAGGED_DEMOTE,
    KINDS
} store_kind;
static const char *const kind_names[KINDS] = {
    "streaming",      "cached",          "cached+cldemote",   "sse+cldemote",
    "avx512+cldemote", "movsb+cldemote", "pfw512+sse+cldem", "pfw4K+sse+cldem",
    "sse+lagged cldem"};

static struct {
    uint8_t *src, *ring;
    size_t ring_bytes, src_bytes;
    store_kind kind;
    atomic_bool stop;
    _Atomic unsigned long long next_slice, copied;
} g;

static inline void demote(void *p)
{
    /* A hint, and a no-op where the CPU lacks it: push the line to the shared
     * cache, where a device read finds it sooner. */
    __asm__ volatile(".byte 0x0f, 0x1c, 0x07" ::"D"(p) : "memory");
}

__attribute__((target("avx512f"))) static void copy_avx512_demote(uint8_t *dst, const uint8_t *src)
{
    for (size_t i = 0; i < SLICE; i += 64) {
        _mm_prefetch((const char *)src + i + 4096, _MM_HINT_T1);
        _mm512_store_si512((void *)(dst + i), _mm512_loadu_si512((const void *)(src + i)));
        demote(dst + i);
    }
}

static void copy_movsb_demote(uint8_t *dst, const uint8_t *src)
{
    for (size_t i = 0; i < SLICE; i += 4096) {
        uint8_t *d = dst + i;
        const uint8_t *s = src + i;
        size_t n = 4096;
        __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
        for (size_t k = 0; k < 4096; k += 64)
            demote(dst + i + k);
    }
}

/* Stores as sse+cldemote, with the destination's lines asked for ahead
 * (prefetchw: owned, ready to be written), or with each line demoted a
 * kilobyte behind its stores. */
static void copy_sse_demote_variant(uint8_t *dst, const uint8_t *src, size_t pfw, size_t lag)
{
    for (size_t i = 0; i < SLICE; i += 64) {
        _mm_prefetch((const char *)src + i + 4096, _MM_HINT_T1);
        if (pfw)
            __builtin_prefetch(dst + i + pfw, 1, 3);
        for (int k = 0; k < 64; k += 16)
            _mm_store_si128((__m128i *)(dst + i + k), _mm_loadu_si128((const __m128i *)(src + i + k)));
        if (!lag)
            demote(dst + i);
        else if (i >= lag)
            demote(dst + i - lag);
    }
    for (size_t i = SLICE > lag ? SLICE - lag : 0; lag && i < SLICE; i += 64)
        demote(dst + i);
}

static void copy_slice(uint8_t *dst, const uint8_t *src)
{
    if (g.kind >= PREFETCHW_512_DEMOTE) {
        copy_sse_demote_variant(dst, src, g.kind == PREFETCHW_512_DEMOTE ? 512
                                          : g.kind == PREFETCHW_4K_DEMOTE ? 4096 : 0,
                                g.kind == LAGGED_DEMOTE ? 1024 : 0);
        return;
    }
    if (g.kind == AVX512_DEMOTE) {
        copy_avx512_demote(dst, src);
        return;
    }
    if (g.kind == MOVSB_DEMOTE) {
        copy_movsb_demote(dst, src);
        return;
    }
    for (size_t i = 0; i < SLICE; i += 64) {
        _mm_prefetch((const char *)src + i + 4096, _MM_HINT_T1);
        if (g.kind == SSE_DEMOTE) {
            for (int k = 0; k < 64; k += 16)
                _mm_store_si128((__m128i *)(dst + i + k),
                                _mm_loadu_si128((const __m128i *)(src + i + k)));
            demote(dst + i);
            continue;
        }
        __m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(src + i + 32));
        if (g.kind == STREAMING) {
            _mm256_stream_si256((__m256i *)(dst + i), a);
            _mm256_stream_si256((__m256i *)(dst + i + 32), b);
        } else {
            _mm256_store_si256((__m256i *)(dst + i), a);
            _mm256_store_si256((__m256i *)(dst + i + 32), b);
            if (g.kind == CACHED_DEMOTE)
                demote(dst + i);
        }
    }
    _mm_sfence();
}

/* Slices are taken in ring order, as the staging fillers take them. */
static void *filler_main(void *arg)
{
    (void)arg;
    while (!atomic_load_explicit(&g.stop, memory_order_relaxed)) {
        unsigned long long k = atomic_fetch_add(&g.next_slice, 1);
        copy_slice(g.ring + (k * SLICE) % g.ring_bytes, g.src + (k * SLICE) % g.src_bytes);
        atomic_fetch_add_explicit(&g.copied, SLICE, memory_order_relaxed);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    /* "ways": only the ways to store, into a 32 MiB ring. */
    const bool ways_only = argc > 1 && strcmp(argv[1], "ways") == 0;
    probe_context();
    static const size_t ring_sizes[] = {(size_t)8 << 20, (size_t)16 << 20, (size_t)32 << 20,
                                        (size_t)128 << 20};
    /* A source copied again while it is still in the cache, and one that is not. */
    static const size_t src_sizes[] = {(size_t)64 << 20, SRC_BYTES};
    const bool avx512 = __builtin_cpu_supports("avx512f");
    static const int thread_counts[] = {0, 1, 4, 8, 12};
    CUdeviceptr dev;
    CUstream s;
    TRY(cuMemAlloc(&dev, PIECE));
    TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    TRY(cuMemHostAlloc((void **)&g.ring, ring_sizes[3], 0));
    memset(g.ring, 2, ring_sizes[3]);
    g.src = malloc(SRC_BYTES);
    memset(g.src, 1, SRC_BYTES);
    printf("DMA reading a ring that threads fill (GB/s, median of %d: DMA / threads' copies)\n",
           REPS);
    for (size_t si = 0; si < sizeof src_sizes / sizeof *src_sizes; si++)
    for (size_t ri = 0; ri < sizeof ring_sizes / sizeof *ring_sizes; ri++)
        for (int kind = 0; kind < KINDS; kind++) {
            if (kind == AVX512_DEMOTE && !avx512)
                continue;
            if (ri != 2 && (kind > CACHED_DEMOTE || ways_only)) /* the ways: one ring size */
                continue;
            g.src_bytes = src_sizes[si];
            g.ring_bytes = ring_sizes[ri];
            g.kind = (store_kind)kind;
            printf("source %4zu MiB ring %3zu MiB %-16s", src_sizes[si] >> 20, ring_sizes[ri] >> 20,
                   kind_names[kind]);
            for (size_t ti = 0; ti < sizeof thread_counts / sizeof *thread_counts; ti++) {
                int threads = thread_counts[ti];
                if (threads == 0 && kind > 0) {
                    printf("  %14s", "");
                    continue;
                }
                pthread_t th[MAX_THREADS];
                atomic_store(&g.stop, false);
                for (int t = 0; t < threads; t++)
                    pthread_create(&th[t], NULL, filler_main, NULL);
                double dma[REPS], cpu[REPS];
                for (int r = 0; r < REPS; r++) {
                    unsigned long long c0 = atomic_load(&g.copied);
                    double t0 = now_ms();
                    for (int p = 0; p < DMAS; p++)
                        TRY(cuMemcpyHtoDAsync(dev, g.ring + (size_t)p * PIECE % g.ring_bytes,
                                              PIECE, s));
                    TRY(cuStreamSynchronize(s));
                    double ms = now_ms() - t0;
                    dma[r] = (double)DMAS * PIECE / ms / 1e6;
                    cpu[r] = (double)(atomic_load(&g.copied) - c0) / ms / 1e6;
                }
                atomic_store(&g.stop, true);
                for (int t = 0; t < threads; t++)
                    pthread_join(th[t], NULL);
                printf("  %2dT %4.1f/%5.1f", threads, probe_median(dma, REPS),
                       probe_median(cpu, REPS));
            }
            printf("\n");
        }
    return 0;
}
