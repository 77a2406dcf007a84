/* Whether registering part of a large pageable copy for its duration, beside
 * the staging engine, makes the copy faster: a staged copy moves every byte
 * through memory three times (read the source, write the ring, the DMA reads
 * the ring) and the DMA engine slows while the fillers copy, while a
 * registered piece is read once; but registering runs at about 20 GB/s on
 * one thread and undoing it waits for the device. Per size and direction:
 * the staged copy alone; registering the whole buffer in pieces, each piece's
 * DMA queued behind its registration (registration and unregistration timed
 * apart); and the front of the buffer staged while another thread registers
 * and moves the back, for several shares of the back. Unregistering is timed
 * apart, and once while a staged copy runs (does it stall the engine?). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "commands.h"
#include "pinmem.h"

enum { PIECE = 8 << 20, REPS = 5 };

typedef struct direct_part {
    const pm__backend *b;
    bool htod;
    uint8_t *host;
    pm_deviceptr dev;
    size_t bytes;
    pm_stream_t stream;
    double register_ns, end_ns;
    bool failed;
} direct_part;

/* Registers part's bytes piece by piece, each piece's DMA queued behind its
 * registration, and waits for the last DMA. */
static void *run_direct(void *arg)
{
    direct_part *d = arg;
    double reg = 0;
    for (size_t off = 0; off < d->bytes; off += PIECE) {
        size_t n = d->bytes - off < PIECE ? d->bytes - off : PIECE;
        double t0 = now_ns();
        d->failed |= d->b->cache_register(d->host + off, n) != PM_SUCCESS;
        reg += now_ns() - t0;
        d->failed |= (d->htod ? d->b->copy_htod_async(d->dev + off, d->host + off, n, d->stream, true)
                              : d->b->copy_dtoh_async(d->host + off, d->dev + off, n, d->stream,
                                                      true)) != PM_SUCCESS;
    }
    d->failed |= d->b->stream_synchronize(d->stream) != PM_SUCCESS;
    d->register_ns = reg;
    d->end_ns = now_ns();
    return NULL;
}

static void undo(direct_part *d)
{
    for (size_t off = 0; off < d->bytes; off += PIECE)
        d->b->cache_unregister(d->host + off, d->bytes - off < PIECE ? d->bytes - off : PIECE);
}

static void *run_undo(void *arg)
{
    undo(arg);
    return NULL;
}

static pm_result staged(bool htod, pm_deviceptr dev, uint8_t *host, size_t n)
{
    return n == 0 ? PM_SUCCESS : htod ? pm_memcpy_htod(dev, host, n) : pm_memcpy_dtoh(host, dev, n);
}

/* One copy of n bytes: the first n - back staged on this thread, the last
 * back registered and moved on another. GB/s of the whole; *undo_ns: the
 * unregistering afterwards. */
static double split_copy(const pm__backend *b, pm_stream_t s, bool htod, pm_deviceptr dev,
                         uint8_t *host, size_t n, size_t back, double *reg_ns, double *undo_ns,
                         bool *failed)
{
    size_t front = n - back;
    direct_part d = {.b = b, .htod = htod, .host = host + front, .dev = dev + front, .bytes = back,
                     .stream = s};
    pthread_t helper;
    double t0 = now_ns();
    bool threaded = back && pthread_create(&helper, NULL, run_direct, &d) == 0;
    if (back && !threaded)
        run_direct(&d);
    *failed |= staged(htod, dev, host, front) != PM_SUCCESS;
    if (htod)
        *failed |= b->stream_synchronize(NULL) != PM_SUCCESS;
    double front_end = now_ns();
    if (threaded)
        pthread_join(helper, NULL);
    double end = back && d.end_ns > front_end ? d.end_ns : front_end;
    double u0 = now_ns();
    undo(&d);
    *undo_ns = now_ns() - u0;
    *reg_ns = d.register_ns;
    *failed |= d.failed;
    return (double)n / (end - t0);
}

/* Unregistering a registered back part while a staged copy of the front runs:
 * the staged copy's rate, against the same copy alone. */
static void undo_beside_staging(const pm__backend *b, pm_stream_t s, pm_deviceptr dev,
                                uint8_t *host, size_t n, bool *failed)
{
    size_t half = n / 2;
    double alone[REPS], beside[REPS], undo_t[REPS];
    for (int k = 0; k < REPS; k++) {
        double t0 = now_ns();
        *failed |= staged(true, dev, host, half) != PM_SUCCESS;
        *failed |= b->stream_synchronize(NULL) != PM_SUCCESS;
        alone[k] = now_ns() - t0;
        direct_part d = {.b = b, .htod = true, .host = host + half, .dev = dev + half,
                         .bytes = n - half, .stream = s};
        run_direct(&d);
        pthread_t helper;
        t0 = now_ns();
        bool threaded = pthread_create(&helper, NULL, run_undo, &d) == 0;
        *failed |= staged(true, dev, host, half) != PM_SUCCESS;
        *failed |= b->stream_synchronize(NULL) != PM_SUCCESS;
        beside[k] = now_ns() - t0;
        if (threaded)
            pthread_join(helper, NULL);
        else
            undo(&d);
        undo_t[k] = now_ns() - t0;
        *failed |= d.failed;
    }
    char sz[32];
    printf("staged htod of %s alone %5.1f GB/s, while %s is unregistered %5.1f GB/s (both done "
           "after %.2f ms)\n",
           human_size(half, sz, sizeof sz), (double)half / median(alone, REPS),
           human_size(n - half, sz, sizeof sz), (double)half / median(beside, REPS),
           median(undo_t, REPS) / 1e6);
}

int bench_split(bool quick)
{
    copy_buffers cb;
    if (!copy_buffers_open(&cb, "bench split", quick))
        return 1;
    const pm__backend *b = cb.b;
    bool failed = false;
    pm_stream_t s = NULL;
    if (b->stream_create(&s) != PM_SUCCESS) {
        printf("bench split: no stream: %s\n", pm_last_error_detail());
        copy_buffers_close(&cb);
        return 1;
    }
    printf("pageable copies split: the front staged, the back registered piece by piece (%d MiB) "
           "and moved on another thread; median of %d\n",
           PIECE >> 20, REPS);
    printf("%-9s %-5s %-10s | %7s | %12s %12s\n", "size", "dir", "back share", "GB/s",
           "register ms", "undo ms");
    static const double shares[] = {0, 0.125, 0.25, 0.375, 0.5, 1};
    for (size_t n = (size_t)64 << 20; n <= cb.max; n *= 4)
        for (int dir = 0; dir < 2; dir++)
            for (size_t i = 0; i < sizeof shares / sizeof *shares; i++) {
                size_t back = (size_t)((double)n * shares[i]) & ~(size_t)4095;
                double g[REPS], reg[REPS], un[REPS];
                double w_reg, w_un;
                split_copy(b, s, dir == 0, cb.dev, cb.pageable, n, back, &w_reg, &w_un,
                           &failed); /* warm */
                for (int k = 0; k < REPS; k++)
                    g[k] = split_copy(b, s, dir == 0, cb.dev, cb.pageable, n, back, &reg[k], &un[k],
                                      &failed);
                char sz[32];
                printf("%-9s %-5s %10.3f | %7.1f | %12.2f %12.2f\n", human_size(n, sz, sizeof sz),
                       dir == 0 ? "htod" : "dtoh", shares[i], median(g, REPS),
                       median(reg, REPS) / 1e6, median(un, REPS) / 1e6);
            }
    undo_beside_staging(b, s, cb.dev, cb.pageable, cb.max < ((size_t)256 << 20) ? cb.max : (size_t)256 << 20,
                        &failed);
    b->stream_destroy(s);
    if (failed)
        printf("(a copy failed: %s)\n", pm_last_error_detail());
    copy_buffers_close(&cb);
    return failed;
}
