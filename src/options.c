/* The PINMEM_* table, its parser and its one check (options.h says the
 * rules). */
#include "options.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"

typedef enum { FLAG, CHOICE, COUNT, SIZE } kind;

enum {
    ZERO_DEFAULT = 1, /* 0 means the default */
    PAGES = 2,        /* rounded up to whole pages */
    NONE = 4          /* -1 (the largest value) means none */
};

typedef struct spec {
    const char *env, *field; /* field: in pm_copy_config, or NULL */
    kind type;
    unsigned flags;
    const char *choices;          /* CHOICE: "auto|cuda|posix" */
    unsigned long long min, max;  /* COUNT, SIZE: besides 0 (ZERO_DEFAULT) and -1 (NONE) */
    unsigned long long fallback;  /* the default, where it is one number */
    const char *default_text, *doc;
} spec;

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define GIB (1024ull * MIB)

static const spec table[PM__OPT_COUNT] = {
    [PM__OPT_BACKEND] = {"PINMEM_BACKEND", NULL, CHOICE, 0, "auto|cuda|posix", 0, 0, 0, "auto",
                         "which backend: the CUDA driver where it loads, else POSIX (auto), or "
                         "only the one named"},
    [PM__OPT_DEVICE] = {"PINMEM_DEVICE", NULL, COUNT, 0, NULL, 0, INT_MAX, 0, "0",
                        "the CUDA device whose primary context pinmem uses"},
    [PM__OPT_STATS] = {"PINMEM_STATS", NULL, FLAG, 0, NULL, 0, 1, 0, "0",
                       "1: print the pools' statistics when the process exits"},
    [PM__OPT_POOL_VMM] = {"PINMEM_POOL_VMM", NULL, CHOICE, 0, "auto|0|1", 0, 0, 0, "auto",
                          "CUDA pool chunks: VMM host granules for every pool (1), registered "
                          "chunks for every pool (0), or by release threshold (auto)"},
    [PM__OPT_PINNED_BUDGET] = {"PINMEM_PINNED_BUDGET", "pinned_budget", SIZE, ZERO_DEFAULT, NULL,
                               1, ULLONG_MAX, 0, "0 (none)",
                               "the most bytes the process pins through pinmem"},
    [PM__OPT_THREAD_CPUS] = {"PINMEM_THREAD_CPUS", NULL, CHOICE, 0, "caller|process", 0, 0, 0,
                             "caller",
                             "the CPUs pinmem's threads run on and are counted from: those of "
                             "the thread whose call starts them (caller), or every CPU of the "
                             "process's cpuset (process: for programs whose threads OpenMP "
                             "binds, OMP_PROC_BIND, which leaves the main thread one CPU)"},
    [PM__OPT_REGISTRATION_CACHE] = {"PINMEM_REGISTRATION_CACHE", "registration_cache", FLAG, 0,
                                    NULL, 0, 1, 0, "0",
                                    "1: keep large pageable buffers registered between copies"},
    [PM__OPT_REGISTRATION_CACHE_MIN] = {"PINMEM_REGISTRATION_CACHE_MIN", "cache_min_bytes", SIZE,
                                        ZERO_DEFAULT | PAGES, NULL, 4 * KIB, 1024 * 1024 * GIB,
                                        64 * MIB, "64M",
                                        "the smallest buffer the registration cache registers"},
    [PM__OPT_REGISTRATION_CACHE_MAX] = {"PINMEM_REGISTRATION_CACHE_MAX", "cache_max_bytes", SIZE,
                                        ZERO_DEFAULT | PAGES, NULL, 4 * KIB, 1024 * 1024 * GIB,
                                        0, "a quarter of the (cgroup's) memory, 8G at most",
                                        "the most bytes the registration cache keeps registered"},
    [PM__OPT_COPY_WORKERS] = {"PINMEM_COPY_WORKERS", "workers", COUNT, ZERO_DEFAULT, NULL, 1, 256,
                              0, "usable CPUs - 1, from 1 to 15", "staging threads"},
    [PM__OPT_COPY_HTOD_WORKERS] = {"PINMEM_COPY_HTOD_WORKERS", "htod_workers", COUNT,
                                   ZERO_DEFAULT, NULL, 1, 256, 0, "all the workers",
                                   "of the workers, the most that fill buffers for "
                                   "host-to-device copies"},
    [PM__OPT_COPY_CHUNK] = {"PINMEM_COPY_CHUNK", "chunk_bytes", SIZE, ZERO_DEFAULT | PAGES, NULL,
                            64 * KIB, 256 * MIB, 4 * MIB, "4M",
                            "one staging buffer, moved by one DMA"},
    [PM__OPT_COPY_SLICE] = {"PINMEM_COPY_SLICE", "slice_bytes", SIZE, ZERO_DEFAULT | PAGES, NULL,
                            4 * KIB, 256 * MIB, 512 * KIB, "512K",
                            "one CPU copy into or out of a staging buffer"},
    [PM__OPT_COPY_DTOH_SLICE] = {"PINMEM_COPY_DTOH_SLICE", "dtoh_slice_bytes", SIZE,
                                 ZERO_DEFAULT | PAGES, NULL, 4 * KIB, 256 * MIB, 128 * KIB, "128K",
                                 "one CPU copy out of a staging buffer, for copies from the "
                                 "device larger than a slice and up to 4 MiB (twice this "
                                 "above, up to 64 MiB)"},
    [PM__OPT_COPY_BUFFERS] = {"PINMEM_COPY_BUFFERS", "buffers", COUNT, ZERO_DEFAULT, NULL, 1,
                              1024, 0, "twice the buffers all threads fill at once, plus 4",
                              "staging buffers in the ring"},
    [PM__OPT_COPY_DIRECT_MAX] = {"PINMEM_COPY_DIRECT_MAX", "direct_max", SIZE, ZERO_DEFAULT | NONE,
                                 NULL, 1, ULLONG_MAX - 1, 512 * KIB, "512K",
                                 "pageable copies to the device up to this size take the "
                                 "backend's own path (-1: none do)"},
    [PM__OPT_COPY_DTOH_DIRECT_MAX] = {"PINMEM_COPY_DTOH_DIRECT_MAX", "dtoh_direct_max", SIZE,
                                      ZERO_DEFAULT | NONE, NULL, 1, ULLONG_MAX - 1, 32 * KIB,
                                      "32K, or PINMEM_COPY_DIRECT_MAX where smaller",
                                      "pageable copies from the device up to this size take the "
                                      "backend's own path (-1: none do)"},
    [PM__OPT_COPY_STORES] = {"PINMEM_COPY_STORES", "staging_stores", CHOICE, 0,
                             "default|cached|streaming|demoting", 0, 0, 0, "default",
                             "how staging threads store into and out of the buffers"},
    [PM__OPT_COPY_FIRST_PIECE] = {"PINMEM_COPY_FIRST_PIECE", "first_piece_bytes", SIZE,
                                  ZERO_DEFAULT | PAGES, NULL, 4 * KIB, 256 * MIB, 0, "the slice",
                                  "a staged copy's first piece to the device (one DMA); each "
                                  "next one doubles"},
    [PM__OPT_COPY_DTOH_FIRST_PIECE] = {"PINMEM_COPY_DTOH_FIRST_PIECE", "dtoh_first_piece_bytes",
                                       SIZE, ZERO_DEFAULT | PAGES, NULL, 4 * KIB, 256 * MIB,
                                       2 * MIB, "2M",
                                       "a staged copy's first piece from the device (one DMA); "
                                       "each next one doubles"},
    [PM__OPT_COPY_PIECES] = {"PINMEM_COPY_PIECES", "pieces", COUNT, ZERO_DEFAULT, NULL, 1, 1024, 1,
                             "1", "a staged copy is cut into at least this many pieces (DMAs), "
                                  "none smaller than the first"},
    [PM__OPT_COPY_SPIN_US] = {"PINMEM_COPY_SPIN_US", "spin_us", COUNT, ZERO_DEFAULT | NONE, NULL,
                              1, 10000, PM__OPT_NONE, "-1 (none)",
                              "microseconds a staging worker looks for more work after a copy of "
                              "up to a buffer before it sleeps (-1: none)"},
    [PM__OPT_COPY_RING] = {"PINMEM_COPY_RING", "ring", CHOICE, 0, "default|shared|split", 0, 0, 0,
                           "default (split)",
                           "copies both ways at once: each direction holds at most half the "
                           "staging buffers (split), or whoever asks first takes one (shared)"},
    [PM__OPT_COPY_BATCH] = {"PINMEM_COPY_BATCH", "batch", CHOICE, 0,
                            "default|gather|each|driver|kernel", 0, 0, 0, "default (kernel)",
                            "pm_memcpy_batch_async: pageable blocks gathered through the staging "
                            "buffers with one driver call for many DMAs (gather), the same with "
                            "a call a DMA (each), every block to the driver's own batch copy "
                            "(driver), or as gather with blocks up to PINMEM_COPY_KERNEL_MAX "
                            "moved by one kernel launch for many (kernel; gather where the "
                            "kernel cannot run)"},
    [PM__OPT_COPY_KERNEL_MAX] = {"PINMEM_COPY_KERNEL_MAX", NULL, SIZE, ZERO_DEFAULT | NONE, NULL,
                                 1, 256 * MIB, 512 * KIB, "512K",
                                 "pm_memcpy_batch_async with the kernel: the largest block it "
                                 "moves (larger ones take DMAs; -1: none)"},
    [PM__OPT_COPY_KERNEL_STAGED] = {"PINMEM_COPY_KERNEL_STAGED", NULL, CHOICE, 0, "0|1", 0, 0, 0,
                                    "0",
                                    "pm_memcpy_batch_async with the kernel: pageable blocks, "
                                    "once gathered into a staging buffer, move by one DMA to "
                                    "device memory beside it and one launch scattering them "
                                    "there (1) rather than a DMA a block (0)"},
    [PM__OPT_COPY_KERNEL_PER_SM] = {"PINMEM_COPY_KERNEL_PER_SM", NULL, COUNT, ZERO_DEFAULT, NULL, 1,
                                    8, 4, "4",
                                    "the batch kernel: blocks of threads launched per "
                                    "multiprocessor (more keep more reads of host memory in "
                                    "flight)"},
    [PM__OPT_COPY_TRACE] = {"PINMEM_COPY_TRACE", NULL, COUNT, ZERO_DEFAULT, NULL, 1, 100000000,
                            0, "0 (off)",
                            "the staging engine notes its first N events (jobs, slices, DMAs, "
                            "waits, wake-ups) and prints them to stderr at exit "
                            "(bench/probe/trace_summary.py)"},
};

/* What the environment gave, and the value in effect. */
static struct {
    bool in_env;
    unsigned long long env;
    bool published;
    unsigned long long value;
    const char *source;
    char allowed[80];
} state[PM__OPT_COUNT];
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static void load(void);
static pm_result load_result;
static char load_detail[320];

static const char *const from_default = "default", *const from_environment = "environment",
                        *const from_code = "code";

/* The n-th word of a CHOICE's list into buf; false past the last. */
static bool choice_word(const spec *o, unsigned n, char *buf, size_t cap)
{
    const char *w = o->choices;
    for (unsigned i = 0; i < n && w; i++) {
        w = strchr(w, '|');
        w = w ? w + 1 : NULL;
    }
    if (!w)
        return false;
    size_t len = strcspn(w, "|");
    snprintf(buf, cap, "%.*s", (int)(len < cap ? len : cap - 1), w);
    return true;
}

/* A size the way the environment writes it: 4M, 512K, 4097. */
static void format_size(unsigned long long v, char *buf, size_t cap)
{
    static const char units[] = "KMGT";
    int u = -1;
    while (v >= 1024 && v % 1024 == 0 && u < 3) {
        v /= 1024;
        u++;
    }
    if (u < 0)
        snprintf(buf, cap, "%llu", v);
    else
        snprintf(buf, cap, "%llu%c", v, units[u]);
}

static void format_value(const spec *o, unsigned long long v, char *buf, size_t cap)
{
    if (o->type == CHOICE && choice_word(o, (unsigned)v, buf, cap))
        return;
    if ((o->flags & NONE) && v == PM__OPT_NONE)
        snprintf(buf, cap, "-1");
    else if (o->type == SIZE)
        format_size(v, buf, cap);
    else
        snprintf(buf, cap, "%llu", v);
}

static void describe_allowed(const spec *o, char *buf, size_t cap)
{
    if (o->type == FLAG) {
        snprintf(buf, cap, "0 or 1");
        return;
    }
    if (o->type == CHOICE) {
        size_t at = 0;
        char word[32];
        for (unsigned n = 0; choice_word(o, n, word, sizeof word) && at < cap; n++)
            at += (size_t)snprintf(buf + at, cap - at, "%s%s", n ? ", " : "", word);
        return;
    }
    char lo[24], hi[32] = " or more";
    format_size(o->min, lo, sizeof lo);
    if (o->max < ULLONG_MAX - 1) {
        snprintf(hi, sizeof hi, " to ");
        format_size(o->max, hi + 4, sizeof hi - 4);
    }
    snprintf(buf, cap, "%s%s%s%s%s", lo, hi, o->flags & PAGES ? ", in whole pages" : "",
             o->flags & ZERO_DEFAULT ? "; 0: the default" : "",
             o->flags & NONE ? "; -1: none" : "");
}

/* Whether the environment named a value (0 names the default, where it means that). */
static bool named_in_env(pm__option id)
{
    return state[id].in_env && (state[id].env != 0 || !(table[id].flags & ZERO_DEFAULT));
}

static pm_result check(pm__option id, unsigned long long v, const char *who,
                       unsigned long long *out)
{
    const spec *o = &table[id];
    const char *allowed = state[id].allowed;
    switch (o->type) {
    case FLAG:
        if (v > 1)
            return pm__fail(PM_ERROR_INVALID_VALUE, "%s: must be 0 or 1", who);
        break;
    case CHOICE: {
        char word[32];
        if (v > UINT_MAX || !choice_word(o, (unsigned)v, word, sizeof word))
            return pm__fail(PM_ERROR_INVALID_VALUE, "%s: must be one of %s", who, allowed);
        break;
    }
    case COUNT:
    case SIZE:
        if ((v == 0 && (o->flags & ZERO_DEFAULT)) || (v == PM__OPT_NONE && (o->flags & NONE)))
            break;
        if (v > o->max)
            return pm__fail(PM_ERROR_INVALID_VALUE, "%s: out of range (allowed: %s)", who, allowed);
        if (o->flags & PAGES) {
            unsigned long long page = (unsigned long long)sysconf(_SC_PAGESIZE);
            v = (v + page - 1) / page * page;
        }
        if (v < o->min)
            return pm__fail(PM_ERROR_INVALID_VALUE, "%s: out of range (allowed: %s)", who, allowed);
        break;
    }
    *out = v;
    return PM_SUCCESS;
}

pm_result pm__option_check(pm__option id, unsigned long long v, const char *who,
                           unsigned long long *out)
{
    pthread_once(&load_once, load);
    return check(id, v, who, out);
}

const char *pm__option_field(pm__option id) { return table[id].field; }

enum { PARSED, NOT_A_VALUE, TOO_LARGE };

/* Text to a number of o's type, before the range check. */
static int parse(const spec *o, const char *text, unsigned long long *v)
{
    if (o->type == CHOICE) {
        char word[32];
        for (unsigned n = 0; choice_word(o, n, word, sizeof word); n++)
            if (strcmp(text, word) == 0) {
                *v = n;
                return PARSED;
            }
        return NOT_A_VALUE;
    }
    if ((o->flags & NONE) && strcmp(text, "-1") == 0) {
        *v = PM__OPT_NONE;
        return PARSED;
    }
    const char *p = text;
    unsigned long long n = 0;
    if (*p < '0' || *p > '9')
        return NOT_A_VALUE;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (n > (ULLONG_MAX - d) / 10)
            return TOO_LARGE;
        n = n * 10 + d;
    }
    if (o->type == SIZE && *p) {
        static const char units[] = "kmgt";
        const char *u = strchr(units, *p | 0x20);
        if (!u)
            return NOT_A_VALUE;
        unsigned shift = 10 * (unsigned)(u - units + 1);
        if (n > (ULLONG_MAX >> shift))
            return TOO_LARGE;
        n <<= shift;
        p++;
        if (*p == 'i')
            p++;
        if (*p == 'B')
            p++;
    }
    *v = n;
    return *p == '\0' ? PARSED : NOT_A_VALUE;
}

static void load(void)
{
    load_result = PM_SUCCESS;
    for (int id = 0; id < PM__OPT_COUNT; id++) {
        const spec *o = &table[id];
        describe_allowed(o, state[id].allowed, sizeof state[id].allowed);
        const char *text = getenv(o->env);
        if (!text || !*text)
            continue;
        char who[160];
        snprintf(who, sizeof who, "%s=%.80s", o->env, text);
        unsigned long long v = 0;
        pm_result r;
        int parsed = parse(o, text, &v);
        if (parsed != PARSED)
            r = pm__fail(PM_ERROR_INVALID_VALUE, "%s: %s (allowed: %s)", who,
                         parsed == TOO_LARGE ? "too large" : "not a value it takes",
                         state[id].allowed);
        else
            r = check((pm__option)id, v, who, &v);
        if (r != PM_SUCCESS) {
            if (load_result == PM_SUCCESS) { /* the first bad one is named */
                load_result = r;
                snprintf(load_detail, sizeof load_detail, "%s", pm_last_error_detail());
            }
            continue;
        }
        state[id].in_env = true;
        state[id].env = v;
    }
}

pm_result pm__options_load(void)
{
    pthread_once(&load_once, load);
    if (load_result != PM_SUCCESS)
        return pm__fail(load_result, "%s", load_detail);
    return PM_SUCCESS;
}

bool pm__option_env(pm__option id, unsigned long long *value)
{
    pthread_once(&load_once, load);
    if (!state[id].in_env || state[id].env == 0)
        return false;
    *value = state[id].env;
    return true;
}

unsigned long long pm__option_value(pm__option id)
{
    pthread_once(&load_once, load);
    return named_in_env(id) ? state[id].env : table[id].fallback;
}

void pm__option_publish(pm__option id, unsigned long long value, unsigned long long default_value,
                        bool by_code)
{
    pthread_once(&load_once, load);
    pthread_mutex_lock(&state_lock);
    state[id].published = true;
    state[id].value = value;
    state[id].source = by_code && value != default_value ? from_code
                       : named_in_env(id)                   ? from_environment
                                                            : from_default;
    pthread_mutex_unlock(&state_lock);
}

bool pm__option_describe(unsigned index, pm_setting *s)
{
    if (index >= PM__OPT_COUNT)
        return false;
    pthread_once(&load_once, load);
    const spec *o = &table[index];
    pthread_mutex_lock(&state_lock);
    unsigned long long v = state[index].published ? state[index].value
                           : named_in_env(index) ? state[index].env
                                                 : o->fallback;
    const char *source = state[index].published ? state[index].source
                         : named_in_env(index)  ? from_environment
                                                : from_default;
    pthread_mutex_unlock(&state_lock);
    s->name = o->env;
    format_value(o, v, s->value, sizeof s->value);
    s->source = source;
    s->default_value = o->default_text;
    s->allowed = state[index].allowed;
    s->doc = o->doc;
    return true;
}
