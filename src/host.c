/* The spec's host-memory API (cuMemHostAlloc and friends) on top of a backend
 * and the range registry. The answers follow docs/driver-behavior.md; memory
 * pinmem does not track is passed to the backend's foreign_* calls, so memory
 * pinned through the driver directly still gets the driver's answers.
 *
 * The driver answers for bytes, not pages: only the bytes asked for are an
 * allocation or a registration. The rest of an allocation's pages answers as
 * pageable memory (and cannot be registered), and two registrations may
 * share a page unless one is READ_ONLY and the other not. pinmem answers for
 * its own pages from its registry, never from the driver's view of them. */
#include <stdint.h>
#include <unistd.h>

#include "budget.h"
#include "copy/copy.h"
#include "errors.h"
#include "host_func.h"
#include "instance.h"
#include "no_cancel.h"
#include "pool/pool.h"

#define ALLOC_FLAGS \
    (PM_MEMHOSTALLOC_PORTABLE | PM_MEMHOSTALLOC_DEVICEMAP | PM_MEMHOSTALLOC_WRITECOMBINED)
#define REGISTER_FLAGS                                                                    \
    (PM_MEMHOSTREGISTER_PORTABLE | PM_MEMHOSTREGISTER_DEVICEMAP | PM_MEMHOSTREGISTER_IOMEMORY | \
     PM_MEMHOSTREGISTER_READ_ONLY)

/* A fresh mapping can land on pages a stale registration still claims (the
 * user unmapped registered memory without unregistering it). Such mappings
 * are held aside while another is taken, at most this many times. */
enum { max_stale_retries = 4 };

static pm_result release_pinned(pm__instance *inst, const pm__range *r)
{
    pm__budget_give(r->pin_len);
    return inst->backend.host_free((void *)r->base, r->pin_len, r->backend_tag);
}

/* The budget is taken once the pinned extent is known, after pinning; a
 * request it cannot admit even at its exact size is refused before anything
 * is mapped or touched. */
static pm_result budget_admits(size_t bytesize)
{
    const unsigned long long cap = pm__budget_cap(), now = pm__budget_pinned();
    if (cap && (bytesize > cap || now > cap - bytesize))
        return pm__fail(PM_ERROR_OUT_OF_MEMORY,
                        "pm_mem_host_alloc: %zu more pinned bytes would pass the pinned budget "
                        "of %llu (%llu pinned now)",
                        bytesize, cap, now);
    return PM_SUCCESS;
}

static pm_result alloc_and_claim(pm__instance *inst, size_t bytesize, unsigned flags,
                                 pm__range *out)
{
    pm__range held[max_stale_retries];
    int n_held = 0;
    pm_result r;
    for (;;) {
        pm__range cand = {0};
        r = inst->backend.host_alloc(bytesize, flags, -1, (void **)&cand.base, &cand.pin_len,
                                     &cand.backend_tag);
        if (r != PM_SUCCESS)
            break;
        r = pm__budget_take(cand.pin_len, "pm_mem_host_alloc");
        if (r != PM_SUCCESS) {
            inst->backend.host_free((void *)cand.base, cand.pin_len, cand.backend_tag);
            break;
        }
        cand.pin_base = cand.base;
        cand.size = bytesize;
        cand.flags = flags | PM_MEMHOSTALLOC_DEVICEMAP;
        cand.kind = PM__RANGE_ALLOC;
        pm__range conflict;
        if (pm__ranges_claim(inst->ranges, &cand, &conflict)) {
            *out = cand;
            break;
        }
        if (conflict.kind == 0 || n_held == max_stale_retries) {
            release_pinned(inst, &cand);
            r = pm__fail(PM_ERROR_OUT_OF_MEMORY,
                         conflict.kind == 0 ? "out of memory for the range registry"
                                            : "every fresh mapping overlaps a stale registration");
            break;
        }
        held[n_held++] = cand;
    }
    for (int i = 0; i < n_held; i++)
        release_pinned(inst, &held[i]);
    return r;
}

pm_result pm_mem_host_alloc(void **pp, size_t bytesize, unsigned flags)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_host_alloc");
    PM__INSTANCE_OR_RETURN(inst);
    if (!pp)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_host_alloc: pp is NULL");
    if (flags & ~ALLOC_FLAGS)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_host_alloc: flags 0x%x has bits outside PORTABLE, DEVICEMAP "
                        "and WRITECOMBINED",
                        flags);
    if (bytesize == 0) {
        *pp = NULL;
        return PM_SUCCESS;
    }
    pm__range r;
    pm_result res = budget_admits(bytesize);
    if (res == PM_SUCCESS)
        res = alloc_and_claim(inst, bytesize, flags, &r);
    if (res != PM_SUCCESS)
        return res;
    pm__ranges_publish(inst->ranges, &r);
    *pp = (void *)r.base;
    return PM_SUCCESS;
}

pm_result pm_mem_alloc_host(void **pp, size_t bytesize)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_alloc_host");
    return pm_mem_host_alloc(pp, bytesize, 0);
}

pm_result pm_mem_free_host(void *p)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_free_host");
    PM__INSTANCE_OR_RETURN(inst);
    if (!p)
        return PM_SUCCESS;
    pm__range r;
    switch (pm__ranges_retire(inst->ranges, (uintptr_t)p, PM__RANGE_ALLOC, &r)) {
    case PM__RETIRED:
        /* Release the claim first: the pages stay mapped until host_free
         * returns, so no fresh mapping can land on them before then, and one
         * may land there the moment after. */
        pm__ranges_withdraw(inst->ranges, r.pin_base);
        if (inst->backend.free_wait)
            inst->backend.free_wait();
        return release_pinned(inst, &r);
    case PM__RETIRE_MISMATCH:
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        r.kind == PM__RANGE_ALLOC  ? "pm_mem_free_host: %p is inside a host "
                                                     "allocation, not its base"
                        : r.kind == PM__RANGE_POOL ? "pm_mem_free_host: %p is pool memory; use "
                                                     "pm_mem_free"
                                                   : "pm_mem_free_host: %p is registered memory; "
                                                     "use pm_mem_host_unregister",
                        p);
    case PM__RETIRE_SLACK:
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_free_host: %p is not a host allocation (it is in the pages of the "
                        "host allocation at %p, past its bytes)",
                        p, (void *)r.base);
    case PM__RETIRE_NOT_TRACKED:
        break;
    }
    return inst->backend.foreign_free_host(p);
}

/* The driver's answer to a registration whose bytes overlap what is pinned
 * already: memory it allocated itself cannot be registered, while the rest
 * of its pages and the bytes of other registrations are registered already.
 * A registration on no byte of the one in the way shares a page with one of
 * the other READ_ONLY-ness, which the driver refuses. */
static pm_result register_conflict(void *p, size_t bytesize, unsigned flags,
                                   const pm__range *in_way)
{
    const uintptr_t lo = (uintptr_t)p, hi = lo + bytesize;
    const bool on_bytes = in_way->base < hi && lo < in_way->base + in_way->size;
    if (in_way->kind == PM__RANGE_REGISTERED && !on_bytes)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_host_register: [%p, +%zu)%s would share a page with the %s "
                        "registration [%p, +%zu); READ_ONLY and writable registrations cannot "
                        "share a page",
                        p, bytesize, flags & PM_MEMHOSTREGISTER_READ_ONLY ? " (READ_ONLY)" : "",
                        in_way->read_only ? "READ_ONLY" : "writable", (void *)in_way->base,
                        in_way->size);
    if (in_way->kind != PM__RANGE_REGISTERED && on_bytes)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_host_register: [%p, +%zu) overlaps %s memory at %p, which is "
                        "pinned already",
                        p, bytesize, in_way->kind == PM__RANGE_POOL ? "pool" : "host-allocated",
                        (void *)in_way->base);
    if (in_way->kind != PM__RANGE_REGISTERED)
        return pm__fail(PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                        "pm_mem_host_register: [%p, +%zu) lies in pages pinned for the host "
                        "allocation [%p, +%zu)",
                        p, bytesize, (void *)in_way->base, in_way->size);
    return pm__fail(PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                    "pm_mem_host_register: [%p, +%zu) overlaps the registration [%p, +%zu)", p,
                    bytesize, (void *)in_way->base, in_way->size);
}

/* Takes a registration's new pages from the budget, under the registry's
 * claim, so that a page registrations share is counted once (and a
 * registration on pages pinned already needs nothing, however full). */
static bool take_budget(size_t bytes, void *result)
{
    if (bytes)
        *(pm_result *)result = pm__budget_take(bytes, "pm_mem_host_register");
    return *(pm_result *)result == PM_SUCCESS;
}

pm_result pm_mem_host_register(void *p, size_t bytesize, unsigned flags)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_host_register");
    PM__INSTANCE_OR_RETURN(inst);
    if (!p || bytesize == 0)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_host_register: %s",
                        p ? "bytesize is 0" : "p is NULL");
    if (flags & ~REGISTER_FLAGS)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_host_register: flags 0x%x has bits outside PORTABLE, DEVICEMAP, "
                        "IOMEMORY and READ_ONLY",
                        flags);
    const uintptr_t page_mask = inst->backend.caps.page_size - 1;
    const uintptr_t lo = (uintptr_t)p & ~page_mask;
    /* The last byte, then the last page, each without wrapping around. */
    if (bytesize - 1 > UINTPTR_MAX - (uintptr_t)p)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_host_register: [%p, +%zu) wraps around the address space", p,
                        bytesize);
    const uintptr_t last = (uintptr_t)p + (bytesize - 1);
    if ((last | page_mask) == UINTPTR_MAX)
        return pm__fail(PM_ERROR_NOT_SUPPORTED,
                        "pm_mem_host_register: [%p, +%zu) reaches the last page of the address "
                        "space, which belongs to the kernel",
                        p, bytesize);
    if ((flags & PM_MEMHOSTREGISTER_READ_ONLY) &&
        !inst->backend.caps.read_only_host_register_supported)
        return pm__fail(PM_ERROR_NOT_SUPPORTED,
                        "pm_mem_host_register: the device does not support READ_ONLY");
    const uintptr_t hi = (last | page_mask) + 1;
    /* The registration claims exactly its bytes, as the driver does. */
    pm__range r = {
        .base = (uintptr_t)p,
        .size = bytesize,
        .pin_base = (uintptr_t)p,
        .pin_len = bytesize,
        .flags = (flags & PM_MEMHOSTREGISTER_PORTABLE) | PM_MEMHOSTREGISTER_DEVICEMAP,
        .kind = PM__RANGE_REGISTERED,
        .read_only = (flags & PM_MEMHOSTREGISTER_READ_ONLY) != 0,
    };
    const size_t page = inst->backend.caps.page_size;
    pm_result res = PM_SUCCESS;
    pm__range conflict;
    if (!pm__ranges_claim_pages(inst->ranges, &r, page, take_budget, &res, &conflict)) {
        if (res != PM_SUCCESS)
            return res;
        if (conflict.kind == 0)
            return pm__fail(PM_ERROR_OUT_OF_MEMORY, "out of memory for the range registry");
        return register_conflict(p, bytesize, flags, &conflict);
    }
    /* The copy engine's cached registrations give way to the user's own. */
    pm__regcache_evict(lo, hi);
    res = inst->backend.host_register(p, bytesize, flags);
    if (res != PM_SUCCESS) {
        pm__budget_give(pm__ranges_withdraw_pages(inst->ranges, r.pin_base, page));
        return res;
    }
    pm__ranges_publish(inst->ranges, &r);
    return PM_SUCCESS;
}

pm_result pm_mem_host_unregister(void *p)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_host_unregister");
    PM__INSTANCE_OR_RETURN(inst);
    if (!p)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_host_unregister: p is NULL");
    pm__range r;
    switch (pm__ranges_retire(inst->ranges, (uintptr_t)p, PM__RANGE_REGISTERED, &r)) {
    case PM__RETIRED: {
        if (inst->backend.free_wait)
            inst->backend.free_wait();
        pm_result res = inst->backend.host_unregister((void *)r.base, r.size);
        pm__budget_give(
            pm__ranges_withdraw_pages(inst->ranges, r.pin_base, inst->backend.caps.page_size));
        return res;
    }
    case PM__RETIRE_SLACK:
        return pm__fail(PM_ERROR_HOST_MEMORY_NOT_REGISTERED,
                        "pm_mem_host_unregister: %p is not in a registered range (it is in the "
                        "pages of the host allocation at %p, past its bytes)",
                        p, (void *)r.base);
    case PM__RETIRE_MISMATCH:
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        r.kind == PM__RANGE_REGISTERED
                            ? "pm_mem_host_unregister: %p is inside a registration, not the "
                              "pointer that was registered"
                        : r.kind == PM__RANGE_POOL
                            ? "pm_mem_host_unregister: %p is pool memory; use pm_mem_free"
                            : "pm_mem_host_unregister: %p is a host allocation; use "
                              "pm_mem_free_host",
                        p);
    case PM__RETIRE_NOT_TRACKED:
        break;
    }
    return inst->backend.foreign_unregister(p);
}

static pm_result not_allocated(const char *call, void *p)
{
    return pm__fail(PM_ERROR_INVALID_VALUE, "%s: %p is in a pool but not allocated", call, p);
}

/* The rest of an allocation's pages is pageable memory to the driver. */
static pm_result past_the_bytes(pm_result code, const char *call, const void *p,
                                const pm__range *r)
{
    return pm__fail(code, "%s: %p is not pinned memory (it is in the pages of the host "
                          "allocation at %p, past its bytes)",
                    call, p, (void *)r->base);
}

pm_result pm_mem_host_get_flags(unsigned *pflags, void *p)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_host_get_flags");
    PM__INSTANCE_OR_RETURN(inst);
    if (!pflags)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_host_get_flags: pflags is NULL");
    pm__range r;
    uintptr_t base;
    size_t size;
    switch (pm__ranges_locate(inst->ranges, (uintptr_t)p, &r)) {
    case PM__PLACE_BYTES:
        if (r.kind == PM__RANGE_POOL && !pm__pool_find((uintptr_t)p, &base, &size))
            return not_allocated("pm_mem_host_get_flags", p);
        *pflags = r.flags;
        return PM_SUCCESS;
    case PM__PLACE_SLACK:
        return past_the_bytes(PM_ERROR_INVALID_VALUE, "pm_mem_host_get_flags", p, &r);
    case PM__PLACE_NONE:
        break;
    }
    return inst->backend.foreign_get_flags(pflags, p);
}

pm_result pm_mem_host_get_device_pointer(pm_deviceptr *pdptr, void *p, unsigned flags)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_host_get_device_pointer");
    PM__INSTANCE_OR_RETURN(inst);
    if (!pdptr)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_host_get_device_pointer: pdptr is NULL");
    if (flags != 0)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_host_get_device_pointer: flags must be 0, not 0x%x", flags);
    pm__range r;
    uintptr_t base;
    size_t size;
    switch (pm__ranges_locate(inst->ranges, (uintptr_t)p, &r)) {
    case PM__PLACE_BYTES:
        if (r.kind == PM__RANGE_POOL && !pm__pool_find((uintptr_t)p, &base, &size))
            return not_allocated("pm_mem_host_get_device_pointer", p);
        return inst->backend.device_pointer(
            pdptr, p, r.kind == PM__RANGE_POOL ? pm__pool_chunk_ops_at((uintptr_t)p) : NULL);
    case PM__PLACE_SLACK:
        return past_the_bytes(PM_ERROR_INVALID_VALUE, "pm_mem_host_get_device_pointer", p, &r);
    case PM__PLACE_NONE:
        break;
    }
    return inst->backend.foreign_get_device_pointer(pdptr, p);
}

pm_result pm_mem_get_address_range(pm_deviceptr *pbase, size_t *psize, pm_deviceptr dptr)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_get_address_range");
    PM__INSTANCE_OR_RETURN(inst);
    if (!pbase && !psize)
        return PM_SUCCESS;
    pm__range r;
    /* Pinned host memory is addressed by the device at its host address. */
    pm__range_place place = pm__ranges_locate(inst->ranges, (uintptr_t)dptr, &r);
    if (place == PM__PLACE_SLACK)
        return past_the_bytes(PM_ERROR_NOT_FOUND, "pm_mem_get_address_range",
                              (const void *)(uintptr_t)dptr, &r);
    if (place == PM__PLACE_BYTES) {
        if (r.kind == PM__RANGE_POOL) {
            uintptr_t base;
            if (!pm__pool_find((uintptr_t)dptr, &base, &r.size))
                return pm__fail(PM_ERROR_NOT_FOUND,
                                "pm_mem_get_address_range: 0x%llx is in a pool but not allocated",
                                dptr);
            r.base = base;
        }
        if (pbase)
            *pbase = (pm_deviceptr)r.base;
        if (psize)
            *psize = r.size;
        return PM_SUCCESS;
    }
    return inst->backend.foreign_get_address_range(pbase, psize, dptr);
}
