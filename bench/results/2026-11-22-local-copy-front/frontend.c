/* What pm_memcpy_htod adds to the backend's own synchronous copy for a
 * 64-byte copy from pageable and from page-locked memory (POSIX backend).
 * Build from the repository root against a build's static library:
 * gcc -O2 -Iinclude -Isrc -Itests -I/usr/local/cuda/include FILE.c BUILD/libpinmem.a -pthread -ldl
 * run: PINMEM_BACKEND=posix ./a.out */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "copy_util.h"

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(void)
{
    enum { N = 2000000 };
    const size_t n = 64;
    if (pm_init(0) != PM_SUCCESS)
        return 1;
    uint8_t *pageable = malloc(4096), *pinned = NULL;
    if (!pageable || pm_mem_alloc_host((void **)&pinned, 4096) != PM_SUCCESS)
        return 1;
    pm_deviceptr d = device_alloc(4096);
    const pm__backend *b = test_backend();
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_ns();
        for (int i = 0; i < N; i++)
            b->copy_htod(d, pageable, n);
        double t1 = now_ns();
        for (int i = 0; i < N; i++)
            pm_memcpy_htod(d, pageable, n);
        double t2 = now_ns();
        for (int i = 0; i < N; i++)
            pm_memcpy_htod(d, pinned, n);
        double t3 = now_ns();
        printf("backend %.1f ns, pm_memcpy_htod pageable %.1f ns, pinned %.1f ns\n", (t1 - t0) / N,
               (t2 - t1) / N, (t3 - t2) / N);
    }
    return 0;
}
