/* Whether the driver's pointer query scales over threads: a batch of 1,000
 * pageable blocks spends most of its planning in one cuPointerGetAttributes
 * (the memory type) per block, so planning in parallel helps only if the
 * driver answers threads at once. Times 1,000 queries (pageable pointers,
 * then pointers into a registered range), split over 1, 2, 4 and 8 threads,
 * wall time from a barrier to the last answer, median of 31 rounds.
 * gcc -O2 -pthread -I/usr/local/cuda/include bench/probe/pointer_query.c -o pointer_query -lcuda */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "probe.h"

enum { QUERIES = 1000, BLOCK = 64 << 10, ROUNDS = 31, MAX_THREADS = 8 };

typedef struct {
    CUcontext ctx;
    const char *base;
    unsigned first, count, threads;
    pthread_barrier_t *start;
} share;

static void query(const char *base, unsigned first, unsigned count)
{
    CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    for (unsigned i = first; i < first + count; i++) {
        unsigned type = 0;
        void *data = &type;
        /* Pageable memory answers type 0 with success, as pinmem relies on. */
        TRY(cuPointerGetAttributes(1, &attr, &data, (CUdeviceptr)(uintptr_t)(base + (size_t)i * BLOCK)));
    }
}

static void *worker(void *arg)
{
    share *s = arg;
    TRY(cuCtxSetCurrent(s->ctx));
    for (int r = 0; r < ROUNDS + 1; r++) {
        pthread_barrier_wait(&s->start[0]);
        query(s->base, s->first, s->count);
        pthread_barrier_wait(&s->start[1]);
    }
    return NULL;
}

/* Median wall time of one round of QUERIES queries over threads threads, in µs. */
static double rounds(CUcontext ctx, const char *base, unsigned threads)
{
    pthread_barrier_t b[2];
    pthread_barrier_init(&b[0], NULL, threads + 1);
    pthread_barrier_init(&b[1], NULL, threads + 1);
    pthread_t t[MAX_THREADS];
    share s[MAX_THREADS];
    for (unsigned i = 0; i < threads; i++) {
        unsigned per = QUERIES / threads;
        s[i] = (share){ctx, base, i * per, i + 1 == threads ? QUERIES - i * per : per, threads, b};
        pthread_create(&t[i], NULL, worker, &s[i]);
    }
    double times[ROUNDS + 1];
    for (int r = 0; r < ROUNDS + 1; r++) {
        pthread_barrier_wait(&b[0]);
        double t0 = now_ms();
        pthread_barrier_wait(&b[1]);
        times[r] = (now_ms() - t0) * 1e3;
    }
    for (unsigned i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&b[0]);
    pthread_barrier_destroy(&b[1]);
    return probe_median(times + 1, ROUNDS); /* the first round warms up */
}

int main(void)
{
    CUcontext ctx = probe_context();
    size_t bytes = (size_t)QUERIES * BLOCK;
    char *pageable = malloc(bytes), *registered = malloc(bytes);
    if (!pageable || !registered)
        return 1;
    memset(pageable, 1, bytes);
    memset(registered, 1, bytes);
    TRY(cuMemHostRegister(registered, bytes, 0));
    printf("%u cuPointerGetAttributes (memory type) over 1-8 threads, wall µs (µs a query)\n",
           (unsigned)QUERIES);
    printf("threads  pageable            registered\n");
    for (unsigned threads = 1; threads <= MAX_THREADS; threads *= 2) {
        double p = rounds(ctx, pageable, threads), r = rounds(ctx, registered, threads);
        printf("%7u  %7.1f (%.3f)  %7.1f (%.3f)\n", threads, p, p / QUERIES, r, r / QUERIES);
    }
    TRY(cuMemHostUnregister(registered));
    free(pageable);
    free(registered);
    return 0;
}
