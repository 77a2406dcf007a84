/* Queries on interior pointers (pm_mem_get_address_range) as the number of
 * live registrations grows to 1,000,000: every query and every copy piece
 * looks its address up among the ranges pinmem pinned. Each registration
 * pins one page of its own, so the count stops where pinning does (the
 * memory-lock limit, or time: registering is a driver call each on cuda). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "commands.h"

enum { lookups = 1 << 20, threads = 16, margin = 64 };
/* Registering the next step may take at most this long. */
static const double register_budget_ns = 120e9;

typedef struct ranges {
    uint8_t *base;
    size_t page, live;
} ranges;

/* Range i: one page's bytes but a margin at each end, so that every range
 * has a page of its own and lookups land inside, never on a boundary. */
static uint8_t *range_at(const ranges *r, size_t i) { return r->base + i * r->page + margin; }
static size_t range_len(const ranges *r) { return r->page - 2 * margin; }

static uint64_t next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

typedef struct probe_job {
    const ranges *r;
    uint64_t seed;
    size_t hits;
} probe_job;

static void *probe(void *arg)
{
    probe_job *j = arg;
    const size_t len = range_len(j->r);
    for (size_t k = 0; k < lookups; k++) {
        size_t i = (size_t)(next_random(&j->seed) % j->r->live);
        uint8_t *p = range_at(j->r, i);
        pm_deviceptr base = 0;
        size_t size = 0;
        if (pm_mem_get_address_range(&base, &size, (pm_deviceptr)(uintptr_t)(p + k % len)) ==
                PM_SUCCESS &&
            base == (pm_deviceptr)(uintptr_t)p)
            j->hits++;
    }
    return NULL;
}

/* One row: lookups on one thread, then on 16 at once. */
static bool measure(const ranges *r)
{
    probe_job one = {r, 88172645463325252ull, 0};
    double t0 = now_ns();
    probe(&one);
    double per_lookup = (now_ns() - t0) / lookups;
    probe_job jobs[threads];
    pthread_t tids[threads];
    int started = 0;
    t0 = now_ns();
    for (int t = 0; t < threads; t++) {
        jobs[t] = (probe_job){r, 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1), 0};
        if (pthread_create(&tids[t], NULL, probe, &jobs[t]) == 0)
            started++;
        else
            break;
    }
    size_t hits = one.hits;
    for (int t = 0; t < started; t++) {
        pthread_join(tids[t], NULL);
        hits += jobs[t].hits;
    }
    double secs = (now_ns() - t0) / 1e9;
    printf("%10zu | %9.0f ns | %14.1f M/s\n", r->live, per_lookup,
           (double)lookups * started / secs / 1e6);
    if (hits != (size_t)lookups * (size_t)(started + 1)) {
        printf("queries missed live ranges\n");
        return false;
    }
    return true;
}

int bench_registry(bool quick)
{
    if (pm_init(0) != PM_SUCCESS) {
        printf("bench registry: no backend: %s\n", pm_last_error_detail());
        return 1;
    }
    static const size_t steps[] = {1000, 10000, 100000, 1000000};
    const size_t most = quick ? 10000 : steps[sizeof steps / sizeof steps[0] - 1];
    ranges r = {.page = (size_t)sysconf(_SC_PAGESIZE)};
    void *map = mmap(NULL, most * r.page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) {
        printf("bench registry: no address space for %zu pages\n", most);
        return 1;
    }
    r.base = map;
    printf("\nqueries among live registrations: pm_mem_get_address_range on random interior "
           "pointers (%d per point; each registration pins a page of its own)\n",
           lookups);
    printf("%10s | %12s | %20s\n", "live", "1 thread", "16 threads, total");
    int rc = 0;
    double register_ns = 0; /* per registration, so far */
    for (size_t s = 0; s < sizeof steps / sizeof steps[0] && steps[s] <= most && rc == 0; s++) {
        size_t want = steps[s];
        if (register_ns * (double)(want - r.live) > register_budget_ns) {
            printf("%10zu | skipped: registering %zu more would take about %.0f s\n", want,
                   want - r.live, register_ns * (double)(want - r.live) / 1e9);
            break;
        }
        double t0 = now_ns();
        size_t before = r.live;
        pm_result failed = PM_SUCCESS;
        while (r.live < want && failed == PM_SUCCESS) {
            failed = pm_mem_host_register(range_at(&r, r.live), range_len(&r), 0);
            r.live += failed == PM_SUCCESS;
        }
        if (r.live > before)
            register_ns = (now_ns() - t0) / (double)(r.live - before);
        if (failed != PM_SUCCESS)
            printf("(registering range %zu failed: %s: %s; measured with %zu, and no more)\n",
                   r.live + 1, pm_result_name(failed), pm_last_error_detail(), r.live);
        if (r.live > 0 && !measure(&r))
            rc = 1;
        if (failed != PM_SUCCESS)
            break;
    }
    for (size_t i = 0; i < r.live; i++)
        pm_mem_host_unregister(range_at(&r, i));
    munmap(map, most * r.page);
    return rc;
}
