/* pm_memcpy_*: a host range is cut where page-locked and pageable memory
 * meet, and each piece goes the cheapest way: page-locked pieces straight to
 * the DMA engine, pageable ones through a cached registration, the driver's
 * own path (small ones) or the staging engine. A stream that is capturing a
 * graph takes page-locked memory only. */
#include <stdint.h>
#include <stdio.h>

#include "../errors.h"
#include "../host_func.h"
#include "../instance.h"
#include "../no_cancel.h"
#include "copy.h"

/* The bytes of a range the driver has registered: all of its extent, since
 * a user's registration claims exactly its bytes, as the driver's does, and
 * every other kind is pinned over its whole extent. */
static void pinned_bytes(const pm__range *r, uintptr_t *lo, uintptr_t *hi)
{
    *lo = r->kind == PM__RANGE_REGISTERED ? r->base : r->pin_base;
    *hi = r->kind == PM__RANGE_REGISTERED ? r->base + r->size : r->pin_base + r->pin_len;
}

static uintptr_t min_addr(uintptr_t a, uintptr_t b) { return a < b ? a : b; }

bool pm__copy_pinned_piece(const pm__range *r, size_t registration_piece, uintptr_t at,
                           uintptr_t *piece_lo, uintptr_t *piece_hi)
{
    uintptr_t lo, hi;
    pinned_bytes(r, &lo, &hi);
    if (at < lo || at >= hi)
        return false;
    /* A user's registration is one driver registration, as the user made it;
     * pinmem's own mappings are registered in pieces from their start. */
    if (r->kind == PM__RANGE_REGISTERED || registration_piece == 0) {
        *piece_lo = lo;
        *piece_hi = hi;
        return true;
    }
    *piece_lo = lo + (at - lo) / registration_piece * registration_piece;
    *piece_hi = min_addr(*piece_lo + registration_piece, hi);
    return true;
}

typedef pm__piece piece;

piece pm__copy_piece_within(const pm__range *r, size_t registration_piece, uintptr_t at,
                            uintptr_t end)
{
    uintptr_t lo, hi;
    if (pm__copy_pinned_piece(r, registration_piece, at, &lo, &hi))
        return (piece){min_addr(hi, end), true, r->read_only};
    pinned_bytes(r, &lo, &hi);
    return (piece){min_addr(at < lo ? lo : r->pin_base + r->pin_len, end), false, false};
}

/* pm__copy_next_piece, for this file's own calls (the copy path), as the
 * compiler inlines it. */
static piece next_piece(pm__ranges *ranges, size_t registration_piece, uintptr_t at,
                        uintptr_t end)
{
    pm__range r;
    uintptr_t lo, hi;
    pm__extent_found found = pm__ranges_extent_at_or_after(ranges, at, &r);
    if (found == PM__EXTENT_NONE)
        return (piece){end, false, false};
    if (found == PM__EXTENT_AT)
        return pm__copy_piece_within(&r, registration_piece, at, end);
    pinned_bytes(&r, &lo, &hi);
    return (piece){min_addr(lo, end), false, false};
}

pm__piece pm__copy_next_piece(pm__ranges *ranges, size_t registration_piece, uintptr_t at,
                              uintptr_t end)
{
    return next_piece(ranges, registration_piece, at, end);
}

/* Through a cached registration: a DMA the caller waits for, because the
 * caller of a pageable copy may reuse the memory once the call returns. */
static pm_result cached_copy(const pm__backend *b, pm__regcache_entry *e, pm__direction dir,
                             uint8_t *host, pm_deviceptr dev, size_t n, pm_stream_t s)
{
    pm_result r = pm__copy_backend(b, dir, host, dev, n, s, PM__VIA_PINNED);
    pm__marker done;
    if (r == PM_SUCCESS && (r = b->marker_record(s, &done)) == PM_SUCCESS) {
        r = b->marker_synchronize(&done);
        b->marker_release(&done);
    } else if (r == PM_SUCCESS) {
        r = b->stream_synchronize(s);
    }
    pm__regcache_release(e);
    if (r == PM_SUCCESS)
        pm__count(&pm__copy_count.cached_bytes, n);
    return r;
}

/* The driver's own path for pageable memory; a synchronous copy uses the
 * driver's synchronous call, which returns as soon as the source is staged
 * rather than after the DMA. */
static pm_result driver_copy(const pm__backend *b, pm__direction dir, uint8_t *host,
                             pm_deviceptr dev, size_t n, pm_stream_t s, bool sync)
{
    pm_result r =
        pm__copy_backend(b, dir, host, dev, n, s, sync ? PM__VIA_SYNC : PM__VIA_PAGEABLE);
    if (r == PM_SUCCESS)
        pm__count(&pm__copy_count.driver_bytes, n);
    return r;
}

/* The calling thread's capture mode while a copy runs: relaxed from the
 * first of the copy's own waits or registrations on (backend.h says why). */
typedef struct capture_mode {
    int saved;
    bool relaxed;
} capture_mode;

static void relax_once(const pm__backend *b, capture_mode *m)
{
    if (!m->relaxed) {
        m->saved = b->captures_relax();
        m->relaxed = true;
    }
}

/* *queued: work was left running on the stream (a synchronous copy waits for
 * it). The driver's own path neither waits nor registers for pinmem, and
 * leaves another thread's capture alone, so it runs in the caller's mode. */
static pm_result pageable_copy(const pm__copy_settings *set, const pm__backend *b,
                               pm__direction dir, uint8_t *host, pm_deviceptr dev, size_t n,
                               pm_stream_t s, bool sync, bool *queued, capture_mode *mode)
{
    if (set->registration_cache && n >= set->cache_min_bytes) {
        relax_once(b, mode);
        pm__regcache_entry *e = pm__regcache_acquire(set, host, n);
        if (e)
            return cached_copy(b, e, dir, host, dev, n, s);
    }
    /* The driver's own path reads through any registration it still holds,
     * so memory with a cached registration waiting to be undone is staged. */
    bool driver_may = !pm__regcache_overlaps(host, n);
    pm_result r;
    if (n <= (dir == PM__HTOD ? set->direct_max : set->dtoh_direct_max) && driver_may)
        return driver_copy(b, dir, host, dev, n, s, sync);
    bool no_ring;
    relax_once(b, mode);
    pm__detail_saved before; /* a copy that succeeds another way leaves it as it was */
    pm__detail_save(&before);
    r = pm__staged_copy(set, dir, host, dev, n, s, sync, &no_ring);
    *queued |= dir == PM__HTOD && !no_ring;
    if (no_ring && driver_may) { /* nothing pinned for staging (budget): slower, but works */
        r = driver_copy(b, dir, host, dev, n, s, sync);
        if (r == PM_SUCCESS)
            pm__detail_restore(&before);
    }
    return r;
}

pm_result pm__copy_read_only_fail(const char *name, const char *role, uintptr_t at)
{
    return pm__fail(PM_ERROR_INVALID_VALUE,
                    "%s: the %s at %p lies in memory registered READ_ONLY, which no copy may "
                    "write (the driver refuses it too)",
                    name, role, (void *)at);
}

pm_result pm__copy_writable(pm__instance *inst, const char *name, const char *role,
                            uintptr_t start, size_t bytes)
{
    const size_t per = inst->backend.registration_piece;
    for (uintptr_t at = start, end = start + bytes; at < end;) {
        piece p = next_piece(inst->ranges, per, at, end);
        if (p.read_only)
            return pm__copy_read_only_fail(name, role, at);
        at = p.end;
    }
    return PM_SUCCESS;
}

/* A graph replays only what the device does: the CPU's part of a copy of
 * pageable memory (staging, or the driver's own bounce buffers) would happen
 * once, at capture, and each replay would move stale bytes. The driver takes
 * such a copy into a capture without complaint; PyTorch refuses it, and so
 * does pinmem, before anything is enqueued. */
pm_result pm__copy_capturable(pm__instance *inst, const char *name, uintptr_t start, size_t bytes)
{
    const pm__backend *b = &inst->backend;
    const uintptr_t end = start + bytes;
    for (uintptr_t at = start; at < end;) {
        piece p = next_piece(inst->ranges, b->registration_piece, at, end);
        if (!p.pinned) {
            pm__memory_kind kind = PM__MEMORY_HOST;
            pm_result r = b->pointer_kind((pm_deviceptr)at, p.end - at, &kind);
            if (r != PM_SUCCESS)
                return r;
            /* A graph would keep using a registration the cache may undo. */
            kind = pm__regcache_kind((const void *)at, p.end - at, kind);
            if (kind != PM__MEMORY_HOST_DRIVER_PINNED)
                return pm__fail(PM_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                                "%s: the stream is capturing a graph, and the host memory at %p "
                                "(of %zu bytes from %p) is pageable; a captured copy needs "
                                "page-locked host memory (pinmem's allocations, pools or "
                                "registrations, or the driver's own)",
                                name, (void *)at, bytes, (void *)start);
        }
        at = p.end;
    }
    return PM_SUCCESS;
}

/* A checked copy, with the calling thread in the copy's place. */
static pm_result copy_in_place(pm__instance *inst, const char *name, pm__direction dir,
                               uint8_t *host, pm_deviceptr dev, size_t bytes, pm_stream_t s,
                               bool sync, pm__capture capture)
{
    const pm__backend *b = &inst->backend;
    pm_result r = PM_SUCCESS;
    /* The copy settings are read only for pageable pieces: a copy that is all
     * page-locked takes no lock but the registry's. */
    const pm__copy_settings *set = NULL;
    bool queued = false;
    const uintptr_t start = (uintptr_t)host, end = start + bytes;
    piece p = next_piece(inst->ranges, b->registration_piece, start, end);
    /* Nothing moves into a READ_ONLY registration; one piece answers itself. */
    if (dir == PM__DTOH) {
        r = p.end != end  ? pm__copy_writable(inst, name, "destination", start, bytes)
            : p.read_only ? pm__copy_read_only_fail(name, "destination", start)
                          : PM_SUCCESS;
        if (r != PM_SUCCESS)
            return r;
    }
    /* A copy that is one page-locked piece is captured as the driver
     * captures it, without asking (the common case costs nothing more);
     * any other asks, and is refused by a capture unless all of it is
     * page-locked (then its pieces the driver pinned go as page-locked). */
    bool captured = capture == PM__CAPTURE_ACTIVE;
    if (capture == PM__CAPTURE_ASK && !(p.pinned && p.end == end)) {
        r = b->stream_capture_status(s, &captured);
        if (r != PM_SUCCESS)
            return r;
    }
    if (captured && (r = pm__copy_capturable(inst, name, start, bytes)) != PM_SUCCESS)
        return r;
    /* The engine's waits and registrations, and the wait of a synchronous
     * copy, are the copy's own: relaxed, from the first on. */
    capture_mode mode = {.saved = -1};
    for (uintptr_t at = start;;) {
        size_t n = p.end - at, off = at - start;
        if (p.pinned || captured) {
            /* A synchronous copy that is one page-locked piece is the driver's
             * synchronous call, which costs what the driver's own copy costs
             * (a queued DMA and a wait for the stream are two calls). */
            bool whole = sync && at == start && p.end == end;
            r = pm__copy_backend(b, dir, (uint8_t *)at, dev + off, n, s,
                                 whole ? PM__VIA_SYNC : PM__VIA_PINNED);
            queued |= !whole;
            if (r == PM_SUCCESS)
                pm__count(&pm__copy_count.direct_bytes, n);
        } else {
            if (!set)
                set = pm__copy_enter();
            r = pageable_copy(set, b, dir, (uint8_t *)at, dev + off, n, s, sync, &queued, &mode);
        }
        at = p.end;
        if (at == end || r != PM_SUCCESS)
            break;
        p = next_piece(inst->ranges, b->registration_piece, at, end);
    }
    if (set)
        pm__copy_leave();
    /* Failed or not: a synchronous copy that failed part way must not leave
     * its queued pieces writing into memory the caller may free at once. */
    if (sync && queued) {
        if (!captured)
            relax_once(b, &mode);
        pm_result waited = b->stream_synchronize(s);
        if (r == PM_SUCCESS)
            r = waited;
    }
    if (mode.relaxed)
        b->captures_restore(mode.saved);
    return r;
}

/* Where device memory is the process's own (posix), nothing stops a copy
 * that runs past its allocation's end but this; the driver refuses such a
 * copy itself. */
static pm_result device_range_fits(const pm__backend *b, const char *name, pm_deviceptr dev,
                                   size_t bytes)
{
    if (!b->device_is_host_memory)
        return PM_SUCCESS;
    pm__memory_kind kind;
    pm_result r = b->pointer_kind(dev, bytes, &kind);
    if (r == PM_SUCCESS)
        return r;
    char why[512];
    snprintf(why, sizeof why, "%s", pm_last_error_detail());
    return pm__fail(r, "%s: %s", name, why);
}

pm_result pm__copy(const char *name, pm__direction dir, uint8_t *host, pm_deviceptr dev,
                   size_t bytes, pm_stream_t s, bool sync, pm__capture capture)
{
    PM__INSTANCE_OR_RETURN(inst);
    if (bytes == 0)
        return PM_SUCCESS;
    if (!host || !dev)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: the %s pointer is NULL", name,
                        host ? "device" : "host");
    if (bytes > UINTPTR_MAX - (uintptr_t)host)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: %zu bytes from the host address %p wrap "
                        "around", name, bytes, (void *)host);
    if (bytes > UINT64_MAX - dev)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%s: %zu bytes from the device address 0x%llx "
                        "wrap around", name, bytes, (unsigned long long)dev);
    const pm__backend *b = &inst->backend;
    pm_result r = device_range_fits(b, name, dev, bytes);
    if (r != PM_SUCCESS)
        return r;
    r = b->stream_check(s);
    pm__place place;
    pm__place_scope scope;
    if (r == PM_SUCCESS)
        r = b->copy_place(s, dev, 0, &place);
    if (r == PM_SUCCESS)
        r = b->place_enter(&place, &scope);
    if (r != PM_SUCCESS)
        return r;
    r = copy_in_place(inst, name, dir, host, dev, bytes, s, sync, capture);
    b->place_leave(&scope);
    return r;
}

/* The synchronous forms run on the legacy stream, which never captures. */
pm_result pm_memcpy_htod(pm_deviceptr dst, const void *src, size_t bytes)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_memcpy_htod");
    return pm__copy("pm_memcpy_htod", PM__HTOD, (uint8_t *)src, dst, bytes, NULL, true,
                    PM__CAPTURE_NONE);
}

pm_result pm_memcpy_dtoh(void *dst, pm_deviceptr src, size_t bytes)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_memcpy_dtoh");
    return pm__copy("pm_memcpy_dtoh", PM__DTOH, dst, src, bytes, NULL, true, PM__CAPTURE_NONE);
}

pm_result pm_memcpy_htod_async(pm_deviceptr dst, const void *src, size_t bytes, pm_stream_t stream)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_memcpy_htod_async");
    return pm__copy("pm_memcpy_htod_async", PM__HTOD, (uint8_t *)src, dst, bytes, stream, false,
                    PM__CAPTURE_ASK);
}

pm_result pm_memcpy_dtoh_async(void *dst, pm_deviceptr src, size_t bytes, pm_stream_t stream)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_memcpy_dtoh_async");
    return pm__copy("pm_memcpy_dtoh_async", PM__DTOH, dst, src, bytes, stream, false,
                    PM__CAPTURE_ASK);
}

pm_result pm_mem_invalidate(void *p, size_t bytes)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_invalidate");
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    if (!p && bytes)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_invalidate: p is NULL");
    if (bytes > UINTPTR_MAX - (uintptr_t)p)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_invalidate: %zu bytes from %p wrap around",
                        bytes, p);
    if (bytes)
        pm__regcache_invalidate((uintptr_t)p, (uintptr_t)p + bytes, true);
    return PM_SUCCESS;
}
