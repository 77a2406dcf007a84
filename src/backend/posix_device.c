/* The POSIX backend's simulated device: its memory, which is host memory
 * whose ranges are recorded, its one place, and what it reports. */
#include "posix_device.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../errors.h"
#include "../ranges.h"
#include "../test_hooks.h"

/* "Device" memory is host memory here: copies run through the same code.
 * Its ranges are recorded, so that pm_memcpy can tell device memory from
 * host memory the way the driver does under unified addressing. */
static pm__ranges *_Atomic device_ranges;

/* The registry, made on first use; NULL while memory for it runs out. Made
 * by whoever gets there first rather than once, so that a failure does not
 * stick: the next call tries again. */
static pm__ranges *devices(void)
{
    pm__ranges *set = atomic_load_explicit(&device_ranges, memory_order_acquire);
    if (set)
        return set;
    pm__ranges *fresh = pm__ranges_create();
    if (!fresh)
        return NULL;
    if (!atomic_compare_exchange_strong(&device_ranges, &set, fresh)) {
        pm__ranges_destroy(fresh);
        return set;
    }
    return fresh;
}

/* The registry where one was made: lookups need none made for them. */
static pm__ranges *devices_made(void)
{
    return atomic_load_explicit(&device_ranges, memory_order_acquire);
}

bool pm__posix_device_overlaps(uintptr_t lo, uintptr_t hi)
{
    pm__ranges *set = devices_made();
    pm__range r;
    if (!set)
        return false;
    switch (pm__ranges_extent_at_or_after(set, lo, &r)) {
    case PM__EXTENT_AT:
        return true;
    case PM__EXTENT_AFTER:
        return r.pin_base < hi;
    default:
        return false;
    }
}

/* Mapped rather than malloc'ed: page aligned (the driver's allocations are
 * aligned at least 256 bytes), and a size no system can give fails with
 * ENOMEM instead of tripping an allocator's limits. */
static pm_result posix_device_alloc(pm_deviceptr *d, size_t bytesize)
{
    const size_t mask = (size_t)sysconf(_SC_PAGESIZE) - 1;
    size_t len = bytesize + mask < bytesize ? 0 : (bytesize + mask) & ~mask;
    void *p = len ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                  : MAP_FAILED;
    if (p == MAP_FAILED)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "device memory: mapping %zu bytes failed: %s",
                        bytesize, len ? strerror(errno) : "too large");
    pm__range r = {.base = (uintptr_t)p, .size = bytesize, .pin_base = (uintptr_t)p,
                   .pin_len = len, .kind = PM__RANGE_ALLOC};
    pm__range conflict;
    pm__ranges *set = devices();
    if (!set || !pm__ranges_claim(set, &r, &conflict)) {
        munmap(p, len);
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "device memory: out of memory for its registry");
    }
    pm__ranges_publish(set, &r);
    *d = (pm_deviceptr)(uintptr_t)p;
    return PM_SUCCESS;
}

static pm_result posix_device_alloc_on(pm_deviceptr *d, size_t bytesize, int ordinal)
{
    (void)ordinal; /* 0, the one device */
    return posix_device_alloc(d, bytesize);
}

static pm_result posix_device_release(pm_deviceptr d)
{
    pm__range r;
    pm__ranges *set = devices_made();
    if (!set || pm__ranges_retire(set, (uintptr_t)d, PM__RANGE_ALLOC, &r) != PM__RETIRED)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_device_free: 0x%llx is not the base of live device memory", d);
    /* Withdrawn before it is freed: the allocator may hand the address out again at once. */
    pm__ranges_withdraw(set, r.pin_base);
    munmap((void *)r.pin_base, r.pin_len);
    return PM_SUCCESS;
}

static pm_result posix_pointer_extent(pm_deviceptr p, size_t bytes, pm__memory_kind *kind,
                                      pm_deviceptr *lo, pm_deviceptr *hi)
{
    pm__range r;
    *kind = PM__MEMORY_HOST;
    *lo = *hi = 0;
    if (!devices_made() || !pm__ranges_find(devices_made(), (uintptr_t)p, &r))
        return PM_SUCCESS;
    if (bytes > r.base + r.size - (uintptr_t)p)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "%zu bytes from 0x%llx run past the end of the device allocation at "
                        "0x%llx (%zu bytes)",
                        bytes, p, (unsigned long long)r.base, r.size);
    *kind = PM__MEMORY_DEVICE;
    *lo = r.base;
    *hi = r.base + r.size;
    return PM_SUCCESS;
}

static pm_result posix_pointer_kind(pm_deviceptr p, size_t bytes, pm__memory_kind *kind)
{
    pm_deviceptr lo, hi;
    return posix_pointer_extent(p, bytes, kind, &lo, &hi);
}

/* As the driver answers for device memory: the allocation's base and the
 * size asked for; the rest of its last page is no part of it. */
static pm_result posix_device_address_range(pm_deviceptr *pbase, size_t *psize, pm_deviceptr p)
{
    pm__range r;
    if (!devices_made() || !pm__ranges_find(devices_made(), (uintptr_t)p, &r))
        return pm__fail(PM_ERROR_NOT_FOUND,
                        "pm_mem_get_address_range: 0x%llx is neither pinned nor device memory", p);
    if (pbase)
        *pbase = (pm_deviceptr)r.base;
    if (psize)
        *psize = r.size;
    return PM_SUCCESS;
}

/* One simulated device and no contexts: every copy runs where it is. */
static pm_result posix_copy_place(pm_stream_t s, pm_deviceptr a, pm_deviceptr b, pm__place *out)
{
    (void)s;
    (void)a;
    (void)b;
    out->context = NULL;
    return PM_SUCCESS;
}

static pm_result posix_place_enter(const pm__place *p, pm__place_scope *scope)
{
    (void)p;
    scope->pushed = false;
    return PM_SUCCESS;
}

static void posix_place_leave(pm__place_scope *scope) { (void)scope; }

static bool posix_place_lasts(const pm__place *p)
{
    (void)p;
    return !PM__TEST_PLACES_PASS();
}

/* Device memory is a live device_alloc range, all of it the one simulated
 * device's. */
static pm_result posix_pointer_device(pm_deviceptr p, int *ordinal)
{
    pm__range r;
    if (!devices_made() || !pm__ranges_find(devices_made(), (uintptr_t)p, &r))
        return pm__fail(PM_ERROR_INVALID_VALUE, "%#llx is not device memory",
                        (unsigned long long)p);
    *ordinal = 0;
    return PM_SUCCESS;
}

/* The simulated device: host memory, nearest the machine's NUMA node where
 * it has one (on several, no node is nearer than another), no PCI link,
 * and the capabilities the backend reports. */
static pm_result posix_device_info(int ordinal, pm_device_info *info)
{
    size_t keep = info->struct_size;
    memset(info, 0, sizeof *info);
    info->struct_size = keep;
    info->ordinal = ordinal;
    info->in_use = 1;
    snprintf(info->name, sizeof info->name, "posix (host memory as device memory)");
    info->host_numa_node = pm__only_numa_node();
    info->can_map_host_memory = 1;
    info->unified_addressing = 1;
    info->can_use_host_pointer_for_registered_mem = 1;
    info->read_only_host_register_supported = 1;
    return PM_SUCCESS;
}

void pm__posix_device_open(pm__backend *out)
{
    out->device_count = 1;
    out->device_in_use = 0;
    out->device_alloc = posix_device_alloc;
    out->device_alloc_on = posix_device_alloc_on;
    out->device_release = posix_device_release;
    out->device_info = posix_device_info;
    out->pointer_kind = posix_pointer_kind;
    out->pointer_extent = posix_pointer_extent;
    out->pointer_device = posix_pointer_device;
    out->foreign_get_address_range = posix_device_address_range;
    out->copy_place = posix_copy_place;
    out->place_enter = posix_place_enter;
    out->place_leave = posix_place_leave;
    out->place_lasts = posix_place_lasts;
}
