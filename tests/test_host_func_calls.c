/* Calls inside a host function (pinmem.h, pm_stream_launch_host_func) answer
 * as the driver's did there (H200, driver 580, bench/probe/host_func_calls.c;
 * docs/driver-behavior.md): every call that allocates, frees, registers,
 * asks about or copies memory, makes or destroys a stream, event or pool, or
 * uses the legacy or per-thread default stream is refused with
 * NOT_PERMITTED, and changes nothing; waits for and records on other
 * streams, event queries and further host functions go through. The
 * function runs on a stream of its own and on the legacy stream; after it,
 * every call works again on that thread and the objects it was handed are
 * whole. On CUDA the same calls answer alike inside a host function another
 * library launched with the driver's cuLaunchHostFunc, which pinmem cannot
 * mark; a process whose first pinmem call is made there is refused, and
 * starts at its next call outside. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "child.h"
#include "copy_util.h"
#include "pool_util.h"

#ifdef PINMEM_HAVE_CUDA_HEADERS
#include <cuda.h>
#include <dlfcn.h>

/* The driver's calls another library would make, loaded from libcuda. */
typedef struct driver_api {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*push)(CUcontext);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*stream_synchronize)(CUstream);
    CUresult (*launch_host_func)(CUstream, CUhostFn, void *);
} driver_api;

static driver_api drv;

/* false without a driver (or one that lacks a call). */
static bool driver_api_load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib)
        return false;
    static const char *const names[] = {
        "cuInit",         "cuDeviceGet",        "cuDevicePrimaryCtxRetain", "cuCtxPushCurrent_v2",
        "cuStreamCreate", "cuStreamDestroy_v2", "cuStreamSynchronize",      "cuLaunchHostFunc"};
    void **slots = (void **)&drv;
    _Static_assert(sizeof drv == sizeof names / sizeof names[0] * sizeof(void *),
                   "one name a slot");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(slots[i] = dlsym(lib, names[i])))
            return false;
    return true;
}
#endif

enum { BYTES = 64 << 10 };

/* What the host function is handed, made before it runs. */
typedef struct setting {
    pm_stream_t stream; /* the function's own */
    pm_stream_t idle;
    pm_event_t done;   /* recorded and complete before the function */
    pm_event_t behind; /* recorded on stream after the function */
    void *pinned;
    void *registered;
    pm_mem_pool_t pool;
    void *pooled;
    pm_deviceptr device;
    uint8_t *pageable;
    unsigned pinned_flags;
    pm_copy_config config; /* the engine's, as the function starts */
    atomic_int nested_ran;
} setting;

static void nested(void *arg) { atomic_store(&((setting *)arg)->nested_ran, 1); }

#define REFUSED(call)                                                                         \
    do {                                                                                      \
        pm_result got_ = (call);                                                              \
        if (got_ != PM_ERROR_NOT_PERMITTED && check_failed_())                                \
            fprintf(stderr, "%s:%d: inside a host function %s gave %s, not NOT_PERMITTED\n",  \
                    __FILE__, __LINE__, #call, pm_result_name(got_));                         \
        else if (!strstr(pm_last_error_detail(), "inside a host function") && check_failed_()) \
            fprintf(stderr, "%s:%d: %s: the detail says %s\n", __FILE__, __LINE__, #call,     \
                    pm_last_error_detail());                                                  \
    } while (0)

/* Memory: allocating, freeing, registering, asking, copying. */
static void memory_calls(setting *s)
{
    void *p = NULL;
    unsigned flags = 0;
    pm_deviceptr d = 0, base = 0;
    size_t size = 0;
    static char aligned[BYTES] __attribute__((aligned(4096)));
    REFUSED(pm_mem_alloc_host(&p, BYTES));
    REFUSED(pm_mem_host_alloc(&p, BYTES, PM_MEMHOSTALLOC_PORTABLE));
    CHECK(p == NULL);
    REFUSED(pm_mem_free_host(s->pinned));
    REFUSED(pm_mem_host_register(aligned, sizeof aligned, 0));
    REFUSED(pm_mem_host_unregister(s->registered));
    REFUSED(pm_mem_host_get_flags(&flags, s->pinned));
    REFUSED(pm_mem_host_get_device_pointer(&d, s->pinned, 0));
    REFUSED(pm_mem_get_address_range(&base, &size, (pm_deviceptr)(uintptr_t)s->pinned));
    /* It asks the driver about device memory, as cuPointerGetAttribute does. */
    REFUSED(pm_mem_check_access(s->device, BYTES, PM_ACCESS_READ, NULL, NULL));
    REFUSED(pm_mem_check_access((pm_deviceptr)(uintptr_t)s->pageable, BYTES, PM_ACCESS_READ,
                                NULL, NULL));
    REFUSED(pm_device_alloc(&d, BYTES));
    REFUSED(pm_device_free(s->device));
    REFUSED(pm_mem_invalidate(s->pageable, BYTES));
}

static void pool_calls(setting *s)
{
    void *p = NULL;
    pm_mem_pool_t pool = NULL;
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    REFUSED(pm_mem_pool_create(&pool, &props));
    REFUSED(pm_mem_pool_destroy(s->pool));
    REFUSED(pm_mem_pool_trim_to(s->pool, 0));
    unsigned long long threshold = 0;
    REFUSED(pm_mem_pool_get_attribute(s->pool, PM_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
    REFUSED(pm_mem_pool_set_attribute(s->pool, PM_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
    REFUSED(pm_mem_alloc_from_pool(&p, 4096, s->pool));
    REFUSED(pm_mem_alloc_from_pool_async(&p, 4096, s->pool, s->stream));
    REFUSED(pm_mem_alloc_from_pool_async(&p, 4096, s->pool, s->idle));
    CHECK(p == NULL);
    REFUSED(pm_mem_free(s->pooled));
    REFUSED(pm_mem_free_async(s->pooled, s->idle));
}

static void copy_calls(setting *s)
{
    pm_deviceptr host = (pm_deviceptr)(uintptr_t)s->pageable;
    pm_deviceptr pinned = (pm_deviceptr)(uintptr_t)s->pinned;
    size_t one = 4096;
    REFUSED(pm_memcpy_htod(s->device, s->pageable, 4096));
    REFUSED(pm_memcpy_htod(s->device, s->pinned, 4096));
    REFUSED(pm_memcpy_dtoh(s->pageable, s->device, 4096));
    REFUSED(pm_memcpy_htod_async(s->device, s->pageable, BYTES, s->stream));
    REFUSED(pm_memcpy_dtoh_async(s->pageable, s->device, BYTES, s->idle));
    REFUSED(pm_memcpy(s->device, host, BYTES));
    REFUSED(pm_memcpy_async(pinned, s->device, 4096, s->idle));
    REFUSED(pm_memcpy_batch_async(&s->device, &host, &one, 1, s->idle));
}

static void stream_and_event_calls(setting *s, bool on_legacy)
{
    pm_stream_t st = NULL;
    pm_event_t ev = NULL;
    REFUSED(pm_stream_create(&st));
    REFUSED(pm_stream_destroy(s->idle));
    REFUSED(pm_event_create(&ev));
    REFUSED(pm_event_destroy(s->done));
    REFUSED(pm_stream_synchronize(NULL));
    REFUSED(pm_stream_synchronize(PM_STREAM_LEGACY));
    REFUSED(pm_stream_synchronize(PM_STREAM_PER_THREAD));
    REFUSED(pm_event_record(s->done, NULL));
    REFUSED(pm_event_record(s->done, PM_STREAM_PER_THREAD));
    REFUSED(pm_stream_wait_event(NULL, s->done));
    REFUSED(pm_stream_launch_host_func(PM_STREAM_LEGACY, nested, s));
    /* Not the legacy stream: these go through, as the driver's do. */
    CHECK_RESULT(pm_stream_synchronize(s->idle), PM_SUCCESS);
    CHECK_RESULT(pm_event_query(s->done), PM_SUCCESS);
    CHECK_RESULT(pm_event_synchronize(s->done), PM_SUCCESS);
    CHECK_RESULT(pm_event_query(s->behind), PM_ERROR_NOT_READY);
    CHECK_RESULT(pm_stream_wait_event(s->idle, s->done), PM_SUCCESS);
    CHECK_RESULT(pm_stream_launch_host_func(s->idle, nested, s), PM_SUCCESS);
    if (on_legacy)
        REFUSED(pm_event_record(s->done, s->stream));
    else
        CHECK_RESULT(pm_event_record(s->done, s->stream), PM_SUCCESS);
}

/* Queries the driver refuses there (its default pool, devices), and
 * pinmem's own that may wait behind work waiting for the function; pinmem's
 * answers from what it holds still go through. */
static void query_calls(setting *s)
{
    pm_mem_pool_t pool = NULL;
    int count = 0;
    pm_device_info info = {.struct_size = sizeof info};
    pm_copy_config config = s->config;
    pm_copy_stats copies = {.struct_size = sizeof copies};
    pm_pool_stats pooled = {.struct_size = sizeof pooled};
    char json[512];
    size_t needed = 0;
    REFUSED(pm_mem_get_default_pool(&pool));
    REFUSED(pm_device_count(&count));
    REFUSED(pm_device_get_info(0, &info));
    REFUSED(pm_copy_get_config(&config));
    REFUSED(pm_copy_set_config(&config));
    REFUSED(pm_copy_get_stats(&copies));
    REFUSED(pm_mem_pool_get_stats(s->pool, &pooled));
    REFUSED(pm_mem_pool_stats_json(NULL, json, sizeof json, &needed));
    pm_setting setting = {.struct_size = sizeof setting};
    REFUSED(pm_get_setting(0, &setting));
    pm_capabilities caps = {.struct_size = sizeof caps};
    unsigned long long budget = 0;
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    CHECK_RESULT(pm_get_capabilities(&caps), PM_SUCCESS);
    CHECK_RESULT(pm_get_pinned_budget(&budget), PM_SUCCESS);
}

static bool legacy_case;
static atomic_int behind_recorded, calls_ran;

static void make_calls(void *arg)
{
    setting *s = arg;
    while (!atomic_load(&behind_recorded))
        usleep(100);
    memory_calls(s);
    pool_calls(s);
    copy_calls(s);
    query_calls(s);
    stream_and_event_calls(s, legacy_case);
    atomic_store(&calls_ran, 1);
}

/* What the function was handed is whole after it, and every call works. */
static void check_after(setting *s)
{
    unsigned flags = 0;
    CHECK_RESULT(pm_mem_host_get_flags(&flags, s->pinned), PM_SUCCESS);
    CHECK(flags == s->pinned_flags);
    CHECK_RESULT(pm_memcpy_htod(s->device, s->pinned, BYTES), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_dtoh(s->pageable, s->device, BYTES), PM_SUCCESS);
    CHECK(first_mismatch(s->pageable, BYTES, 5) == BYTES);
    CHECK_RESULT(pm_stream_synchronize(s->idle), PM_SUCCESS);
    CHECK(atomic_load(&s->nested_ran) == 1);
    CHECK_RESULT(pm_mem_free(s->pooled), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(s->pool), PM_SUCCESS);
    CHECK_RESULT(pm_mem_host_unregister(s->registered), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_host(s->pinned), PM_SUCCESS);
    CHECK_RESULT(pm_event_destroy(s->done), PM_SUCCESS);
    CHECK_RESULT(pm_event_destroy(s->behind), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(s->idle), PM_SUCCESS);
    if (s->stream)
        CHECK_RESULT(pm_stream_destroy(s->stream), PM_SUCCESS);
    CHECK_RESULT(pm_device_free(s->device), PM_SUCCESS);
}

/* How the function is queued: pinmem's call, or the driver's as another
 * library would call it (CUDA only; pinmem's streams are the driver's). */
typedef enum launcher { BY_PINMEM, BY_DRIVER } launcher;

static pm_result launch(launcher by, pm_stream_t stream, void (*fn)(void *), void *arg)
{
#ifdef PINMEM_HAVE_CUDA_HEADERS
    if (by == BY_DRIVER)
        return drv.launch_host_func((CUstream)stream, fn, arg) == CUDA_SUCCESS ? PM_SUCCESS
                                                                               : PM_ERROR_UNKNOWN;
#endif
    (void)by;
    return pm_stream_launch_host_func(stream, fn, arg);
}

static void in_host_function(bool on_legacy, launcher by)
{
    setting s = {0};
    SCOPED_MALLOC void *registered = aligned_alloc(4096, BYTES);
    SCOPED_MALLOC uint8_t *pageable = malloc(BYTES);
    REQUIRE(registered && pageable);
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    if (!on_legacy)
        REQUIRE_RESULT(pm_stream_create(&s.stream), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&s.idle), PM_SUCCESS);
    REQUIRE_RESULT(pm_event_create(&s.done), PM_SUCCESS);
    REQUIRE_RESULT(pm_event_create(&s.behind), PM_SUCCESS);
    REQUIRE_PINNED(pm_mem_host_alloc(&s.pinned, BYTES, PM_MEMHOSTALLOC_PORTABLE), "64 KiB");
    REQUIRE_PINNED(pm_mem_host_register(registered, BYTES, 0), "64 KiB");
    s.registered = registered;
    REQUIRE_RESULT(pm_mem_pool_create(&s.pool, &props), PM_SUCCESS);
    REQUIRE_PINNED(pm_mem_alloc_from_pool(&s.pooled, 4096, s.pool), "a pool's chunk");
    s.device = device_alloc(BYTES);
    REQUIRE(s.device);
    s.pageable = pageable;
    fill(s.pinned, BYTES, 5);
    REQUIRE_RESULT(pm_mem_host_get_flags(&s.pinned_flags, s.pinned), PM_SUCCESS);
    s.config.struct_size = sizeof s.config;
    REQUIRE_RESULT(pm_copy_get_config(&s.config), PM_SUCCESS);
    REQUIRE_RESULT(pm_event_record(s.done, s.stream), PM_SUCCESS);
    REQUIRE_RESULT(pm_event_synchronize(s.done), PM_SUCCESS);

    legacy_case = on_legacy;
    atomic_store(&calls_ran, 0);
    atomic_store(&behind_recorded, 0);
    REQUIRE_RESULT(launch(by, s.stream, make_calls, &s), PM_SUCCESS);
    pm_result recorded = pm_event_record(s.behind, s.stream);
    atomic_store(&behind_recorded, 1); /* the function goes on however the record went */
    REQUIRE_RESULT(recorded, PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_synchronize(s.stream), PM_SUCCESS);
    CHECK(atomic_load(&calls_ran) == 1);
    check_after(&s);
}

/* A change of the copy engine's shape, asked inside a host function while
 * a copy on the function's stream waits for it: the change would wait for
 * the copy, and the copy for the function, for ever. */
static pm_result change_inside;

static void change_engine(void *arg)
{
    pm_copy_config c = *(pm_copy_config *)arg;
    usleep(50 * 1000); /* the copy below is under way by then */
    c.buffers = c.buffers == 8 ? 6 : 8;
    change_inside = pm_copy_set_config(&c);
}

static void engine_change_while_copy_waits(void)
{
    enum { COPY = 16 << 20 };
    pm_stream_t stream = NULL;
    pm_copy_config config = {.struct_size = sizeof config};
    SCOPED_MALLOC uint8_t *pageable = malloc(COPY);
    pm_deviceptr device = device_alloc(COPY);
    REQUIRE(pageable && device);
    REQUIRE_RESULT(pm_copy_get_config(&config), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&stream), PM_SUCCESS);
    fill(pageable, COPY, 9);
    REQUIRE_RESULT(pm_stream_launch_host_func(stream, change_engine, &config), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_htod_async(device, pageable, COPY, stream), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(stream), PM_SUCCESS);
    CHECK_RESULT(change_inside, PM_ERROR_NOT_PERMITTED);
    memset(pageable, 0, COPY);
    CHECK_RESULT(pm_memcpy_dtoh(pageable, device, COPY), PM_SUCCESS);
    CHECK(first_mismatch(pageable, COPY, 9) == COPY);
    CHECK_RESULT(pm_stream_destroy(stream), PM_SUCCESS);
    CHECK_RESULT(pm_device_free(device), PM_SUCCESS);
}

/* Two threads copy pageable memory on their own streams, which the driver
 * keeps apart: a host function on the first one's stream, queued before its
 * copy, waits for an event the second records after its own copy. The
 * second copy must not run on the lane the first one left still waiting
 * for that function (the test hung: its alarm ends it). */
typedef struct apart {
    pm_event_t second_done;
    pm_deviceptr device[2];
    uint8_t *pageable[2];
    atomic_int recorded, first_copied;
    pm_result waited;
} apart;

/* Two slices, staged. */
enum { APART_BYTES = 1 << 20 };

static void wait_for_second(void *arg)
{
    apart *a = arg;
    while (!atomic_load(&a->recorded))
        usleep(1000);
    a->waited = pm_event_synchronize(a->second_done); /* permitted here */
}

static void *first_thread(void *arg)
{
    apart *a = arg;
    CHECK_RESULT(pm_stream_launch_host_func(PM_STREAM_PER_THREAD, wait_for_second, a),
                 PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_htod_async(a->device[0], a->pageable[0], APART_BYTES,
                                      PM_STREAM_PER_THREAD), PM_SUCCESS);
    atomic_store(&a->first_copied, 1);
    CHECK_RESULT(pm_stream_synchronize(PM_STREAM_PER_THREAD), PM_SUCCESS);
    return NULL;
}

static void *second_thread(void *arg)
{
    apart *a = arg;
    CHECK_RESULT(pm_memcpy_htod_async(a->device[1], a->pageable[1], APART_BYTES,
                                      PM_STREAM_PER_THREAD), PM_SUCCESS);
    CHECK_RESULT(pm_event_record(a->second_done, PM_STREAM_PER_THREAD), PM_SUCCESS);
    atomic_store(&a->recorded, 1);
    CHECK_RESULT(pm_event_synchronize(a->second_done), PM_SUCCESS);
    return NULL;
}

static void own_streams_stay_apart(void)
{
    /* The staging buffers are shared: where the ring holds too few for each
     * copy to have its own (four of 512 KiB under an 8 MiB memlock limit),
     * the second copy waits for a buffer the first one's DMAs hold. */
    pm_copy_stats ring = {.struct_size = sizeof ring};
    REQUIRE_RESULT(pm_copy_get_stats(&ring), PM_SUCCESS);
    if (ring.ring_buffers < 4 || ring.ring_buffer_bytes < APART_BYTES) {
        printf("own streams apart: skipped: the staging ring (%u x %llu bytes) is too small to "
               "keep two copies' buffers apart\n", ring.ring_buffers, ring.ring_buffer_bytes);
        return;
    }
    apart a = {.waited = PM_ERROR_UNKNOWN};
    SCOPED_MALLOC uint8_t *first = malloc(APART_BYTES), *second = malloc(APART_BYTES);
    a.device[0] = device_alloc(APART_BYTES);
    a.device[1] = device_alloc(APART_BYTES);
    REQUIRE(first && second && a.device[0] && a.device[1]);
    fill(first, APART_BYTES, 21);
    fill(second, APART_BYTES, 22);
    a.pageable[0] = first;
    a.pageable[1] = second;
    REQUIRE_RESULT(pm_event_create(&a.second_done), PM_SUCCESS);
    pthread_t t1, t2;
    REQUIRE(pthread_create(&t1, NULL, first_thread, &a) == 0);
    while (!atomic_load(&a.first_copied))
        usleep(1000);
    REQUIRE(pthread_create(&t2, NULL, second_thread, &a) == 0);
    pthread_join(t2, NULL);
    pthread_join(t1, NULL);
    CHECK_RESULT(a.waited, PM_SUCCESS);
    for (int i = 0; i < 2; i++) {
        memset(a.pageable[i], 0, APART_BYTES);
        CHECK_RESULT(pm_memcpy_dtoh(a.pageable[i], a.device[i], APART_BYTES), PM_SUCCESS);
        CHECK(first_mismatch(a.pageable[i], APART_BYTES, (unsigned)(21 + i)) == APART_BYTES);
        CHECK_RESULT(pm_device_free(a.device[i]), PM_SUCCESS);
    }
    CHECK_RESULT(pm_event_destroy(a.second_done), PM_SUCCESS);
}

/* A host function records the event another thread synchronizes with
 * behind it, which the driver lets through: the record must not wait for
 * that synchronization (the test hung: its alarm ends it), and the wait
 * ends once the function has returned. */
typedef struct rerecord {
    pm_event_t event;
    pm_stream_t other;
    atomic_int waiting;
    pm_result recorded, waited;
} rerecord;

static void record_while_waited(void *arg)
{
    rerecord *r = arg;
    while (!atomic_load(&r->waiting))
        usleep(1000);
    usleep(20000); /* the waiter into its synchronization */
    r->recorded = pm_event_record(r->event, r->other);
}

static void *synchronize_event(void *arg)
{
    rerecord *r = arg;
    atomic_store(&r->waiting, 1);
    r->waited = pm_event_synchronize(r->event);
    return NULL;
}

static void record_of_a_waited_event(void)
{
    rerecord r = {.recorded = PM_ERROR_UNKNOWN, .waited = PM_ERROR_UNKNOWN};
    pm_stream_t stream;
    REQUIRE_RESULT(pm_stream_create(&stream), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&r.other), PM_SUCCESS);
    REQUIRE_RESULT(pm_event_create(&r.event), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_launch_host_func(stream, record_while_waited, &r), PM_SUCCESS);
    REQUIRE_RESULT(pm_event_record(r.event, stream), PM_SUCCESS);
    pthread_t waiter;
    REQUIRE(pthread_create(&waiter, NULL, synchronize_event, &r) == 0);
    pthread_join(waiter, NULL);
    CHECK_RESULT(pm_stream_synchronize(stream), PM_SUCCESS);
    CHECK_RESULT(r.recorded, PM_SUCCESS);
    CHECK_RESULT(r.waited, PM_SUCCESS);
    CHECK_RESULT(pm_event_synchronize(r.event), PM_SUCCESS); /* the point recorded inside */
    CHECK_RESULT(pm_event_destroy(r.event), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(r.other), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(stream), PM_SUCCESS);
}

/* A block freed on stream a before a host function that waits for stream
 * b is reusable on b without waiting for that function, as the driver's
 * pools make it: the pool (room for one block) hands it to b, and the event
 * the function waits for, recorded on b after that allocation, completes
 * (the test hung: its alarm ends it). The function waits for an event, not
 * for another host function: the driver may run them on one thread. */
typedef struct reuse_apart {
    pm_event_t b_done;
    atomic_int recorded;
    pm_result waited;
} reuse_apart;

static void wait_for_b(void *arg)
{
    reuse_apart *r = arg;
    while (!atomic_load(&r->recorded))
        usleep(1000);
    r->waited = pm_event_synchronize(r->b_done); /* permitted here */
}

/* legacy: the free on the legacy stream and the function on the thread's
 * own, which the driver orders behind the legacy stream's work; else both
 * on one stream of their own. */
static void free_before_a_waiting_function(bool legacy)
{
    enum { BLOCK = 1 << 20 };
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}, .max_size = BLOCK};
    pm_mem_pool_t pool = NULL;
    pm_stream_t a = NULL, b = NULL;
    reuse_apart r = {.waited = PM_ERROR_UNKNOWN};
    REQUIRE_RESULT(pm_mem_pool_create(&pool, &props), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&a), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&b), PM_SUCCESS);
    REQUIRE_RESULT(pm_event_create(&r.b_done), PM_SUCCESS);
    pm_stream_t freed_on = legacy ? PM_STREAM_LEGACY : a;
    pm_stream_t function_on = legacy ? PM_STREAM_PER_THREAD : a;
    void *first = NULL, *second = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool_async(&first, BLOCK, pool, freed_on), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_async(first, freed_on), PM_SUCCESS);
    CHECK_RESULT(pm_stream_launch_host_func(function_on, wait_for_b, &r), PM_SUCCESS);
    CHECK_RESULT(pm_mem_alloc_from_pool_async(&second, BLOCK, pool, b), PM_SUCCESS);
    CHECK(second == first); /* the one block there is */
    CHECK_RESULT(pm_event_record(r.b_done, b), PM_SUCCESS);
    atomic_store(&r.recorded, 1);
    CHECK_RESULT(pm_stream_synchronize(b), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(function_on), PM_SUCCESS);
    CHECK_RESULT(r.waited, PM_SUCCESS);
    if (second)
        CHECK_RESULT(pm_mem_free(second), PM_SUCCESS);
    CHECK_RESULT(pm_event_destroy(r.b_done), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(a), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(b), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* A block freed on a behind a host function that waits for b: the driver
 * makes an allocation on b wait for that free only once it cannot pin
 * more (REUSE_ALLOW_INTERNAL_DEPENDENCIES), so where it can, b's allocation
 * gets other memory and the event the function waits for completes (the
 * test hung: its alarm ends it). */
static void free_behind_a_waiting_function(void)
{
    enum { BLOCK = 2 << 20 };
    NEED_PINNABLE((size_t)64 << 20); /* a whole chunk, then more */
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    pm_stream_t a = NULL, b = NULL;
    reuse_apart r = {.waited = PM_ERROR_UNKNOWN};
    REQUIRE_RESULT(pm_stream_create(&a), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&b), PM_SUCCESS);
    REQUIRE_RESULT(pm_event_create(&r.b_done), PM_SUCCESS);
    void *first = NULL, *rest = NULL, *second = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool_async(&first, BLOCK, pool, a), PM_SUCCESS);
    pm_pool_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_mem_pool_get_stats(pool, &st), PM_SUCCESS);
    if (st.reserved > BLOCK) /* the rest of the chunk: b's block must come from a new one */
        REQUIRE_RESULT(pm_mem_alloc_from_pool_async(&rest, st.reserved - BLOCK, pool, a),
                       PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(a), PM_SUCCESS);
    CHECK_RESULT(pm_stream_launch_host_func(a, wait_for_b, &r), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_async(first, a), PM_SUCCESS);
    CHECK_RESULT(pm_mem_alloc_from_pool_async(&second, BLOCK, pool, b), PM_SUCCESS);
    CHECK(second != first);
    CHECK_RESULT(pm_event_record(r.b_done, b), PM_SUCCESS);
    atomic_store(&r.recorded, 1);
    CHECK_RESULT(pm_stream_synchronize(b), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(a), PM_SUCCESS);
    CHECK_RESULT(r.waited, PM_SUCCESS);
    if (second)
        CHECK_RESULT(pm_mem_free(second), PM_SUCCESS);
    if (rest)
        CHECK_RESULT(pm_mem_free(rest), PM_SUCCESS);
    CHECK_RESULT(pm_event_destroy(r.b_done), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(a), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(b), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

#ifdef PINMEM_HAVE_CUDA_HEADERS
static pm_result first_init, first_alloc;

static void CUDA_CB first_calls(void *unused)
{
    (void)unused;
    void *p = NULL;
    first_init = pm_init(0);
    if (first_init != PM_SUCCESS && !strstr(pm_last_error_detail(), "inside a host function") &&
        check_failed_())
        fprintf(stderr, "pm_init refused with the detail: %s\n", pm_last_error_detail());
    first_alloc = pm_mem_host_alloc(&p, BYTES, 0);
}

/* In a process that has not called pinmem: its first call, made inside a
 * host function the driver runs, is refused without starting pinmem; the
 * next, outside, starts it on the backend asked for. */
static void first_call_in_drivers_host_function(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    if (!driver_api_load() || drv.init(0) != CUDA_SUCCESS ||
        drv.device_get(&dev, 0) != CUDA_SUCCESS || drv.primary_retain(&ctx, dev) != CUDA_SUCCESS ||
        drv.push(ctx) != CUDA_SUCCESS) {
        printf("first call in a driver's host function: skipped: no CUDA driver\n");
        return;
    }
    REQUIRE(drv.stream_create(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    REQUIRE(drv.launch_host_func(stream, first_calls, NULL) == CUDA_SUCCESS);
    REQUIRE(drv.stream_synchronize(stream) == CUDA_SUCCESS);
    CHECK_RESULT(first_init, PM_ERROR_NOT_PERMITTED);
    CHECK_RESULT(first_alloc, PM_ERROR_NOT_PERMITTED);
    REQUIRE_RESULT(pm_init(0), PM_SUCCESS);
    const char *asked = getenv("PINMEM_BACKEND");
    CHECK(on_backend(asked && strcmp(asked, "posix") == 0 ? "posix" : "cuda"));
    void *p = NULL;
    CHECK_RESULT(pm_mem_host_alloc(&p, BYTES, 0), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_host(p), PM_SUCCESS);
    drv.stream_destroy(stream);
    printf("first call in a driver's host function: refused, then started outside\n");
}

static int in_fresh_process(void *unused)
{
    (void)unused;
    first_call_in_drivers_host_function();
    return check_failures != 0;
}
#endif

int main(void)
{
#ifdef PINMEM_HAVE_CUDA_HEADERS
    /* Before this process calls pinmem: the child's first call must be its first. */
    CHECK(in_child(in_fresh_process, NULL, 60) == 0);
#endif
    alarm(120); /* a call that waits for its own host function fails the test */
    in_host_function(false, BY_PINMEM);
    in_host_function(true, BY_PINMEM);
    engine_change_while_copy_waits();
    own_streams_stay_apart();
    record_of_a_waited_event();
    free_before_a_waiting_function(false);
    free_before_a_waiting_function(true);
    free_behind_a_waiting_function();
#ifdef PINMEM_HAVE_CUDA_HEADERS
    if (on_backend("cuda") && driver_api_load()) {
        in_host_function(false, BY_DRIVER);
        printf("calls in a host function the driver's cuLaunchHostFunc queued: as the driver's\n");
    } else {
        printf("calls in a host function the driver queued: skipped: no CUDA driver\n");
    }
#endif
    return check_finish("host_func_calls");
}
