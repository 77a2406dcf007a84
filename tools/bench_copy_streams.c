/* Pageable copies on the calling thread's own stream (PM_STREAM_PER_THREAD),
 * which the engine runs on a lane of its own (or, where it has none, stages
 * on the caller alone), against the same copies on a stream made by
 * pm_stream_create. Each copy
 * is timed with its stream's synchronization, the two kinds in turn. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_copy.h"

static pm_result copy_on(pm_stream_t s, bool to_device, const copy_buffers *cb, size_t n)
{
    pm_result r = to_device ? pm_memcpy_htod_async(cb->dev, cb->pageable, n, s)
                            : pm_memcpy_dtoh_async(cb->pageable, cb->dev, n, s);
    return r == PM_SUCCESS ? pm_stream_synchronize(s) : r;
}

/* Median GB/s on each of the two streams, copies alternating between them. */
static bool time_streams(const copy_buffers *cb, pm_stream_t made, bool to_device, size_t n,
                         int reps, double *on_made, double *on_own)
{
    double *a = malloc(sizeof *a * (size_t)reps), *b = malloc(sizeof *b * (size_t)reps);
    bool failed = !a || !b || copy_on(made, to_device, cb, n) != PM_SUCCESS ||
                  copy_on(PM_STREAM_PER_THREAD, to_device, cb, n) != PM_SUCCESS;
    for (int k = 0; k < reps && !failed; k++) {
        double t0 = now_ns();
        failed |= copy_on(made, to_device, cb, n) != PM_SUCCESS;
        double t1 = now_ns();
        failed |= copy_on(PM_STREAM_PER_THREAD, to_device, cb, n) != PM_SUCCESS;
        a[k] = t1 - t0;
        b[k] = now_ns() - t1;
    }
    *on_made = failed ? 0 : (double)n / median(a, (size_t)reps);
    *on_own = failed ? 0 : (double)n / median(b, (size_t)reps);
    free(a);
    free(b);
    return failed;
}

bool bench_copy_streams(const copy_buffers *cb, bool quick, copy_summary *sum)
{
    pm_stream_t made = NULL;
    if (pm_stream_create(&made) != PM_SUCCESS)
        return true;
    printf("\npageable copies on a stream of pm_stream_create and on the thread's own stream "
           "(PM_STREAM_PER_THREAD), GB/s, median\n");
    printf("%-9s | %9s %9s %7s | %9s %9s %7s\n", "size", "to, made", "to, own", "own/made",
           "from, made", "from, own", "own/made");
    bool failed = false;
    const size_t sizes[] = {(size_t)1 << 20, (size_t)16 << 20, (size_t)256 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && sizes[i] <= cb->max; i++) {
        const size_t n = sizes[i];
        const int reps = quick ? 3 : n <= ((size_t)16 << 20) ? 20 : 5;
        double to_made, to_own, from_made, from_own;
        failed |= time_streams(cb, made, true, n, reps, &to_made, &to_own);
        failed |= time_streams(cb, made, false, n, reps, &from_made, &from_own);
        char sz[32], key[48];
        printf("%-9s | %9.1f %9.1f %6.2fx | %9.1f %9.1f %6.2fx\n", human_size(n, sz, sizeof sz),
               to_made, to_own, to_made > 0 ? to_own / to_made : 0, from_made, from_own,
               from_made > 0 ? from_own / from_made : 0);
        snprintf(key, sizeof key, "own.htod.%s", short_size(n, sz, sizeof sz));
        summary_add(sum, key, to_made > 0 ? to_own / to_made : 0);
        snprintf(key, sizeof key, "own.dtoh.%s", short_size(n, sz, sizeof sz));
        summary_add(sum, key, from_made > 0 ? from_own / from_made : 0);
    }
    pm_stream_destroy(made);
    return failed;
}
