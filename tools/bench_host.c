/* Cold alloc and free cost of pinned host memory: pinmem against the
 * backend's own way (the driver's cuMemHostAlloc, or mmap + mlock), side by
 * side in one run, alternating so drift hits both alike. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/backend.h"
#include "commands.h"
#include "instance.h"
#include "pinmem.h"

typedef struct sample {
    double alloc_ns, free_ns;
} sample;

static bool run_pinmem(size_t bytes, sample *s)
{
    void *p = NULL;
    double t0 = now_ns();
    pm_result r = pm_mem_alloc_host(&p, bytes);
    double t1 = now_ns();
    if (r != PM_SUCCESS) {
        printf("    pinmem alloc of %zu failed: %s: %s\n", bytes, pm_result_name(r),
               pm_last_error_detail());
        return false;
    }
    memset(p, 1, 64); /* the memory is usable, not just promised */
    r = pm_mem_free_host(p);
    double t2 = now_ns();
    s->alloc_ns = t1 - t0;
    s->free_ns = t2 - t1;
    return r == PM_SUCCESS;
}

static bool run_baseline(const pm__backend *b, size_t bytes, sample *s)
{
    void *p = NULL;
    double t0 = now_ns();
    pm_result r = b->baseline_alloc(&p, bytes);
    double t1 = now_ns();
    if (r != PM_SUCCESS) {
        printf("    %s of %zu failed: %s: %s\n", b->baseline_name, bytes, pm_result_name(r),
               pm_last_error_detail());
        return false;
    }
    memset(p, 1, 64);
    r = b->baseline_free(p, bytes);
    double t2 = now_ns();
    s->alloc_ns = t1 - t0;
    s->free_ns = t2 - t1;
    return r == PM_SUCCESS;
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

/* How much of a large cold allocation is getting the pages at all (mapping
 * and faulting them in on several threads), before anything is pinned. */
static void print_prefault_share(size_t bytes, int reps)
{
    enum { max_reps = 7 };
    double t[max_reps];
    unsigned long long huge_kib = 0;
    int n = reps < max_reps ? reps : max_reps;
    for (int k = 0; k < n; k++) {
        size_t len = 0;
        double t0 = now_ns();
        void *p = pm__map_anonymous(bytes, &len);
        if (!p)
            return;
        pm__prefault(p, len);
        t[k] = now_ns() - t0;
        huge_kib = anon_huge_kib();
        munmap(p, len);
    }
    char buf[32];
    printf("          of which mmap + parallel pre-fault alone: %s (%llu MiB of it in huge pages)\n",
           human_time(median(t, (size_t)n), buf, sizeof buf), huge_kib / 1024);
}

int bench_host(bool quick)
{
    pm_result r = PM_SUCCESS;
    pm__instance *inst = pm__instance_get(&r);
    if (!inst) {
        printf("bench host: no backend: %s\n", pm_last_error_detail());
        return 1;
    }
    const pm__backend *b = &inst->backend;
    static const size_t sizes[] = {4u << 10, 64u << 10, 1u << 20, 16u << 20, 256u << 20,
                                   1u << 30};
    enum { max_reps = 41 };
    printf("host alloc + free, cold, median of N (backend %s; baseline %s)\n", b->name,
           b->baseline_name);
    printf("%-9s %4s | %11s %11s | %11s %11s | %8s %8s\n", "size", "N", "pinmem alloc",
           "free", "baseline alloc", "free", "alloc x", "free x");
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t bytes = sizes[i];
        int reps = bytes >= (256u << 20) ? (quick ? 3 : 7) : bytes >= (16u << 20) ? 11 : (quick ? 21 : max_reps);
        double pa[max_reps], pf[max_reps], ba[max_reps], bf[max_reps];
        bool ok = true;
        sample warm;
        ok = run_pinmem(bytes, &warm) && run_baseline(b, bytes, &warm);
        for (int k = 0; ok && k < reps; k++) {
            sample sp = {0}, sb = {0};
            ok = run_pinmem(bytes, &sp) && run_baseline(b, bytes, &sb);
            pa[k] = sp.alloc_ns;
            pf[k] = sp.free_ns;
            ba[k] = sb.alloc_ns;
            bf[k] = sb.free_ns;
        }
        char sz[32], t1[32], t2[32], t3[32], t4[32];
        if (!ok) {
            printf("%-9s  skipped (see the line above)\n", human_size(bytes, sz, sizeof sz));
            continue;
        }
        double mpa = median(pa, reps), mpf = median(pf, reps), mba = median(ba, reps),
               mbf = median(bf, reps);
        printf("%-9s %4d | %11s %11s | %11s %11s | %7.2fx %7.2fx\n",
               human_size(bytes, sz, sizeof sz), reps, human_time(mpa, t1, sizeof t1),
               human_time(mpf, t2, sizeof t2), human_time(mba, t3, sizeof t3),
               human_time(mbf, t4, sizeof t4), mba / mpa, mbf / mpf);
        if (!quick && bytes >= (256u << 20))
            print_prefault_share(bytes, reps);
    }
    printf("(x = baseline time / pinmem time: above 1 means pinmem is faster)\n");
    return 0;
}
