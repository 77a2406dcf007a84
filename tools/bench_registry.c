/* Interior-pointer lookups in the range registry as it grows to 1,000,000
 * live ranges. Synthetic ranges (no memory is pinned): this measures the
 * registry alone, which every query and free goes through. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "commands.h"
#include "ranges.h"

enum { stride = 1 << 16, lookups = 1 << 20, threads = 16 };
static const uintptr_t arena = (uintptr_t)1 << 44;

static uint64_t next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void fill(pm__ranges *set, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        pm__range r = {.base = arena + i * stride + 100, .size = 20000,
                       .pin_base = arena + i * stride, .pin_len = 24576,
                       .flags = 2, .kind = PM__RANGE_REGISTERED};
        pm__range conflict;
        pm__ranges_claim(set, &r, &conflict);
        pm__ranges_publish(set, &r);
    }
}

typedef struct probe_job {
    pm__ranges *set;
    size_t live;
    uint64_t seed;
    size_t hits;
} probe_job;

static void *probe(void *arg)
{
    probe_job *j = arg;
    pm__range out;
    for (size_t k = 0; k < lookups; k++) {
        uint64_t i = next_random(&j->seed) % j->live;
        j->hits += pm__ranges_find(j->set, arena + i * stride + 100 + (k % 20000), &out);
    }
    return NULL;
}

int bench_registry(bool quick)
{
    pm__ranges *set = pm__ranges_create();
    if (!set)
        return 1;
    static const size_t steps[] = {1000, 10000, 100000, 1000000};
    printf("\nrange registry: random interior-pointer lookups (%d per point)\n", lookups);
    printf("%10s | %12s | %20s\n", "live", "1 thread", "16 threads, total");
    size_t have = 0;
    int rc = 0;
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        if (quick && steps[s] > 100000)
            break;
        fill(set, have, steps[s]);
        have = steps[s];
        probe_job one = {set, have, 88172645463325252ull, 0};
        double t0 = now_ns();
        probe(&one);
        double per_lookup = (now_ns() - t0) / lookups;

        probe_job jobs[threads];
        pthread_t tids[threads];
        t0 = now_ns();
        for (int t = 0; t < threads; t++) {
            jobs[t] = (probe_job){set, have, 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1), 0};
            pthread_create(&tids[t], NULL, probe, &jobs[t]);
        }
        size_t hits = one.hits;
        for (int t = 0; t < threads; t++) {
            pthread_join(tids[t], NULL);
            hits += jobs[t].hits;
        }
        double secs = (now_ns() - t0) / 1e9;
        if (hits != (size_t)lookups * (threads + 1)) {
            printf("registry lookups missed live ranges\n");
            rc = 1;
        }
        printf("%10zu | %9.0f ns | %14.1f M/s\n", have, per_lookup,
               (double)lookups * threads / secs / 1e6);
    }
    pm__ranges_destroy(set);
    return rc;
}
