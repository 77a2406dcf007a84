/* Calls inside a host function (pinmem.h, pm_stream_launch_host_func) answer
 * as the driver's did there (H200, driver 580, bench/probe/host_func_calls.c;
 * docs/driver-behavior.md): every call that allocates, frees, registers,
 * asks about or copies memory, makes or destroys a stream, event or pool, or
 * uses the legacy or per-thread default stream is refused with
 * NOT_PERMITTED, and changes nothing; waits for and records on other
 * streams, event queries and further host functions go through. The
 * function runs on a stream of its own and on the legacy stream; after it,
 * every call works again on that thread and the objects it was handed are
 * whole. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "copy_util.h"

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

static void in_host_function(bool on_legacy)
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
    REQUIRE_RESULT(pm_event_record(s.done, s.stream), PM_SUCCESS);
    REQUIRE_RESULT(pm_event_synchronize(s.done), PM_SUCCESS);

    legacy_case = on_legacy;
    atomic_store(&calls_ran, 0);
    atomic_store(&behind_recorded, 0);
    REQUIRE_RESULT(pm_stream_launch_host_func(s.stream, make_calls, &s), PM_SUCCESS);
    pm_result recorded = pm_event_record(s.behind, s.stream);
    atomic_store(&behind_recorded, 1); /* the function goes on however the record went */
    REQUIRE_RESULT(recorded, PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_synchronize(s.stream), PM_SUCCESS);
    CHECK(atomic_load(&calls_ran) == 1);
    check_after(&s);
}

int main(void)
{
    alarm(120); /* a call that waits for its own host function fails the test */
    in_host_function(false);
    in_host_function(true);
    return check_finish("host_func_calls");
}
