/* What the preload says on stderr, and what it counts: per interposed
 * function, the calls pinmem served (and their bytes), the calls passed on
 * to the runtime, and the calls pinmem failed and the runtime then served.
 * PINMEM_STATS=1 prints them at exit, in the process that counted them (a
 * forked child counts its own). */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "preload.h"

typedef struct counts {
    atomic_ullong served, bytes, passed, fell_back;
} counts;

static counts table[PM__FN_COUNT];
static const char *const names[PM__FN_COUNT] = {
#define PM__PRELOAD_FN_NAME_(name) #name,
    PM__PRELOAD_FUNCTIONS(PM__PRELOAD_FN_NAME_)
#undef PM__PRELOAD_FN_NAME_
};

void pm__preload_say(const char *fmt, ...)
{
    char line[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "pinmem preload: %s\n", line);
}

void pm__preload_count_served(pm__preload_fn fn, size_t bytes)
{
    atomic_fetch_add_explicit(&table[fn].served, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&table[fn].bytes, bytes, memory_order_relaxed);
}

void pm__attempt_failed(pm__attempt *a, const pm__pinmem_api *pm, pm_result r)
{
    a->tried = true;
    a->r = r;
    snprintf(a->detail, sizeof a->detail, "%s", pm->pm_last_error_detail());
}

cudaError_t pm__attempt_settle(const pm__attempt *a, cudaError_t real_rc)
{
    static atomic_uint said, said_off; /* features told of a fallback, of turning off */
    counts *c = &table[a->fn];
    if (!a->tried) {
        atomic_fetch_add_explicit(&c->passed, 1, memory_order_relaxed);
        return real_rc;
    }
    atomic_fetch_add_explicit(&c->fell_back, 1, memory_order_relaxed);
    if (real_rc != cudaSuccess)
        return real_rc; /* the program's own error: the runtime answered it */
    const bool off = a->r != PM_ERROR_OUT_OF_MEMORY;
    if (off)
        pm__preload_turn_off(a->feature);
    /* Turning a feature off is told even where a fallback of it was told before. */
    if (atomic_fetch_or(off ? &said_off : &said, a->feature) & a->feature)
        return real_rc;
    const pm__pinmem_api *pm = pm__pinmem();
    pm__preload_say("pinmem could not serve %s (%s: %s); the CUDA runtime's own call did%s",
                    names[a->fn], pm ? pm->pm_result_name(a->r) : "?", a->detail,
                    !off                                ? ""
                    : a->feature == PM__PRELOAD_ALLOC ? ", and serves all pinning from now on"
                                                      : ", and serves all copies from now on");
    return real_rc;
}

static pid_t counted_in;

static void human(unsigned long long n, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    unsigned u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

static void print_stats(void)
{
    if (getpid() != counted_in)
        return; /* a forked child's copy of the parent's counts */
    static const char *const modes[] = {"off", "alloc", "copy", "all"};
    fprintf(stderr, "pinmem preload (pid %d, PINMEM_PRELOAD=%s): calls served by pinmem, passed "
                    "to the CUDA runtime, and failed by pinmem then served by the runtime\n",
            (int)getpid(), modes[pm__preload_mode() & 3]);
    fprintf(stderr, "  %-26s %10s %12s %10s %10s\n", "function", "pinmem", "bytes", "runtime",
            "fell back");
    for (int i = 0; i < PM__FN_COUNT; i++) {
        unsigned long long s = atomic_load(&table[i].served), p = atomic_load(&table[i].passed),
                           f = atomic_load(&table[i].fell_back);
        if (!s && !p && !f)
            continue;
        char bytes[32];
        human(atomic_load(&table[i].bytes), bytes, sizeof bytes);
        fprintf(stderr, "  %-26s %10llu %12s %10llu %10llu\n", names[i], s, bytes, p, f);
    }
}

/* A forked child counts its own calls from nothing, and prints them at its exit. */
static void count_in_child(void)
{
    memset(table, 0, sizeof table);
    counted_in = getpid();
}

static void arm(void)
{
    if (!pm__preload_stats_wanted())
        return;
    counted_in = getpid();
    pthread_atfork(NULL, NULL, count_in_child);
    atexit(print_stats);
}

void pm__preload_stats_arm(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, arm);
}
