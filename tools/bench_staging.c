/* Where a staged copy's time goes: large pageable copies forced through the
 * staging ring, with each kind of stores side by side, and the
 * engine's own time counters per piece (CPU copy, waiting for a buffer or a
 * DMA, queuing the DMA). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"

static void configure(pm_copy_stores stores, size_t direct_max)
{
    pm_copy_config c = {.struct_size = sizeof c};
    pm_copy_get_config(&c);
    c.staging_stores = stores;
    c.direct_max = c.dtoh_direct_max = direct_max;
    pm_copy_set_config(&c);
}

static const char *const store_names[] = {"default", "cached", "streaming", "demoting"};

static void row(bool htod, pm_copy_stores stores, pm_deviceptr dev, uint8_t *host, size_t n,
                bool *failed)
{
    enum { REPS = 7 };
    double t[REPS];
    pm_copy_stats before = {.struct_size = sizeof before}, after = before;
    configure(stores, (size_t)-1);
    *failed |= (htod ? pm_memcpy_htod(dev, host, n) : pm_memcpy_dtoh(host, dev, n)) != PM_SUCCESS;
    pm_copy_get_stats(&before);
    for (int k = 0; k < REPS; k++) {
        double t0 = now_ns();
        *failed |= (htod ? pm_memcpy_htod(dev, host, n) : pm_memcpy_dtoh(host, dev, n)) != PM_SUCCESS;
        t[k] = now_ns() - t0;
    }
    pm_copy_get_stats(&after);
    double pieces = (double)(after.staged_pieces - before.staged_pieces);
    if (pieces < 1)
        pieces = 1;
    double copy_us = (double)(after.staging_copy_ns - before.staging_copy_ns) / pieces / 1e3;
    double wait_us = (double)(after.staging_wait_ns - before.staging_wait_ns) / pieces / 1e3;
    double queue_us = (double)(after.staging_queue_ns - before.staging_queue_ns) / pieces / 1e3;
    pm_copy_config c = {.struct_size = sizeof c};
    pm_copy_get_config(&c);
    char sz[32];
    printf("%-9s %-6s %-9s | %7.1f | %9.1f %9.1f %9.1f | %7.2f | %u\n", human_size(n, sz, sizeof sz),
           htod ? "htod" : "dtoh", store_names[stores],
           (double)n / median(t, REPS), copy_us, wait_us, queue_us,
           copy_us > 0 ? (double)c.chunk_bytes / copy_us / 1e3 : 0, after.htod_fillers);
}

/* Copies that start after the engine sat idle (its workers asleep, their
 * cores idle), as copies between other work do, and right after the CPU
 * copied as many other bytes (the caches then hold none of the source or the
 * ring, as after a program's own work), against copies back to back. The
 * other bytes are two halves of the page-locked buffer: the third column
 * needs it twice the copy's size. */
static void cold_rows(pm_deviceptr dev, uint8_t *host, uint8_t *other, size_t max, bool *failed)
{
    enum { REPS = 9 };
    enum { HOT, IDLE, AFTER_CPU, WAYS };
    configure(PM_COPY_STORES_DEFAULT, (size_t)-1);
    printf("\nstaged copies, default stores, median of %d: back to back, each after 5 ms idle, "
           "and each right after a CPU copy of as many other bytes\n",
           REPS);
    for (size_t n = (size_t)16 << 20; n <= max && n <= ((size_t)256 << 20); n *= 4) {
        const bool cpu_first = 2 * n <= max;
        for (int dir = 0; dir < 2; dir++) {
            double t[WAYS][REPS];
            for (int way = HOT; way < WAYS; way++) {
                if (way == AFTER_CPU && !cpu_first)
                    break;
                for (int k = 0; k < REPS + (way == HOT); k++) {
                    if (way == IDLE)
                        usleep(5000);
                    else if (way == AFTER_CPU)
                        memcpy(other + n, other, n);
                    double t0 = now_ns();
                    *failed |= (dir == 0 ? pm_memcpy_htod(dev, host, n)
                                         : pm_memcpy_dtoh(host, dev, n)) != PM_SUCCESS;
                    if (way != HOT || k > 0) /* back to back after one unmeasured copy */
                        t[way][k - (way == HOT)] = now_ns() - t0;
                }
            }
            char sz[32];
            printf("%-9s %-6s | back to back %5.1f GB/s | after idle %5.1f GB/s | ",
                   human_size(n, sz, sizeof sz), dir == 0 ? "htod" : "dtoh",
                   (double)n / median(t[HOT], REPS), (double)n / median(t[IDLE], REPS));
            if (cpu_first)
                printf("after a CPU copy %5.1f GB/s\n", (double)n / median(t[AFTER_CPU], REPS));
            else
                printf("after a CPU copy: needs a buffer of %s\n", human_size(2 * n, sz, sizeof sz));
        }
    }
}

/* The DMA engine's own rate for pieces queued back to back from and into
 * page-locked memory, with and without a marker behind each piece as the
 * ring records: the ceiling for a staged copy of that piece size. */
static void dma_ceiling(const baseline *b, pm_deviceptr dev, uint8_t *pinned, size_t total,
                        bool *failed)
{
    enum { REPS = 5 };
    void *mark = NULL;
    if (b->marker_open(&mark) != PM_SUCCESS) {
        printf("\nDMA from page-locked memory: skipped: %s\n", baseline_detail());
        *failed = true;
        return;
    }
    char sz[32];
    printf("\nDMA of page-locked memory, %s in pieces queued on one stream (%s, median of %d)\n",
           human_size(total, sz, sizeof sz), b->queued_name, REPS);
    printf("%-9s | %9s %14s | %9s %14s\n", "pieces", "to device", "marker behind", "from dev.",
           "marker behind");
    for (size_t piece = (size_t)64 << 10; piece <= ((size_t)4 << 20); piece *= 2) {
        double t[2][2][REPS]; /* [from the device][marked][k] */
        for (int k = 0; k < REPS; k++)
            for (int from = 0; from < 2; from++)
                for (int marked = 0; marked < 2; marked++) {
                    double t0 = now_ns();
                    for (size_t off = 0; off < total; off += piece) {
                        *failed |= (from ? b->copy_dtoh_queued(pinned + off, dev + off, piece)
                                         : b->copy_htod_queued(dev + off, pinned + off, piece)) !=
                                   PM_SUCCESS;
                        if (marked)
                            *failed |= b->marker_record(mark) != PM_SUCCESS;
                    }
                    *failed |= b->synchronize() != PM_SUCCESS;
                    t[from][marked][k] = now_ns() - t0;
                }
        printf("%-9s | %9.1f %14.1f | %9.1f %14.1f\n", human_size(piece, sz, sizeof sz),
               (double)total / median(t[0][0], REPS), (double)total / median(t[0][1], REPS),
               (double)total / median(t[1][0], REPS), (double)total / median(t[1][1], REPS));
    }
    printf("(GB/s; marker behind: an event recorded after each piece, as the staging ring does)\n");
    b->marker_close(mark);
}

int bench_staging(bool quick)
{
    copy_buffers cb;
    if (!copy_buffers_open(&cb, "bench staging", quick))
        return 1;
    const baseline *b = cb.bl;
    const size_t max = cb.max;
    uint8_t *pageable = cb.pageable;
    pm_deviceptr dev = cb.dev;
    bool failed = false;
    pm_copy_config saved = {.struct_size = sizeof saved};
    pm_copy_get_config(&saved);
    if (b->meaning)
        printf("(%s)\n", b->meaning);
    dma_ceiling(b, dev, cb.pinned, max < ((size_t)256 << 20) ? max : (size_t)256 << 20, &failed);
    printf("\nstaged copies only (%s: %u workers, %u of them to the device, %u buffers of %zu KiB, "
           "%zu KiB slices), median of 7; time per piece (one DMA) summed over the threads that "
           "ran it\n",
           pm_backend_name(), saved.workers, saved.htod_workers, saved.buffers, saved.chunk_bytes >> 10,
           saved.slice_bytes >> 10);
    printf("%-9s %-6s %-9s | %7s | %9s %9s %9s | %s | %s\n", "size", "dir", "stores", "GB/s",
           "copy us", "wait us", "queue us", "CPU GB/s per thread", "fillers after");
    for (size_t n = (size_t)16 << 20; n <= max; n *= 4)
        for (int dir = 0; dir < 2; dir++)
            for (int s = PM_COPY_STORES_CACHED; s <= PM_COPY_STORES_DEMOTING; s++)
                if (dir == 0 || s != PM_COPY_STORES_DEMOTING) /* a ring-side choice */
                    row(dir == 0, (pm_copy_stores)s, dev, pageable, n, &failed);
    cold_rows(dev, pageable, cb.pinned, max, &failed);
    pm_copy_set_config(&saved);
    if (failed)
        printf("(a copy failed: pinmem's last error: %s; the baseline's: %s)\n",
               pm_last_error_detail(), baseline_detail());
    copy_buffers_close(&cb);
    return failed;
}
