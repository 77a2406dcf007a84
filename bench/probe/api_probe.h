/* What the probes of pinmem's own calls share: a millisecond clock, an
 * ordering of doubles for qsort, and a stop on the first failing call that
 * says what failed. Header-only, so each probe still builds alone with
 * gcc -Iinclude FILE.c -lpinmem. */
#ifndef PINMEM_API_PROBE_H
#define PINMEM_API_PROBE_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "pinmem.h"

static inline double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static inline int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline void fail(const char *what, pm_result r)
{
    fprintf(stderr, "%s: %s (%s)\n", what, pm_result_name(r), pm_last_error_detail());
    exit(1);
}

#endif
