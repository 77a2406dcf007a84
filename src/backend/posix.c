/* The POSIX backend: pinning is mmap + mlock, the device pointer is the host
 * pointer, and the answers are the driver's (docs/driver-behavior.md). */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../errors.h"
#include "../options.h"
#include "../proc_maps.h"
#include "../test_hooks.h"
#include "backend.h"
#include "block_parts.h"
#include "posix_device.h"
#include "posix_pages.h"
#include "posix_stream.h"

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* Raw system calls: sanitizer runtimes replace mlock with a no-op, and pinned
 * memory that is not locked is a silent lie. */
static int lock_pages(void *p, size_t len) { return (int)syscall(SYS_mlock, p, len); }
static int unlock_pages(void *p, size_t len) { return (int)syscall(SYS_munlock, p, len); }

/* Addresses with the top bit set belong to the kernel on x86-64 and arm64. */
static const uintptr_t kernel_half = (uintptr_t)1 << (sizeof(uintptr_t) * 8 - 1);

static unsigned long long locked_kib_now(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    unsigned long long kib = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %llu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

/* Locking len bytes failed, or would: name the limit and how to raise it. */
static pm_result memlock_refusal(const char *what, size_t len, const char *why)
{
    struct rlimit rl;
    char limit[64] = "unlimited";
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        snprintf(limit, sizeof limit, "%llu KiB", (unsigned long long)rl.rlim_cur / 1024);
    return pm__fail(PM_ERROR_OUT_OF_MEMORY,
                    "%s: mlock of %zu bytes %s; RLIMIT_MEMLOCK is %s with %llu KiB "
                    "already locked; raise it with 'ulimit -l' or memlock in "
                    "/etc/security/limits.conf, or grant CAP_IPC_LOCK",
                    what, len, why, limit, locked_kib_now());
}

static pm_result memlock_failure(int err, size_t len, const char *what)
{
    char why[96];
    snprintf(why, sizeof why, "failed (%s)", strerror(err));
    return memlock_refusal(what, len, why);
}

/* Before faulting in a range that is large enough to be faulted ahead of
 * mlock: a range the limit dooms is refused with nothing touched (mlock
 * itself checks the limit before faulting, so smaller ranges need no look). */
static pm_result check_lockable(size_t len, const char *what)
{
    if (len < pm__prefault_parallel_min)
        return PM_SUCCESS;
    size_t room = pm__memlock_headroom();
    if (room != SIZE_MAX && len > room)
        return memlock_refusal(what, len, "would pass the limit");
    return PM_SUCCESS;
}

static pm_result posix_host_alloc(size_t bytesize, unsigned flags, int numa_node, void **base,
                                  size_t *pin_len, unsigned *tag)
{
    (void)flags; /* write-combining has no meaning for the CPU's own memory */
    pm_result r = check_lockable(bytesize, "pm_mem_host_alloc");
    if (r != PM_SUCCESS)
        return r;
    size_t len = 0;
    void *p = pm__map_anonymous(bytesize, &len);
    if (!p)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "mmap of %zu bytes failed: %s", bytesize,
                        strerror(errno));
    r = numa_node >= 0 ? pm__bind_to_node(p, len, numa_node) : PM_SUCCESS;
    if (r != PM_SUCCESS) {
        munmap(p, len);
        return r;
    }
    /* mlock faults pages in on one thread; for large ranges, several threads
     * fault them ahead of it. Small ones go straight to mlock, unless their
     * node's threads must touch them. */
    if (len >= pm__prefault_parallel_min || pm__placed_by_touch(numa_node))
        pm__prefault(p, len, numa_node);
    if (lock_pages(p, len) != 0) {
        int err = errno;
        munmap(p, len);
        return memlock_failure(err, len, "pm_mem_host_alloc");
    }
    *base = p;
    *pin_len = len;
    *tag = 0;
    return PM_SUCCESS;
}

static pm_result posix_host_free(void *base, size_t pin_len, unsigned tag)
{
    (void)tag;
    if (munmap(base, pin_len) != 0)
        return pm__fail(PM_ERROR_UNKNOWN, "munmap failed: %s", strerror(errno));
    return PM_SUCCESS;
}

typedef struct mapping_check {
    bool all_mapped, all_readable, all_writable, all_io;
} mapping_check;

/* Treats mappings of device files as I/O memory, the kind IOMEMORY is for. */
static bool is_io_path(const char *path)
{
    return strncmp(path, "/dev/", 5) == 0 && strncmp(path, "/dev/zero", 9) != 0 &&
           strncmp(path, "/dev/shm/", 9) != 0;
}

/* Walks /proc/self/maps over [lo, hi): is every page mapped, and how. */
static mapping_check inspect_mappings(uintptr_t lo, uintptr_t hi)
{
    mapping_check c = {false, true, true, true};
    pm__maps_text t;
    pm__mapping m;
    if (pm__maps_text_open(&t) != 0)
        return c;
    uintptr_t covered = lo;
    while (covered < hi && pm__maps_text_next(&t, &m) == 1) {
        if (m.end <= covered)
            continue;
        if (m.start > covered)
            break; /* a hole */
        c.all_readable &= m.readable;
        c.all_writable &= m.writable;
        c.all_io &= is_io_path(t.name);
        covered = m.end;
    }
    pm__maps_text_close(&t);
    c.all_mapped = covered >= hi;
    return c;
}

/* The pages [*lo, *hi) that [p, p + bytesize) touches (bytesize > 0); false
 * when they would run past the top of the address space. */
static bool page_extent(void *p, size_t bytesize, uintptr_t *lo, uintptr_t *hi)
{
    const uintptr_t mask = page_size() - 1;
    if (bytesize == 0 || bytesize - 1 > UINTPTR_MAX - (uintptr_t)p ||
        (((uintptr_t)p + (bytesize - 1)) | mask) == UINTPTR_MAX)
        return false;
    *lo = (uintptr_t)p & ~mask;
    *hi = (((uintptr_t)p + (bytesize - 1)) | mask) + 1;
    return true;
}

static pm_result posix_host_register(void *p, size_t bytesize, unsigned flags)
{
    uintptr_t lo, hi;
    if (!page_extent(p, bytesize, &lo, &hi))
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_host_register: [%p, +%zu) runs past the end of the address space",
                        p, bytesize);
    /* The driver's answer for the kernel's half of the address space. */
    if (hi - 1 >= kernel_half)
        return pm__fail(PM_ERROR_NOT_SUPPORTED,
                        "pm_mem_host_register: [%p, +%zu) is kernel address space", p, bytesize);
    if (pm__posix_device_overlaps(lo, hi))
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_host_register: [%p, +%zu) lies in device memory "
                        "(pm_device_alloc), which no host registration may take", p, bytesize);
    mapping_check c = inspect_mappings(lo, hi);
    /* The kernel writes /proc/self/maps a read() at a time, and a mapping
     * that another thread's mlock splits or merges between two reads can be
     * missed: a hole is asked about again before it is believed. */
    for (int again = 0; !c.all_mapped && again < 3; again++)
        c = inspect_mappings(lo, hi);
    if (!c.all_mapped)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_host_register: part of [%p, +%zu) is not mapped", p, bytesize);
    if (!c.all_readable)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_host_register: part of the range is not readable");
    if (!c.all_writable && !(flags & PM_MEMHOSTREGISTER_READ_ONLY))
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_host_register: the range is mapped read-only; pass "
                        "PM_MEMHOSTREGISTER_READ_ONLY");
    if ((flags & PM_MEMHOSTREGISTER_IOMEMORY) && !c.all_io)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_host_register: IOMEMORY given for ordinary memory");
    if (c.all_io)
        return PM_SUCCESS; /* device memory is never paged out; nothing to lock */
    int err = pm__posix_lock_registration(p, bytesize, lo, hi);
    if (err == -1)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY,
                        "pm_mem_host_register: out of memory for the count of shared pages");
    if (err)
        return memlock_failure(err, hi - lo, "pm_mem_host_register");
    return PM_SUCCESS;
}

static pm_result posix_host_unregister(void *p, size_t bytesize)
{
    uintptr_t lo, hi;
    if (!page_extent(p, bytesize, &lo, &hi))
        return PM_SUCCESS; /* never registered: no such range can be */
    /* ENOMEM here means the user unmapped the memory first: nothing is left
     * locked, so the registration is gone all the same. */
    pm__posix_unlock_registration(p, bytesize, lo, hi);
    return PM_SUCCESS;
}

static pm_result posix_device_pointer(pm_deviceptr *out, void *p, const pm__chunk_ops *pool_chunk)
{
    (void)pool_chunk; /* "device" memory is host memory: every address is its own */
    *out = (pm_deviceptr)(uintptr_t)p;
    return PM_SUCCESS;
}

static pm_result posix_foreign_free_host(void *p)
{
    return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_free_host: %p is not a host allocation", p);
}

static pm_result posix_foreign_unregister(void *p)
{
    if (pm__posix_device_overlaps((uintptr_t)p, (uintptr_t)p + 1))
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_host_unregister: %p lies in device memory, which no host "
                        "registration takes", p);
    return pm__fail(PM_ERROR_HOST_MEMORY_NOT_REGISTERED,
                    "pm_mem_host_unregister: %p is not in a registered range", p);
}

static pm_result posix_foreign_get_flags(unsigned *pflags, void *p)
{
    (void)pflags;
    return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_host_get_flags: %p is not pinned memory", p);
}

static pm_result posix_foreign_get_device_pointer(pm_deviceptr *out, void *p)
{
    (void)out;
    return pm__fail(PM_ERROR_INVALID_VALUE,
                    "pm_mem_host_get_device_pointer: %p is not pinned memory", p);
}

static pm_result posix_chunk_commit(void *p, size_t len, int numa_node)
{
    pm_result r = check_lockable(len, "pool memory");
    if (r != PM_SUCCESS)
        return r;
    /* bound when reserved, or placed by this touch */
    if (len >= pm__prefault_parallel_min || pm__placed_by_touch(numa_node))
        pm__prefault(p, len, numa_node);
    if (lock_pages(p, len) != 0) {
        int err = errno;
        madvise(p, len, MADV_DONTNEED);
        return memlock_failure(err, len, "pool memory");
    }
    return PM_SUCCESS;
}

/* The pages go back to the system; the range stays mapped and reads zeros. */
static void posix_chunk_decommit(void *p, size_t len)
{
    unlock_pages(p, len);
    madvise(p, len, MADV_DONTNEED);
}

static void posix_chunk_unreserve(void *base, size_t len) { munmap(base, len); }

static void posix_own_thread_start(void) { (void)PM__TEST_RELAX_THREAD(); }

static int posix_captures_relax(void) { return PM__TEST_RELAX_THREAD(); }

static void posix_captures_restore(int saved) { PM__TEST_RESTORE_THREAD(saved); }

/* The waits the copy engine and the public API make: in the test model of a
 * global capture on another thread, refused where the driver refuses them. */
static pm_result posix_stream_synchronize(pm_stream_t s)
{
    if (PM__TEST_WAIT_REFUSED())
        return pm__fail(PM_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                        "stream synchronization while another thread captures in global mode");
    return pm__posix_stream_synchronize(s);
}

static pm_result posix_marker_synchronize(const pm__marker *m)
{
    if (PM__TEST_WAIT_REFUSED())
        return pm__fail(PM_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                        "event synchronization while another thread captures in global mode");
    return pm__posix_marker_synchronize(m);
}

static pm_result posix_marker_query(const pm__marker *m)
{
    return pm__posix_marker_done(m) ? PM_SUCCESS : PM_ERROR_NOT_READY;
}

static pm_result posix_stream_capture_status(pm_stream_t s, bool *capturing)
{
    (void)s;
    *capturing = PM__TEST_CAPTURING(s);
    return PM_SUCCESS;
}

/* The synchronous copies are ordered on the default stream, as the driver's
 * are on its legacy stream: they start once the work queued there before
 * them is done. */
static pm_result copy_in_default_stream_order(void *dst, const void *src, size_t bytesize)
{
    pm_result r = pm__posix_stream_synchronize(NULL);
    if (r == PM_SUCCESS)
        memcpy(dst, src, bytesize);
    return r;
}

static pm_result posix_copy_htod(pm_deviceptr d, const void *src, size_t bytesize)
{
    return copy_in_default_stream_order((void *)(uintptr_t)d, src, bytesize);
}

static pm_result posix_copy_dtoh(void *dst, pm_deviceptr d, size_t bytesize)
{
    return copy_in_default_stream_order(dst, (const void *)(uintptr_t)d, bytesize);
}

/* An asynchronous copy: the stream's thread plays the DMA engine. */
typedef struct copy_task {
    void *dst;
    const void *src;
    size_t bytes;
} copy_task;

static void run_copy(void *arg)
{
    copy_task *t = arg;
    memcpy(t->dst, t->src, t->bytes);
    free(t);
}

/* Page-locked host memory is copied by the stream thread in order; other
 * memory, as the driver does, once the stream's earlier work is done and
 * before the call returns. */
static pm_result copy_async(void *dst, const void *src, size_t bytes, pm_stream_t s, bool pinned)
{
    if (!pinned) {
        pm_result r = pm__posix_stream_synchronize(s);
        if (r == PM_SUCCESS)
            memcpy(dst, src, bytes);
        return r;
    }
    copy_task *t = malloc(sizeof *t);
    if (!t)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "asynchronous copy: out of memory");
    *t = (copy_task){dst, src, bytes};
    pm_result r = pm__posix_stream_launch_host_func(s, run_copy, t);
    if (r != PM_SUCCESS)
        free(t);
    return r;
}

static pm_result posix_copy_htod_async(pm_deviceptr d, const void *src, size_t bytesize,
                                       pm_stream_t s, bool host_pinned)
{
    return copy_async((void *)(uintptr_t)d, src, bytesize, s, host_pinned);
}

static pm_result posix_copy_dtoh_async(void *dst, pm_deviceptr d, size_t bytesize, pm_stream_t s,
                                       bool host_pinned)
{
    return copy_async(dst, (const void *)(uintptr_t)d, bytesize, s, host_pinned);
}

/* Many copies as one task of the stream, as the driver's batch copy is one
 * call: the stream's thread plays the DMA engine for all of them. */
typedef struct batch_task {
    size_t count;
    copy_task copies[];
} batch_task;

static void run_batch(void *arg)
{
    batch_task *t = arg;
    for (size_t i = 0; i < t->count; i++)
        memcpy(t->copies[i].dst, t->copies[i].src, t->copies[i].bytes);
    free(t);
}

static pm_result posix_copy_batch_async(const pm_deviceptr *dsts, const pm_deviceptr *srcs,
                                        const size_t *sizes, size_t count, size_t read_now,
                                        pm_stream_t s, bool one_call, bool *batched)
{
    *batched = false;
    pm_result r = PM_SUCCESS;
    if (read_now > 0 && (r = pm__posix_stream_synchronize(s)) != PM_SUCCESS)
        return r;
    for (size_t i = 0; i < read_now; i++) /* pageable sources: now, as the driver's own path */
        memcpy((void *)(uintptr_t)dsts[i], (const void *)(uintptr_t)srcs[i], sizes[i]);
    size_t rest = count - read_now;
    if (!one_call || rest < 2) {
        for (size_t i = read_now; i < count && r == PM_SUCCESS; i++)
            r = copy_async((void *)(uintptr_t)dsts[i], (const void *)(uintptr_t)srcs[i], sizes[i],
                           s, true);
        return r;
    }
    batch_task *t = malloc(sizeof *t + rest * sizeof t->copies[0]);
    if (!t)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "batch of copies: out of memory");
    t->count = rest;
    for (size_t i = 0; i < rest; i++)
        t->copies[i] = (copy_task){(void *)(uintptr_t)dsts[read_now + i],
                                   (const void *)(uintptr_t)srcs[read_now + i], sizes[read_now + i]};
    r = pm__posix_stream_launch_host_func(s, run_batch, t);
    if (r != PM_SUCCESS)
        free(t);
    *batched = r == PM_SUCCESS;
    return r;
}

/* Block copies: the stream's thread plays the kernel, reading the list
 * when its turn comes, as the kernel reads it from page-locked memory, and
 * copying each block part by part as the kernel's blocks of threads would
 * on a device of 132 multiprocessors (block_parts.h), so that the tests
 * check how the kernel shares the bytes out. */
enum { PLAYED_GRID = 132 * 4 };

typedef struct blocks_task {
    const pm__block_copy *blocks;
    size_t count;
} blocks_task;

static void run_blocks(void *arg)
{
    blocks_task *t = arg;
    unsigned long long largest = 0;
    for (size_t i = 0; i < t->count; i++)
        largest = t->blocks[i].bytes > largest ? t->blocks[i].bytes : largest;
    const unsigned long long parts = pm__block_parts(t->count, largest, PLAYED_GRID);
    for (size_t i = 0; i < t->count; i++) {
        const pm__block_copy *b = &t->blocks[i];
        for (unsigned long long part = 0; part < parts; part++) {
            unsigned long long lo, hi;
            pm__block_part_span(b->bytes, parts, part, &lo, &hi);
            memcpy((uint8_t *)(uintptr_t)b->dst + lo, (const uint8_t *)(uintptr_t)b->src + lo,
                   (size_t)(hi - lo));
        }
    }
    free(t);
}

static bool posix_block_copy_ready(pm_stream_t s)
{
    (void)s;
    return true;
}

static bool posix_block_copy_reaches(pm_deviceptr p, size_t bytes)
{
    (void)p;
    (void)bytes;
    return true;
}

static pm_result posix_block_copy_async(const pm__block_copy *blocks, size_t count,
                                        unsigned long long largest, pm_stream_t s)
{
    (void)largest; /* the stand-in takes each block's parts from its own bytes */
    blocks_task *t = malloc(sizeof *t);
    if (!t)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "block copies: out of memory");
    *t = (blocks_task){blocks, count};
    pm_result r = pm__posix_stream_launch_host_func(s, run_blocks, t);
    if (r != PM_SUCCESS)
        free(t);
    return r;
}

static pm_result posix_copy_any(pm_deviceptr dst, pm_deviceptr src, size_t bytes, pm_stream_t s,
                                bool sync, bool device_only)
{
    void *d = (void *)(uintptr_t)dst;
    const void *from = (const void *)(uintptr_t)src;
    if (sync)
        return copy_in_default_stream_order(d, from, bytes);
    return copy_async(d, from, bytes, s, device_only);
}

/* The stream thread copies through the page tables, so a cached
 * registration needs no pinning here; mlock would also make the user's
 * madvise(MADV_DONTNEED) fail, which the driver's pinning does not. */
static pm_result posix_cache_register(void *p, size_t bytesize)
{
    (void)p;
    (void)bytesize;
    return PM_SUCCESS;
}

static void posix_cache_unregister(void *p, size_t bytesize)
{
    (void)p;
    (void)bytesize;
}

pm_result pm__backend_posix_open(pm__backend *out)
{
    /* One simulated device: another ordinal names a device that is not
     * there, as it would on a machine with one GPU. */
    unsigned long long device = pm__option_value(PM__OPT_DEVICE);
    if (device != 0)
        return pm__fail(PM_ERROR_INVALID_DEVICE,
                        "PINMEM_DEVICE=%llu is not a device ordinal below 1 (the posix backend "
                        "simulates one device)",
                        device);
    memset(out, 0, sizeof *out);
    out->name = "posix";
    out->device_is_host_memory = true;
    pm_capabilities *c = &out->caps;
    c->struct_size = sizeof *c;
    snprintf(c->backend, sizeof c->backend, "posix");
    snprintf(c->device_name, sizeof c->device_name, "none (host memory only)");
    c->device_ordinal = -1;
    c->can_map_host_memory = 1;
    c->unified_addressing = 1;
    c->can_use_host_pointer_for_registered_mem = 1;
    c->read_only_host_register_supported = 1;
    c->pinning_limited_by_memlock_rlimit = pm__memlock_headroom() != SIZE_MAX;
    pm__system_fill_caps(c);

    out->host_alloc = posix_host_alloc;
    out->host_free = posix_host_free;
    out->free_wait = pm__posix_streams_drain;
    out->host_register = posix_host_register;
    out->host_unregister = posix_host_unregister;
    out->pinnable_bytes = pm__memlock_headroom;
    out->device_pointer = posix_device_pointer;
    out->foreign_free_host = posix_foreign_free_host;
    out->foreign_unregister = posix_foreign_unregister;
    out->foreign_get_flags = posix_foreign_get_flags;
    out->foreign_get_device_pointer = posix_foreign_get_device_pointer;
    out->stream_create = pm__posix_stream_create;
    out->stream_check = pm__posix_stream_check;
    out->stream_id = pm__posix_stream_id;
    out->stream_destroy = pm__posix_stream_destroy;
    out->stream_release = pm__posix_stream_release;
    out->stream_synchronize = posix_stream_synchronize;
    out->stream_launch_host_func = pm__posix_stream_launch_host_func;
    out->stream_write_flag = pm__posix_stream_write_flag;
    out->marker_record = pm__posix_marker_record;
    out->marker_done = pm__posix_marker_done;
    out->marker_query = posix_marker_query;
    out->marker_wait = pm__posix_marker_wait;
    out->marker_release = pm__posix_marker_release;
    out->marker_synchronize = posix_marker_synchronize;
    out->marker_rerecord = pm__posix_marker_rerecord;
    /* Granules of a huge page, as the driver's VMM host granule, for every
     * pool; mlock takes any pages, so smaller ones where a pool needs them. */
    out->pool_keep = (pm__chunk_ops){"mlock granules", (size_t)2 << 20, false,
                                     pm__reserve_chunk_range, posix_chunk_commit,
                                     posix_chunk_decommit, posix_chunk_unreserve, 0};
    out->pool_give_back = out->pool_keep;
    out->copy_htod = posix_copy_htod;
    out->copy_dtoh = posix_copy_dtoh;
    out->cache_register = posix_cache_register;
    out->cache_unregister = posix_cache_unregister;
    out->copy_htod_async = posix_copy_htod_async;
    out->copy_dtoh_async = posix_copy_dtoh_async;
    out->stream_capture_status = posix_stream_capture_status;
    out->own_thread_start = posix_own_thread_start;
    out->captures_relax = posix_captures_relax;
    out->captures_restore = posix_captures_restore;
    out->copy_any = posix_copy_any;
    out->copy_batch_async = posix_copy_batch_async;
    pm__posix_device_open(out);
    out->block_copy_ready = posix_block_copy_ready;
    out->block_copy_reaches = posix_block_copy_reaches;
    out->block_copy_async = posix_block_copy_async;
    return PM_SUCCESS;
}
