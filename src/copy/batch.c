/* pm_memcpy_batch_async: many copies in one call, each what pm_memcpy_async
 * would make of it, in any order among themselves.
 *
 * Every element is checked, and the host side of each cut where page-locked
 * and pageable memory meet, before anything moves. Then the page-locked
 * pieces and device-to-device copies go to the DMA engine in one driver call
 * where the driver has a batch copy (cuMemcpyBatchAsync): one call for a
 * thousand DMAs costs far less than a thousand calls. The pageable pieces of
 * each direction become one staging job of many segments, so the workers
 * gather small blocks into full buffers (or scatter them out of full ones),
 * and each buffer's DMAs again go in one call. With pm_copy_config.batch
 * DRIVER, pageable pieces go to the driver's batch copy instead (it reads
 * pageable sources during the call). Host-to-host copies are the backend's
 * own, one by one.
 *
 * With KERNEL (the default), elements of up to kernel_max bytes between host
 * and device memory that the batch kernel reaches skip the DMA engine, whose
 * cost per DMA halves the rate of small blocks: page-locked ones go to the
 * kernel in lists of blocks (staging.c keeps each list in a ring buffer until
 * its launch is done); pageable ones are gathered as with GATHER, and with
 * kernel_staged each buffer moves by one DMA to or from its device twin and
 * one launch between the twin and the blocks, instead of a DMA a block
 * (slower on the GPUs measured). Nothing of it on a capturing stream,
 * or where the backend cannot launch on the stream: those take GATHER's
 * way. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../errors.h"
#include "../instance.h"
#include "copy.h"

static const char name[] = "pm_memcpy_batch_async";

/* What an element is, from its pointers. */
typedef enum {
    WAY_NONE, /* 0 bytes */
    WAY_HTOD, /* host memory to device memory: pinmem's or pageable, cut into pieces */
    WAY_DTOH,
    WAY_DMA,  /* device to device, or memory the driver page-locked itself and device memory */
    WAY_HTOH  /* host to host, of any kinds */
} way;

/* Device allocations seen in this call: blocks that lie in one large
 * allocation (a cache of blocks) then cost one query of the backend, and
 * one more for whether the batch kernel reaches it (reach: 0 not asked
 * yet, 1 yes, -1 no). An allocation that holds none of pinmem's host ranges
 * (no_host, one registry lookup when it is first seen) answers before the
 * registry is asked: a batch's device pointers would each cost a lookup
 * under the registry's lock. */
enum { KNOWN_DEVICE = 8 };
typedef struct known_device {
    pm_deviceptr lo[KNOWN_DEVICE], hi[KNOWN_DEVICE];
    signed char reach[KNOWN_DEVICE];
    bool no_host[KNOWN_DEVICE];
    unsigned n, next;
} known_device;

/* What the registry answered last in this call: the page-locked range that
 * holds an address, and the gap around one that no range touches. A batch's
 * blocks mostly lie in one allocation, page-locked or pageable, and each
 * lookup of the registry takes its lock. */
typedef struct known_host {
    pm__range r;
    bool have;
    uintptr_t gap_lo, gap_hi; /* empty while none is known */
} known_host;

static bool known_host_holds(const known_host *kh, uintptr_t addr)
{
    return kh->have && addr - kh->r.pin_base < kh->r.pin_len;
}

static bool known_gap_holds(const known_host *kh, uintptr_t addr)
{
    return addr - kh->gap_lo < kh->gap_hi - kh->gap_lo;
}

/* The page-locked range whose extent holds addr, or NULL. */
static const pm__range *find_host(pm__instance *inst, known_host *kh, uintptr_t addr)
{
    if (known_host_holds(kh, addr))
        return &kh->r;
    if (known_gap_holds(kh, addr))
        return NULL;
    pm__range r;
    uintptr_t lo, hi;
    if (!pm__ranges_extent_or_gap(inst->ranges, addr, &r, &lo, &hi)) {
        kh->gap_lo = lo; /* the range known is kept too: the next address may lie there */
        kh->gap_hi = hi;
        return NULL;
    }
    kh->r = r;
    kh->have = true;
    return &kh->r;
}

/* The known device allocation that holds [p, p + bytes), or -1. */
static int known_device_at(const known_device *kd, pm_deviceptr p, size_t bytes)
{
    for (unsigned i = 0; i < kd->n; i++)
        if (p >= kd->lo[i] && p < kd->hi[i] && bytes <= kd->hi[i] - p)
            return (int)i;
    return -1;
}

static void remember_device(pm__instance *inst, known_device *kd, pm_deviceptr lo,
                            pm_deviceptr hi)
{
    pm__range r;
    const pm__extent_found f = pm__ranges_extent_at_or_after(inst->ranges, (uintptr_t)lo, &r);
    kd->lo[kd->next] = lo;
    kd->hi[kd->next] = hi;
    kd->reach[kd->next] = 0;
    kd->no_host[kd->next] = f == PM__EXTENT_NONE || (f == PM__EXTENT_AFTER && r.pin_base >= hi);
    kd->next = (kd->next + 1) % KNOWN_DEVICE;
    kd->n += kd->n < KNOWN_DEVICE;
}

/* Memory pinmem pinned is host memory for the engine, whatever the backend
 * would call it (as memcpy.c says); then a device allocation seen before;
 * then the backend. */
static pm_result kind_of(pm__instance *inst, known_device *kd, known_host *kh, pm_deviceptr p,
                         size_t bytes, pm__memory_kind *kind)
{
    const int dev = known_device_at(kd, p, bytes);
    if (dev >= 0 && kd->no_host[dev]) {
        *kind = PM__MEMORY_DEVICE;
        return PM_SUCCESS;
    }
    if (find_host(inst, kh, (uintptr_t)p)) {
        *kind = PM__MEMORY_HOST;
        return PM_SUCCESS;
    }
    if (dev >= 0) {
        *kind = PM__MEMORY_DEVICE;
        return PM_SUCCESS;
    }
    pm_deviceptr lo = 0, hi = 0;
    pm_result res = inst->backend.pointer_extent(p, bytes, kind, &lo, &hi);
    if (res == PM_SUCCESS && *kind == PM__MEMORY_DEVICE && lo < hi)
        remember_device(inst, kd, lo, hi);
    return res;
}

static way way_of(pm__memory_kind to, pm__memory_kind from)
{
    if (to == PM__MEMORY_DEVICE && from == PM__MEMORY_HOST)
        return WAY_HTOD;
    if (to == PM__MEMORY_HOST && from == PM__MEMORY_DEVICE)
        return WAY_DTOH;
    if (to == PM__MEMORY_DEVICE || from == PM__MEMORY_DEVICE)
        return WAY_DMA;
    return WAY_HTOH;
}

/* A range an element writes (dst) or reads, for the check that no copy of
 * the batch depends on another. */
typedef struct span {
    pm_deviceptr lo, hi;
    size_t index;
    bool dst, device; /* a destination; in device memory */
} span;

/* Sorts v by start, stably, with tmp as large as v: a byte of the start at a
 * time from the lowest, only the bytes where some starts differ (nearby
 * addresses share their high bytes, aligned blocks their low ones). qsort's
 * calls of a comparison took most of a 1,000-block batch's planning, and
 * counting every byte most of what was left. */
static void sort_by_start(span *v, span *tmp, size_t n)
{
    enum { DIGITS = sizeof(pm_deviceptr), RADIX = 256 };
    pm_deviceptr differ = 0;
    for (size_t i = 1; i < n; i++)
        differ |= v[i].lo ^ v[0].lo;
    span *from = v, *to = tmp;
    for (unsigned d = 0; d < DIGITS; d++) {
        const unsigned shift = 8 * d;
        if (((differ >> shift) & (RADIX - 1)) == 0)
            continue;
        size_t at[RADIX] = {0};
        for (size_t i = 0; i < n; i++)
            at[(from[i].lo >> shift) & (RADIX - 1)]++;
        for (size_t k = 0, sum = 0; k < RADIX; k++) {
            const size_t here = at[k];
            at[k] = sum;
            sum += here;
        }
        for (size_t i = 0; i < n; i++)
            to[at[(from[i].lo >> shift) & (RADIX - 1)]++] = from[i];
        span *t = from;
        from = to;
        to = t;
    }
    if (from != v)
        memcpy(v, from, n * sizeof *v);
}

/* Sorted by start, a range overlaps an earlier one exactly when it starts
 * before the furthest end seen so far; a destination may overlap nothing,
 * a source no destination. (An element's own two ranges were checked
 * already.) */
static pm_result check_dependences(span *v, span *tmp, size_t n)
{
    /* Host memory and device memory never share an address, so a source
     * needs a look only where some destination lies in its kind of memory:
     * a batch one way sorts its destinations alone. */
    unsigned dst_kinds = 0;
    for (size_t k = 0; k < n; k++)
        dst_kinds |= v[k].dst ? 1u << v[k].device : 0;
    size_t kept = 0;
    for (size_t k = 0; k < n; k++)
        if (v[k].dst || (dst_kinds >> v[k].device & 1))
            v[kept++] = v[k];
    n = kept;
    sort_by_start(v, tmp, n);
    const span *far_any = NULL, *far_dst = NULL;
    for (size_t k = 0; k < n; k++) {
        const span *x = &v[k];
        const span *hit = x->dst && far_any && x->lo < far_any->hi   ? far_any
                          : !x->dst && far_dst && x->lo < far_dst->hi ? far_dst
                                                                      : NULL;
        if (hit)
            return pm__fail(PM_ERROR_INVALID_VALUE,
                            "%s: element %zu's %s (0x%llx, %llu bytes) overlaps element %zu's %s "
                            "(0x%llx, %llu bytes): the copies of a batch may not depend on each "
                            "other",
                            name, x->index, x->dst ? "destination" : "source", x->lo,
                            x->hi - x->lo, hit->index, hit->dst ? "destination" : "source",
                            hit->lo, hit->hi - hit->lo);
        if (!far_any || x->hi > far_any->hi)
            far_any = x;
        if (x->dst && (!far_dst || x->hi > far_dst->hi))
            far_dst = x;
    }
    return PM_SUCCESS;
}

/* r again, its detail (and the driver's code) now naming element i. */
static pm_result name_element(pm_result r, size_t i)
{
    char why[512];
    snprintf(why, sizeof why, "%s", pm_last_error_detail());
    return pm__fail_driver(r, pm_last_driver_error(), "%s: element %zu: %s", name, i, why);
}

/* The check of element i, its way and its ranges for the check of the whole
 * batch (appended at *spans). */
static pm_result check_element(pm__instance *inst, known_device *kd, known_host *kh, size_t i,
                               pm_deviceptr dst, pm_deviceptr src, size_t bytes, bool capturing,
                               uint8_t *w, span **spans)
{
    if (!dst || !src)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: element %zu: the %s pointer is NULL", name, i,
                        dst ? "source" : "destination");
    if (bytes > UINT64_MAX - dst || bytes > UINT64_MAX - src || bytes > UINTPTR_MAX)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "%s: element %zu: %zu bytes from 0x%llx or 0x%llx wrap around", name, i,
                        bytes, dst, src);
    if (dst < src + bytes && src < dst + bytes)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "%s: element %zu: its ranges overlap (destination 0x%llx, source 0x%llx, "
                        "%zu bytes)",
                        name, i, dst, src, bytes);
    pm__memory_kind to, from;
    pm_result r;
    if ((r = kind_of(inst, kd, kh, dst, bytes, &to)) != PM_SUCCESS ||
        (r = kind_of(inst, kd, kh, src, bytes, &from)) != PM_SUCCESS)
        return name_element(r, i);
    /* A capture takes page-locked host memory only (copy.c says why). */
    if (capturing && ((to != PM__MEMORY_DEVICE &&
                       (r = pm__copy_capturable(inst, name, dst, bytes)) != PM_SUCCESS) ||
                      (from != PM__MEMORY_DEVICE &&
                       (r = pm__copy_capturable(inst, name, src, bytes)) != PM_SUCCESS)))
        return name_element(r, i);
    *w = (uint8_t)way_of(to, from);
    *(*spans)++ = (span){dst, dst + bytes, i, true, to == PM__MEMORY_DEVICE};
    *(*spans)++ = (span){src, src + bytes, i, false, from == PM__MEMORY_DEVICE};
    return PM_SUCCESS;
}

/* A growing list of DMAs, and one of staging segments. */
typedef struct dmas {
    pm_deviceptr *dst, *src;
    size_t *bytes;
    size_t n, cap;
} dmas;

typedef struct segments {
    pm__segment *v;
    size_t n, cap, bytes;
    bool kernel; /* some segment may move by the batch kernel */
} segments;

typedef struct blocks {
    pm__block_copy *v;
    size_t n, cap;
} blocks;

static bool add_block(blocks *k, pm_deviceptr dst, pm_deviceptr src, size_t n)
{
    if (k->n == k->cap) {
        size_t more = k->cap ? 2 * k->cap : 64;
        pm__block_copy *v = realloc(k->v, more * sizeof *v);
        if (!v)
            return false;
        k->v = v;
        k->cap = more;
    }
    k->v[k->n++] = (pm__block_copy){.dst = dst, .src = src, .bytes = n};
    return true;
}

static bool add_dma(dmas *d, pm_deviceptr dst, pm_deviceptr src, size_t n)
{
    if (d->n == d->cap) {
        size_t more = d->cap ? 2 * d->cap : 64;
        pm_deviceptr *a = realloc(d->dst, more * sizeof *a);
        if (!a)
            return false;
        d->dst = a;
        if (!(a = realloc(d->src, more * sizeof *a)))
            return false;
        d->src = a;
        size_t *z = realloc(d->bytes, more * sizeof *z);
        if (!z)
            return false;
        d->bytes = z;
        d->cap = more;
    }
    d->dst[d->n] = dst;
    d->src[d->n] = src;
    d->bytes[d->n++] = n;
    return true;
}

static bool add_segment(segments *s, uint8_t *host, pm_deviceptr dev, size_t n, bool kernel)
{
    if (s->n == s->cap) {
        size_t more = s->cap ? 2 * s->cap : 64;
        pm__segment *v = realloc(s->v, more * sizeof *v);
        if (!v)
            return false;
        s->v = v;
        s->cap = more;
    }
    s->v[s->n++] = (pm__segment){.host = host, .dev = dev, .bytes = n, .at = s->bytes,
                                 .kernel = kernel};
    s->bytes += n;
    s->kernel |= kernel;
    return true;
}

/* Everything the call moves, sorted by how it moves. */
typedef struct plan {
    dmas now;      /* pageable sources for the driver to read during its call (DRIVER) */
    dmas queued;   /* page-locked and device memory: DMAs in stream order */
    blocks kernel; /* page-locked and device memory: by the batch kernel, in stream order */
    segments staged[2]; /* pageable pieces through the staging engine, by direction */
    bool wait;     /* pageable destinations given to the driver: wait for the stream */
    unsigned long long direct, driver;
} plan;

static void plan_free(plan *p)
{
    dmas *d[2] = {&p->now, &p->queued};
    for (int k = 0; k < 2; k++) {
        free(d[k]->dst);
        free(d[k]->src);
        free(d[k]->bytes);
    }
    free(p->kernel.v);
    free(p->staged[0].v);
    free(p->staged[1].v);
}

/* What the batch kernel may take in this call: nothing unless the mode is
 * KERNEL, the stream does not capture and the backend is ready on it;
 * then elements of up to max bytes whose memory it reaches. Host ranges
 * seen (their extents' bases) are remembered as device allocations are. */
enum { KNOWN_HOST = 8 };
typedef struct kernel_use {
    bool on;
    bool staged; /* pageable blocks too, once gathered (PINMEM_COPY_KERNEL_STAGED) */
    size_t max;
    uintptr_t host_base[KNOWN_HOST];
    bool host_reach[KNOWN_HOST];
    unsigned hosts, next_host;
} kernel_use;

/* Whether the kernel reaches device memory [d, d + n). */
static bool device_reaches(const pm__backend *b, known_device *kd, pm_deviceptr d, size_t n)
{
    const int i = known_device_at(kd, d, n);
    if (i < 0)
        return b->block_copy_reaches(d, n);
    if (kd->reach[i] == 0) /* the whole allocation answers alike */
        kd->reach[i] = b->block_copy_reaches(kd->lo[i], kd->hi[i] - kd->lo[i]) ? 1 : -1;
    return kd->reach[i] > 0;
}

/* Whether the kernel reaches the page-locked host piece at at, which
 * it writes when written: pool memory is mapped for every device by how
 * pools pin it; other ranges are the backend's to answer (a registration
 * made in another context may not be mapped where the kernel runs); and
 * no kernel writes into a read-only registration. */
static bool host_reaches(pm__instance *inst, kernel_use *k, known_host *kh, uintptr_t at,
                         bool written)
{
    const pm__range *r = find_host(inst, kh, at);
    if (!r || (written && r->read_only))
        return false;
    if (r->kind == PM__RANGE_POOL)
        return true;
    for (unsigned i = 0; i < k->hosts; i++)
        if (k->host_base[i] == r->pin_base)
            return k->host_reach[i];
    bool reach = inst->backend.block_copy_reaches((pm_deviceptr)r->pin_base, r->pin_len);
    k->host_base[k->next_host] = r->pin_base;
    k->host_reach[k->next_host] = reach;
    k->next_host = (k->next_host + 1) % KNOWN_HOST;
    k->hosts += k->hosts < KNOWN_HOST;
    return reach;
}

/* The piece of host memory [at, end) that starts at at, page-locked or not,
 * answered from what the call knows where it can be. */
static pm__piece piece_at(pm__instance *inst, const known_host *kh, uintptr_t at, uintptr_t end)
{
    const size_t per = inst->backend.registration_piece;
    if (known_host_holds(kh, at))
        return pm__copy_piece_within(&kh->r, per, at, end);
    if (known_gap_holds(kh, at))
        return (pm__piece){end < kh->gap_hi ? end : kh->gap_hi, false};
    return pm__copy_next_piece(inst->ranges, per, at, end);
}

/* Element i (host to device or back) into the plan, cut where page-locked
 * and pageable memory meet. On a capturing stream all of it is page-locked
 * (checked), pieces the driver pinned included. */
static bool plan_host_element(pm__instance *inst, plan *p, way w, pm_deviceptr dst,
                              pm_deviceptr src, size_t bytes, bool capturing, bool to_driver,
                              kernel_use *k, known_device *kd, known_host *kh)
{
    const pm__backend *b = &inst->backend;
    const uintptr_t start = (uintptr_t)(w == WAY_HTOD ? src : dst), end = start + bytes;
    const pm_deviceptr dev = w == WAY_HTOD ? dst : src;
    const bool kernel = k->on && bytes <= k->max && device_reaches(b, kd, dev, bytes);
    for (uintptr_t at = start; at < end;) {
        pm__piece piece = piece_at(inst, kh, at, end);
        size_t n = piece.end - at;
        pm_deviceptr host = (pm_deviceptr)at, d = dev + (at - start);
        bool ok;
        if (piece.pinned && kernel && host_reaches(inst, k, kh, at, w == WAY_DTOH)) {
            ok = add_block(&p->kernel, w == WAY_HTOD ? d : host, w == WAY_HTOD ? host : d, n);
            p->direct += n;
        } else if (piece.pinned || capturing) {
            ok = add_dma(&p->queued, w == WAY_HTOD ? d : host, w == WAY_HTOD ? host : d, n);
            p->direct += n;
        } else if (to_driver && !pm__regcache_overlaps((void *)at, n)) {
            /* The driver's own path reads through a registration the cache still
             * holds, so such memory is staged instead. */
            ok = w == WAY_HTOD ? add_dma(&p->now, d, host, n) : add_dma(&p->queued, host, d, n);
            p->wait |= w == WAY_DTOH;
            p->driver += n;
        } else {
            ok = add_segment(&p->staged[w == WAY_HTOD ? PM__HTOD : PM__DTOH], (uint8_t *)at, d, n,
                             kernel && k->staged);
        }
        if (!ok)
            return false;
        at = piece.end;
    }
    return true;
}

/* The pageable pieces of one direction through the staging engine; where no
 * ring can be pinned, each through the backend's own path. */
static pm_result run_staged(const pm__copy_settings *set, const pm__backend *b, pm__direction dir,
                            const segments *s, pm_stream_t stream, unsigned long long *driver)
{
    if (s->n == 0)
        return PM_SUCCESS;
    bool no_ring = false;
    pm_result r = pm__staged_segments(set, dir, s->v, s->n, s->bytes, stream, s->kernel, &no_ring);
    if (!no_ring)
        return r;
    for (size_t i = 0; i < s->n; i++) {
        const pm__segment *g = &s->v[i];
        if (pm__regcache_overlaps(g->host, g->bytes))
            return r; /* the driver would read through the cache's registration */
        pm_result each = pm__copy_backend(b, dir, g->host, g->dev, g->bytes, stream,
                                          PM__VIA_PAGEABLE);
        if (each != PM_SUCCESS)
            return each;
        *driver += g->bytes;
    }
    return PM_SUCCESS;
}

/* The page-locked blocks for the kernel, each list in a staging buffer;
 * where no ring can be pinned, as DMAs instead. */
static pm_result run_blocks(const pm__copy_settings *set, const pm__backend *b, const blocks *k,
                            pm_stream_t stream, bool one_call)
{
    if (k->n == 0)
        return PM_SUCCESS;
    bool no_ring = false;
    pm_result r = pm__staged_blocks(set, k->v, k->n, stream, &no_ring);
    if (!no_ring)
        return r;
    dmas d = {0};
    bool ok = true;
    for (size_t i = 0; i < k->n && ok; i++)
        ok = add_dma(&d, k->v[i].dst, k->v[i].src, (size_t)k->v[i].bytes);
    r = ok ? pm__copy_backend_batch(b, d.dst, d.src, d.bytes, d.n, 0, stream, one_call)
           : pm__fail(PM_ERROR_OUT_OF_MEMORY, "%s: out of memory", name);
    free(d.dst);
    free(d.src);
    free(d.bytes);
    return r;
}

/* Moves what the plan holds: the DMAs first, so the DMA engine works while
 * the threads gather, and the kernel's blocks; then host to host; then the
 * staged pieces. */
static pm_result run(pm__instance *inst, const pm__copy_settings *set, plan *p,
                     const pm_deviceptr *dsts, const pm_deviceptr *srcs, const size_t *sizes,
                     const uint8_t *ways, size_t count, pm_stream_t stream, bool capturing)
{
    const pm__backend *b = &inst->backend;
    const bool one_call = !capturing && set->batch != PM_COPY_BATCH_EACH;
    pm_result r = PM_SUCCESS;
    if (p->now.n + p->queued.n > 0) {
        /* One call takes both groups, the one the driver reads now first. */
        const size_t now = p->now.n;
        dmas *all = now ? &p->now : &p->queued;
        for (size_t i = 0; now && i < p->queued.n; i++)
            if (!add_dma(all, p->queued.dst[i], p->queued.src[i], p->queued.bytes[i]))
                return pm__fail(PM_ERROR_OUT_OF_MEMORY, "%s: out of memory", name);
        r = pm__copy_backend_batch(b, all->dst, all->src, all->bytes, all->n, now, stream,
                                   one_call);
    }
    if (r == PM_SUCCESS)
        r = run_blocks(set, b, &p->kernel, stream, one_call);
    for (size_t i = 0; i < count && r == PM_SUCCESS; i++)
        if (ways[i] == WAY_HTOH)
            r = b->copy_any(dsts[i], srcs[i], sizes[i], stream, false, false);
    if (r == PM_SUCCESS)
        r = run_staged(set, b, PM__HTOD, &p->staged[PM__HTOD], stream, &p->driver);
    if (r == PM_SUCCESS)
        r = run_staged(set, b, PM__DTOH, &p->staged[PM__DTOH], stream, &p->driver);
    if (r == PM_SUCCESS && p->wait)
        r = b->stream_synchronize(stream);
    return r;
}

static void count(_Atomic unsigned long long *counter, unsigned long long n)
{
    atomic_fetch_add_explicit(counter, n, memory_order_relaxed);
}

pm_result pm_memcpy_batch_async(const pm_deviceptr *dsts, const pm_deviceptr *srcs,
                                const size_t *sizes, size_t count_, pm_stream_t stream)
{
    PM__INSTANCE_OR_RETURN(inst);
    if (!dsts || !srcs || !sizes)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: %s is NULL", name,
                        !dsts ? "dsts" : !srcs ? "srcs" : "sizes");
    if (count_ == 0)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: count is 0", name);
    if (count_ > SIZE_MAX / (4 * sizeof(span)))
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: count %zu is too large", name, count_);
    const pm__backend *b = &inst->backend;
    pm_result r = b->stream_check(stream);
    if (r != PM_SUCCESS)
        return r;
    bool capturing = false;
    if ((r = b->stream_capture_status(stream, &capturing)) != PM_SUCCESS)
        return r;
    uint8_t *ways = malloc(count_);
    span *spans = malloc(4 * count_ * sizeof *spans); /* and as many to sort them with */
    if (!ways || !spans) {
        free(ways);
        free(spans);
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "%s: out of memory for %zu elements", name,
                        count_);
    }
    known_device kd = {.n = 0};
    known_host kh = {.have = false};
    span *spans_end = spans;
    size_t copies = 0;
    for (size_t i = 0; i < count_ && r == PM_SUCCESS; i++) {
        ways[i] = WAY_NONE;
        if (sizes[i] == 0)
            continue; /* as cuMemcpyAsync of 0 bytes: nothing, whatever the pointers */
        r = check_element(inst, &kd, &kh, i, dsts[i], srcs[i], sizes[i], capturing, &ways[i],
                          &spans_end);
        copies++;
    }
    if (r == PM_SUCCESS)
        r = check_dependences(spans, spans_end, (size_t)(spans_end - spans));
    free(spans);
    if (r != PM_SUCCESS) {
        free(ways);
        return r;
    }
    const pm__copy_settings *set = pm__copy_enter();
    /* The batch's own waits and registrations: relaxed (backend.h says why). */
    const int mode = capturing ? -1 : b->captures_relax();
    const bool to_driver = set->batch == PM_COPY_BATCH_DRIVER && !capturing;
    kernel_use k = {.on = set->batch == PM_COPY_BATCH_KERNEL && set->kernel_max > 0 &&
                          !capturing && b->block_copy_ready && b->block_copy_ready(stream),
                    .staged = set->kernel_staged,
                    .max = set->kernel_max};
    plan p = {0};
    for (size_t i = 0; i < count_ && r == PM_SUCCESS; i++) {
        bool ok = true;
        if (ways[i] == WAY_HTOD || ways[i] == WAY_DTOH) {
            ok = plan_host_element(inst, &p, (way)ways[i], dsts[i], srcs[i], sizes[i], capturing,
                                   to_driver, &k, &kd, &kh);
        } else if (ways[i] == WAY_DMA) {
            ok = add_dma(&p.queued, dsts[i], srcs[i], sizes[i]);
        }
        if (!ok)
            r = pm__fail(PM_ERROR_OUT_OF_MEMORY, "%s: out of memory", name);
    }
    if (r == PM_SUCCESS)
        r = run(inst, set, &p, dsts, srcs, sizes, ways, count_, stream, capturing);
    if (!capturing)
        b->captures_restore(mode);
    pm__copy_leave();
    if (r == PM_SUCCESS) {
        count(&pm__copy_count.direct_bytes, p.direct);
        count(&pm__copy_count.driver_bytes, p.driver);
        count(&pm__copy_count.batch_calls, copies > 0);
        count(&pm__copy_count.batch_copies, copies);
    }
    plan_free(&p);
    free(ways);
    return r;
}
