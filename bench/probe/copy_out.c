/* How fast threads copy a staging buffer out to pageable memory right after
 * a DMA from the device filled it, by way of copying, against the same
 * buffer written by the CPU (in its cache) and flushed from the cache.
 * Device-to-pageable copies spend most of their time there: a 512 KiB
 * slice took a worker 80-100 us in the engine's trace, against 42-48 us
 * for a slice copied into the ring. Each of T threads copies its own 512
 * KiB slice of one 4 MiB buffer into its own warm pageable buffer.
 *   gcc -O2 -mavx2 -pthread -I/usr/local/cuda/include bench/probe/copy_out.c -o copy_out -lcuda
 *   ./copy_out [ROUNDS] */
#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "probe.h"

enum { SLICE = 512 << 10, BUFFER = 4 << 20, MAX_THREADS = 8 };

typedef enum { WAY_MEMCPY, WAY_STORES, WAY_STREAMING, WAY_REP_MOVSB, WAYS } way;
static const char *const way_names[WAYS] = {"memcpy", "avx2 stores", "avx2 streaming",
                                            "rep movsb"};

static void copy_stores(uint8_t *d, const uint8_t *s, size_t n, bool streaming)
{
    for (size_t i = 0; i < n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        if (streaming) {
            _mm256_stream_si256((__m256i *)(d + i), a);
            _mm256_stream_si256((__m256i *)(d + i + 32), b);
            _mm256_stream_si256((__m256i *)(d + i + 64), c);
            _mm256_stream_si256((__m256i *)(d + i + 96), e);
        } else {
            _mm256_storeu_si256((__m256i *)(d + i), a);
            _mm256_storeu_si256((__m256i *)(d + i + 32), b);
            _mm256_storeu_si256((__m256i *)(d + i + 64), c);
            _mm256_storeu_si256((__m256i *)(d + i + 96), e);
        }
    }
    if (streaming)
        _mm_sfence();
}

static void copy_by(way w, uint8_t *d, const uint8_t *s, size_t n)
{
    switch (w) {
    case WAY_MEMCPY:
        memcpy(d, s, n);
        break;
    case WAY_STORES:
    case WAY_STREAMING:
        copy_stores(d, s, n, w == WAY_STREAMING);
        break;
    default:
        __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
    }
}

/* The threads of one round: each waits at the barrier, copies its slice,
 * and notes how long it took. */
typedef struct round {
    pthread_barrier_t start;
    uint8_t *ring, *dst[MAX_THREADS];
    way w;
    double us[MAX_THREADS];
} round_t;

typedef struct copier {
    round_t *r;
    int index;
} copier;

static void *copy_main(void *arg)
{
    copier *c = arg;
    round_t *r = c->r;
    pthread_barrier_wait(&r->start);
    double t0 = now_ms();
    copy_by(r->w, r->dst[c->index], r->ring + (size_t)c->index * SLICE, SLICE);
    r->us[c->index] = (now_ms() - t0) * 1e3;
    return NULL;
}

typedef enum { FILLED_BY_DMA, WRITTEN_BY_CPU, FLUSHED, STATES } state;
static const char *const state_names[STATES] = {"after a DMA", "CPU-written", "flushed"};

static void prepare(state st, uint8_t *ring, CUdeviceptr dev, CUstream s)
{
    if (st == FILLED_BY_DMA) {
        TRY(cuMemcpyDtoHAsync(ring, dev, BUFFER, s));
        TRY(cuStreamSynchronize(s));
        return;
    }
    memset(ring, 7, BUFFER);
    if (st == FLUSHED) {
        for (size_t i = 0; i < BUFFER; i += 64)
            _mm_clflush(ring + i);
        _mm_mfence();
    }
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 50;
    if (rounds < 1 || rounds > 1000)
        rounds = 50;
    probe_context();
    /* The ring as pinmem pins it: mapped, huge pages advised, faulted in, registered. */
    uint8_t *ring = mmap(NULL, BUFFER, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ring == MAP_FAILED)
        return 1;
    madvise(ring, BUFFER, MADV_HUGEPAGE);
    memset(ring, 1, BUFFER);
    TRY(cuMemHostRegister(ring, BUFFER, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
    CUdeviceptr dev;
    CUstream s;
    TRY(cuMemAlloc(&dev, BUFFER));
    TRY(cuMemsetD8(dev, 9, BUFFER));
    TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    round_t r;
    r.ring = ring;
    for (int t = 0; t < MAX_THREADS; t++) {
        r.dst[t] = aligned_alloc(4096, SLICE); /* streaming stores need 32-byte alignment */
        if (!r.dst[t])
            return 1;
        memset(r.dst[t], 2, SLICE); /* warm, as a program's buffer is */
    }
    static const int thread_counts[] = {1, 4, 8};
    printf("one thread's copy of a 512 KiB slice out of a 4 MiB pinned buffer, median of %d "
           "(us; GB/s per thread)\n",
           rounds);
    printf("%-15s %-12s", "way", "buffer");
    for (size_t k = 0; k < sizeof thread_counts / sizeof *thread_counts; k++)
        printf(" | %2d thread%s%10s", thread_counts[k], thread_counts[k] > 1 ? "s" : " ", "");
    printf("\n");
    for (int w = 0; w < WAYS; w++)
        for (int st = 0; st < STATES; st++) {
            printf("%-15s %-12s", way_names[w], state_names[st]);
            for (size_t k = 0; k < sizeof thread_counts / sizeof *thread_counts; k++) {
                const int n = thread_counts[k];
                double *all = malloc(sizeof *all * (size_t)rounds * (size_t)n);
                if (!all)
                    return 1;
                r.w = (way)w;
                for (int i = 0; i < rounds; i++) {
                    prepare((state)st, ring, dev, s);
                    pthread_barrier_init(&r.start, NULL, (unsigned)n);
                    pthread_t th[MAX_THREADS];
                    copier cs[MAX_THREADS];
                    for (int t = 0; t < n; t++) {
                        cs[t] = (copier){&r, t};
                        pthread_create(&th[t], NULL, copy_main, &cs[t]);
                    }
                    for (int t = 0; t < n; t++)
                        pthread_join(th[t], NULL);
                    pthread_barrier_destroy(&r.start);
                    for (int t = 0; t < n; t++)
                        all[i * n + t] = r.us[t];
                }
                double med = probe_median(all, (size_t)rounds * (size_t)n);
                printf(" | %6.1f us %5.1f GB/s", med, SLICE / med / 1e3);
                free(all);
            }
            printf("\n");
        }
    return 0;
}
