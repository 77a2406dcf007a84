/* Cold alloc and free cost of pinned host memory: pinmem against the
 * backend's plain way (the driver's cuMemHostAlloc, or mmap + mlock), side
 * by side in one run, alternating so drift hits both alike. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "commands.h"

typedef struct sample {
    double alloc_ns, free_ns;
} sample;

/* Each returns PM_SUCCESS, or the failure it printed. */
static pm_result run_pinmem(size_t bytes, sample *s)
{
    void *p = NULL;
    double t0 = now_ns();
    pm_result r = pm_mem_alloc_host(&p, bytes);
    double t1 = now_ns();
    if (r != PM_SUCCESS) {
        printf("    pinmem alloc of %zu failed: %s: %s\n", bytes, pm_result_name(r),
               pm_last_error_detail());
        return r;
    }
    memset(p, 1, 64); /* the memory is usable, not just promised */
    r = pm_mem_free_host(p);
    double t2 = now_ns();
    s->alloc_ns = t1 - t0;
    s->free_ns = t2 - t1;
    if (r != PM_SUCCESS)
        printf("    pinmem free of %zu failed: %s: %s\n", bytes, pm_result_name(r),
               pm_last_error_detail());
    return r;
}

static pm_result run_baseline(const baseline *b, size_t bytes, sample *s)
{
    void *p = NULL;
    double t0 = now_ns();
    pm_result r = b->pin(&p, bytes);
    double t1 = now_ns();
    if (r != PM_SUCCESS) {
        printf("    %s of %zu failed: %s\n", b->pin_name, bytes, baseline_detail());
        return r;
    }
    memset(p, 1, 64);
    r = b->unpin(p, bytes);
    double t2 = now_ns();
    s->alloc_ns = t1 - t0;
    s->free_ns = t2 - t1;
    if (r != PM_SUCCESS)
        printf("    its unpinning of %zu failed: %s\n", bytes, baseline_detail());
    return r;
}

static unsigned long long anon_huge_kib(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %llu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

/* Pages touched by several threads, 2 MiB at a time from one counter. */
typedef struct touch_job {
    uint8_t *base;
    size_t len, page;
    atomic_size_t next;
} touch_job;

static void *touch(void *arg)
{
    touch_job *j = arg;
    const size_t chunk = (size_t)2 << 20;
    for (size_t off; (off = atomic_fetch_add(&j->next, chunk)) < j->len;)
        for (size_t i = off; i < off + chunk && i < j->len; i += j->page)
            ((volatile uint8_t *)j->base)[i] = 0;
    return NULL;
}

/* What the machine charges for the pages alone: len bytes mapped 2 MiB
 * aligned with huge pages advised, then faulted in by this thread and up to
 * 16 more (one per 32 MiB), as pinmem gets the pages of a large allocation
 * before it pins them. Returns the pages (unmap *map, *map_len) or NULL. */
static void *pages_alone(size_t len, void **map, size_t *map_len)
{
    const size_t align = (size_t)2 << 20;
    *map_len = len + align;
    *map = mmap(NULL, *map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (*map == MAP_FAILED)
        return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)*map + align - 1) & ~(uintptr_t)(align - 1));
    madvise(p, len, MADV_HUGEPAGE);
    touch_job job = {.base = p, .len = len, .page = (size_t)sysconf(_SC_PAGESIZE)};
    atomic_init(&job.next, 0);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t threads = len / ((size_t)32 << 20);
    threads = threads > 16 ? 16 : threads;
    threads = cpus > 0 && threads > (size_t)cpus ? (size_t)cpus : threads;
    pthread_t tids[16];
    size_t started = 0;
    while (threads > 1 && started < threads &&
           pthread_create(&tids[started], NULL, touch, &job) == 0)
        started++;
    touch(&job); /* this thread works too */
    for (size_t i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    return p;
}

static void print_pages_share(size_t bytes, int reps)
{
    enum { max_reps = 7 };
    double t[max_reps];
    unsigned long long huge_kib = 0;
    int n = reps < max_reps ? reps : max_reps;
    for (int k = 0; k < n; k++) {
        void *map = NULL;
        size_t map_len = 0;
        double t0 = now_ns();
        void *p = pages_alone(bytes, &map, &map_len);
        t[k] = now_ns() - t0;
        if (!p)
            return;
        huge_kib = anon_huge_kib();
        munmap(map, map_len);
    }
    char buf[32];
    printf("          of which getting the pages alone (mmap, faulted in by several threads): %s "
           "(%llu MiB of it in huge pages)\n",
           human_time(median(t, (size_t)n), buf, sizeof buf), huge_kib / 1024);
}

int bench_host(bool quick)
{
    const baseline *b = baseline_open("bench host");
    if (!b)
        return 1;
    static const size_t sizes[] = {4u << 10, 64u << 10, 1u << 20, 16u << 20, 256u << 20,
                                   1u << 30};
    enum { max_reps = 41 };
    printf("host alloc + free, cold, median of N (backend %s; baseline %s)\n", pm_backend_name(),
           b->pin_name);
    printf("%-9s %4s | %12s %11s | %14s %11s | %17s %17s\n", "size", "N", "pinmem alloc", "free",
           "baseline alloc", "free", "alloc, x faster", "free, x faster");
    printf("%-9s %4s | %12s %11s | %14s %11s | %17s %17s\n", "", "", "", "", "", "",
           "higher is better", "higher is better");
    bool failed = false;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t bytes = sizes[i];
        int reps = bytes >= (256u << 20) ? (quick ? 3 : 7) : bytes >= (16u << 20) ? 11 : (quick ? 21 : max_reps);
        double pa[max_reps], pf[max_reps], ba[max_reps], bf[max_reps];
        sample warm;
        pm_result r = run_pinmem(bytes, &warm);
        if (r == PM_SUCCESS)
            r = run_baseline(b, bytes, &warm);
        for (int k = 0; r == PM_SUCCESS && k < reps; k++) {
            sample sp = {0}, sb = {0};
            r = run_pinmem(bytes, &sp);
            if (r == PM_SUCCESS)
                r = run_baseline(b, bytes, &sb);
            pa[k] = sp.alloc_ns;
            pf[k] = sp.free_ns;
            ba[k] = sb.alloc_ns;
            bf[k] = sb.free_ns;
        }
        char sz[32], t1[32], t2[32], t3[32], t4[32];
        if (r != PM_SUCCESS) {
            /* what may be pinned (a memlock limit, the budget) skips a size; else it failed */
            failed = failed || r != PM_ERROR_OUT_OF_MEMORY;
            printf("%-9s  skipped (see the line above)\n", human_size(bytes, sz, sizeof sz));
            continue;
        }
        double mpa = median(pa, reps), mpf = median(pf, reps), mba = median(ba, reps),
               mbf = median(bf, reps);
        printf("%-9s %4d | %12s %11s | %14s %11s | %16.2fx %16.2fx\n",
               human_size(bytes, sz, sizeof sz), reps, human_time(mpa, t1, sizeof t1),
               human_time(mpf, t2, sizeof t2), human_time(mba, t3, sizeof t3),
               human_time(mbf, t4, sizeof t4), mba / mpa, mbf / mpf);
        if (!quick && bytes >= (256u << 20))
            print_pages_share(bytes, reps);
    }
    printf("(x faster: the baseline's time over pinmem's; above 1, pinmem is faster)\n");
    return failed ? 1 : 0;
}
