/* pm_mem_check_access: whether a copy may read or write a range, asked of the
 * kernel without touching the memory (docs/design.md, "Copies", after the batches).
 *
 * Linux 6.11 and later answer, for an address, the mapping that holds it with
 * its permissions (the PROCMAP_QUERY ioctl of /proc/self/maps). Device memory
 * lies in mappings that permit nothing, so there the library and the driver
 * say whether the range is one allocation they know. Older kernels leave
 * msync, which says only whether every page is mapped. */
#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "errors.h"
#include "instance.h"
#include "proc_maps.h"

typedef enum {
    ACCESS_GOOD,
    ACCESS_UNMAPPED,
    ACCESS_DENIED,    /* a mapping permits some access, not the one asked */
    ACCESS_NOTHING,   /* a mapping permits nothing: a guard page, or device memory */
    ACCESS_UNANSWERED /* the kernel did not answer: ask msync */
} access_verdict;

/* The verdict for [start, end), walking its mappings; *one_lo and *one_hi get
 * the mapping that holds all of it, or stay 0 where it takes several. */
static access_verdict ask_mappings(int fd, uintptr_t start, uintptr_t end, unsigned access,
                                   uintptr_t *one_lo, uintptr_t *one_hi)
{
    bool read = access & PM_ACCESS_READ, write = access & PM_ACCESS_WRITE;
    pm__mapping m;
    for (uintptr_t at = start; at < end; at = m.end) {
        if (pm__proc_maps_query(fd, at, &m) != 0)
            return errno == ENOENT ? ACCESS_UNMAPPED : ACCESS_UNANSWERED;
        if ((read && !m.readable) || (write && !m.writable))
            return m.readable || m.writable ? ACCESS_DENIED : ACCESS_NOTHING;
        if (at == start && m.end >= end) {
            *one_lo = m.start;
            *one_hi = m.end;
        }
    }
    return ACCESS_GOOD;
}

/* msync(MS_ASYNC) flushes nothing on Linux and fails with ENOMEM where a page
 * of the range is not mapped. */
static access_verdict ask_msync(uintptr_t start, uintptr_t end)
{
    return msync((void *)start, end - start, MS_ASYNC) == 0 ? ACCESS_GOOD : ACCESS_UNMAPPED;
}

pm_result pm_mem_check_access(pm_deviceptr p, size_t bytes, unsigned access,
                              pm_deviceptr *span_base, size_t *span_size)
{
    PM__INSTANCE_OR_RETURN(inst);
    if (access == 0 || (access & ~(unsigned)(PM_ACCESS_READ | PM_ACCESS_WRITE)))
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_check_access: access must be PM_ACCESS_READ, PM_ACCESS_WRITE "
                        "or both, not 0x%x", access);
    if (span_base)
        *span_base = p;
    if (span_size)
        *span_size = bytes;
    if (bytes == 0)
        return PM_SUCCESS;
    if (bytes > UINTPTR_MAX - p)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_check_access: address 0x%llx (+%zu bytes) runs past the end "
                        "of the address space", (unsigned long long)p, bytes);

    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)p & ~(page - 1);
    uintptr_t end = (uintptr_t)p + bytes;
    uintptr_t lo = 0, hi = 0;
    int fd = pm__instance_maps_file(inst);
    access_verdict verdict = fd >= 0 ? ask_mappings(fd, start, end, access, &lo, &hi)
                                     : ACCESS_UNANSWERED;
    if (verdict == ACCESS_UNANSWERED)
        verdict = ask_msync(start, end);
    if (verdict == ACCESS_NOTHING) {
        pm_deviceptr base;
        size_t size;
        if (pm_mem_get_address_range(&base, &size, p) == PM_SUCCESS && bytes <= size &&
            p - base <= size - bytes) {
            lo = (uintptr_t)base;
            hi = (uintptr_t)base + size;
            verdict = ACCESS_GOOD;
        }
    }
    const char *how = access == PM_ACCESS_READ    ? "readable"
                      : access == PM_ACCESS_WRITE ? "writable"
                                                  : "readable and writable";
    switch (verdict) {
    case ACCESS_GOOD:
        if (hi > lo) {
            if (span_base)
                *span_base = lo;
            if (span_size)
                *span_size = hi - lo;
        }
        return PM_SUCCESS;
    case ACCESS_UNMAPPED:
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_check_access: address 0x%llx (+%zu bytes) is not mapped in "
                        "this process", (unsigned long long)p, bytes);
    case ACCESS_DENIED:
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_check_access: address 0x%llx (+%zu bytes) is not %s in this "
                        "process", (unsigned long long)p, bytes, how);
    default:
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_check_access: address 0x%llx (+%zu bytes) is neither %s host "
                        "memory nor inside one device allocation", (unsigned long long)p, bytes,
                        how);
    }
}
