/* Pools: warm alloc + free pairs on one thread and on 16, pinmem beside the
 * baseline (the driver's host pool with access granted and nothing released,
 * or glibc malloc), copy speed from pool memory against cuMemHostAlloc
 * memory, and reserved/used after a mixed workload. One run, side by side. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"

enum { pairs_per_batch = 20000, batches = 15 };

typedef enum { PINMEM_SYNC, PINMEM_ASYNC, BASELINE, MALLOC } pair_kind;

/* Each on cache lines of its own: threads read their job on every pair. */
typedef struct __attribute__((aligned(64))) pair_job {
    pair_kind kind;
    const baseline *b;
    pm_mem_pool_t pool;
    void *baseline_pool;
    pm_stream_t stream;
    size_t size;
    long pairs;
    bool failed;
    atomic_bool *go, *stop;
} pair_job;

static bool one_pair(pair_job *j)
{
    void *p = NULL;
    switch (j->kind) {
    case PINMEM_SYNC:
        return pm_mem_alloc_from_pool(&p, j->size, j->pool) == PM_SUCCESS &&
               pm_mem_free(p) == PM_SUCCESS;
    case PINMEM_ASYNC:
        return pm_mem_alloc_from_pool_async(&p, j->size, j->pool, j->stream) == PM_SUCCESS &&
               pm_mem_free_async(p, j->stream) == PM_SUCCESS;
    case BASELINE:
        return j->b->pool_alloc(j->baseline_pool, &p, j->size, j->stream) == PM_SUCCESS &&
               j->b->pool_free(j->baseline_pool, p, j->stream) == PM_SUCCESS;
    case MALLOC: /* shares nothing between threads: how far this machine scales */
        p = malloc(j->size);
        *(volatile char *)p = 0;
        free(p);
        return p != NULL;
    }
    return false;
}

/* Median nanoseconds per pair over batches. */
static double pair_ns(pair_job *j)
{
    double per[batches];
    for (int w = 0; w < 100000 && j->kind != BASELINE; w++)
        one_pair(j); /* long enough for the clock to settle */
    for (int w = 0; w < 1000; w++)
        one_pair(j);
    for (int k = 0; k < batches; k++) {
        double t0 = now_ns();
        for (int i = 0; i < pairs_per_batch; i++)
            if (!one_pair(j)) {
                j->failed = true;
                return 0;
            }
        per[k] = (now_ns() - t0) / pairs_per_batch;
    }
    return median(per, batches);
}

static void *pair_thread(void *arg)
{
    pair_job *j = arg;
    for (int w = 0; w < 1000; w++)
        one_pair(j);
    while (!atomic_load_explicit(j->go, memory_order_acquire))
        sched_yield();
    long pairs = 0; /* counted here, so the loop writes nothing shared */
    bool ok = true;
    while (ok && !atomic_load_explicit(j->stop, memory_order_relaxed)) {
        for (int i = 0; i < 64 && ok; i++)
            ok = one_pair(j);
        pairs += 64;
    }
    j->pairs = pairs;
    j->failed = !ok;
    return NULL;
}

/* Total pairs per second of n threads, each with its own stream, all running
 * through one window of time: a thread that starts late or is preempted does
 * fewer pairs, while the others go on, so the figure is the machine's
 * throughput rather than the pace of the slowest thread. */
static double pairs_per_second(pair_job proto, int n)
{
    enum { window_ms = 300 };
    pair_job jobs[16];
    pthread_t tids[16];
    atomic_bool go = false, stop = false;
    int started = 0;
    for (; started < n; started++) {
        jobs[started] = proto;
        jobs[started].go = &go;
        jobs[started].stop = &stop;
        if (pm_stream_create(&jobs[started].stream) != PM_SUCCESS)
            break;
        if (pthread_create(&tids[started], NULL, pair_thread, &jobs[started]) != 0) {
            pm_stream_destroy(jobs[started].stream);
            break;
        }
    }
    /* Threads the system refused (a process limit) end the round: it would
     * not be the count asked for. */
    if (started < n) {
        fprintf(stderr, "bench pool: %d of %d threads started; the round is not counted\n",
                started, n);
        atomic_store(&stop, true);
    }
    atomic_store_explicit(&go, true, memory_order_release);
    double t0 = now_ns();
    if (started == n)
        nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = window_ms * 1000000L}, NULL);
    atomic_store(&stop, true);
    double pairs = 0;
    bool failed = started < n;
    for (int t = 0; t < started; t++) {
        pthread_join(tids[t], NULL);
        pairs += (double)jobs[t].pairs;
        failed |= jobs[t].failed;
        pm_stream_destroy(jobs[t].stream);
    }
    return failed ? 0 : pairs / ((now_ns() - t0) / 1e9);
}

enum { scaling_rounds = 3 };

/* Pairs per second for 1, 2, 4, 8 and 16 threads, pinmem and glibc: the
 * median of three rounds over every count, pinmem and glibc interleaved, so
 * that a slow stretch of a noisy machine is not pinned on one count. */
static void scaling(pair_job proto, double pinmem[5], double glibc[5])
{
    double runs[2][5][scaling_rounds];
    for (int round = 0; round < scaling_rounds; round++)
        for (int k = 0; k < 5; k++)
            for (int kind = 0; kind < 2; kind++) {
                proto.kind = kind == 0 ? PINMEM_SYNC : MALLOC;
                runs[kind][k][round] = pairs_per_second(proto, 1 << k);
            }
    for (int k = 0; k < 5; k++) {
        pinmem[k] = median(runs[0][k], scaling_rounds);
        glibc[k] = median(runs[1][k], scaling_rounds);
    }
}

static void print_scaling(const char *name, const double rate[5], double unit)
{
    printf("  %-8s", name);
    for (int k = 0; k < 5; k++)
        printf(" %9.2f M (%4.1fx)", rate[k] / unit, rate[k] / rate[0]);
    printf("\n");
}

static double copy_gbps(const baseline *b, pm_deviceptr d, const void *src, size_t bytes)
{
    double t[10];
    b->copy_htod(d, src, bytes);
    for (int k = 0; k < 10; k++) {
        double t0 = now_ns();
        if (b->copy_htod(d, src, bytes) != PM_SUCCESS)
            return 0;
        t[k] = now_ns() - t0;
    }
    return (double)bytes / median(t, 10);
}

static void copy_speed(const baseline *b, pm_mem_pool_t pool)
{
    const size_t bytes = 256u << 20;
    pm_deviceptr d = 0;
    void *from_pool = NULL, *from_baseline = NULL;
    if (pm_device_alloc(&d, bytes) != PM_SUCCESS ||
        pm_mem_alloc_from_pool(&from_pool, bytes, pool) != PM_SUCCESS) {
        printf("\ncopy: skipped: %s\n", pm_last_error_detail());
        pm_device_free(d);
        return;
    }
    if (b->pin(&from_baseline, bytes) != PM_SUCCESS) {
        printf("\ncopy: skipped: %s\n", baseline_detail());
        pm_mem_free(from_pool);
        pm_device_free(d);
        return;
    }
    memset(from_pool, 1, bytes);
    memset(from_baseline, 1, bytes);
    double pool_rate = copy_gbps(b, d, from_pool, bytes);
    double base_rate = copy_gbps(b, d, from_baseline, bytes);
    printf("\nH2D copy of 256 MiB with %s (median of 10): from pool memory %.1f GB/s, from %s "
           "memory %.1f GB/s: %.1f%% (100%% is par, higher is better)\n",
           b->copy_name, pool_rate, b->pin_name, base_rate, 100 * pool_rate / base_rate);
    if (b->meaning)
        printf("(%s)\n", b->meaning);
    pm_mem_free(from_pool);
    b->unpin(from_baseline, bytes);
    pm_device_free(d);
}

static size_t mixed_size(uint64_t *rng)
{
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    bool big = (*rng >> 20) % 10 == 0;
    unsigned lo = big ? 20 : 6, span = big ? 3 : 14;
    size_t n = (size_t)1 << (lo + (*rng >> 40) % span);
    return n + (size_t)((*rng >> 8) % n);
}

/* Allocates a new size into slot k of the steady state. */
static bool add_at(pm_mem_pool_t pool, void **live, size_t *sizes, size_t k, uint64_t *rng,
                   size_t *bytes)
{
    sizes[k] = mixed_size(rng);
    *bytes += sizes[k];
    return pm_mem_alloc_from_pool(&live[k], sizes[k], pool) == PM_SUCCESS;
}

/* The steady states, each in a pool of its own, with sizes drawn
 * log-uniformly from 64 B to 1 MiB (one in ten from 1 to 8 MiB):
 * - replacing: 2048 live allocations; each of 200,000 steps frees a random one
 *   and allocates a new size in its place, so the live bytes wander (by about
 *   a quarter over a run);
 * - holding: live bytes held at 900 MiB; each step frees a random allocation
 *   and allocates new sizes until the live bytes are back at 900 MiB.
 * Then reserved over used, at the end and sampled over the second half, and
 * where the reserved bytes that no allocation uses lie. Each runs with the
 * default release threshold (keep everything) and with 0 (the driver's
 * default: give back whatever is idle). */
static void steady_state(bool holding, bool threshold_zero)
{
    enum { slots = 8192, steps = 200000, samples = 20, replacing_live = 2048 };
    static void *live[slots];
    static size_t sizes[slots];
    const size_t held = (size_t)900 << 20;
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    pm_mem_pool_t pool = NULL;
    uint64_t zero = 0;
    if (pm_mem_pool_create(&pool, &props) != PM_SUCCESS ||
        (threshold_zero &&
         pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero) != PM_SUCCESS)) {
        printf("steady state: %s\n", pm_last_error_detail());
        return;
    }
    double worst = 0, sum = 0, t0 = now_ns();
    int sampled = 0;
    uint64_t rng = 12345;
    size_t n = 0, bytes = 0;
    bool failed = false;
    while (holding ? bytes < held : n < replacing_live)
        failed |= !add_at(pool, live, sizes, n++, &rng, &bytes);
    for (int i = 0; i < steps && !failed; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t s = (size_t)(rng >> 33) % n;
        pm_mem_free(live[s]);
        bytes -= sizes[s];
        if (holding) { /* the last allocation takes the freed slot */
            live[s] = live[--n];
            sizes[s] = sizes[n];
            while (bytes < held && n < slots)
                failed |= !add_at(pool, live, sizes, n++, &rng, &bytes);
        } else {
            failed |= !add_at(pool, live, sizes, s, &rng, &bytes);
        }
        if (i >= steps / 2 && (i + 1) % (steps / 2 / samples) == 0) {
            uint64_t reserved = 0, used = 0;
            pm_mem_pool_get_attribute(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
            pm_mem_pool_get_attribute(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
            double ratio = (double)reserved / (double)used;
            sum += ratio;
            sampled++;
            worst = ratio > worst ? ratio : worst;
        }
    }
    double step_us = (now_ns() - t0) / steps / 1e3;
    uint64_t reserved = 0, used = 0, used_high = 0;
    pm_mem_pool_get_attribute(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
    pm_mem_pool_get_attribute(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
    pm_mem_pool_get_attribute(pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH, &used_high);
    pm_pool_stats st = {.struct_size = sizeof st};
    pm_mem_pool_get_stats(pool, &st);
    const double mib = 1048576.0;
    const char *threshold = threshold_zero ? "release threshold 0" : "default release threshold";
    if (holding)
        printf("\nsteady state, holding (live bytes held at 900 MiB, 200k steps, 64 B-1 MiB "
               "log-uniform, 10%% 1-8 MiB), %s%s:\n", threshold, failed ? " (an allocation failed)" : "");
    else
        printf("\nsteady state (2048 live, 200k replacements, 64 B-1 MiB log-uniform, "
               "10%% 1-8 MiB), %s%s:\n", threshold, failed ? " (an allocation failed)" : "");
    printf("  requested %.1f MiB, used %.1f MiB (high %.1f), reserved %.1f MiB: reserved/used "
           "%.3f, reserved/used high %.3f, reserved/requested %.3f (lower is better)\n",
           st.requested / mib, used / mib, used_high / mib, reserved / mib,
           (double)reserved / (double)used, (double)reserved / (double)used_high,
           (double)reserved / (double)st.requested);
    if (sampled)
        printf("  reserved/used sampled %d times over the second half: mean %.3f, worst %.3f\n",
               sampled, sum / sampled, worst);
    else
        printf("  reserved/used not sampled: the steps stopped at the failed allocation\n");
    printf("  reserved, not used: %.1f MiB in wholly free chunks, %.1f MiB in holes of chunks in "
           "use, %.1f MiB in free small blocks\n",
           st.free_in_empty_chunks / mib, st.free_in_holes / mib,
           (double)(reserved - used - st.free_in_empty_chunks - st.free_in_holes) / mib);
    printf("  of those, %.1f MiB in granules no allocation touches; granules of %s: %llu "
           "pinned, %llu given back (%llu moved where allocations needed them), %.1f ms pinning "
           "and giving back",
           st.idle_granules / mib, st.granule ? "2 MiB" : "whole chunks", st.granules_pinned,
           st.granules_released, st.granules_moved, st.pin_ns / 1e6);
    if (!failed)
        printf("; %.2f us a step", step_us);
    printf("\n");
    for (size_t s = 0; s < n; s++)
        pm_mem_free(live[s]);
    pm_mem_pool_destroy(pool);
}

/* The first allocation from a fresh pool: best of three. *granule: the
 * pool's (0: chunks pinned whole). */
/* The best time of rounds none of which succeeded. */
static const double no_time = 1e30;

static double first_alloc_ns(size_t bytes, bool threshold_zero, unsigned long long *granule)
{
    double best = no_time;
    for (int round = 0; round < 3; round++) {
        pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
        pm_mem_pool_t pool = NULL;
        uint64_t zero = 0;
        void *p = NULL;
        if (pm_mem_pool_create(&pool, &props) != PM_SUCCESS)
            continue;
        if (!threshold_zero ||
            pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero) == PM_SUCCESS) {
            double t0 = now_ns();
            if (pm_mem_alloc_from_pool(&p, bytes, pool) == PM_SUCCESS) {
                double t = now_ns() - t0;
                best = t < best ? t : best;
                pm_pool_stats st = {.struct_size = sizeof st};
                if (pm_mem_pool_get_stats(pool, &st) == PM_SUCCESS)
                    *granule = st.granule;
                pm_mem_free(p);
            }
        }
        pm_mem_pool_destroy(pool);
    }
    return best;
}

static const char *pinned_in(unsigned long long granule, char *buf, size_t cap)
{
    char sz[32];
    if (granule == 0)
        snprintf(buf, cap, "chunks pinned whole");
    else
        snprintf(buf, cap, "%s granules", human_size((size_t)granule, sz, sizeof sz));
    return buf;
}

/* The first allocation of a fresh pool pins its memory: pinmem's pool (with
 * the default release threshold, and with 0, which on CUDA pins granules
 * that can go back one by one) and the baseline's (the driver's host pool,
 * its memory released at each round, or glibc), 4 KiB and 256 MiB, best of
 * three. */
static void cold_first_alloc(const baseline *b)
{
    static const size_t sizes[] = {4096, (size_t)256 << 20};
    printf("\nfirst allocation from a fresh pool (best of 3; x faster: the baseline's time over "
           "pinmem's, higher is better):\n");
    for (size_t i = 0; i < 2; i++) {
        unsigned long long keep_granule = 0, zero_granule = 0;
        double best = first_alloc_ns(sizes[i], false, &keep_granule),
               zero_best = first_alloc_ns(sizes[i], true, &zero_granule);
        double base_best = no_time;
        for (int round = 0; round < 3; round++) {
            void *bp = NULL, *q = NULL;
            if (b->pool_open(&bp) == PM_SUCCESS) {
                double t0 = now_ns();
                if (b->pool_alloc(bp, &q, sizes[i], NULL) == PM_SUCCESS) {
                    b->synchronize();
                    double t = now_ns() - t0;
                    base_best = t < base_best ? t : base_best;
                    b->pool_free(bp, q, NULL);
                    b->synchronize();
                }
                b->pool_close(bp);
            }
        }
        char sz[32], keep[48], zero[48];
        if (best >= no_time || zero_best >= no_time || base_best >= no_time) {
            printf("  %-8s not measured: an allocation failed (pinmem %s, with release "
                   "threshold 0 %s, %s %s)\n",
                   human_size(sizes[i], sz, sizeof sz), best < no_time ? "ok" : "failed",
                   zero_best < no_time ? "ok" : "failed", b->pool_name,
                   base_best < no_time ? "ok" : "failed");
            continue;
        }
        printf("  %-8s pinmem %9.3f ms (%s), with release threshold 0 %9.3f ms (%s); %s %9.3f ms "
               "(%.1fx, %.1fx faster)\n",
               human_size(sizes[i], sz, sizeof sz), best / 1e6,
               pinned_in(keep_granule, keep, sizeof keep), zero_best / 1e6,
               pinned_in(zero_granule, zero, sizeof zero), b->pool_name, base_best / 1e6,
               base_best / best, base_best / zero_best);
    }
}

int bench_footprint(void)
{
    if (pm_init(0) != PM_SUCCESS) {
        printf("bench footprint: no backend: %s\n", pm_last_error_detail());
        return 1;
    }
    for (int zero = 0; zero < 2; zero++) {
        steady_state(false, zero);
        steady_state(true, zero);
    }
    return 0;
}

int bench_pool(bool quick)
{
    const baseline *b = baseline_open("bench pool");
    if (!b)
        return 1;
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    pm_mem_pool_t pool = NULL;
    void *baseline_pool = NULL;
    pm_stream_t stream = NULL;
    if (pm_mem_pool_create(&pool, &props) != PM_SUCCESS || pm_stream_create(&stream) != PM_SUCCESS) {
        printf("bench pool: setup failed: %s\n", pm_last_error_detail());
        return 1;
    }
    if (b->pool_open(&baseline_pool) != PM_SUCCESS) {
        printf("bench pool: %s: %s\n", b->pool_name, baseline_detail());
        return 1;
    }
    static const size_t sizes[] = {64, 4096, 65536, 1u << 20};
    bool any_failed = false;
    printf("pool alloc + free pair, warm, one thread, median of %d x %d (backend %s; baseline %s)\n",
           batches, pairs_per_batch, pm_backend_name(), b->pool_name);
    /* "async, legacy": on the default stream, where each call asks the
     * driver for the thread's context (docs/design.md, "Pools"). */
    printf("%-9s | %12s %14s %15s | %12s | %16s\n", "size", "pinmem", "pinmem async",
           "async, legacy", "baseline", "x faster");
    printf("%-9s | %12s %14s %15s | %12s | %16s\n", "", "", "", "", "", "higher is better");
    /* Twice over, so an effect of order or warm-up shows as a difference. */
    for (size_t pass = 0; pass < 2 * sizeof sizes / sizeof sizes[0]; pass++) {
        size_t i = pass % (sizeof sizes / sizeof sizes[0]);
        pair_job sync = {PINMEM_SYNC, b, pool, baseline_pool, stream, sizes[i], 0, false, NULL, NULL};
        pair_job async = sync, legacy = sync, base = sync;
        async.kind = legacy.kind = PINMEM_ASYNC;
        legacy.stream = NULL;
        base.kind = BASELINE;
        double ns = pair_ns(&sync), ans = pair_ns(&async), lns = pair_ns(&legacy),
               bns = pair_ns(&base);
        char sz[32];
        bool failed = sync.failed || async.failed || legacy.failed || base.failed;
        printf("%-9s | %9.1f ns %11.1f ns %12.1f ns | %9.1f ns | %15.1fx%s\n",
               human_size(sizes[i], sz, sizeof sz), ns, ans, lns, bns, bns / ns,
               failed ? "  (a call failed)" : "");
        any_failed = any_failed || failed;
    }
    pair_job proto = {PINMEM_SYNC, b, pool, baseline_pool, NULL, 4096, 0, false, NULL, NULL};
    double pinmem_rate[5], glibc_rate[5], base_one, base_sixteen;
    scaling(proto, pinmem_rate, glibc_rate);
    proto.kind = BASELINE;
    base_one = pairs_per_second(proto, 1);
    base_sixteen = pairs_per_second(proto, 16);
    printf("\n4 KiB pairs per second, in total, all threads through one 300 ms window "
           "(median of %d rounds; the baseline's pool once; x: over one thread, higher is "
           "better):\n"
           "  %-8s%20s%20s%20s%20s%20s\n", scaling_rounds, "threads", "1", "2", "4", "8", "16");
    print_scaling("pinmem", pinmem_rate, 1e6);
    print_scaling("glibc", glibc_rate, 1e6);
    printf("  %-8s %9.2f M (%4.1fx) %59s %9.2f M (%4.1fx)\n", "baseline", base_one / 1e6, 1.0, "",
           base_sixteen / 1e6, base_sixteen / base_one);
    printf("4 KiB pairs per second, in total: pinmem 1 thread %.1f M, 16 threads %.1f M (%.1fx); "
           "baseline 1 thread %.2f M, 16 threads %.2f M (%.1fx); for reference, glibc malloc+free "
           "1 thread %.1f M, 16 threads %.1f M (%.1fx)\n",
           pinmem_rate[0] / 1e6, pinmem_rate[4] / 1e6, pinmem_rate[4] / pinmem_rate[0],
           base_one / 1e6, base_sixteen / 1e6, base_sixteen / base_one, glibc_rate[0] / 1e6,
           glibc_rate[4] / 1e6, glibc_rate[4] / glibc_rate[0]);
    if (!quick)
        copy_speed(b, pool);
    cold_first_alloc(b);
    for (int zero = 0; zero < 2; zero++) {
        steady_state(false, zero);
        steady_state(true, zero);
    }
    pm_stream_destroy(stream);
    b->pool_close(baseline_pool);
    pm_mem_pool_destroy(pool);
    return any_failed ? 1 : 0;
}
