#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "commands.h"

double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double median(double *v, size_t n)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

const char *human_size(size_t bytes, char *buf, size_t cap)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    size_t v = bytes;
    while (v >= 1024 && v % 1024 == 0 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, cap, "%zu %s", v, units[u]);
    return buf;
}

const char *human_time(double ns, char *buf, size_t cap)
{
    if (ns < 1e3)
        snprintf(buf, cap, "%.0f ns", ns);
    else if (ns < 1e6)
        snprintf(buf, cap, "%.1f us", ns / 1e3);
    else if (ns < 1e9)
        snprintf(buf, cap, "%.2f ms", ns / 1e6);
    else
        snprintf(buf, cap, "%.3f s", ns / 1e9);
    return buf;
}
