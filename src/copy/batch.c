/* pm_memcpy_batch_async: many copies in one call, each what pm_memcpy_async
 * would make of it, in any order among themselves.
 *
 * One pass over the elements checks each one, and the host side of each cut
 * where page-locked and pageable memory meet, and plans how each piece
 * moves; then the check that no copy depends on another (batch_overlap.c);
 * only then does anything move (batch_run.c). Planning moves nothing, so a
 * refused batch just drops its plan; checking and planning in one pass asks
 * each element's memory once.
 *
 * The page-locked pieces and device-to-device copies go to the DMA engine in
 * one driver call where the driver has a batch copy (cuMemcpyBatchAsync):
 * one call for a thousand DMAs costs far less than a thousand calls. The
 * pageable pieces of each direction become one staging job of many
 * segments, so the workers gather small blocks into full buffers (or
 * scatter them out of full ones), and each buffer's DMAs again go in one
 * call. With pm_copy_config.batch DRIVER, pageable pieces go to the driver's
 * batch copy instead (it reads pageable sources during the call). Host-to-
 * host copies are the backend's own, one by one.
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
#include "../host_func.h"
#include "../instance.h"
#include "../no_cancel.h"
#include "batch.h"

static const char name[] = PM__BATCH_NAME;

/* What an element is, from its pointers. */
typedef enum {
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
 * under the registry's lock. last: the one found last, asked first. */
enum { KNOWN_DEVICE = 8 };
typedef struct known_device {
    pm_deviceptr lo[KNOWN_DEVICE], hi[KNOWN_DEVICE];
    signed char reach[KNOWN_DEVICE];
    bool no_host[KNOWN_DEVICE];
    unsigned n, next, last;
} known_device;

/* What the registry answered last in this call: the page-locked range that
 * holds an address, and the gap around one that no range touches. A batch's
 * blocks mostly lie in one allocation, page-locked or pageable, and each
 * lookup of the registry takes its lock. Of the range: the registration
 * piece seen last (a DMA may not cross out of one, and finding it divides),
 * and whether the kernel reaches it, read and written (0: not asked yet). */
typedef struct known_host {
    pm__range r;
    bool have;
    uintptr_t gap_lo, gap_hi;     /* empty while none is known */
    uintptr_t piece_lo, piece_hi; /* likewise */
    signed char reach[2];
} known_host;

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

/* One call's state: what it knows of memory, what it may use, the ranges
 * for the overlap check and the plan. */
typedef struct batch {
    pm__instance *inst;
    const pm__backend *b;
    bool capturing, to_driver;
    known_device kd;
    known_host kh;
    kernel_use k;
    pm__spans device, host;
    pm__batch_plan plan;
} batch;

static bool known_host_holds(const known_host *kh, uintptr_t addr)
{
    return kh->have && addr - kh->r.pin_base < kh->r.pin_len;
}

static bool in(uintptr_t addr, uintptr_t lo, uintptr_t hi) { return addr - lo < hi - lo; }

static uintptr_t min_addr(uintptr_t a, uintptr_t b) { return a < b ? a : b; }

/* The page-locked range whose extent holds addr, or NULL. */
static const pm__range *find_host(pm__instance *inst, known_host *kh, uintptr_t addr)
{
    if (known_host_holds(kh, addr))
        return &kh->r;
    if (in(addr, kh->gap_lo, kh->gap_hi))
        return NULL;
    pm__range r;
    uintptr_t lo, hi;
    if (!pm__ranges_extent_or_gap(inst->ranges, addr, &r, &lo, &hi)) {
        kh->gap_lo = lo; /* the range known is kept too: the next address may lie there */
        kh->gap_hi = hi;
        return NULL;
    }
    *kh = (known_host){.r = r, .have = true, .gap_lo = kh->gap_lo, .gap_hi = kh->gap_hi};
    return &kh->r;
}

static bool device_holds(const known_device *kd, unsigned i, pm_deviceptr p, size_t bytes)
{
    return p >= kd->lo[i] && p < kd->hi[i] && bytes <= kd->hi[i] - p;
}

/* The known device allocation that holds [p, p + bytes), or -1. */
static int known_device_at(known_device *kd, pm_deviceptr p, size_t bytes)
{
    if (kd->n > 0 && device_holds(kd, kd->last, p, bytes))
        return (int)kd->last;
    for (unsigned i = 0; i < kd->n; i++)
        if (device_holds(kd, i, p, bytes)) {
            kd->last = i;
            return (int)i;
        }
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
 * then the backend, but for memory only the registration cache pinned. */
static pm_result kind_of(batch *c, pm_deviceptr p, size_t bytes, pm__memory_kind *kind)
{
    if (known_host_holds(&c->kh, (uintptr_t)p)) { /* the cheapest answer: no lookup */
        *kind = PM__MEMORY_HOST;
        return PM_SUCCESS;
    }
    const int dev = known_device_at(&c->kd, p, bytes);
    if (dev >= 0 && c->kd.no_host[dev]) {
        *kind = PM__MEMORY_DEVICE;
        return PM_SUCCESS;
    }
    if (find_host(c->inst, &c->kh, (uintptr_t)p)) {
        *kind = PM__MEMORY_HOST;
        return PM_SUCCESS;
    }
    if (dev >= 0) {
        *kind = PM__MEMORY_DEVICE;
        return PM_SUCCESS;
    }
    pm_deviceptr lo = 0, hi = 0;
    pm_result res = c->b->pointer_extent(p, bytes, kind, &lo, &hi);
    if (res != PM_SUCCESS)
        return res;
    if (*kind == PM__MEMORY_DEVICE && lo < hi)
        remember_device(c->inst, &c->kd, lo, hi);
    *kind = pm__regcache_kind((const void *)(uintptr_t)p, bytes, *kind);
    return PM_SUCCESS;
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

/* Whether the kernel reaches device memory [d, d + n). */
static bool device_reaches(batch *c, pm_deviceptr d, size_t n)
{
    known_device *kd = &c->kd;
    const int i = known_device_at(kd, d, n);
    if (i < 0)
        return c->b->block_copy_reaches(d, n);
    if (kd->reach[i] == 0) /* the whole allocation answers alike */
        kd->reach[i] = c->b->block_copy_reaches(kd->lo[i], kd->hi[i] - kd->lo[i]) ? 1 : -1;
    return kd->reach[i] > 0;
}

/* Whether the kernel reaches the page-locked range r, which it writes when
 * written: pool memory is mapped for every device by how pools pin it; other
 * ranges are the backend's to answer (a registration made in another context
 * may not be mapped where the kernel runs); and no kernel writes into a
 * read-only registration. */
static bool range_reaches(batch *c, const pm__range *r, bool written)
{
    kernel_use *k = &c->k;
    if (written && r->read_only)
        return false;
    if (r->kind == PM__RANGE_POOL)
        return true;
    for (unsigned i = 0; i < k->hosts; i++)
        if (k->host_base[i] == r->pin_base)
            return k->host_reach[i];
    bool reach = c->b->block_copy_reaches((pm_deviceptr)r->pin_base, r->pin_len);
    k->host_base[k->next_host] = r->pin_base;
    k->host_reach[k->next_host] = reach;
    k->next_host = (k->next_host + 1) % KNOWN_HOST;
    k->hosts += k->hosts < KNOWN_HOST;
    return reach;
}

/* Whether the kernel reaches the page-locked host piece at at. */
static bool host_reaches(batch *c, uintptr_t at, bool written)
{
    const pm__range *r = find_host(c->inst, &c->kh, at);
    if (!r)
        return false;
    signed char *known = &c->kh.reach[written];
    if (*known == 0)
        *known = range_reaches(c, r, written) ? 1 : -1;
    return *known > 0;
}

/* The piece of host memory [at, end) that starts at at, page-locked or not,
 * answered from what the call knows where it can be. */
static pm__piece piece_at(batch *c, uintptr_t at, uintptr_t end)
{
    known_host *kh = &c->kh;
    const size_t per = c->b->registration_piece;
    if (in(at, kh->piece_lo, kh->piece_hi))
        return (pm__piece){min_addr(end, kh->piece_hi), true, kh->r.read_only};
    if (known_host_holds(kh, at)) {
        if (pm__copy_pinned_piece(&kh->r, per, at, &kh->piece_lo, &kh->piece_hi))
            return (pm__piece){min_addr(end, kh->piece_hi), true, kh->r.read_only};
        return pm__copy_piece_within(&kh->r, per, at, end);
    }
    if (in(at, kh->gap_lo, kh->gap_hi))
        return (pm__piece){min_addr(end, kh->gap_hi), false, false};
    return pm__copy_next_piece(c->inst->ranges, per, at, end);
}

/* The first byte of host memory [at, end) in a READ_ONLY registration, or 0. */
static uintptr_t read_only_in(batch *c, uintptr_t at, uintptr_t end)
{
    for (pm__piece p; at < end; at = p.end)
        if ((p = piece_at(c, at, end)).read_only)
            return at;
    return 0;
}

/* An element between host and device memory into the plan, cut where
 * page-locked and pageable memory meet. On a capturing stream all of it is
 * page-locked (checked), pieces the driver pinned included. false: out of
 * memory. */
static bool plan_host_element(batch *c, way w, pm_deviceptr dst, pm_deviceptr src, size_t bytes)
{
    pm__batch_plan *p = &c->plan;
    const uintptr_t start = (uintptr_t)(w == WAY_HTOD ? src : dst), end = start + bytes;
    const pm_deviceptr dev = w == WAY_HTOD ? dst : src;
    const bool kernel = c->k.on && bytes <= c->k.max && device_reaches(c, dev, bytes);
    for (uintptr_t at = start; at < end;) {
        pm__piece piece = piece_at(c, at, end);
        size_t n = piece.end - at;
        pm_deviceptr host = (pm_deviceptr)at, d = dev + (at - start);
        pm_deviceptr to = w == WAY_HTOD ? d : host, from = w == WAY_HTOD ? host : d;
        bool ok;
        if (piece.pinned && kernel && host_reaches(c, at, w == WAY_DTOH)) {
            ok = pm__blocks_add(&p->kernel, p->hint, to, from, n);
        } else if (piece.pinned || c->capturing) {
            ok = pm__dmas_add(&p->queued, p->hint, to, from, n);
            p->direct += n;
        } else if (c->to_driver && !pm__regcache_overlaps((void *)at, n)) {
            /* The driver's own path reads through a registration the cache still
             * holds, so such memory is staged instead. */
            ok = pm__dmas_add(w == WAY_HTOD ? &p->now : &p->queued, p->hint, to, from, n);
            p->wait |= w == WAY_DTOH;
            p->driver += n;
        } else {
            ok = pm__segments_add(&p->staged[w == WAY_HTOD ? PM__HTOD : PM__DTOH], p->hint,
                                  (uint8_t *)at, d, n, kernel && c->k.staged);
        }
        if (!ok)
            return false;
        at = piece.end;
    }
    return true;
}

/* r again, its detail (and the driver's code) now naming element i, the
 * call's name once. */
static pm_result name_element(pm_result r, size_t i)
{
    char why[512];
    const char *detail = pm_last_error_detail();
    const size_t named = strlen(name);
    if (strncmp(detail, name, named) == 0 && strncmp(detail + named, ": ", 2) == 0)
        detail += named + 2;
    snprintf(why, sizeof why, "%s", detail);
    return pm__fail_driver(r, pm_last_driver_error(), "%s: element %zu: %s", name, i, why);
}

/* Element i, where it is what most elements of a large batch are: a block
 * between the host piece and the device allocation the call found last,
 * both known to the kernel. Then those answer every check and the plan (as
 * take_element would: both lie in memory known to be non-NULL, and host
 * memory never shares an address with device memory), without a lookup.
 * false: take_element must answer. */
static bool take_known(batch *c, size_t i, pm_deviceptr dst, pm_deviceptr src, size_t bytes)
{
    const known_host *kh = &c->kh;
    const known_device *kd = &c->kd;
    const unsigned d = kd->last;
    if (!c->k.on || bytes > c->k.max || kd->n == 0 || kd->reach[d] <= 0 || !kd->no_host[d])
        return false;
    const bool htod = kh->reach[0] > 0 && in(src, kh->piece_lo, kh->piece_hi) &&
                      bytes <= kh->piece_hi - src && device_holds(kd, d, dst, bytes);
    if (!htod && !(kh->reach[1] > 0 && in(dst, kh->piece_lo, kh->piece_hi) &&
                   bytes <= kh->piece_hi - dst && device_holds(kd, d, src, bytes)))
        return false;
    pm__batch_plan *p = &c->plan;
    if (!pm__blocks_add(&p->kernel, p->hint, dst, src, bytes))
        return false; /* take_element tries again and says so */
    pm__spans_add(htod ? &c->device : &c->host, dst, dst + bytes, i, true);
    pm__spans_add(htod ? &c->host : &c->device, src, src + bytes, i, false);
    return true;
}

/* Element i checked, its ranges kept for the overlap check and its pieces
 * planned. */
static pm_result take_element(batch *c, size_t i, pm_deviceptr dst, pm_deviceptr src,
                              size_t bytes)
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
    if ((r = kind_of(c, dst, bytes, &to)) != PM_SUCCESS ||
        (r = kind_of(c, src, bytes, &from)) != PM_SUCCESS)
        return name_element(r, i);
    /* A capture takes page-locked host memory only (copy.c says why). */
    if (c->capturing && ((to != PM__MEMORY_DEVICE &&
                          (r = pm__copy_capturable(c->inst, name, dst, bytes)) != PM_SUCCESS) ||
                         (from != PM__MEMORY_DEVICE &&
                          (r = pm__copy_capturable(c->inst, name, src, bytes)) != PM_SUCCESS)))
        return name_element(r, i);
    const way w = way_of(to, from);
    /* As the driver: nothing is written into a READ_ONLY registration. */
    const uintptr_t read_only = (w == WAY_DTOH || w == WAY_HTOH) && to == PM__MEMORY_HOST
                                    ? read_only_in(c, (uintptr_t)dst, (uintptr_t)dst + bytes)
                                    : 0;
    if (read_only)
        return name_element(pm__copy_read_only_fail(name, "destination", read_only), i);
    pm__spans_add(to == PM__MEMORY_DEVICE ? &c->device : &c->host, dst, dst + bytes, i, true);
    pm__spans_add(from == PM__MEMORY_DEVICE ? &c->device : &c->host, src, src + bytes, i, false);
    pm__batch_plan *p = &c->plan;
    const bool ok = w == WAY_HTOD || w == WAY_DTOH ? plan_host_element(c, w, dst, src, bytes)
                    : w == WAY_DMA ? pm__dmas_add(&p->queued, p->hint, dst, src, bytes)
                                   : pm__dmas_add(&p->host, p->hint, dst, src, bytes);
    return ok ? PM_SUCCESS : pm__fail(PM_ERROR_OUT_OF_MEMORY, "%s: out of memory", name);
}

static pm_result check_arrays(const pm_deviceptr *dsts, const pm_deviceptr *srcs,
                              const size_t *sizes, size_t n)
{
    if (!dsts || !srcs || !sizes)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: %s is NULL", name,
                        !dsts ? "dsts" : !srcs ? "srcs" : "sizes");
    if (n == 0)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: count is 0", name);
    if (n > SIZE_MAX / (4 * sizeof(pm__span)))
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: count %zu is too large", name, n);
    return PM_SUCCESS;
}

/* Checks and plans every element, then that no destination overlaps
 * another range of its kind of memory (the copies run in any order);
 * *copies counts the elements that move bytes. */
static pm_result plan_elements(batch *c, const pm_deviceptr *dsts, const pm_deviceptr *srcs,
                               const size_t *sizes, size_t n, size_t *copies)
{
    pm_result r = PM_SUCCESS;
    for (size_t i = 0; i < n && r == PM_SUCCESS; i++) {
        if (sizes[i] == 0)
            continue; /* as cuMemcpyAsync of 0 bytes: nothing, whatever the pointers */
        if (!take_known(c, i, dsts[i], srcs[i], sizes[i]))
            r = take_element(c, i, dsts[i], srcs[i], sizes[i]);
        (*copies)++;
    }
    /* Where the kinds share addresses, every range is checked against every
     * other: the device list has room for all of them. */
    if (r == PM_SUCCESS && c->b->device_is_host_memory) {
        for (size_t k = 0; k < c->host.n; k++)
            pm__spans_add(&c->device, c->host.v[k].lo, c->host.v[k].hi, c->host.v[k].tag >> 1,
                          c->host.v[k].tag & 1);
        c->host.n = 0;
        c->host.has_dst = false;
    }
    if (r == PM_SUCCESS)
        r = pm__batch_check_overlaps(&c->device, c->host.v + c->host.n);
    if (r == PM_SUCCESS)
        r = pm__batch_check_overlaps(&c->host, c->device.v + c->device.n);
    return r;
}

pm_result pm_memcpy_batch_async(const pm_deviceptr *dsts, const pm_deviceptr *srcs,
                                const size_t *sizes, size_t count_, pm_stream_t stream)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_memcpy_batch_async");
    PM__INSTANCE_OR_RETURN(inst);
    pm_result r = check_arrays(dsts, srcs, sizes, count_);
    if (r != PM_SUCCESS)
        return r;
    const pm__backend *b = &inst->backend;
    if ((r = b->stream_check(stream)) != PM_SUCCESS)
        return r;
    bool capturing = false;
    if ((r = b->stream_capture_status(stream, &capturing)) != PM_SUCCESS)
        return r;
    /* The whole batch runs in the place of its stream (or of its first
     * element's device, for a thread without a context): the first that
     * moves bytes, as an element of 0 bytes may hold any pointers. */
    size_t first = 0;
    while (first + 1 < count_ && sizes[first] == 0)
        first++;
    pm__place place;
    pm__place_scope scope;
    if ((r = b->copy_place(stream, dsts[first], srcs[first], &place)) != PM_SUCCESS ||
        (r = b->place_enter(&place, &scope)) != PM_SUCCESS)
        return r;
    /* Room for both kinds' ranges, two an element each: while one kind is
     * sorted, the room the other left is as large as it. */
    pm__span *spans = malloc(4 * count_ * sizeof *spans);
    if (!spans) {
        b->place_leave(&scope);
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "%s: out of memory for %zu elements", name,
                        count_);
    }
    const pm__copy_settings *set = pm__copy_enter();
    /* The batch's own waits and registrations: relaxed (backend.h says why). */
    const int mode = capturing ? -1 : b->captures_relax();
    batch c = {
        .inst = inst,
        .b = b,
        .capturing = capturing,
        .to_driver = set->batch == PM_COPY_BATCH_DRIVER && !capturing,
        .k = {.on = set->batch == PM_COPY_BATCH_KERNEL && set->kernel_max > 0 && !capturing &&
                    b->block_copy_ready && b->block_copy_ready(stream),
              .staged = set->kernel_staged,
              .max = set->kernel_max},
        .device = {.v = spans},
        .host = {.v = spans + 2 * count_},
        .plan = {.hint = count_},
    };
    size_t copies = 0;
    r = plan_elements(&c, dsts, srcs, sizes, count_, &copies);
    free(spans);
    if (r == PM_SUCCESS)
        r = pm__batch_run(set, b, &c.plan, stream, !capturing && set->batch != PM_COPY_BATCH_EACH);
    if (!capturing)
        b->captures_restore(mode);
    pm__copy_leave();
    b->place_leave(&scope);
    /* The bytes were counted as they went (batch_run.c); the call counts
     * where it succeeded. */
    if (r == PM_SUCCESS) {
        pm__count(&pm__copy_count.batch_calls, copies > 0);
        pm__count(&pm__copy_count.batch_copies, copies);
    }
    pm__batch_plan_free(&c.plan);
    return r;
}
