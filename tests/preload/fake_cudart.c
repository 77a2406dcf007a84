/* A stand-in for the CUDA runtime (built as libcudart.so.13 for the tests):
 * the functions the preload interposes and calls, with the runtime's
 * argument checks and error codes, its per-thread last error, and its
 * default streams, on pinmem's POSIX backend. Device memory is
 * pm_device_alloc's, streams and events are pinmem's, and memory pinmem
 * pinned is page-locked memory as far as this runtime's "driver" can tell
 * (as the real driver knows pinmem's registrations). Every function counts
 * its calls (fake_calls), so a test sees what reached the runtime. Copies
 * are done on the calling thread, after the stream's earlier work; a copy
 * on a capturing stream is kept for a replay (fake_replay) instead.
 *
 * Captures follow the driver's rule for other threads: while a stream
 * captures in global mode, a potentially unsafe call (a stream's or an
 * event's synchronization, an event's query, a host registration) from
 * another thread whose own capture mode is global is refused and
 * invalidates that capture; in relaxed or thread-local mode it runs. The
 * runtime's own copies from pageable memory are not unsafe.
 *
 * Inside a host function it launched, the calls on host memory answer
 * cudaErrorNotPermitted, as the driver refuses them there. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cudart.h"
#include "pm_dyn.h"

#define EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------ call counts */

enum { MAX_NAMES = 64 };
static struct {
    const char *name;
    atomic_int n;
} calls[MAX_NAMES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* every table below */

/* A forked child finds the lock free, whatever the parent's threads held,
 * so that a hang in a child is the preload's own. */
static void lock_for_fork(void)
{
    pthread_mutex_lock(&lock);
}

static void unlock_after_fork(void)
{
    pthread_mutex_unlock(&lock);
}

__attribute__((constructor)) static void guard_fork(void)
{
    pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork);
}

static void count(const char *name)
{
    pthread_mutex_lock(&lock);
    int i = 0;
    while (i < MAX_NAMES && calls[i].name && strcmp(calls[i].name, name) != 0)
        i++;
    if (i < MAX_NAMES) {
        calls[i].name = name;
        calls[i].n++;
    }
    pthread_mutex_unlock(&lock);
}

EXPORT int fake_calls(const char *name)
{
    int n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_NAMES && calls[i].name; i++)
        if (strcmp(calls[i].name, name) == 0)
            n = calls[i].n;
    pthread_mutex_unlock(&lock);
    return n;
}

/* ------------------------------------------------------------ last error */

static _Thread_local cudaError_t last_error;

static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

/* The context's sticky error (fake_set_sticky): once set, every call
 * returns it, as the runtime does after a kernel's fault. */
static _Atomic cudaError_t sticky;

EXPORT void fake_set_sticky(cudaError_t e)
{
    sticky = e;
}

/* Loads pinmem as this runtime's first call would, without initialising it:
 * a fork must not catch that loading, which is the runtime's own affair. */
EXPORT void fake_load_pinmem(void)
{
    (void)pmd();
}

#define ENTER()                  \
    do {                         \
        count(__func__);         \
        cudaError_t sticky_ = sticky; \
        if (sticky_ != cudaSuccess) \
            return ret(sticky_); \
    } while (0)

/* Whether the calling thread runs a host function this runtime launched. */
static _Thread_local bool in_host_func;

#define REFUSED_IN_HOST_FUNC()                 \
    do {                                       \
        if (in_host_func)                      \
            return ret(cudaErrorNotPermitted); \
    } while (0)

/* A potentially unsafe call returns the runtime's refusal where another
 * thread's capture forbids it (see capture_allows). */
static bool capture_allows(void);
#define UNSAFE()                                           \
    do {                                                   \
        if (!capture_allows())                             \
            return ret(cudaErrorStreamCaptureUnsupported); \
    } while (0)

EXPORT cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

EXPORT cudaError_t cudaPeekAtLastError(void)
{
    return last_error;
}

EXPORT cudaError_t cudaGetDevice(int *device)
{
    ENTER();
    if (!device)
        return ret(cudaErrorInvalidValue);
    *device = 0;
    return cudaSuccess;
}

/* ------------------------------------------------- this runtime's memory */

typedef enum { HOST_ALLOC = 1, HOST_REGISTERED, DEVICE } kind;
typedef struct region {
    uintptr_t base;
    size_t size;
    unsigned flags;
    kind k;
} region;

enum { MAX_REGIONS = 1024 };
static region regions[MAX_REGIONS];

/* The region holding p, or NULL. */
static region *find(const void *p)
{
    for (int i = 0; i < MAX_REGIONS; i++)
        if (regions[i].k && (uintptr_t)p >= regions[i].base &&
            (uintptr_t)p - regions[i].base < regions[i].size)
            return &regions[i];
    return NULL;
}

static bool add(uintptr_t base, size_t size, unsigned flags, kind k)
{
    for (int i = 0; i < MAX_REGIONS; i++)
        if (!regions[i].k) {
            regions[i] = (region){base, size, flags, k};
            return true;
        }
    return false;
}

/* What the driver knows as page-locked: this runtime's own, or pinmem's. */
static bool pinmem_pinned(const void *p)
{
    unsigned flags;
    return pmd()->pm_mem_host_get_flags(&flags, (void *)p) == PM_SUCCESS;
}

/* The kind of this runtime's host memory [lo, lo + n) overlaps, or 0. */
static kind overlaps(uintptr_t lo, size_t n)
{
    for (int i = 0; i < MAX_REGIONS; i++)
        if (regions[i].k == HOST_REGISTERED || regions[i].k == HOST_ALLOC)
            if (lo < regions[i].base + regions[i].size && regions[i].base < lo + n)
                return regions[i].k;
    return 0;
}

/* pinmem's allocation or registration starting at p: the driver knows each
 * as a registration of its own. */
static bool pinmem_base(const void *p)
{
    pm_deviceptr base = 0;
    return pinmem_pinned(p) &&
           pmd()->pm_mem_get_address_range(&base, NULL, (pm_deviceptr)(uintptr_t)p) ==
               PM_SUCCESS &&
           base == (pm_deviceptr)(uintptr_t)p;
}

static cudaError_t host_alloc(void **p, size_t size, unsigned flags)
{
    if (!p || (flags & ~7u))
        return ret(cudaErrorInvalidValue);
    if (size == 0) {
        *p = NULL;
        return cudaSuccess;
    }
    void *m = aligned_alloc(4096, (size + 4095) & ~(size_t)4095);
    if (!m)
        return ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&lock);
    bool ok = add((uintptr_t)m, size, flags | cudaHostAllocMapped, HOST_ALLOC);
    pthread_mutex_unlock(&lock);
    if (!ok) {
        free(m);
        return ret(cudaErrorMemoryAllocation);
    }
    *p = m;
    return cudaSuccess;
}

EXPORT cudaError_t cudaHostAlloc(void **p, size_t size, unsigned flags)
{
    ENTER();
    REFUSED_IN_HOST_FUNC();
    return host_alloc(p, size, flags);
}

EXPORT cudaError_t cudaMallocHost(void **p, size_t size)
{
    ENTER();
    REFUSED_IN_HOST_FUNC();
    return host_alloc(p, size, 0);
}

EXPORT cudaError_t cudaFreeHost(void *p)
{
    ENTER();
    REFUSED_IN_HOST_FUNC();
    if (!p)
        return cudaSuccess;
    pthread_mutex_lock(&lock);
    region *r = find(p);
    bool ok = r && r->k == HOST_ALLOC && r->base == (uintptr_t)p;
    if (ok)
        r->k = 0;
    pthread_mutex_unlock(&lock);
    if (!ok)
        return ret(cudaErrorInvalidValue);
    free(p);
    return cudaSuccess;
}

EXPORT cudaError_t cudaHostRegister(void *p, size_t size, unsigned flags)
{
    ENTER();
    REFUSED_IN_HOST_FUNC();
    UNSAFE();
    if (!p || size == 0 || (flags & ~15u))
        return ret(cudaErrorInvalidValue);
    if (flags & cudaHostRegisterIoMemory)
        return ret(cudaErrorInvalidValue); /* ordinary memory is not I/O memory */
    /* Memory of this runtime's allocations cannot be registered; memory
     * registered already (pinmem's included) is. */
    pthread_mutex_lock(&lock);
    kind over = overlaps((uintptr_t)p, size);
    bool taken = over == HOST_REGISTERED || pinmem_pinned(p) || pinmem_pinned((char *)p + size - 1);
    bool ok = !over && !taken &&
              add((uintptr_t)p, size, (flags & cudaHostRegisterPortable) | cudaHostRegisterMapped,
                  HOST_REGISTERED);
    pthread_mutex_unlock(&lock);
    return ok      ? cudaSuccess
           : over == HOST_ALLOC ? ret(cudaErrorInvalidValue)
           : taken ? ret(cudaErrorHostMemoryAlreadyRegistered)
                   : ret(cudaErrorMemoryAllocation);
}

EXPORT cudaError_t cudaHostUnregister(void *p)
{
    ENTER();
    REFUSED_IN_HOST_FUNC();
    if (!p)
        return ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    region *r = find(p);
    cudaError_t e = cudaSuccess;
    if (!r && pinmem_base(p))
        e = cudaSuccess; /* the driver would undo pinmem's registration */
    else if (!r || r->k != HOST_REGISTERED)
        e = r ? cudaErrorInvalidValue : cudaErrorHostMemoryNotRegistered;
    else if (r->base != (uintptr_t)p)
        e = cudaErrorInvalidValue;
    else
        r->k = 0;
    pthread_mutex_unlock(&lock);
    return ret(e);
}

/* The driver answers for memory pinmem registered with the flags of the
 * registration (PORTABLE | DEVICEMAP), not those the program asked for. */
EXPORT cudaError_t cudaHostGetFlags(unsigned *flags, void *p)
{
    ENTER();
    if (!flags)
        return ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    region *r = find(p);
    bool own = r && r->k != DEVICE;
    if (own)
        *flags = r->flags;
    pthread_mutex_unlock(&lock);
    if (own)
        return cudaSuccess;
    if (pinmem_pinned(p)) {
        *flags = cudaHostAllocPortable | cudaHostAllocMapped;
        return cudaSuccess;
    }
    return ret(cudaErrorInvalidValue);
}

EXPORT cudaError_t cudaHostGetDevicePointer(void **dev, void *p, unsigned flags)
{
    ENTER();
    if (!dev || flags)
        return ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    region *r = find(p);
    bool ok = (r && r->k != DEVICE) || pinmem_pinned(p);
    pthread_mutex_unlock(&lock);
    if (!ok)
        return ret(cudaErrorInvalidValue);
    *dev = p;
    return cudaSuccess;
}

EXPORT cudaError_t cudaMalloc(void **p, size_t size)
{
    ENTER();
    pm_deviceptr d = 0;
    if (!p)
        return ret(cudaErrorInvalidValue);
    if (pmd()->pm_device_alloc(&d, size) != PM_SUCCESS)
        return ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&lock);
    bool ok = add((uintptr_t)d, size, 0, DEVICE);
    pthread_mutex_unlock(&lock);
    *p = (void *)(uintptr_t)d;
    return ok ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

EXPORT cudaError_t cudaFree(void *p)
{
    ENTER();
    if (!p)
        return cudaSuccess;
    pthread_mutex_lock(&lock);
    region *r = find(p);
    bool ok = r && r->k == DEVICE && r->base == (uintptr_t)p;
    if (ok)
        r->k = 0;
    pthread_mutex_unlock(&lock);
    if (!ok)
        return ret(cudaErrorInvalidValue);
    return pmd()->pm_device_free((pm_deviceptr)(uintptr_t)p) == PM_SUCCESS
               ? cudaSuccess
               : ret(cudaErrorInvalidValue);
}

EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    ENTER();
    if (!a)
        return ret(cudaErrorInvalidValue);
    memset(a, 0, sizeof *a);
    pthread_mutex_lock(&lock);
    region *r = find(p);
    enum cudaMemoryType type = !r ? cudaMemoryTypeUnregistered
                               : r->k == DEVICE ? cudaMemoryTypeDevice
                                                : cudaMemoryTypeHost;
    pthread_mutex_unlock(&lock);
    if (type == cudaMemoryTypeUnregistered && pinmem_pinned(p))
        type = cudaMemoryTypeHost;
    a->type = type;
    a->device = type == cudaMemoryTypeUnregistered ? -2 : 0;
    a->devicePointer = type == cudaMemoryTypeUnregistered ? NULL : (void *)p;
    a->hostPointer = type == cudaMemoryTypeDevice ? NULL : (void *)p;
    return cudaSuccess;
}

/* ---------------------------------------------------------------- streams */

enum { MAX_STREAMS = 256 };
static pm_stream_t streams[MAX_STREAMS];
static bool capturing[MAX_STREAMS];
static bool non_blocking[MAX_STREAMS];
/* The thread that began a capture in global mode, and whether an unsafe
 * call of another thread invalidated it. */
static bool global_capture[MAX_STREAMS], invalidated[MAX_STREAMS];
static pthread_t captured_by[MAX_STREAMS];
static _Thread_local enum cudaStreamCaptureMode capture_mode; /* global at first */

/* The pinmem stream a runtime stream stands for: 0 and cudaStreamLegacy the
 * legacy default stream (pinmem's NULL), cudaStreamPerThread (or 0 in the
 * per-thread forms) pinmem's PM_STREAM_PER_THREAD, others as created. */
static int slot_of(cudaStream_t s)
{
    for (int i = 0; i < MAX_STREAMS; i++)
        if (streams[i] && streams[i] == (pm_stream_t)s)
            return i;
    return -1;
}

static bool map_stream(cudaStream_t s, bool per_thread, pm_stream_t *out)
{
    if (s == cudaStreamPerThread || (s == NULL && per_thread)) {
        *out = PM_STREAM_PER_THREAD;
        return true;
    }
    if (s == NULL || s == cudaStreamLegacy) {
        *out = NULL;
        return true;
    }
    pthread_mutex_lock(&lock);
    int i = slot_of(s);
    pthread_mutex_unlock(&lock);
    *out = (pm_stream_t)s;
    return i >= 0;
}

static bool stream_capturing(cudaStream_t s)
{
    pthread_mutex_lock(&lock);
    int i = slot_of(s);
    bool c = i >= 0 && capturing[i];
    pthread_mutex_unlock(&lock);
    return c;
}

/* Whether a blocking stream captures: the legacy stream synchronizes with
 * those, so it may not be used then. */
static bool any_capturing(void)
{
    pthread_mutex_lock(&lock);
    bool c = false;
    for (int i = 0; i < MAX_STREAMS; i++)
        c = c || (streams[i] && capturing[i] && !non_blocking[i]);
    pthread_mutex_unlock(&lock);
    return c;
}

/* A potentially unsafe call may go on: false when another thread's global
 * capture forbids it to this thread, which invalidates that capture. */
static bool capture_allows(void)
{
    if (capture_mode != cudaStreamCaptureModeGlobal)
        return true;
    bool refused = false;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_STREAMS; i++)
        if (streams[i] && capturing[i] && global_capture[i] &&
            !pthread_equal(captured_by[i], pthread_self())) {
            invalidated[i] = true;
            refused = true;
        }
    pthread_mutex_unlock(&lock);
    return !refused;
}

EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    ENTER();
    if (!mode || (unsigned)*mode > cudaStreamCaptureModeRelaxed)
        return ret(cudaErrorInvalidValue);
    enum cudaStreamCaptureMode was = capture_mode;
    capture_mode = *mode;
    *mode = was;
    return cudaSuccess;
}

EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    ENTER();
    pm_stream_t made = NULL;
    if (!s || (flags & ~1u))
        return ret(cudaErrorInvalidValue);
    if (pmd()->pm_stream_create(&made) != PM_SUCCESS)
        return ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&lock);
    int i;
    for (i = 0; i < MAX_STREAMS && streams[i]; i++)
        ;
    if (i < MAX_STREAMS) {
        streams[i] = made;
        capturing[i] = false;
        non_blocking[i] = flags & cudaStreamNonBlocking;
    }
    pthread_mutex_unlock(&lock);
    if (i == MAX_STREAMS) {
        pmd()->pm_stream_destroy(made);
        return ret(cudaErrorMemoryAllocation);
    }
    *s = (cudaStream_t)made;
    return cudaSuccess;
}

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    return cudaStreamCreateWithFlags(s, 0);
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    ENTER();
    pthread_mutex_lock(&lock);
    int i = slot_of(s);
    if (i >= 0)
        streams[i] = NULL;
    pthread_mutex_unlock(&lock);
    if (i < 0)
        return ret(cudaErrorInvalidResourceHandle);
    pmd()->pm_stream_destroy((pm_stream_t)s);
    return cudaSuccess;
}

static cudaError_t synchronize(cudaStream_t s, bool per_thread)
{
    pm_stream_t ps;
    if (!map_stream(s, per_thread, &ps))
        return ret(cudaErrorInvalidResourceHandle);
    return pmd()->pm_stream_synchronize(ps) == PM_SUCCESS ? cudaSuccess : ret(cudaErrorUnknown);
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    ENTER();
    UNSAFE();
    return synchronize(s, false);
}

EXPORT cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s)
{
    ENTER();
    UNSAFE();
    return synchronize(s, true);
}

static cudaError_t is_capturing(cudaStream_t s, enum cudaStreamCaptureStatus *st, bool per_thread)
{
    pm_stream_t ps;
    if (!st)
        return ret(cudaErrorInvalidValue);
    if (!map_stream(s, per_thread, &ps))
        return ret(cudaErrorInvalidResourceHandle);
    /* The legacy stream synchronizes with every blocking stream, so it may
     * not be used while one of them captures. */
    if ((s == NULL && !per_thread) || s == cudaStreamLegacy) {
        if (any_capturing())
            return ret(cudaErrorStreamCaptureImplicit);
        *st = cudaStreamCaptureStatusNone;
        return cudaSuccess;
    }
    pthread_mutex_lock(&lock);
    int i = slot_of(s);
    *st = i < 0 || !capturing[i] ? cudaStreamCaptureStatusNone
          : invalidated[i]       ? cudaStreamCaptureStatusInvalidated
                                 : cudaStreamCaptureStatusActive;
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st)
{
    ENTER();
    return is_capturing(s, st, false);
}

EXPORT cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t s, enum cudaStreamCaptureStatus *st)
{
    ENTER();
    return is_capturing(s, st, true);
}

EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    ENTER();
    if ((unsigned)mode > cudaStreamCaptureModeRelaxed)
        return ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    int i = slot_of(s);
    if (i >= 0) {
        capturing[i] = true;
        global_capture[i] = mode == cudaStreamCaptureModeGlobal;
        invalidated[i] = false;
        captured_by[i] = pthread_self();
    }
    pthread_mutex_unlock(&lock);
    return i >= 0 ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}

/* The copies captured on a stream, for fake_replay. */
typedef struct captured {
    cudaStream_t s;
    void *dst;
    const void *src;
    size_t n;
} captured;
enum { MAX_CAPTURED = 64 };
static captured graph[MAX_CAPTURED];
static int graph_len;

EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, void **g)
{
    ENTER();
    pthread_mutex_lock(&lock);
    int i = slot_of(s);
    bool ok = i >= 0 && capturing[i];
    bool lost = ok && invalidated[i];
    if (ok)
        capturing[i] = invalidated[i] = false;
    pthread_mutex_unlock(&lock);
    if (g)
        *g = NULL;
    return !ok ? ret(cudaErrorInvalidValue) : lost ? ret(cudaErrorStreamCaptureInvalidated)
                                                  : cudaSuccess;
}

/* Runs the copies captured on s, in order, and forgets them: how many. */
EXPORT int fake_replay(cudaStream_t s)
{
    int n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < graph_len; i++)
        if (graph[i].s == s) {
            memcpy(graph[i].dst, graph[i].src, graph[i].n);
            n++;
        }
    graph_len = 0;
    pthread_mutex_unlock(&lock);
    return n;
}

/* ----------------------------------------------------------------- events */

EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    ENTER();
    (void)flags;
    if (!e)
        return ret(cudaErrorInvalidValue);
    return pmd()->pm_event_create((pm_event_t *)e) == PM_SUCCESS ? cudaSuccess
                                                                  : ret(cudaErrorMemoryAllocation);
}

EXPORT cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    ENTER();
    return pmd()->pm_event_destroy((pm_event_t)e) == PM_SUCCESS
               ? cudaSuccess
               : ret(cudaErrorInvalidResourceHandle);
}

static cudaError_t event_record(cudaEvent_t e, cudaStream_t s, bool per_thread)
{
    pm_stream_t ps;
    if (!map_stream(s, per_thread, &ps))
        return ret(cudaErrorInvalidResourceHandle);
    return pmd()->pm_event_record((pm_event_t)e, ps) == PM_SUCCESS
               ? cudaSuccess
               : ret(cudaErrorInvalidResourceHandle);
}

EXPORT cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    ENTER();
    return event_record(e, s, false);
}

EXPORT cudaError_t cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t s)
{
    ENTER();
    return event_record(e, s, true);
}

EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    ENTER();
    UNSAFE();
    return pmd()->pm_event_synchronize((pm_event_t)e) == PM_SUCCESS
               ? cudaSuccess
               : ret(cudaErrorInvalidResourceHandle);
}

EXPORT cudaError_t cudaEventQuery(cudaEvent_t e)
{
    ENTER();
    UNSAFE();
    pm_result r = pmd()->pm_event_query((pm_event_t)e);
    return r == PM_SUCCESS           ? cudaSuccess
           : r == PM_ERROR_NOT_READY ? ret(cudaErrorNotReady)
                                     : ret(cudaErrorInvalidResourceHandle);
}

static cudaError_t wait_event(cudaStream_t s, cudaEvent_t e, bool per_thread)
{
    pm_stream_t ps;
    if (!map_stream(s, per_thread, &ps))
        return ret(cudaErrorInvalidResourceHandle);
    return pmd()->pm_stream_wait_event(ps, (pm_event_t)e) == PM_SUCCESS
               ? cudaSuccess
               : ret(cudaErrorInvalidResourceHandle);
}

EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    ENTER();
    (void)flags;
    return wait_event(s, e, false);
}

EXPORT cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    ENTER();
    (void)flags;
    return wait_event(s, e, true);
}

typedef struct host_func {
    void (*fn)(void *);
    void *arg;
} host_func;

static void run_host_func(void *arg)
{
    host_func h = *(host_func *)arg;
    free(arg);
    in_host_func = true;
    h.fn(h.arg);
    in_host_func = false;
}

static cudaError_t launch_host_func(cudaStream_t s, bool per_thread, void (*fn)(void *), void *arg)
{
    pm_stream_t ps;
    if (!map_stream(s, per_thread, &ps))
        return ret(cudaErrorInvalidResourceHandle);
    host_func *h = malloc(sizeof *h);
    if (!h)
        return ret(cudaErrorMemoryAllocation);
    *h = (host_func){fn, arg};
    if (pmd()->pm_stream_launch_host_func(ps, run_host_func, h) == PM_SUCCESS)
        return cudaSuccess;
    free(h);
    return ret(cudaErrorUnknown);
}

EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t s, void (*fn)(void *), void *arg)
{
    ENTER();
    return launch_host_func(s, false, fn, arg);
}

EXPORT cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t s, void (*fn)(void *), void *arg)
{
    ENTER();
    return launch_host_func(s, true, fn, arg);
}

/* ----------------------------------------------------------------- copies */

static cudaError_t copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                        cudaStream_t s, bool per_thread)
{
    if ((unsigned)kind > cudaMemcpyDefault)
        return ret(cudaErrorInvalidMemcpyDirection);
    pm_stream_t ps;
    if (!map_stream(s, per_thread, &ps))
        return ret(cudaErrorInvalidResourceHandle);
    if (n == 0)
        return cudaSuccess;
    if (!dst || !src)
        return ret(cudaErrorInvalidValue);
    if (s && s != cudaStreamLegacy && s != cudaStreamPerThread && stream_capturing(s)) {
        pthread_mutex_lock(&lock);
        bool room = graph_len < MAX_CAPTURED;
        if (room)
            graph[graph_len++] = (captured){s, dst, src, n};
        pthread_mutex_unlock(&lock);
        return room ? cudaSuccess : ret(cudaErrorStreamCaptureUnsupported);
    }
    if (((s == NULL && !per_thread) || s == cudaStreamLegacy) && any_capturing())
        return ret(cudaErrorStreamCaptureImplicit);
    if (pmd()->pm_stream_synchronize(ps) != PM_SUCCESS)
        return ret(cudaErrorUnknown);
    memmove(dst, src, n);
    return cudaSuccess;
}

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    ENTER();
    return copy(dst, src, n, kind, NULL, false);
}

EXPORT cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    ENTER();
    return copy(dst, src, n, kind, NULL, true);
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                                   cudaStream_t s)
{
    ENTER();
    return copy(dst, src, n, kind, s, false);
}

EXPORT cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t n,
                                        enum cudaMemcpyKind kind, cudaStream_t s)
{
    ENTER();
    return copy(dst, src, n, kind, s, true);
}
