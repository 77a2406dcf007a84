/* What the staging engine costs per slice: synchronous pageable copies of
 * each size, each way, through pinmem with the settings of the environment
 * (PINMEM_COPY_SLICE, PINMEM_COPY_WORKERS, ...), as GB/s (median of REPS).
 * Run it once per slice size; the difference in time between two slice sizes
 * over the difference in their slice counts is the engine's cost per slice.
 * Unlike the other probes it measures pinmem, so it links the library.
 * Build: cc -O2 -Iinclude bench/probe/staging_slices.c -Lbuild-test -lpinmem -o staging_slices
 * Run:   PINMEM_BACKEND=posix PINMEM_COPY_SLICE=64K LD_LIBRARY_PATH=build-test \
 *        ./staging_slices [REPS [MIB]]   (MIB: one size only)
 * (or probe_staging_slices, built with the other probes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pinmem.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 15;
    if (reps < 1 || reps > 1000)
        reps = 15;
    size_t sizes[] = {1 << 20, 4 << 20, 16 << 20, 64 << 20};
    size_t n_sizes = sizeof sizes / sizeof *sizes;
    if (argc > 2) { /* one size only, in MiB */
        sizes[0] = (size_t)strtoul(argv[2], NULL, 10) << 20;
        n_sizes = 1;
    }
    size_t most = 0;
    for (size_t s = 0; s < n_sizes; s++)
        most = sizes[s] > most ? sizes[s] : most;
    if (most == 0)
        return 1;
    unsigned char *h = malloc(most);
    pm_deviceptr d;
    if (!h || pm_device_alloc(&d, most) != PM_SUCCESS) {
        fprintf(stderr, "staging_slices: no memory (%s)\n", pm_last_error_detail());
        return 1;
    }
    memset(h, 1, most);
    double *t = malloc((size_t)reps * sizeof *t);
    const char *slice = getenv("PINMEM_COPY_SLICE");
    printf("slice %s: size, htod GB/s, dtoh GB/s (median of %d)\n", slice ? slice : "default",
           reps);
    for (size_t s = 0; s < n_sizes; s++) {
        double gbps[2];
        for (int dir = 0; dir < 2; dir++) {
            for (int i = 0; i < reps; i++) {
                double t0 = now_s();
                pm_result r = dir == 0 ? pm_memcpy_htod(d, h, sizes[s])
                                       : pm_memcpy_dtoh(h, d, sizes[s]);
                t[i] = now_s() - t0;
                if (r != PM_SUCCESS) {
                    fprintf(stderr, "staging_slices: %s\n", pm_last_error_detail());
                    return 1;
                }
            }
            qsort(t, (size_t)reps, sizeof *t, by_value);
            gbps[dir] = (double)sizes[s] / t[reps / 2] * 1e-9;
        }
        printf("%6zu MiB  %7.2f  %7.2f\n", sizes[s] >> 20, gbps[0], gbps[1]);
    }
    free(t);
    pm_device_free(d);
    free(h);
    return 0;
}
