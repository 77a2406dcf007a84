/* Both directions at once, as a program that offloads and prefetches at the
 * same time: one thread copies pageable memory to the device while another
 * copies device memory into pageable memory, each on a stream of its own
 * (the legacy stream would serialize them), against two copies of
 * page-locked memory running the same way (the driver's cuMemcpyAsync), the
 * ceiling. The sum is all bytes over the time until both threads are done,
 * so a direction that starves the other shows as a lower sum. With
 * own_streams, pinmem's copies run on each thread's own stream
 * (PM_STREAM_PER_THREAD, which the engine runs on lanes) instead. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_copy.h"

typedef struct one_way {
    const baseline *bl;
    pthread_barrier_t *start;
    bool to_device, pinned, own_stream;
    uint8_t *host;
    pm_deviceptr dev;
    size_t n;
    int reps;
    double ns;
    bool failed;
} one_way;

static void *run_one_way(void *arg)
{
    one_way *w = arg;
    pm_stream_t s = w->own_stream ? PM_STREAM_PER_THREAD : NULL;
    w->failed = !s && pm_stream_create(&s) != PM_SUCCESS;
    pthread_barrier_wait(w->start);
    double t0 = now_ns();
    const pm_deviceptr host = (pm_deviceptr)(uintptr_t)w->host;
    for (int k = 0; k < w->reps && !w->failed; k++) {
        pm_result r;
        if (w->pinned)
            r = w->to_device ? w->bl->copy_async(w->dev, host, w->n, s)
                             : w->bl->copy_async(host, w->dev, w->n, s);
        else
            r = w->to_device ? pm_memcpy_htod_async(w->dev, w->host, w->n, s)
                             : pm_memcpy_dtoh_async(w->host, w->dev, w->n, s);
        if (r == PM_SUCCESS)
            r = w->pinned ? w->bl->stream_synchronize(s) : pm_stream_synchronize(s);
        w->failed |= r != PM_SUCCESS;
    }
    w->ns = now_ns() - t0;
    if (s && !w->own_stream)
        pm_stream_destroy(s);
    return NULL;
}

/* One round both ways at once: each direction's GB/s and the sum. */
static bool both_at_once(const baseline *bl, bool pinned, bool own_streams, uint8_t *host_to,
                         uint8_t *host_from, pm_deviceptr dev_to, pm_deviceptr dev_from, size_t n,
                         int reps, double *to, double *from, double *sum)
{
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    const bool own = own_streams && !pinned;
    one_way w[2] = {
        {bl, &start, true, pinned, own, host_to, dev_to, n, reps, 0, false},
        {bl, &start, false, pinned, own, host_from, dev_from, n, reps, 0, false},
    };
    pthread_t t;
    bool failed = pthread_create(&t, NULL, run_one_way, &w[1]) != 0;
    if (!failed) {
        run_one_way(&w[0]);
        pthread_join(t, NULL);
    }
    pthread_barrier_destroy(&start);
    const double bytes = (double)n * reps, longest = w[0].ns > w[1].ns ? w[0].ns : w[1].ns;
    *to = w[0].ns > 0 ? bytes / w[0].ns : 0;
    *from = w[1].ns > 0 ? bytes / w[1].ns : 0;
    *sum = longest > 0 ? 2 * bytes / longest : 0;
    return failed || w[0].failed || w[1].failed;
}

bool bench_copy_both(const copy_buffers *cb, bool quick, bool own_streams, copy_summary *sum)
{
    const size_t max = cb->max;
    uint8_t *pageable = malloc(max), *pinned = NULL;
    pm_deviceptr dev = 0;
    if (!pageable || pm_mem_alloc_host((void **)&pinned, max) != PM_SUCCESS ||
        pm_device_alloc(&dev, max) != PM_SUCCESS) {
        printf("\nboth ways at once: skipped: %s\n",
               pageable ? pm_last_error_detail() : "malloc failed");
        if (pinned)
            pm_mem_free_host(pinned);
        free(pageable);
        return false;
    }
    memset(pageable, 3, max);
    memset(pinned, 4, max);
    const int rounds = quick ? 3 : 5;
    printf("\nboth ways at once: one thread to the device, one from it, each on %s, median of "
           "%d rounds (pageable: pm_memcpy_htod_async / pm_memcpy_dtoh_async; pinned: %s)\n",
           own_streams ? "its own stream (PM_STREAM_PER_THREAD; pinned: a made stream)"
                       : "a stream of its own",
           rounds, cb->bl->async_name);
    printf("%-9s | %-26s | %-26s | %s\n", "", "pageable (pinmem), GB/s", "pinned (the ceiling), GB/s",
           "sum, % of pinned");
    printf("%-9s | %8s %8s %8s | %8s %8s %8s | %s\n", "size", "to dev", "from dev", "sum",
           "to dev", "from dev", "sum", "higher is better");
    bool failed = false;
    for (size_t n = (size_t)64 << 20; n <= max; n *= 4) {
        const int reps = n >= ((size_t)1 << 30) ? 1 : (int)(((size_t)1 << 30) / n);
        double v[2][3][8]; /* [pinned][to, from, sum][round] */
        for (int k = 0; k < rounds && k < 8; k++)
            for (int i = 0; i < 2; i++) {
                int p = (k + i) % 2; /* each kind first in every other round */
                failed |= both_at_once(cb->bl, p, own_streams, p ? cb->pinned : cb->pageable,
                                       p ? pinned : pageable, cb->dev, dev, n, reps, &v[p][0][k],
                                       &v[p][1][k], &v[p][2][k]);
            }
        double m[2][3];
        for (int p = 0; p < 2; p++)
            for (int q = 0; q < 3; q++)
                m[p][q] = median(v[p][q], (size_t)(rounds < 8 ? rounds : 8));
        double share = m[1][2] > 0 ? 100 * m[0][2] / m[1][2] : 0;
        char sz[32], key[48];
        printf("%-9s | %8.1f %8.1f %8.1f | %8.1f %8.1f %8.1f | %.1f%%\n", human_size(n, sz, sizeof sz),
               m[0][0], m[0][1], m[0][2], m[1][0], m[1][1], m[1][2], share);
        snprintf(key, sizeof key, "%s.%s", own_streams ? "own-both" : "both",
                 short_size(n, sz, sizeof sz));
        summary_add(sum, key, share);
    }
    printf("(to dev, from dev: each thread's bytes over its own time; sum: both threads' bytes "
           "over the time until both are done)\n");
    pm_device_free(dev);
    pm_mem_free_host(pinned);
    free(pageable);
    return failed;
}
