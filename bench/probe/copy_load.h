/* Background threads that copy through host memory as the staging fillers
 * do: 512 KiB slices from a large pageable buffer into a pinned one with
 * streaming stores, round and round, until stopped, counting what they
 * copy. The probes that measure
 * how the DMA engine or the GPU's own reads slow down under such traffic
 * share it. Header-only, and valid C and C++ (sm_pull.cu): the stop flag is a
 * plain int read and written with the compiler's atomic builtins. Needs AVX2
 * (-mavx2). */
#ifndef PINMEM_COPY_LOAD_H
#define PINMEM_COPY_LOAD_H

#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { LOAD_MAX_THREADS = 16, LOAD_SLICE = 512 << 10 };
static const size_t LOAD_SRC = (size_t)1 << 30, LOAD_DST = (size_t)64 << 20;

static uint8_t *load_src, *load_dst;
static int load_stopping;
/* Bytes the threads have copied, for the probes that report the threads'
 * own rate beside the DMA engine's. */
static unsigned long long load_copied;

static void *load_main(void *arg)
{
    size_t k = (size_t)(uintptr_t)arg * 97; /* threads start spread over the source */
    while (!__atomic_load_n(&load_stopping, __ATOMIC_RELAXED)) {
        __atomic_fetch_add(&load_copied, (unsigned long long)LOAD_SLICE, __ATOMIC_RELAXED);
        const __m256i *s = (const __m256i *)(load_src + (k * LOAD_SLICE) % LOAD_SRC);
        __m256i *d = (__m256i *)(load_dst + (k * LOAD_SLICE) % LOAD_DST);
        for (size_t i = 0; i < LOAD_SLICE / 32; i += 4) {
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

/* The source is made here; pinned_dst (LOAD_DST bytes, page-locked) comes
 * from the probe, which pins it with the API it studies. */
static inline void load_prepare(uint8_t *pinned_dst)
{
    load_src = (uint8_t *)malloc(LOAD_SRC);
    if (!load_src)
        exit(1);
    memset(load_src, 1, LOAD_SRC);
    load_dst = pinned_dst;
    memset(load_dst, 3, LOAD_DST);
}

/* Starts n (at most LOAD_MAX_THREADS) copying threads into th. */
static inline void load_start(pthread_t *th, int n)
{
    __atomic_store_n(&load_stopping, 0, __ATOMIC_RELAXED);
    for (int t = 0; t < n; t++)
        pthread_create(&th[t], NULL, load_main, (void *)(uintptr_t)t);
}

static inline void load_stop(pthread_t *th, int n)
{
    __atomic_store_n(&load_stopping, 1, __ATOMIC_RELAXED);
    for (int t = 0; t < n; t++)
        pthread_join(th[t], NULL);
}

#endif
