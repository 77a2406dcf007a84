/* How far this machine's CPUs scale on code that shares nothing: each thread
 * runs integer arithmetic (two independent chains, so a core has work for
 * more than one unit) on its own stack for one 300 ms window; totals for 1,
 * 2, 4, 8 and 16 threads. gcc -O2 -pthread cpu_scaling.c */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static atomic_bool stop;
static pthread_barrier_t start;

static void *spin(void *arg)
{
    uint64_t a = (uintptr_t)arg | 1, b = a * 3, n = 0;
    pthread_barrier_wait(&start);
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (int i = 0; i < 1000; i++) {
            a ^= a << 13, a ^= a >> 7, a ^= a << 17;
            b = b * 6364136223846793005ull + 1442695040888963407ull;
        }
        n += 1000;
    }
    *(uint64_t *)arg = n + (a ^ b) % 2;
    return NULL;
}

int main(void)
{
    double one = 0;
    for (int threads = 1; threads <= 16; threads *= 2) {
        pthread_t tid[16];
        uint64_t count[16];
        atomic_store(&stop, false);
        pthread_barrier_init(&start, NULL, threads + 1);
        for (int t = 0; t < threads; t++)
            pthread_create(&tid[t], NULL, spin, &count[t]);
        pthread_barrier_wait(&start);
        nanosleep(&(struct timespec){0, 300000000}, NULL);
        atomic_store(&stop, true);
        double total = 0;
        for (int t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            total += (double)count[t];
        }
        pthread_barrier_destroy(&start);
        if (threads == 1)
            one = total;
        printf("cpu scaling: %2d threads: %.0f M iterations (%.1fx one thread)\n", threads,
               total / 1e6, total / one);
    }
    return 0;
}
