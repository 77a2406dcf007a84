/* Batches of blocks, as a KV cache offloads and reloads them: 1,000 blocks
 * (100 with --quick) of 256 KiB, of 64 KiB, and of 16 KiB to 2 MiB mixed,
 * from scattered pageable host memory to scattered device memory and back
 * with pm_memcpy_batch_async; against one contiguous copy of the same bytes
 * from or into page-locked memory (the ceiling), against a loop of the
 * driver's cuMemcpyAsync over the same pageable blocks, and the same batch
 * from page-locked blocks against the ceiling. Scattered: each block at its
 * own place in host and device memory, in an order of its own on each side,
 * with gaps between. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_copy.h"

typedef struct blocks {
    const char *label;
    size_t count, total, host_span, dev_span;
    size_t *bytes, *host_at, *dev_at;
} blocks;

static uint64_t rng = 12345;
static size_t rnd(size_t n)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (size_t)(rng >> 33) % n;
}

/* Places count blocks in a random order with gaps of up to 64 KiB (in 4 KiB
 * steps); *span: the bytes they take. */
static void scatter(const blocks *b, size_t *at, size_t *span)
{
    size_t *order = malloc(b->count * sizeof *order);
    if (!order) {
        *span = 0;
        return;
    }
    for (size_t i = 0; i < b->count; i++)
        order[i] = i;
    for (size_t i = b->count; i > 1; i--) {
        size_t j = rnd(i), t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    size_t off = 0;
    for (size_t k = 0; k < b->count; k++) {
        off += rnd(17) * 4096;
        at[order[k]] = off;
        off += b->bytes[order[k]];
    }
    *span = off;
    free(order);
}

/* mixed: sizes log-uniform from 16 KiB to 2 MiB, in whole 4 KiB pages.
 * Fewer blocks where their bytes would not fit the contiguous copy. */
static bool make_blocks(blocks *b, const char *label, size_t count, size_t size, size_t max_total)
{
    *b = (blocks){.label = label, .count = count};
    b->bytes = malloc(count * sizeof *b->bytes);
    b->host_at = malloc(count * sizeof *b->host_at);
    b->dev_at = malloc(count * sizeof *b->dev_at);
    if (!b->bytes || !b->host_at || !b->dev_at)
        return false;
    for (size_t i = 0; i < count; i++) {
        size_t n = size;
        if (!n) { /* 2^14 to 2^21, about as many in each doubling */
            unsigned bits = 14 + (unsigned)rnd(7);
            n = ((size_t)1 << bits) + rnd((size_t)1 << bits);
            n = n / 4096 * 4096;
            n = n > ((size_t)2 << 20) ? (size_t)2 << 20 : n;
        }
        if (b->total + n > max_total) {
            b->count = i;
            break;
        }
        b->bytes[i] = n;
        b->total += n;
    }
    scatter(b, b->host_at, &b->host_span);
    scatter(b, b->dev_at, &b->dev_span);
    return b->count > 0 && b->host_span && b->dev_span;
}

static void free_blocks(blocks *b)
{
    free(b->bytes);
    free(b->host_at);
    free(b->dev_at);
}

/* The ways a batch is timed. */
enum { PINMEM, CONTIGUOUS, DRIVER_LOOP, PINMEM_PINNED, WAYS };

typedef struct batch_case {
    const copy_buffers *cb;
    const blocks *b;
    bool to_device;
    uint8_t *pageable, *pinned;
    pm_deviceptr dev;
    pm_deviceptr *dsts, *srcs; /* filled per way */
    pm_stream_t s;
} batch_case;

static pm_result run_way(batch_case *c, int way)
{
    const baseline *bl = c->cb->bl;
    const blocks *b = c->b;
    if (way == CONTIGUOUS) {
        pm_deviceptr host = (pm_deviceptr)(uintptr_t)c->cb->pinned;
        pm_result r = c->to_device ? bl->copy_async(c->cb->dev, host, b->total, c->s)
                                   : bl->copy_async(host, c->cb->dev, b->total, c->s);
        return r == PM_SUCCESS ? bl->stream_synchronize(c->s) : r;
    }
    uint8_t *host = way == PINMEM_PINNED ? c->pinned : c->pageable;
    for (size_t i = 0; i < b->count; i++) {
        pm_deviceptr h = (pm_deviceptr)(uintptr_t)(host + b->host_at[i]), d = c->dev + b->dev_at[i];
        c->dsts[i] = c->to_device ? d : h;
        c->srcs[i] = c->to_device ? h : d;
    }
    pm_result r = PM_SUCCESS;
    if (way == DRIVER_LOOP) {
        for (size_t i = 0; i < b->count && r == PM_SUCCESS; i++)
            r = bl->copy_async(c->dsts[i], c->srcs[i], b->bytes[i], c->s);
        return r == PM_SUCCESS ? bl->stream_synchronize(c->s) : r;
    }
    r = pm_memcpy_batch_async(c->dsts, c->srcs, b->bytes, b->count, c->s);
    return r == PM_SUCCESS ? pm_stream_synchronize(c->s) : r;
}

/* Median GB/s of each way, the ways in a new order each round. The arrays
 * are filled inside the time, as a caller fills them for each batch. */
static bool time_ways(batch_case *c, int rounds, double gbps[WAYS])
{
    bool failed = false;
    double t[WAYS][9];
    for (int w = 0; w < WAYS; w++)
        failed |= run_way(c, w) != PM_SUCCESS; /* warm */
    for (int k = 0; k < rounds && k < 9; k++)
        for (int i = 0; i < WAYS; i++) {
            int w = (k + i) % WAYS;
            double t0 = now_ns();
            failed |= run_way(c, w) != PM_SUCCESS;
            t[w][k] = now_ns() - t0;
        }
    for (int w = 0; w < WAYS; w++) {
        double m = median(t[w], (size_t)(rounds < 9 ? rounds : 9));
        gbps[w] = m > 0 ? (double)c->b->total / m : 0;
    }
    return failed;
}

bool bench_copy_batch(const copy_buffers *cb, bool quick, copy_summary *sum, char *rows, size_t cap)
{
    const size_t count = quick ? 100 : 1000;
    static const struct {
        const char *label;
        size_t size;
    } kinds[] = {{"256K", 256 << 10}, {"64K", 64 << 10}, {"16K-2M", 0}};
    const int rounds = quick ? 3 : 5;
    pm_stream_t s = NULL;
    if (pm_stream_create(&s) != PM_SUCCESS) {
        printf("\nbatches: skipped: %s\n", pm_last_error_detail());
        return true;
    }
    printf("\nbatches of scattered blocks, median of %d (pinmem: pm_memcpy_batch_async and a "
           "stream synchronization; driver: %s a block)\n",
           rounds, cb->bl->async_name);
    printf("%-16s %-4s | %8s %10s %9s | %8s %8s | %8s %11s\n", "blocks", "dir", "pinmem",
           "contiguous", "% of it", "driver", "x driver", "pinned", "% of ceil.");
    printf("%-16s %-4s | %8s %10s %9s | %8s %8s | %8s %11s\n", "", "", "GB/s", "pinned GB/s",
           "higher", "GB/s", "higher", "GB/s", "higher");
    pm_copy_stats before = {.struct_size = sizeof before}, after = before;
    pm_copy_get_stats(&before);
    bool failed = false;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        blocks b;
        batch_case c = {.cb = cb, .b = &b, .s = s};
        pm_result pinned = PM_ERROR_UNKNOWN;
        if (!make_blocks(&b, kinds[k].label, count, kinds[k].size, cb->max) ||
            !(c.pageable = malloc(b.host_span)) ||
            (pinned = pm_mem_alloc_host((void **)&c.pinned, b.host_span)) != PM_SUCCESS ||
            pm_device_alloc(&c.dev, b.dev_span) != PM_SUCCESS ||
            !(c.dsts = malloc(b.count * sizeof *c.dsts)) ||
            !(c.srcs = malloc(b.count * sizeof *c.srcs))) {
            printf("%-16s: skipped: %s\n", kinds[k].label, pm_last_error_detail());
            /* More page-locked memory than the limit holds leaves a row out. */
            failed |= pinned != PM_ERROR_OUT_OF_MEMORY;
        } else {
            memset(c.pageable, 5, b.host_span);
            memset(c.pinned, 6, b.host_span);
            for (int dir = 0; dir < 2; dir++) {
                c.to_device = dir == 0;
                double g[WAYS];
                failed |= time_ways(&c, rounds, g);
                char label[48], key[64];
                snprintf(label, sizeof label, "%zu x %s", b.count, kinds[k].label);
                const char *d = dir == 0 ? "htod" : "dtoh";
                double share = g[CONTIGUOUS] > 0 ? 100 * g[PINMEM] / g[CONTIGUOUS] : 0;
                double times = g[DRIVER_LOOP] > 0 ? g[PINMEM] / g[DRIVER_LOOP] : 0;
                double pinned = g[CONTIGUOUS] > 0 ? 100 * g[PINMEM_PINNED] / g[CONTIGUOUS] : 0;
                printf("%-16s %-4s | %8.1f %10.1f %8.1f%% | %8.1f %7.2fx | %8.1f %10.1f%%\n", label,
                       d, g[PINMEM], g[CONTIGUOUS], share, g[DRIVER_LOOP], times, g[PINMEM_PINNED],
                       pinned);
                snprintf(key, sizeof key, "batch.%s.%s", kinds[k].label, d);
                summary_add(sum, key, share);
                snprintf(key, sizeof key, "batch.%s.%s.x", kinds[k].label, d);
                summary_add(sum, key, times);
                snprintf(key, sizeof key, "batch.%s.%s.pinned", kinds[k].label, d);
                summary_add(sum, key, pinned);
                size_t used = strlen(rows);
                snprintf(rows + used, cap - used, "\"%s %s\" %.3f %.3f %.3f %.3f\n", kinds[k].label,
                         dir == 0 ? "to" : "from", g[PINMEM], g[DRIVER_LOOP],
                         g[CONTIGUOUS], g[PINMEM_PINNED]);
            }
        }
        free(c.dsts);
        free(c.srcs);
        if (c.dev)
            pm_device_free(c.dev);
        if (c.pinned)
            pm_mem_free_host(c.pinned);
        free(c.pageable);
        free_blocks(&b);
    }
    pm_copy_get_stats(&after);
    printf("(%% of it: pinmem's rate as a share of one contiguous copy of the same bytes from or "
           "into page-locked memory; x driver: pinmem's rate over the driver's copies of the "
           "same pageable blocks; pinned: pinmem's batch of page-locked blocks, its share of the "
           "same ceiling. Driver calls that took many DMAs at once in these rows: %llu; "
           "launches of the batch kernel: %llu, moving %.1f MiB)\n",
           after.dma_batch_calls - before.dma_batch_calls,
           after.kernel_launches - before.kernel_launches,
           (double)(after.kernel_bytes - before.kernel_bytes) / (1 << 20));
    pm_stream_destroy(s);
    return failed;
}
