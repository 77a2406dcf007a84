/* The one contract every backend implements.
 *
 * Generic code (host.c and above) never asks which backend it runs on; it
 * calls through this table and reads pm__backend.caps.
 *
 * Invariants every backend keeps:
 *  - Results are pm_result values; driver codes are translated here, at the
 *    boundary, and the raw code recorded with pm__fail_driver.
 *  - host_alloc returns the memory and the extent it claims,
 *    [*base, *base + *pin_len): whole pages for memory pinmem maps itself,
 *    exactly the bytes for memory the driver places (it packs small
 *    allocations tighter than pages). The memory is page-locked and mapped
 *    for every device before it returns; where numa_node is not -1, memory
 *    pinmem maps itself is bound to that node before it is faulted in (the
 *    driver places its own wherever it does).
 *  - host_register pins the pages the byte range touches; the generic layer
 *    has already checked flags, NULL, size 0 and overlaps with pinmem's own
 *    ranges. Registrations never share a byte but may share a page, as the
 *    driver's do (the rest of an allocation's pages is never registered):
 *    a page stays pinned while any registration touches it, so
 *    host_unregister unpins only the pages no other registration touches
 *    (posix counts the registrations on each page it covers in part).
 *  - Every function is thread-safe and leaves nothing pinned or mapped when
 *    it fails.
 *  - The foreign_* calls answer for memory pinmem does not track: memory the
 *    user pinned through the driver directly. A backend without such memory
 *    gives the driver's answer for ordinary pageable memory.
 */
#ifndef PINMEM_BACKEND_H
#define PINMEM_BACKEND_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>

#include "pinmem.h"

/* A point in a stream's work: done once everything enqueued before it is.
 * cuda: an event, or in a context pinmem does not hold a flag the stream
 * writes (handle: the flag's word, seq: its value; cuda_flags.c says why);
 * posix: the stream and its sequence number. */
typedef struct pm__marker {
    void *handle;
    unsigned long long seq;
    void *context; /* cuda: the context of the event, where it may be recorded again */
    bool flag;     /* cuda: handle is a flag, not an event */
} pm__marker;

/* Where a copy's driver calls run (cuda: a context; posix: nowhere in
 * particular, NULL). Every thread that queues work for a copy enters its
 * place first, so that the legacy stream is the same stream on each. */
typedef struct pm__place {
    void *context;
} pm__place;

typedef struct pm__place_scope {
    bool pushed;
} pm__place_scope;

/* Pool chunks: address space of len bytes aligned to align, whose memory is
 * committed (page-locked and mapped for every device, on numa_node unless it
 * is -1) and decommitted (given back to the system) in whole granules of
 * granule bytes from the chunk's start; 0: a chunk is one granule. unreserve
 * runs once nothing in the chunk is committed. give_back_waits: decommitting
 * waits for all device work, so the pools do it only when asked to (trim,
 * the release threshold at synchronization). granule_min: the smallest
 * granule commit and decommit take, a power of two that divides granule (0:
 * any whole number of pages, and a chunk of any such length); pools pin in
 * smaller granules, down to it, where max_size or the memlock limit leaves
 * less room than granule. */
typedef struct pm__chunk_ops {
    const char *name;
    size_t granule;
    bool give_back_waits;
    pm_result (*reserve)(size_t len, size_t align, int numa_node, void **base);
    pm_result (*commit)(void *p, size_t len, int numa_node);
    void (*decommit)(void *p, size_t len);
    void (*unreserve)(void *base, size_t len);
    size_t granule_min;
} pm__chunk_ops;

/* One copy of a list that block_copy_async queues as one unit of work:
 * bytes from src to dst, each an address the device reaches (device memory,
 * or page-locked host memory by its host address under unified addressing). */
typedef struct pm__block_copy {
    pm_deviceptr dst, src;
    unsigned long long bytes;
} pm__block_copy;

/* What memory an address is, for pm_memcpy (pointer_kind below). */
typedef enum pm__memory_kind {
    PM__MEMORY_HOST,               /* host memory the driver does not know as pinned */
    PM__MEMORY_HOST_DRIVER_PINNED, /* host memory the driver page-locked, the whole range */
    PM__MEMORY_DEVICE,             /* device memory (managed memory included) */
} pm__memory_kind;

typedef struct pm__backend {
    const char *name;
    pm_capabilities caps;

    pm_result (*host_alloc)(size_t bytesize, unsigned flags, int numa_node, void **base,
                            size_t *pin_len, unsigned *tag);
    pm_result (*host_free)(void *base, size_t pin_len, unsigned tag);
    /* Waits as the driver's frees wait before memory the user frees goes
     * (pm_mem_free_host, pm_mem_host_unregister, pm_device_free): posix, for
     * every stream's work queued so far; NULL (cuda) where the frees wait
     * in the driver. */
    void (*free_wait)(void);
    pm_result (*host_register)(void *p, size_t bytesize, unsigned flags);
    pm_result (*host_unregister)(void *p, size_t bytesize);
    /* Registrations the copy engine's cache keeps: the device may then copy
     * [p, p + bytesize) directly, and the user may still do anything with
     * the memory (unmap it, discard it). */
    pm_result (*cache_register)(void *p, size_t bytesize);
    void (*cache_unregister)(void *p, size_t bytesize);
    /* Memory pinmem maps and pins itself (host allocations, pool chunks) and
     * cache registrations are registered in pieces of this many bytes from
     * their first page (0: one piece), and a DMA must stay inside one piece:
     * the driver refuses a copy that runs past a registration's end. */
    size_t registration_piece;
    /* Device memory is ordinary memory of the process (posix), so a host
     * registration may lie inside a device allocation and an address can be
     * both kinds; on a GPU the two never share an address. */
    bool device_is_host_memory;
    /* Bytes that can still be pinned before the system refuses (posix: the
     * RLIMIT_MEMLOCK headroom); SIZE_MAX when nothing binds (cuda: the driver
     * ignores the limit). Pools and the staging ring size themselves by it. */
    size_t (*pinnable_bytes)(void);
    /* The device pointer of p, which lies in a range pinmem pinned through
     * this backend; pool_chunk: for pool memory, the chunk ops its chunk was
     * pinned with (NULL for host allocations and registrations), since how
     * memory was pinned can decide where devices see it (cuda: VMM host
     * granules are mapped at their host address, where the driver's query
     * answers otherwise). */
    pm_result (*device_pointer)(pm_deviceptr *out, void *p, const pm__chunk_ops *pool_chunk);

    pm_result (*foreign_free_host)(void *p);
    pm_result (*foreign_unregister)(void *p);
    pm_result (*foreign_get_flags)(unsigned *pflags, void *p);
    pm_result (*foreign_get_device_pointer)(pm_deviceptr *out, void *p);
    pm_result (*foreign_get_address_range)(pm_deviceptr *pbase, size_t *psize, pm_deviceptr dptr);

    /* Streams. NULL is the default stream. */
    pm_result (*stream_create)(pm_stream_t *out);
    /* PM_SUCCESS when s can be used (posix checks its own handles; cuda
     * trusts the caller, as the driver does). */
    pm_result (*stream_check)(pm_stream_t s);
    pm_result (*stream_destroy)(pm_stream_t s);
    /* Destroys s once the work queued on it is done, without waiting for it
     * (the driver's own cuStreamDestroy; stream_destroy waits first). */
    pm_result (*stream_release)(pm_stream_t s);
    pm_result (*stream_synchronize)(pm_stream_t s);
    /* Whether the calling thread's legacy stream (NULL too) is the one of
     * home, the place whose legacy stream is pinmem's own (cuda: threads in
     * other contexts, another device's or one the user made, each have a
     * legacy stream of their own; NULL: every thread's is the same one);
     * pm__stream_varies_by_thread below. */
    bool (*legacy_is_home)(void);
    pm__place home; /* cuda: pinmem's primary context */
    pm_result (*stream_launch_host_func)(pm_stream_t s, void (*fn)(void *), void *arg);
    /* Whether the calling thread is the driver's, running a host function
     * another library launched (cuda: the driver refuses it cuCtxGetCurrent);
     * NULL (posix) where only pinmem launches host functions, and marks
     * them itself (host_func.h). */
    bool (*thread_runs_host_funcs)(void);
    /* A number for s that no other stream of the process has had or will
     * have, even one given s's handle after s is destroyed. */
    pm_result (*stream_id)(pm_stream_t s, unsigned long long *id);
    pm_result (*marker_record)(pm_stream_t s, pm__marker *out);
    bool (*marker_done)(const pm__marker *m);
    /* pm_event_query's answer for m: SUCCESS once done, NOT_READY before,
     * or the error that stopped its work (cuda: a sticky error). */
    pm_result (*marker_query)(const pm__marker *m);
    /* Work enqueued on s after this waits for m. */
    pm_result (*marker_wait)(pm_stream_t s, const pm__marker *m);
    void (*marker_release)(pm__marker *m);
    /* Records m again at the end of s's work, reusing what it holds (cuda:
     * the event); m is done, or empty (handle NULL). */
    pm_result (*marker_rerecord)(pm_stream_t s, pm__marker *m);
    /* Whether marker_rerecord(s, m) records m in place, its handle kept, so
     * that a thread in marker_synchronize on m meanwhile is left as the
     * driver leaves one (cuda: an event of s's context); NULL where a record
     * always takes something new (posix). */
    bool (*marker_rerecord_in_place)(pm_stream_t s, const pm__marker *m);
    /* Blocks the calling thread until m is done. */
    pm_result (*marker_synchronize)(const pm__marker *m);
    /* Stores value into the 32-bit flag at device address flag (in memory
     * pinned through this backend) once the work enqueued on s before it is
     * done, with that work's writes visible first: a thread then sees the
     * work done by reading memory, without a driver call. NULL where the
     * backend cannot. */
    pm_result (*stream_write_flag)(pm_stream_t s, pm_deviceptr flag, uint32_t value);

    /* How pool chunks get their memory: for pools that keep what they pin
     * (the default release threshold), the fastest way to pin; for pools
     * with a release threshold, the finest pieces that can be given back
     * without waiting for the device. The two may be the same. */
    pm__chunk_ops pool_keep, pool_give_back;

    /* Device memory, and a synchronous copy to or from it (posix: host
     * memory). */
    pm_result (*device_alloc)(pm_deviceptr *d, size_t bytesize);
    /* device_alloc on device ordinal (below device_count), in its primary
     * context (posix: the one simulated device). */
    pm_result (*device_alloc_on)(pm_deviceptr *d, size_t bytesize, int ordinal);
    pm_result (*copy_htod)(pm_deviceptr d, const void *src, size_t bytesize);
    pm_result (*copy_dtoh)(void *dst, pm_deviceptr d, size_t bytesize);
    /* Copies ordered on stream s. When the host side is page-locked
     * (host_pinned) the copy may still run after the call returns; otherwise
     * the call returns once the host side has been read (htod) or written
     * (dtoh), as the driver does for pageable memory. */
    pm_result (*copy_htod_async)(pm_deviceptr d, const void *src, size_t bytesize, pm_stream_t s,
                                 bool host_pinned);
    pm_result (*copy_dtoh_async)(void *dst, pm_deviceptr d, size_t bytesize, pm_stream_t s,
                                 bool host_pinned);

    /* pm_memcpy asks these. pointer_kind: what [p, p + bytes) is (cuda: the
     * driver's memory type; posix: device memory is a live device_alloc
     * range, and a range that starts in one and runs past its end is
     * INVALID_VALUE). Memory pinmem pinned is host memory the generic layer
     * knows from its registry before it asks. */
    pm_result (*pointer_kind)(pm_deviceptr p, size_t bytes, pm__memory_kind *kind);
    /* pm_device_free: INVALID_VALUE unless d is the base of live device memory. */
    pm_result (*device_release)(pm_deviceptr d);
    /* *capturing: whether work enqueued on s now goes into a graph capture
     * (cuda: the capture is active or was invalidated). The query's own
     * failure is returned, such as the legacy stream while another stream
     * captures in global mode. posix streams never capture; test builds can
     * name one that answers as if it did (test_hooks.h). */
    pm_result (*stream_capture_status)(pm_stream_t s, bool *capturing);
    /* Called first on each thread pinmem starts that may call the driver (the
     * staging workers, the registration cache's listener, the pools'
     * reaper): such threads must not disturb a graph capture another thread
     * has in progress, and run their driver calls in pinmem's context (cuda:
     * the thread's capture mode is relaxed and the primary context made
     * current; posix: nothing to do). */
    void (*own_thread_start)(void);
    /* Around a copy's own waits and registrations on the caller's thread,
     * while the copy's stream does not capture: they must neither be refused
     * nor end a graph capture another thread has in progress in global
     * mode, as the driver's own copies of pageable memory are not (cuda:
     * the thread's capture mode is relaxed until captures_restore is given
     * what captures_relax returned; posix: only the test model of such a
     * capture, test_hooks.h). */
    int (*captures_relax)(void);
    void (*captures_restore)(int saved);
    /* The driver's own copy, direction from the pointers (cuMemcpy,
     * cuMemcpyAsync): for what the copy engine does not take. posix: a
     * synchronous copy waits for the default stream; an asynchronous one is
     * queued on s when both sides are device memory (device_only), and is
     * otherwise done before returning, after s's earlier work, as the driver
     * does copies from host to host. */
    pm_result (*copy_any)(pm_deviceptr dst, pm_deviceptr src, size_t bytes, pm_stream_t s,
                          bool sync, bool device_only);
    /* count copies queued on s in any order among themselves, each with
     * page-locked host memory or device memory on both sides (direction
     * from the pointers, as copy_any) but the first read_now, whose sources
     * are pageable host memory that the call reads before it returns (cuda:
     * source access order DURING_API_CALL); the others run in stream order
     * and may still run after it returns. In one call where one_call and
     * the backend can (cuda: cuMemcpyBatchAsync where the driver has it, on
     * a stream other than the legacy one; posix: one task of the stream),
     * else one queued copy each; *batched says whether one call took them. */
    pm_result (*copy_batch_async)(const pm_deviceptr *dsts, const pm_deviceptr *srcs,
                                  const size_t *sizes, size_t count, size_t read_now,
                                  pm_stream_t s, bool one_call, bool *batched);
    /* pointer_kind, and for device memory the extent of its allocation,
     * [*lo, *hi), where every address answers the same (*lo == *hi when it
     * is not known), so that a batch asks once for many pointers. */
    pm_result (*pointer_extent)(pm_deviceptr p, size_t bytes, pm__memory_kind *kind,
                                pm_deviceptr *lo, pm_deviceptr *hi);

    /* Devices. device_count (at least 1) and device_in_use (the ordinal
     * whose primary context serves threads without a context) are fixed
     * when the backend opens; posix simulates one device, ordinal 0.
     * device_info fills the whole of *info (struct_size aside) for an
     * ordinal below device_count. */
    int device_count;
    int device_in_use;
    pm_result (*device_info)(int ordinal, pm_device_info *info);
    /* The ordinal of the device whose memory p is (cuda: the pointer's
     * DEVICE_ORDINAL attribute; posix: 0 for a live device_alloc range);
     * INVALID_VALUE when p is not device memory. */
    pm_result (*pointer_device)(pm_deviceptr p, int *ordinal);
    /* Where a copy on s between a and b runs (cuda: s's context; for the
     * legacy and per-thread handles the calling thread's current one, or
     * where it has none, the primary context of the device whose memory a
     * is, else b, else pinmem's own; b may be 0). place_enter makes p
     * current on the calling thread until place_leave. */
    pm_result (*copy_place)(pm_stream_t s, pm_deviceptr a, pm_deviceptr b, pm__place *out);
    pm_result (*place_enter)(const pm__place *p, pm__place_scope *scope);
    void (*place_leave)(pm__place_scope *scope);
    /* Whether p lasts as long as the process, so that what is made there may
     * be kept (cuda: a context pinmem holds; posix: always). */
    bool (*place_lasts)(const pm__place *p);
    /* The place of the context that owns device memory at a where pinmem
     * holds that context, else out->context NULL (cuda: the pointer's
     * CONTEXT attribute). NULL where places hold no memory (posix). */
    void (*memory_place)(pm_deviceptr a, pm__place *out);

    /* Block copies for pm_memcpy_batch_async: many small copies in one unit
     * of work, where one DMA each would pay the DMA engine's cost per copy
     * (cuda: one launch of a kernel whose threads move every block; posix:
     * one stream task). NULL where the backend has none.
     * block_copy_ready: whether a block copy may be queued on s now (cuda:
     * the kernel loaded, on first use, in pinmem's context, and both the
     * calling thread's context and s's are that one; false, remembered,
     * where it cannot load). block_copy_reaches: whether the kernel can
     * address [p, p + bytes), device memory of one allocation or host
     * memory pinmem pinned (cuda: device memory of pinmem's device in its
     * context, or host memory pinned for every context or in that one).
     * block_copy_async: queues the count copies of blocks (all checked by
     * the caller, none overlapping, the largest of largest bytes) on s,
     * after s's earlier work; blocks itself must be memory the kernel
     * reaches (page-locked host memory or device memory, which the call
     * does not read) and stays unchanged until work enqueued on s after
     * the call is done. */
    bool (*block_copy_ready)(pm_stream_t s);
    bool (*block_copy_reaches)(pm_deviceptr p, size_t bytes);
    pm_result (*block_copy_async)(const pm__block_copy *blocks, size_t count,
                                  unsigned long long largest, pm_stream_t s);
} pm__backend;

/* Whether s names the calling thread's own stream, on which no other thread
 * can queue work (PM_STREAM_PER_THREAD, on both backends). */
static inline bool pm__stream_is_threads_own(pm_stream_t s) { return s == PM_STREAM_PER_THREAD; }

static inline bool pm__stream_is_legacy(pm_stream_t s) { return !s || s == PM_STREAM_LEGACY; }

/* Whether s, on the calling thread, may name another stream than on another
 * thread: the thread's own stream always; the legacy one where the thread is
 * not in b's home place. Inline, as every asynchronous pool allocation and
 * free asks (the legacy one at the cost of asking the driver for the
 * thread's context). */
static inline bool pm__stream_varies_by_thread(const pm__backend *b, pm_stream_t s)
{
    if (pm__stream_is_threads_own(s))
        return true;
    return pm__stream_is_legacy(s) && b->legacy_is_home && !b->legacy_is_home();
}

/* Each fills *out and returns PM_SUCCESS, or says why the backend cannot run. */
pm_result pm__backend_posix_open(pm__backend *out);
pm_result pm__backend_cuda_open(pm__backend *out);
/* Before any backend is open: whether the calling thread runs a host
 * function of a CUDA driver already in the process (false without one). */
bool pm__backend_cuda_in_host_func(void);

/* System facts both backends report the same way. */
void pm__system_fill_caps(pm_capabilities *caps);
/* Touches every page of [p, p + len) with several threads, so the kernel
 * faults them in (as huge pages where advised) in parallel; where
 * pm__placed_by_touch(node), only threads on node's CPUs touch them. */
void pm__prefault(void *p, size_t len, int node);
/* Below this size pm__prefault uses one thread. */
#define pm__prefault_parallel_min ((size_t)64 << 20)
/* mmap for a host allocation: page-rounded, huge-page advised when large.
 * Returns NULL on failure (errno set). */
void *pm__map_anonymous(size_t bytesize, size_t *map_len);
/* The same, aligned to align (a power of two). */
void *pm__map_anonymous_aligned(size_t bytesize, size_t align, size_t *map_len);
/* Binds [p, p + len) to one NUMA node before it is faulted in; where the
 * kernel refuses memory policies (a container's seccomp profile, a kernel
 * without NUMA), succeeds unbound: pm__prefault then places the pages. */
pm_result pm__bind_to_node(void *p, size_t len, int node);
/* Whether pages meant for node (-1: none) are faulted in from its CPUs: on
 * a machine of several nodes, where a binding the kernel refused leaves
 * placement to the first touch (harmless where the range is bound). */
bool pm__placed_by_touch(int node);
/* Runs the calling thread on node's CPUs from now on; false where it cannot
 * (no sysfs, or none of them in the process's cpuset). */
bool pm__run_on_node(int node);
bool pm__numa_node_exists(int node);
/* The machine's NUMA node when it has exactly one, else -1. */
int pm__only_numa_node(void);
/* The first line of the file at path, without its newline, into line;
 * false when it cannot be read. */
bool pm__read_first_line(const char *path, char *line, size_t cap);
/* A CPU list file ("0-15,32-47", as sysfs and cgroups write them) into
 * set; false when it cannot be read or names no CPU. */
bool pm__read_cpu_list(const char *path, cpu_set_t *set);
/* CPUs this process may keep busy: the calling thread's affinity, or with
 * PINMEM_THREAD_CPUS=process the process's cpuset, lowered to a CPU quota
 * of its cgroup (cpu.max in v2, cpu.cfs_quota_us in v1), rounded up; at
 * least 1. */
unsigned pm__usable_cpus(void);
/* The CPUs a thread pinmem starts runs on, asked by that thread: with
 * PINMEM_THREAD_CPUS=process, true and the process's cpuset (or every CPU
 * online where no cgroup says) in *set, less the CPUs the thread inherited
 * where that leaves any (its starter, bound there, works beside it);
 * otherwise false: it keeps the affinity it inherited. */
bool pm__thread_cpus(cpu_set_t *set);
/* Bytes of memory this process may use: the machine's, lowered to its
 * cgroup's memory limit (memory.max in v2, memory.limit_in_bytes in v1);
 * 0 where unknown. */
unsigned long long pm__usable_memory(void);
/* The cgroup parts alone, read through the given mountinfo and cgroup files
 * (/proc/self/...; tests pass their own): the CPU quota in whole CPUs and
 * the memory limit in bytes, 0 where none binds. */
unsigned pm__cgroup_cpu_limit(const char *mountinfo, const char *proc_cgroup);
unsigned long long pm__cgroup_memory_limit(const char *mountinfo, const char *proc_cgroup);
/* The effective CPUs of the process's cpuset (v2 cpuset.cpus.effective, v1
 * cpuset.effective_cpus, from its cgroup or the nearest level above with
 * the file); false where none can be read. */
bool pm__cgroup_cpuset(const char *mountinfo, const char *proc_cgroup, cpu_set_t *set);
/* Bytes this process may still lock with mlock: RLIMIT_MEMLOCK less what is
 * locked now; SIZE_MAX when no limit binds (unlimited, or CAP_IPC_LOCK). */
size_t pm__memlock_headroom(void);
/* sysfs facts of a PCI device, for device_info. bus_id as the driver
 * writes it ("0000:3B:00.0", a domain of any width); *out the form sysfs
 * names it by ("0000:3b:00.0"); false when bus_id is not one. */
bool pm__pci_bus_id_normalize(const char *bus_id, char *out, size_t cap);
/* The device's numa_node in sysfs; -1 when absent or unknown. */
int pm__pci_numa_node(const char *bus_id);
/* The device's link now: generation 1 to 6 from current_link_speed, lanes
 * from current_link_width; 0 for what sysfs does not say. */
void pm__pci_link(const char *bus_id, int *generation, int *width);
/* Address space for a pool chunk, bound to numa_node unless it is -1, nothing pinned. */
pm_result pm__reserve_chunk_range(size_t len, size_t align, int numa_node, void **base);

#endif
