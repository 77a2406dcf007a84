/* pm_mem_check_access: whether a copy may read or write a range, asked of the
 * kernel without touching the memory (docs/design.md, "Copies", after the batches).
 *
 * Linux 6.11 and later answer, for an address, the mapping that holds it with
 * its permissions (the PROCMAP_QUERY ioctl of /proc/self/maps); older kernels
 * give the same in that file's text, read up to the range on every check.
 * Device memory lies in mappings that permit nothing, so there the library
 * and the driver say whether the range is one device allocation they know;
 * page-locked host memory answers by its mapping, as any host memory. Where
 * /proc cannot be read, msync says only whether every page is mapped. */
#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "errors.h"
#include "host_func.h"
#include "instance.h"
#include "no_cancel.h"
#include "proc_maps.h"

typedef enum {
    ACCESS_GOOD,
    ACCESS_UNMAPPED,
    ACCESS_DENIED,    /* a mapping permits some access, not the one asked */
    ACCESS_NOTHING,   /* a mapping permits nothing: a guard page, or device memory */
    ACCESS_UNANSWERED /* not answered: ask the text, then msync */
} access_verdict;

/* What one mapping says of an access to it. */
static access_verdict judge(const pm__mapping *m, unsigned access)
{
    bool read = access & PM_ACCESS_READ, write = access & PM_ACCESS_WRITE;
    if ((read && !m->readable) || (write && !m->writable))
        return m->readable || m->writable ? ACCESS_DENIED : ACCESS_NOTHING;
    return ACCESS_GOOD;
}

/* A walk over the mappings that hold [start, end), in order: at is where the
 * next one must start; lo and hi get the mapping that holds all of it, or
 * stay 0 where it takes several. */
typedef struct walk {
    uintptr_t start, end, at, lo, hi;
    unsigned access;
} walk;

/* Takes the mapping that holds w->at: ACCESS_GOOD once the walk has reached
 * the end, ACCESS_UNANSWERED while it goes on, else the verdict. */
static access_verdict walk_step(walk *w, const pm__mapping *m)
{
    access_verdict v = judge(m, w->access);
    if (v != ACCESS_GOOD)
        return v;
    if (w->at == w->start && m->end >= w->end) {
        w->lo = m->start;
        w->hi = m->end;
    }
    w->at = m->end;
    return w->at >= w->end ? ACCESS_GOOD : ACCESS_UNANSWERED;
}

/* The verdict from the kernel's query, a call a mapping. */
static access_verdict ask_query(int fd, walk *w)
{
    pm__mapping m;
    for (;;) {
        if (pm__proc_maps_query(fd, w->at, &m) != 0)
            return errno == ENOENT ? ACCESS_UNMAPPED : ACCESS_UNANSWERED;
        access_verdict v = walk_step(w, &m);
        if (v != ACCESS_UNANSWERED)
            return v;
    }
}

/* The verdict from the file's text, read as far as the range. */
static access_verdict ask_text(walk *w)
{
    pm__maps_text t;
    if (pm__maps_text_open(&t) != 0)
        return ACCESS_UNANSWERED;
    access_verdict v = ACCESS_UNANSWERED;
    pm__mapping m;
    int got = -1;
    while (v == ACCESS_UNANSWERED && (got = pm__maps_text_next(&t, &m)) == 1) {
        if (m.end <= w->at)
            continue;
        v = m.start > w->at ? ACCESS_UNMAPPED : walk_step(w, &m);
    }
    if (v == ACCESS_UNANSWERED && got == 0)
        v = ACCESS_UNMAPPED; /* past the last mapping */
    pm__maps_text_close(&t);
    return v;
}

/* Whether [p, p + bytes) lies inside one device allocation the library or
 * the driver knows (which no mapping lets the CPU touch); if so, w's span is
 * that allocation. */
static bool in_one_device_allocation(pm_deviceptr p, size_t bytes, walk *w)
{
    pm_deviceptr base;
    size_t size;
    pm__memory_kind kind;
    pm__detail_saved before; /* an address outside every allocation is no failure here */
    pm__detail_save(&before);
    bool inside = pm_mem_get_address_range(&base, &size, p) == PM_SUCCESS && bytes <= size &&
                  p - base <= size - bytes &&
                  pm__instance_backend()->pointer_kind(p, bytes, &kind) == PM_SUCCESS &&
                  kind == PM__MEMORY_DEVICE; /* not page-locked host memory */
    pm__detail_restore(&before);
    if (inside) {
        w->lo = (uintptr_t)base;
        w->hi = (uintptr_t)base + size;
    }
    return inside;
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
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_check_access");
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
    walk w = {.start = start, .end = end, .at = start, .access = access};
    int fd = pm__instance_maps_file(inst);
    access_verdict verdict = ACCESS_UNANSWERED;
    if (fd >= 0)
        verdict = ask_query(fd, &w);
    else if (!inst->backend.device_is_host_memory && in_one_device_allocation(p, bytes, &w))
        verdict = ACCESS_GOOD; /* the text costs tens of microseconds or more: this first */
    if (verdict == ACCESS_UNANSWERED) {
        w.at = start; /* a query refused midway: from the start again */
        w.lo = w.hi = 0;
        verdict = ask_text(&w);
    }
    if (verdict == ACCESS_UNANSWERED)
        verdict = ask_msync(start, end);
    /* Where device memory is the process's own (posix), the CPU moves every
     * byte of a copy, so what its mapping forbids stays forbidden; elsewhere
     * only device memory passes so, as the driver reads a small copy's
     * page-locked source with the CPU (docs/driver-behavior.md). */
    if (verdict == ACCESS_NOTHING && !inst->backend.device_is_host_memory &&
        in_one_device_allocation(p, bytes, &w))
        verdict = ACCESS_GOOD;
    const uintptr_t lo = w.lo, hi = w.hi;
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
