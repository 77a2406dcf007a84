/* Monotonic nanoseconds, for the statistics that report time spent. */
#ifndef PINMEM_CLOCK_H
#define PINMEM_CLOCK_H

#include <time.h>

static inline unsigned long long pm__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

#endif
