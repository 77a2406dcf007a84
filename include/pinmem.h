/*
 * pinmem: page-locked host memory for GPU programs.
 *
 * One header, in sections. Functions that mirror the CUDA driver's host-memory
 * API keep its shape and its answers (see the README); everything else is
 * pinmem's own. Every function returns a pm_result; on failure,
 * pm_last_error_detail() says why, for the calling thread.
 *
 * Structs that begin with struct_size grow only at their end. The caller sets
 * struct_size to the sizeof it was compiled with: an older, smaller struct is
 * read or filled as far as it goes (a set call leaves the fields it lacks as
 * they are), a larger one than this library knows is refused with
 * PM_ERROR_INVALID_VALUE.
 *
 * Every call checks its arguments before it changes anything. A NULL pointer
 * the call would write through or read from, flag bits it does not know, a
 * struct pointer that is NULL or whose struct_size is out of range, and the
 * other cases each declaration names fail with PM_ERROR_INVALID_VALUE, or
 * PM_ERROR_INVALID_HANDLE for a stream or event handle that is not live.
 * Every call but those of the version and results sections may also fail as
 * pm_init does.
 */
#ifndef PINMEM_H
#define PINMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(PINMEM_BUILDING) && defined(__GNUC__)
#define PM_API __attribute__((visibility("default")))
#else
#define PM_API
#endif

/* ---------------------------------------------------------------- version */

#define PM_VERSION_MAJOR 0
#define PM_VERSION_MINOR 1
#define PM_VERSION_PATCH 0
#define PM_VERSION_NUMBER (PM_VERSION_MAJOR * 10000 + PM_VERSION_MINOR * 100 + PM_VERSION_PATCH)

/* PM_VERSION_NUMBER of the library actually loaded; needs no initialisation. */
PM_API int pm_version(void);
/* The loaded library's version as "major.minor.patch". */
PM_API const char *pm_version_string(void);

/* ---------------------------------------------------------------- results */

/* Values equal CUDA's CUresult where the meaning is the same. The list only
 * grows. X(name, value, sentence). */
#define PM_RESULT_LIST(X)                                                                   \
    X(PM_SUCCESS, 0, "no error")                                                            \
    X(PM_ERROR_INVALID_VALUE, 1, "an argument is not valid for this call")                  \
    X(PM_ERROR_OUT_OF_MEMORY, 2, "the memory could not be allocated or page-locked")        \
    X(PM_ERROR_NOT_INITIALIZED, 3, "the library or its driver is not initialized")          \
    X(PM_ERROR_DEINITIALIZED, 4, "the driver is shutting down")                             \
    X(PM_ERROR_STUB_LIBRARY, 34, "the CUDA driver found is a stub library")                \
    X(PM_ERROR_NO_DEVICE, 100, "no CUDA-capable device or driver was found")                \
    X(PM_ERROR_INVALID_DEVICE, 101, "the device ordinal is not valid")                      \
    X(PM_ERROR_INVALID_CONTEXT, 201, "there is no valid context for this call")             \
    X(PM_ERROR_INVALID_HANDLE, 400, "the handle is not valid")                              \
    X(PM_ERROR_NOT_FOUND, 500, "the address or name was not found")                         \
    X(PM_ERROR_NOT_READY, 600, "the asynchronous work has not completed yet")               \
    X(PM_ERROR_ILLEGAL_ADDRESS, 700, "the device touched an illegal address")               \
    X(PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED, 712, "the range is already registered")      \
    X(PM_ERROR_HOST_MEMORY_NOT_REGISTERED, 713, "the address is not a registered range")    \
    X(PM_ERROR_NOT_PERMITTED, 800, "the operation is not permitted")                        \
    X(PM_ERROR_NOT_SUPPORTED, 801, "the operation is not supported on this system")         \
    X(PM_ERROR_STREAM_CAPTURE_UNSUPPORTED, 900, "the operation is not permitted while the stream is capturing") \
    X(PM_ERROR_STREAM_CAPTURE_INVALIDATED, 901, "the stream's capture was invalidated by an earlier error") \
    X(PM_ERROR_STREAM_CAPTURE_IMPLICIT, 906, "the legacy stream was used while another stream captures") \
    X(PM_ERROR_UNKNOWN, 999, "an unexpected error occurred")

typedef enum pm_result {
#define PM_RESULT_ENUM_(name, value, text) name = value,
    PM_RESULT_LIST(PM_RESULT_ENUM_)
#undef PM_RESULT_ENUM_
} pm_result;

/* "PM_ERROR_INVALID_VALUE"; "PM_ERROR_UNRECOGNIZED" for a value not in the list.
 * These four need no initialisation. */
PM_API const char *pm_result_name(pm_result r);
/* A sentence describing r; "unrecognized result code" for a value not in the list. */
PM_API const char *pm_result_string(pm_result r);
/* Per thread: why the last failing call of this thread failed ("" if none did). */
PM_API const char *pm_last_error_detail(void);
/* Per thread: the raw driver code behind the last failure, 0 if the failure did
 * not come from the driver. */
PM_API int pm_last_driver_error(void);

/* ------------------------------------------------------ init, capabilities */

/* Optional: every call initialises lazily, reading the PINMEM_* variables
 * and choosing the backend (PINMEM_BACKEND). flags must be 0. Returns the
 * result of initialisation, the same on every call, and every other call
 * fails the same way when it failed: PM_ERROR_INVALID_VALUE for a bad
 * PINMEM_* value (the detail names it), PM_ERROR_NO_DEVICE when
 * PINMEM_BACKEND=cuda and the driver cannot be used.
 *
 * fork(): a child of a process that has initialised pinmem, or was
 * initialising it on another thread when it forked, cannot use it, as the
 * CUDA driver cannot be used after fork (and the parent's streams,
 * staging threads and locks are not in the child). In such a child every
 * call fails at once with PM_ERROR_NOT_INITIALIZED, and pm_last_error_detail()
 * names the process that initialised pinmem; nothing waits, and nothing is
 * reported pinned: memory the parent pinned is not page-locked in the child
 * and is not pinmem's there (it stays mapped until the child unmaps it or
 * exits). Only the calls that need no library state work there: the version,
 * result names and strings, and the last error. A child forked before its
 * parent's first pinmem call, and any process after exec, initialise as
 * usual.
 *
 * pthread_cancel(): no pinmem call is a cancellation point. A thread
 * cancelled while a call waits (for a stream, an event, a copy) finishes the
 * call, which returns its usual result, and the request acts at the thread's
 * next cancellation point after it; a thread that makes asynchronous
 * cancellation its type must not call pinmem. */
PM_API pm_result pm_init(unsigned flags);
/* "cuda" or "posix"; NULL when no backend could be initialised (and in a
 * forked child, see pm_init). */
PM_API const char *pm_backend_name(void);

typedef struct pm_capabilities {
    size_t struct_size;                   /* set by the caller to sizeof(pm_capabilities) */
    char backend[16];                     /* "cuda" or "posix" */
    int driver_version;                   /* cuDriverGetVersion; 0 on posix */
    int device_ordinal;                   /* device whose primary context is used; -1 on posix */
    char device_name[128];
    int can_map_host_memory;
    int unified_addressing;
    int can_use_host_pointer_for_registered_mem;
    int read_only_host_register_supported;
    int pageable_memory_access_uses_host_page_tables;
    int pinning_limited_by_memlock_rlimit; /* 1: RLIMIT_MEMLOCK bounds pinning now (posix,
                                              with a finite limit and no CAP_IPC_LOCK);
                                              0: nothing does (cuda: the driver ignores it) */
    int host_numa_node;                   /* closest host NUMA node; -1 if unknown */
    size_t page_size;
    size_t huge_page_size;                /* 0 when transparent huge pages are unavailable */
    char huge_page_mode[16];              /* "always", "madvise", "never" or "unavailable" */
    int access_checks_permissions;        /* 1: pm_mem_check_access learns what each mapping
                                             permits (/proc/self/maps); 0: only whether
                                             each page is mapped */
} pm_capabilities;

/* Fills *caps as far as caps->struct_size goes (caps and its struct_size are
 * checked). */
PM_API pm_result pm_get_capabilities(pm_capabilities *caps);

/* ---------------------------------------------------------------- devices */

/* One device the backend sees. cuda: every device the driver lists (as
 * CUDA_VISIBLE_DEVICES leaves them), by driver ordinal; posix: one simulated
 * device, ordinal 0, whose "device" memory is host memory (pm_capabilities
 * still says device_ordinal -1 there: no CUDA device is in use). */
typedef struct pm_device_info {
    size_t struct_size;  /* set by the caller to sizeof(pm_device_info) */
    int ordinal;
    int in_use;          /* 1: the device whose primary context pinmem uses (PINMEM_DEVICE) */
    char name[128];
    char pci_bus_id[32]; /* "0000:17:00.0" (lower case); "" where there is none (posix) */
    int host_numa_node;  /* nearest host NUMA node (cuda: the driver's HOST_NUMA_ID, else
                            the PCI device's numa_node in sysfs); -1 if unknown */
    int pcie_generation; /* of the link now (sysfs current_link_speed): 1 to 6; 0 if unknown */
    int pcie_width;      /* lanes now (sysfs current_link_width); 0 if unknown */
    int can_map_host_memory;
    int unified_addressing;
    int can_use_host_pointer_for_registered_mem;
    int read_only_host_register_supported;
    int pageable_memory_access_uses_host_page_tables;
} pm_device_info;

/* How many devices pm_device_get_info answers for, at least 1. count must
 * not be NULL. */
PM_API pm_result pm_device_count(int *count);
/* Fills *info as far as info->struct_size goes (info and its struct_size
 * are checked). An ordinal below 0 or not below the count is
 * PM_ERROR_INVALID_DEVICE, as with the driver's cuDeviceGet, and the detail
 * names the count. */
PM_API pm_result pm_device_get_info(int ordinal, pm_device_info *info);

/* ----------------------------------------------------------- pinned budget */

/* A cap on the bytes the whole process pins through pinmem: host
 * allocations, registrations, pools, the staging ring and the registration
 * cache; 0: none (the default, unless PINMEM_PINNED_BUDGET names one).
 * Past it, calls that would pin more fail with PM_ERROR_OUT_OF_MEMORY and a
 * detail, the registration cache stops registering and staged copies go on.
 * A cap below what is pinned now unpins nothing: it only refuses more.
 * pm_copy_config.pinned_budget is the same setting. Any value is accepted. */
PM_API pm_result pm_set_pinned_budget(unsigned long long bytes);
/* bytes must not be NULL. */
PM_API pm_result pm_get_pinned_budget(unsigned long long *bytes);

/* --------------------------------------------------------------- settings */

/* One setting in effect: the environment variable that sets it, its value
 * as that variable would write it, and where the value came from. A bad
 * value in a PINMEM_* variable makes pm_init (and every call) fail with
 * PM_ERROR_INVALID_VALUE and a detail naming it. */
typedef struct pm_setting {
    size_t struct_size;        /* set by the caller */
    const char *name;          /* "PINMEM_COPY_CHUNK" */
    char value[32];            /* "4M", "15", "auto", "-1" */
    const char *source;        /* "default", "environment" or "code" */
    const char *default_value; /* "4M", "usable CPUs - 1, from 1 to 15" */
    const char *allowed;       /* "64K to 256M, in whole pages; 0: the default" */
    const char *doc;           /* what it does, in a line */
} pm_setting;

/* The settings in effect, one per index from 0; PM_ERROR_NOT_FOUND past the
 * last (setting and its struct_size are checked). The strings are the
 * library's own and live as long as it does. */
PM_API pm_result pm_get_setting(unsigned index, pm_setting *setting);

/* ------------------------------------------- host allocation, registration */

typedef unsigned long long pm_deviceptr;

#define PM_MEMHOSTALLOC_PORTABLE 0x01u
#define PM_MEMHOSTALLOC_DEVICEMAP 0x02u
#define PM_MEMHOSTALLOC_WRITECOMBINED 0x04u

#define PM_MEMHOSTREGISTER_PORTABLE 0x01u
#define PM_MEMHOSTREGISTER_DEVICEMAP 0x02u
#define PM_MEMHOSTREGISTER_IOMEMORY 0x04u
#define PM_MEMHOSTREGISTER_READ_ONLY 0x08u

/* Each of these answers as the driver's call it names does, edge cases
 * included (docs/driver-behavior.md). Memory pinmem did not pin gets the
 * driver's own answer (on posix: that of ordinary pageable memory). The
 * driver answers for bytes, not pages: the rest of an allocation's last page
 * is pageable memory to these calls. */

/* cuMemAllocHost: bytesize bytes of page-locked, mapped memory; size 0 gives
 * NULL. pp must not be NULL; past the pinned budget or what the system lets
 * the process pin, PM_ERROR_OUT_OF_MEMORY. */
PM_API pm_result pm_mem_alloc_host(void **pp, size_t bytesize);
/* cuMemHostAlloc: as above; flags may hold PORTABLE, DEVICEMAP and
 * WRITECOMBINED only. */
PM_API pm_result pm_mem_host_alloc(void **pp, size_t bytesize, unsigned flags);
/* cuMemFreeHost: p must be the base of a host allocation; an interior
 * pointer, the pages past its bytes, pool memory and registered memory are
 * PM_ERROR_INVALID_VALUE (for the last two the detail names the call that
 * frees them). NULL is a no-op. Like the driver's frees, this,
 * pm_mem_host_unregister and pm_device_free first wait for the work queued
 * on streams (posix: every stream's; cuda: the device's, in the driver), so
 * they must not be called from a function running on a stream. */
PM_API pm_result pm_mem_free_host(void *p);
/* cuMemHostRegister: page-lock an existing range, any alignment. p must not
 * be NULL, bytesize not 0, flags only PM_MEMHOSTREGISTER_*, and the range
 * must not wrap around the address space (PM_ERROR_INVALID_VALUE); a range
 * that reaches the address space's last page, or READ_ONLY where the device
 * lacks it, is PM_ERROR_NOT_SUPPORTED. A range that overlaps a registration
 * or the pages of a host allocation past its bytes is
 * PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED; one that overlaps the bytes of a
 * host allocation or pool memory, PM_ERROR_INVALID_VALUE. */
PM_API pm_result pm_mem_host_register(void *p, size_t bytesize, unsigned flags);
/* cuMemHostUnregister: p must be the pointer that was registered. NULL, an
 * interior pointer, a host allocation and pool memory are
 * PM_ERROR_INVALID_VALUE; memory not registered,
 * PM_ERROR_HOST_MEMORY_NOT_REGISTERED. */
PM_API pm_result pm_mem_host_unregister(void *p);
/* cuMemHostGetDevicePointer: pdptr must not be NULL and flags must be 0; p
 * must lie in the bytes of pinned memory (in pool memory, of an allocated
 * block), else PM_ERROR_INVALID_VALUE. */
PM_API pm_result pm_mem_host_get_device_pointer(pm_deviceptr *pdptr, void *p, unsigned flags);
/* cuMemHostGetFlags: the allocation's flags, DEVICEMAP always included.
 * pflags must not be NULL; p as for pm_mem_host_get_device_pointer. */
PM_API pm_result pm_mem_host_get_flags(unsigned *pflags, void *p);
/* cuMemGetAddressRange: base and size as allocated or registered (not
 * page-rounded); a pool block's as allocated; device memory's as allocated
 * by pm_device_alloc, on both backends. Either output may be NULL
 * (both: PM_SUCCESS, nothing done). In pinmem's memory, an address past an
 * allocation's bytes or in a pool block that is not allocated is
 * PM_ERROR_NOT_FOUND. */
PM_API pm_result pm_mem_get_address_range(pm_deviceptr *pbase, size_t *psize, pm_deviceptr dptr);

/* ------------------------------------------------------------------ streams */

/* cuda backend: a CUstream or cudaStream_t; NULL is the legacy default stream.
 * posix backend: an ordered queue of work run by a thread of its own. Every
 * call that takes a stream checks it on posix (PM_ERROR_INVALID_HANDLE when
 * it is not a live stream); the cuda backend passes it to the driver, which
 * trusts it. */
typedef void *pm_stream_t;

/* The driver's two named handles, on both backends: the legacy default
 * stream (as NULL; CU_STREAM_LEGACY) and the calling thread's own default
 * stream (CU_STREAM_PER_THREAD; on posix made on the thread's first use and
 * ended, after its work, when the thread exits). */
#define PM_STREAM_LEGACY ((pm_stream_t)0x1)
#define PM_STREAM_PER_THREAD ((pm_stream_t)0x2)

/* A stream whose work is not ordered with the default stream's (cuda:
 * CU_STREAM_NON_BLOCKING, as PyTorch creates its streams).
 * stream must not be NULL. */
PM_API pm_result pm_stream_create(pm_stream_t *stream);
/* Waits for the stream's work, then destroys it. NULL, PM_STREAM_LEGACY and
 * PM_STREAM_PER_THREAD, which are not the caller's to destroy, are
 * PM_ERROR_INVALID_HANDLE. As with the driver, no other thread may be using
 * the stream in a call meanwhile. */
PM_API pm_result pm_stream_destroy(pm_stream_t stream);
/* Waits for the stream's work; then pools above their release threshold
 * give memory back (see PM_MEMPOOL_ATTR_RELEASE_THRESHOLD). */
PM_API pm_result pm_stream_synchronize(pm_stream_t stream);
/* Enqueues fn(arg) on the stream, after the work before it (cuLaunchHostFunc).
 * fn must not be NULL. Inside fn, as inside the driver's host functions,
 * every call that allocates, frees, registers, asks about or copies memory,
 * makes or destroys a stream, event or pool (or sets or reads its
 * attributes or statistics), asks for the default pool or about devices,
 * or uses the legacy or the per-thread default stream returns
 * PM_ERROR_NOT_PERMITTED and changes nothing (pm_mem_check_access included:
 * it asks the driver about device memory, as cuPointerGetAttribute does); so
 * do pm_copy_get_config, pm_copy_set_config, pm_copy_get_stats and
 * pm_get_setting, which may wait behind copies that wait for fn. Waiting
 * for, recording on and launching host functions on other streams, event
 * queries, pm_init, pm_get_capabilities and the pinned budget go through.
 * A wait for fn's own stream, or for an event recorded behind fn, never
 * returns, as with the driver. On CUDA the same holds inside a host function
 * another library queued (cuLaunchHostFunc, cudaLaunchHostFunc); there, a
 * process's first pinmem call is refused and starts nothing, and the next
 * one outside starts pinmem. */
PM_API pm_result pm_stream_launch_host_func(pm_stream_t stream, void (*fn)(void *arg), void *arg);

/* ------------------------------------------------------------------- events */

/* A point in a stream's work (cuda: a CUevent, created without timing). Pools
 * learn stream order from events: with
 * PM_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, memory freed on stream A
 * before an event recorded on A serves allocations on stream B at once, once B
 * waits for that event, directly or through other streams' events. Waits
 * pinmem does not see (cuStreamWaitEvent called on the driver, the legacy
 * default stream's implicit ones) create no such reuse. Every call that
 * takes an event checks that it is live (created and not destroyed):
 * PM_ERROR_INVALID_HANDLE otherwise. */
typedef struct pm_event_s *pm_event_t;

/* event must not be NULL. */
PM_API pm_result pm_event_create(pm_event_t *event);
/* The event may still be pending: its resources go when it completes. Calls
 * on the event in other threads meanwhile finish as if it were still live;
 * later calls are PM_ERROR_INVALID_HANDLE. */
PM_API pm_result pm_event_destroy(pm_event_t event);
/* Captures the stream's work enqueued so far; recording again replaces it. */
PM_API pm_result pm_event_record(pm_event_t event, pm_stream_t stream);
/* PM_SUCCESS when the captured work is done (or nothing was recorded),
 * PM_ERROR_NOT_READY when not yet; after a sticky error (cuda: a kernel's
 * illegal address), that error, as cuEventQuery answers, and so does
 * pm_event_synchronize. */
PM_API pm_result pm_event_query(pm_event_t event);
/* Waits for the captured work. Meanwhile queries of, waits on and records
 * of the same event from other threads (or host functions) answer at once;
 * after such a record this still waits for the work captured when it
 * began, as the driver's cuEventSynchronize does (docs/driver-behavior.md). */
PM_API pm_result pm_event_synchronize(pm_event_t event);
/* Work enqueued on stream after this call waits for the event's captured work. */
PM_API pm_result pm_stream_wait_event(pm_stream_t stream, pm_event_t event);

/* -------------------------------------------------------------------- pools */

typedef struct pm_mem_pool_s *pm_mem_pool_t;

typedef enum {
    PM_MEM_LOCATION_TYPE_INVALID = 0,
    PM_MEM_LOCATION_TYPE_HOST = 2,
    PM_MEM_LOCATION_TYPE_HOST_NUMA = 3,
    PM_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4
} pm_mem_location_type;

typedef struct {
    pm_mem_location_type type;
    int id; /* the NUMA node for HOST_NUMA; ignored for HOST */
} pm_mem_location;

typedef struct {
    pm_mem_location location;
    unsigned handle_types; /* must be 0: host pools are not shareable */
    size_t max_size;       /* 0: no limit beyond the system's */
    unsigned char reserved[64]; /* must be zero */
} pm_mem_pool_props;

typedef enum {
    PM_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1, /* int */
    PM_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,           /* int */
    PM_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,   /* int */
    PM_MEMPOOL_ATTR_RELEASE_THRESHOLD,                   /* uint64_t */
    PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,                /* uint64_t, read only */
    PM_MEMPOOL_ATTR_RESERVED_MEM_HIGH,                   /* uint64_t, set to 0 to reset */
    PM_MEMPOOL_ATTR_USED_MEM_CURRENT,                    /* uint64_t, read only */
    PM_MEMPOOL_ATTR_USED_MEM_HIGH                        /* uint64_t, set to 0 to reset */
} pm_mem_pool_attribute;

/* Unlike the driver, whose default is 0, pinmem pools keep the memory they
 * reserve (release threshold UINT64_MAX) and pin it the fastest way the
 * backend has (on CUDA: whole registered chunks, whose release waits for all
 * device work). Any other threshold asks for a small footprint: the pool's
 * new chunks are pinned in granules that go back one by one without waiting
 * for the device (CUDA: VMM host granules, where the driver has them;
 * POSIX: 2 MiB mlock granules, for every pool), and granules with nothing in
 * them go back as soon as they go idle while the pool holds more than the
 * threshold, besides at synchronization and trim as the driver does. That
 * costs pinning again when memory is needed again (a driver call for each 2
 * MiB granule on CUDA; docs/performance.md, "Pool footprint"): allocations
 * larger than 1 MiB that come and go pin and release each time. */
#define PM_MEMPOOL_DEFAULT_RELEASE_THRESHOLD UINT64_MAX

/* Every call that takes a pool checks that it is live (created and not
 * destroyed): PM_ERROR_INVALID_VALUE otherwise, as with the driver. */

/* pool and props must not be NULL; props: reserved all zero, handle_types 0,
 * location HOST, or HOST_NUMA with a node that exists. */
PM_API pm_result pm_mem_pool_create(pm_mem_pool_t *pool, const pm_mem_pool_props *props);
/* Destroying a pool with live allocations succeeds; their memory goes back
 * when the last one is freed. The default pool cannot be destroyed. As with
 * the driver, no other thread may be using the pool in a call meanwhile
 * (frees of its blocks excepted). */
PM_API pm_result pm_mem_pool_destroy(pm_mem_pool_t pool);
/* The process-wide pool of location HOST. pool must not be NULL. */
PM_API pm_result pm_mem_get_default_pool(pm_mem_pool_t *pool);
/* pp must not be NULL; bytesize 0 gives NULL. Past the pool's max_size, the
 * pinned budget or what the system lets the process pin,
 * PM_ERROR_OUT_OF_MEMORY. */
PM_API pm_result pm_mem_alloc_from_pool(void **pp, size_t bytesize, pm_mem_pool_t pool);
/* As above, for use in stream order (the stream is checked). */
PM_API pm_result pm_mem_alloc_from_pool_async(void **pp, size_t bytesize, pm_mem_pool_t pool,
                                              pm_stream_t stream);
/* The caller guarantees no device work still uses p. p must be the start of
 * an allocated pool block: any other pointer, and a second free, are
 * PM_ERROR_INVALID_VALUE (the detail names the call that frees memory pinmem
 * pinned another way). NULL is a no-op. */
PM_API pm_result pm_mem_free(void *p);
/* p is reusable once the stream's work before this call is done. p as for
 * pm_mem_free; the stream is checked. */
PM_API pm_result pm_mem_free_async(void *p, pm_stream_t stream);
/* Gives back free memory while more than min_bytes_to_keep stay reserved,
 * never leaving less than that reserved (as the driver keeps it). */
PM_API pm_result pm_mem_pool_trim_to(pm_mem_pool_t pool, size_t min_bytes_to_keep);
/* value must not be NULL. The REUSE_* attributes and RELEASE_THRESHOLD can be
 * set; the high-water marks only reset to 0; other attributes are
 * PM_ERROR_INVALID_VALUE. */
PM_API pm_result pm_mem_pool_set_attribute(pm_mem_pool_t pool, pm_mem_pool_attribute attr,
                                           void *value);
/* value must not be NULL; attr must be one of pm_mem_pool_attribute. */
PM_API pm_result pm_mem_pool_get_attribute(pm_mem_pool_t pool, pm_mem_pool_attribute attr,
                                           void *value);

/* Statistics of one pool, or of all pools together (pool NULL). */
typedef struct pm_pool_stats {
    size_t struct_size;              /* set by the caller */
    unsigned long long requested;    /* bytes asked for by live allocations */
    unsigned long long used;         /* the same, rounded to the pool's size classes */
    unsigned long long reserved;     /* bytes pinned by the pool */
    unsigned long long used_high, reserved_high;
    unsigned long long allocs, frees;        /* calls that succeeded */
    /* Address ranges (chunks: 32 MiB and up, less where a chunk pinned whole
     * would pass the pool's max_size) reserved and released. Their
     * memory is pinned in granules: committed while any page of theirs is in
     * use; one with no page in use is reused in place, moved (given back
     * before committing another where an allocation needs it, so the pool
     * does not grow around its holes), or given back by trim and the release
     * threshold. */
    unsigned long long chunks_pinned, chunks_released;
    unsigned long long pin_ns;       /* time spent pinning and unpinning */
    unsigned long long live;         /* live allocations */
    /* Reserved bytes on no allocation's pages: in chunks wholly free, and in
     * holes of chunks still in use. Free blocks of small size classes sit on
     * used pages and count in neither. */
    unsigned long long free_in_empty_chunks, free_in_holes;
    /* bytes in which the chunks the pool adds now are pinned (by its release
     * threshold; smaller where max_size or the memlock limit leaves less
     * room and the backend can); 0: a chunk is pinned whole */
    unsigned long long granule;
    unsigned long long granules_pinned, granules_released, granules_moved;
    unsigned long long idle_granules; /* bytes in committed granules no allocation touches */
} pm_pool_stats;

/* pool live or NULL (all pools); stats and its struct_size are checked. */
PM_API pm_result pm_mem_pool_get_stats(pm_mem_pool_t pool, pm_pool_stats *stats);
/* Writes the statistics as one JSON object into buf (always NUL-terminated);
 * *needed (needed may be NULL) receives the length without the NUL.
 * PM_ERROR_INVALID_VALUE when buf is NULL or too small, with *needed set. */
PM_API pm_result pm_mem_pool_stats_json(pm_mem_pool_t pool, char *buf, size_t cap, size_t *needed);

/* ------------------------------------------------------------------ copies */

/* Copies between any host memory and device memory. Page-locked host memory
 * (pinmem's allocations, registrations and pools) goes straight to DMA;
 * pageable memory goes through pinned staging buffers filled by worker
 * threads while earlier chunks are in flight. A range that mixes them is
 * split where they meet, so a copy never fails for crossing the end of a
 * registration. The synchronous forms are ordered on the default stream and
 * return when the copy is done, but for host to device from pageable memory,
 * which may return once the source has been read, as cuMemcpyHtoD does: the
 * bytes then land before the default stream's later work, not necessarily
 * before that of a stream from pm_stream_create (cuda: non-blocking).
 *
 * Asynchronous forms: host to device returns once the source has been read
 * (the caller may reuse it; page-locked sources are read by the DMA engine
 * later, as with the driver); device to host into pageable memory completes
 * before returning, and into page-locked memory runs in stream order.
 *
 * bytes 0 succeeds and does nothing; otherwise a NULL pointer on either side,
 * a range that wraps around and a destination any byte of which lies in a
 * READ_ONLY registration (the driver refuses every copy into one) are
 * PM_ERROR_INVALID_VALUE, before anything moves, and the stream is checked.
 *
 * Where a copy runs (cuda): in its stream's context; on the default stream,
 * in the calling thread's current context, or, for a thread without one,
 * in the primary context of the device whose memory is copied (so any
 * thread may copy to any device's memory).
 *
 * On a stream that is capturing a graph (cuda), the host side must be all
 * page-locked (pinmem's memory, or memory the driver page-locked itself):
 * the copy is then captured as the driver captures it. Otherwise the call
 * fails with PM_ERROR_STREAM_CAPTURE_UNSUPPORTED before anything is
 * captured or moved, since a replay would not repeat the CPU's part of a
 * copy of pageable memory (the driver accepts such a copy; PyTorch refuses
 * it, as pinmem does). */
PM_API pm_result pm_memcpy_htod(pm_deviceptr dst, const void *src, size_t bytes);
PM_API pm_result pm_memcpy_dtoh(void *dst, pm_deviceptr src, size_t bytes);
PM_API pm_result pm_memcpy_htod_async(pm_deviceptr dst, const void *src, size_t bytes,
                                      pm_stream_t stream);
PM_API pm_result pm_memcpy_dtoh_async(void *dst, pm_deviceptr src, size_t bytes,
                                      pm_stream_t stream);

/* Drops every cached registration that overlaps [p, p + bytes). Call it after
 * changing what memory backs an address range by means the registration cache
 * cannot hear (see pm_copy_config.registration_cache). bytes 0 does nothing;
 * p NULL with bytes, or a range that wraps around, is PM_ERROR_INVALID_VALUE. */
PM_API pm_result pm_mem_invalidate(void *p, size_t bytes);

/* How staging workers write into or out of their buffers. */
typedef enum {
    PM_COPY_STORES_DEFAULT = 0,
    PM_COPY_STORES_CACHED = 1,    /* memcpy */
    PM_COPY_STORES_STREAMING = 2, /* non-temporal stores (x86-64; elsewhere memcpy) */
    PM_COPY_STORES_DEMOTING = 3   /* cached stores, each line then pushed to the shared
                                     cache (cldemote, x86-64 CPUs that have it; elsewhere
                                     memcpy): a ring that stays in that cache is read by
                                     the DMA engine there, not from memory */
} pm_copy_stores;

/* Copies both ways at once through the staging buffers. */
typedef enum {
    PM_COPY_RING_DEFAULT = 0,
    PM_COPY_RING_SHARED = 1, /* whoever asks first takes a free buffer */
    PM_COPY_RING_SPLIT = 2   /* while copies run both ways at once, each direction holds at
                                most half the buffers, so neither waits behind the other */
} pm_copy_ring;

/* How pm_memcpy_batch_async moves its blocks. */
typedef enum {
    PM_COPY_BATCH_DEFAULT = 0,
    PM_COPY_BATCH_GATHER = 1, /* pageable blocks are gathered into (or scattered from) the
                                 staging buffers by the workers; the DMAs of a buffer's blocks,
                                 and the page-locked blocks, go to the driver in one call where
                                 it has a batch copy (cuMemcpyBatchAsync) */
    PM_COPY_BATCH_EACH = 2,   /* gathered the same way, one driver call a DMA */
    PM_COPY_BATCH_DRIVER = 3, /* every block to the driver's own batch copy (pageable sources
                                 read during the call), or one driver call a block where it
                                 has none */
    PM_COPY_BATCH_KERNEL = 4  /* as GATHER, but blocks of up to PINMEM_COPY_KERNEL_MAX bytes
                                 (512 KiB by default) between host and device memory move by
                                 a kernel, one launch for many blocks instead of a DMA each:
                                 page-locked blocks read or written by the kernel in place;
                                 pageable ones gathered as GATHER does (with
                                 PINMEM_COPY_KERNEL_STAGED=1, scattered from their staging
                                 buffer by one launch a buffer, or the reverse). Where the
                                 kernel cannot run (a capturing stream, another context than
                                 pinmem's, memory it cannot address, a driver that cannot load
                                 it), those blocks move as with GATHER */
} pm_copy_batch;

/* How copies work. A zero field means the default: the environment's value
 * where it names one, else chosen from the machine; pm_copy_get_config
 * reports the values in effect, and pm_copy_set_config(pm_copy_get_config())
 * changes nothing. Each field has its environment variable, which takes the
 * same values and is held to the same limits (pm_get_setting lists them):
 * workers PINMEM_COPY_WORKERS (1 to 256), htod_workers
 * PINMEM_COPY_HTOD_WORKERS (1 to 256), chunk_bytes PINMEM_COPY_CHUNK (64 KiB
 * to 256 MiB), slice_bytes PINMEM_COPY_SLICE (4 KiB to 256 MiB), buffers
 * PINMEM_COPY_BUFFERS (1 to 1024), direct_max PINMEM_COPY_DIRECT_MAX (-1:
 * none), dtoh_direct_max PINMEM_COPY_DTOH_DIRECT_MAX (-1: none),
 * staging_stores PINMEM_COPY_STORES (default, cached, streaming or
 * demoting), registration_cache PINMEM_REGISTRATION_CACHE (0 or 1),
 * cache_min_bytes PINMEM_REGISTRATION_CACHE_MIN and cache_max_bytes
 * PINMEM_REGISTRATION_CACHE_MAX (from 4 KiB), pinned_budget
 * PINMEM_PINNED_BUDGET, first_piece_bytes PINMEM_COPY_FIRST_PIECE and
 * dtoh_first_piece_bytes PINMEM_COPY_DTOH_FIRST_PIECE (4 KiB to 256 MiB),
 * dtoh_slice_bytes PINMEM_COPY_DTOH_SLICE (4 KiB to 256 MiB), pieces
 * PINMEM_COPY_PIECES (1 to 1024), spin_us
 * PINMEM_COPY_SPIN_US (1 to 10000; -1: none), ring PINMEM_COPY_RING
 * (default, shared or split), batch PINMEM_COPY_BATCH (default, gather, each,
 * driver or kernel). Sizes of memory are rounded up to whole pages; in
 * the environment, sizes take K, M, G and T suffixes. A value outside its
 * limits is refused with PM_ERROR_INVALID_VALUE (from the environment: by
 * pm_init and every later call). */
typedef struct pm_copy_config {
    size_t struct_size;          /* set by the caller */
    unsigned workers;            /* staging threads of each device's engine (the caller
                                    helps as well; default: one per CPU the thread's affinity
                                    and the cgroup's quota allow, less one, 1 to 15) */
    size_t chunk_bytes;          /* size of one staging buffer, moved by one DMA */
    unsigned buffers;            /* staging buffers in each engine's ring */
    size_t direct_max;           /* pageable copies to the device up to this size go
                                    through the driver's own path, which is cheaper for
                                    them (default 512 KiB); (size_t)-1: none do */
    int registration_cache;      /* 1: keep large pageable buffers registered between
                                    copies (needs userfaultfd to hear unmaps; else
                                    nothing is cached); 0: off (the default) */
    size_t cache_min_bytes;      /* smallest buffer the cache registers */
    size_t cache_max_bytes;      /* most bytes the cache keeps registered */
    unsigned long long pinned_budget; /* the pinned budget (pm_set_pinned_budget), the same
                                         setting; 0 here means the default (none, unless
                                         PINMEM_PINNED_BUDGET names one) */
    pm_copy_stores staging_stores; /* DEFAULT: into the ring, streaming stores for copies
                                      below 256 MiB, cached stores from there (the DMA then
                                      finds part of the bytes in the CPU's cache); from 64
                                      MiB, demoting stores instead where the CPU has them
                                      and the ring is at most 32 MiB, if synchronous copies
                                      timed with each kind show them faster on this machine.
                                      Out of the ring: cached stores */
    size_t slice_bytes;          /* one CPU copy: several threads fill or empty a buffer */
    unsigned htod_workers;       /* of the workers, at most how many fill buffers for
                                    host-to-device copies (the caller helps as well; default:
                                    all). The engine steers the count below it: the DMA
                                    engine reads those buffers from the memory the threads
                                    copy through, and too many threads copying slow it */
    /* How a staged copy is cut into pieces, each moved by one DMA: the first piece is
     * first_piece_bytes to the device (default: slice_bytes) and dtoh_first_piece_bytes
     * from it (first_piece_bytes for a batch's blocks), each next one twice the one before,
     * up to the copy's bytes / pieces (default 1: up to a whole buffer), never past a
     * buffer. Small first pieces start the first DMA to the device sooner; large pieces run
     * the DMA engine faster. */
    size_t first_piece_bytes;
    unsigned pieces;
    unsigned spin_us;            /* after a copy of up to a buffer, up to half the workers
                                    look for more work this long, napping between looks,
                                    before they sleep, so that the next such copy finds them
                                    awake; (unsigned)-1: not at all (the default: on some
                                    hosts spinning slows other threads) */
    pm_copy_ring ring;           /* DEFAULT: SPLIT */
    pm_copy_batch batch;         /* DEFAULT: KERNEL */
    size_t dtoh_direct_max;      /* the same from the device (default 32 KiB, or direct_max
                                    where smaller): the staging engine wins there from
                                    smaller sizes; (size_t)-1: none do */
    size_t dtoh_slice_bytes;     /* slices of staged copies from the device larger than
                                    slice_bytes and up to 4 MiB (default 128 KiB; above 4
                                    and up to 64 MiB twice this, but for a batch's blocks):
                                    more threads then empty each buffer as its DMA lands;
                                    slice_bytes at most */
    size_t dtoh_first_piece_bytes; /* a staged copy's first piece from the device (default 2
                                      MiB): its DMA needs no CPU copy first, so a large one
                                      keeps the DMA engine busy while the workers wake */
} pm_copy_config;

/* config and its struct_size are checked. */
PM_API pm_result pm_copy_get_config(pm_copy_config *config);
/* Waits for copies in flight, then applies config to the copies after it;
 * copies that start while it waits wait for it, so a copy in flight must not
 * wait (through stream work, say) for one another thread starts later.
 * config and its struct_size are checked, and each field against its limits
 * (above): a field outside them is PM_ERROR_INVALID_VALUE, with a detail
 * naming it, and nothing changes. */
PM_API pm_result pm_copy_set_config(const pm_copy_config *config);

/* What the copy engine has done since the process started. */
typedef struct pm_copy_stats {
    size_t struct_size;                 /* set by the caller */
    unsigned long long direct_bytes;    /* from or to page-locked memory */
    unsigned long long staged_bytes;    /* through the staging buffers */
    unsigned long long driver_bytes;    /* small pageable copies left to the driver */
    unsigned long long cached_bytes;    /* through cached registrations */
    unsigned long long cache_registrations, cache_hits, cache_invalidations;
    unsigned long long pinned_bytes;    /* pinned by the process now, all kinds */
    int cache_listening;                /* 1: the cache is on and hears unmaps (userfaultfd) */
    /* Where staging time goes, summed over all threads that ran pieces: */
    unsigned long long staged_pieces;    /* DMAs through a staging buffer */
    unsigned long long staging_copy_ns;  /* CPU copies into or out of the buffers */
    unsigned long long staging_wait_ns;  /* waiting for a free buffer or for a DMA */
    unsigned long long staging_queue_ns; /* queuing DMAs and markers with the backend */
    unsigned htod_fillers;               /* workers that fill buffers for host-to-device
                                            copies now (steered between 1 and htod_workers
                                            in each device's engine), all engines' */
    unsigned long long demoted_bytes;    /* of staged_bytes, those of host-to-device copies
                                            that used demoting stores (see staging_stores) */
    unsigned staging_threads;            /* staging workers running now, all engines' (a
                                            worker that could not be started is tried again
                                            by the next staged copy) */
    /* The staging ring of the first device's engine (each device whose memory
     * a staged copy moves has an engine of its own, with a ring planned the
     * same way): pinned now (ring_pinned 1), or the one the next
     * staged copy would pin. It is as configured where the system's limit on
     * pinned memory (RLIMIT_MEMLOCK on POSIX) and the pinned budget leave
     * room for it, taking at most a quarter of that room, else smaller; where
     * not even two 64 KiB buffers fit, there is none (ring_buffers 0) and
     * pageable copies take the backend's own path (driver_bytes). ring_note
     * says why it differs from the configuration ("" when it does not). */
    int ring_pinned;
    unsigned ring_buffers;
    unsigned long long ring_buffer_bytes;
    char ring_note[224];
    /* pm_memcpy_batch_async: */
    unsigned long long batch_calls;      /* calls that succeeded, moving something */
    unsigned long long batch_copies;     /* their elements of more than 0 bytes */
    unsigned long long dma_batch_calls;  /* driver calls that queued several DMAs at once
                                            (cuMemcpyBatchAsync; posix: one stream task) */
    unsigned long long kernel_launches;  /* launches of the batch kernel (PM_COPY_BATCH_KERNEL;
                                            posix: stream tasks playing it) */
    unsigned long long kernel_bytes;     /* the bytes those launches moved */
} pm_copy_stats;

/* stats and its struct_size are checked. */
PM_API pm_result pm_copy_get_stats(pm_copy_stats *stats);

/* ------------------------------------ device memory, copies in any direction */

/* cuMemAlloc / cuMemFree in pinmem's context (the calling thread's current
 * context, else the primary context of pinmem's device). On the posix
 * backend, ordinary memory that pinmem records as device memory: there an
 * address is device memory exactly when it lies in a live pm_device_alloc
 * range, and every other address is host memory (pageable unless pinmem
 * pinned it). dptr must not be NULL and bytes 0 is INVALID_VALUE, as with the
 * driver; pm_device_free(0) succeeds and does nothing; any other pointer must
 * be an allocation's base. */
PM_API pm_result pm_device_alloc(pm_deviceptr *dptr, size_t bytes);
/* pm_device_alloc on device ordinal (below pm_device_count), in that
 * device's primary context whatever the calling thread's context is;
 * PM_ERROR_INVALID_DEVICE for any other ordinal. pm_device_free frees memory
 * of any device, in the context that allocated it. */
PM_API pm_result pm_device_alloc_on(pm_deviceptr *dptr, size_t bytes, int ordinal);
PM_API pm_result pm_device_free(pm_deviceptr dptr);

/* cuMemcpy / cuMemcpyAsync: direction from the pointers (unified addressing);
 * host memory of any kind on either side, device memory, or both.
 *
 * Host to device and device to host go through the copy engine above, with
 * its semantics: from a pageable source, return once the source has been
 * read; into a pageable destination, return when the bytes are there;
 * page-locked host memory, stream-ordered. Device to device is
 * stream-ordered (pm_memcpy_async may return before it is done, pm_memcpy
 * on cuda as well, as cuMemcpy does); host to host of any kinds is done
 * before the call returns, after the work queued before it on the stream.
 * Host memory the driver page-locked itself (cuda: cuMemHostAlloc,
 * cuMemHostRegister called directly, other libraries' pinned memory) goes to
 * the driver's own copy. A stream that is capturing a graph (cuda) takes
 * page-locked host memory only, as pm_memcpy_htod_async does.
 *
 * bytes 0 succeeds and does nothing; otherwise NULL on either side, ranges
 * that wrap around the address space or overlap each other, a destination
 * any byte of which lies in a READ_ONLY registration, a device range that
 * runs past its allocation's end (posix) and a stream that is not live
 * (posix) are INVALID_VALUE (INVALID_HANDLE for the stream). pm_memcpy is
 * ordered on the default stream, as the synchronous copies above are. */
PM_API pm_result pm_memcpy(pm_deviceptr dst, pm_deviceptr src, size_t bytes);
PM_API pm_result pm_memcpy_async(pm_deviceptr dst, pm_deviceptr src, size_t bytes, pm_stream_t stream);

/* What a copy may do to a range, for pm_mem_check_access. */
#define PM_ACCESS_READ 0x1
#define PM_ACCESS_WRITE 0x2

/* Whether a copy may read (PM_ACCESS_READ) or write (PM_ACCESS_WRITE; both
 * bits: both) the bytes [p, p + bytes), asked of the system without touching
 * them. The copies above, as the driver's, fault on a host page the process
 * may not read or write; an address that comes from outside the program can
 * be checked here first. PM_SUCCESS where every page of the range lies in
 * host mappings that permit that access, or where the range lies inside one
 * device allocation the library or the driver knows (which the process's
 * mappings leave the CPU no access to; not on the posix backend, whose
 * copies are the CPU's). Page-locked host memory passes only as its mapping
 * permits: the driver reads a small copy's page-locked source with the CPU.
 * *span_base and *span_size
 * (either pointer may be NULL) then receive a range that holds [p, p + bytes)
 * and passes as well, the one mapping or allocation that holds it, else the
 * range itself. Otherwise PM_ERROR_INVALID_VALUE, the detail saying why.
 * The mappings' permissions come from /proc/self/maps: by its PROCMAP_QUERY
 * ioctl on Linux 6.11 and later (about a microsecond), else by reading its
 * text as far as the range (a time that grows with the mappings below it);
 * where /proc cannot be read (or no file descriptor is left for it), only
 * whether each page is mapped is checked.
 * bytes 0 succeeds; a range that wraps around and an access of other bits or
 * none are PM_ERROR_INVALID_VALUE. */
PM_API pm_result pm_mem_check_access(pm_deviceptr p, size_t bytes, unsigned access,
                                     pm_deviceptr *span_base, size_t *span_size);

/* cuMemcpyBatchAsync without attributes: count copies, each direction from its pointers,
 * in stream order with respect to other work on stream, in any order among themselves.
 *
 * Each element is what pm_memcpy_async(dsts[i], srcs[i], sizes[i], stream) would be: host
 * memory of any kind on either side, device memory, or both; a pageable source may be
 * reused once the call returns, a pageable destination holds its bytes when it returns,
 * page-locked memory is read and written in stream order. Pageable blocks are gathered
 * through the copy engine's staging buffers and page-locked ones go straight to the DMA
 * engine, many DMAs to a driver call, or small blocks of either kind to a kernel that moves
 * many in one launch (pm_copy_config.batch). stream may be NULL, the legacy
 * stream (which the driver's own batch copy refuses).
 *
 * Everything is checked before anything moves, and a bad element fails the whole call with
 * PM_ERROR_INVALID_VALUE and a detail naming its index: a NULL pointer with a size, a range
 * that wraps around, a destination that overlaps its own source, another element's
 * destination or another element's source (copies in a batch may not depend on each
 * other), a destination any byte of which lies in a READ_ONLY registration, a device
 * range that runs past its allocation's end (posix). An element of 0 bytes does nothing
 * and its pointers are not looked at. count 0 and a NULL array are
 * PM_ERROR_INVALID_VALUE, as with the driver; the stream is checked
 * (PM_ERROR_INVALID_HANDLE). On a stream that is capturing a graph (cuda) every host side
 * must be page-locked (PM_ERROR_STREAM_CAPTURE_UNSUPPORTED otherwise, as
 * pm_memcpy_htod_async), and the elements are captured as copies of their own. A failure
 * while copying (the driver's) is returned as it comes; elements may then have been
 * copied in part. */
PM_API pm_result pm_memcpy_batch_async(const pm_deviceptr *dsts, const pm_deviceptr *srcs,
                                       const size_t *sizes, size_t count, pm_stream_t stream);

/* ------------------------------------------------------------------- DLPack */

/* A DLManagedTensor deleter (dlpack.h) for bindings with no compiled part,
 * such as pinmem's Python package: it sets the tensor's manager_ctx to NULL
 * and does nothing else, so it is safe on any thread, with or without an
 * interpreter's lock or a pending exception; the binding frees the tensor
 * once it sees manager_ctx cleared. managed is a DLManagedTensor *; NULL
 * does nothing. */
PM_API void pm_dlpack_deleter(void *managed);

#ifdef __cplusplus
}
#endif

#endif /* PINMEM_H */
