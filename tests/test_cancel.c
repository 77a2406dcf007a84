/* pthread_cancel (pinmem.h, "Threads"): pinmem's calls are not cancellation
 * points. A thread cancelled while a call waits (for a stream, an event, a
 * staged copy, its own worker threads) finishes that call, which returns its
 * usual answer, and is cancelled at its next cancellation point after it:
 * nothing stays locked, half made or leaked, and other threads' calls go on.
 * Each case runs in a child that a watchdog ends, so a lock left held fails
 * the case instead of stalling the test. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#if defined(__has_include)
#if __has_include(<sanitizer/asan_interface.h>)
#include <sanitizer/asan_interface.h>
#endif
#endif
#ifndef ASAN_UNPOISON_MEMORY_REGION
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#endif

#include "check.h"
#include "child.h"
#include "copy_util.h"
#include "stream_util.h"

/* AddressSanitizer: the frames a cancellation unwinds keep their redzones,
 * and its own code at the thread's exit runs over them; so a cancelled
 * thread's last cleanup clears its stack. */
static void unpoison_own_stack(void *unused)
{
    (void)unused;
    pthread_attr_t attr;
    void *addr = NULL;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) != 0)
        return;
    if (pthread_attr_getstack(&attr, &addr, &size) == 0)
        ASAN_UNPOISON_MEMORY_REGION(addr, size);
    pthread_attr_destroy(&attr);
}

static bool joined_cancelled(pthread_t t)
{
    void *ret = NULL;
    return pthread_join(t, &ret) == 0 && ret == PTHREAD_CANCELED;
}

/* One call made by a thread that is cancelled while the call waits. */
typedef struct waiter {
    pm_result (*call)(struct waiter *);
    pm_stream_t stream;
    pm_event_t event;
    pm_deviceptr device;
    uint8_t *host;
    size_t bytes;
    atomic_int started;
    atomic_int result; /* -1 until the call returned */
} waiter;

static void *call_then_testcancel(void *arg)
{
    waiter *w = arg;
    pthread_cleanup_push(unpoison_own_stack, NULL);
    atomic_store(&w->started, 1);
    atomic_store(&w->result, (int)w->call(w));
    pthread_testcancel();
    pthread_cleanup_pop(0);
    return NULL;
}

static pm_result synchronize_stream(waiter *w) { return pm_stream_synchronize(w->stream); }
static pm_result synchronize_event(waiter *w) { return pm_event_synchronize(w->event); }
static pm_result copy_to_device(waiter *w)
{
    return pm_memcpy_htod(w->device, w->host, w->bytes);
}

/* Cancels w's thread while its call waits at the gate, then opens the gate:
 * the call must have returned SUCCESS and the thread ended cancelled. */
static void cancel_at_gate(waiter *w)
{
    atomic_store(&w->result, -1);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, call_then_testcancel, w) == 0);
    while (!atomic_load(&w->started))
        usleep(100);
    usleep(20000); /* long enough to be waiting inside the call */
    CHECK(pthread_cancel(t) == 0);
    usleep(20000);
    atomic_store(&gate_open, 1);
    CHECK(joined_cancelled(t));
    CHECK(atomic_load(&w->result) == PM_SUCCESS);
}

static int stream_synchronize_cancelled(void *unused)
{
    (void)unused;
    waiter w = {.call = synchronize_stream};
    REQUIRE_RESULT_OR(pm_stream_create(&w.stream), PM_SUCCESS, 1);
    CHECK_RESULT(pm_stream_launch_host_func(w.stream, wait_gate, NULL), PM_SUCCESS);
    cancel_at_gate(&w);
    CHECK_RESULT(pm_stream_synchronize(w.stream), PM_SUCCESS);
    CHECK_RESULT(pm_stream_launch_host_func(w.stream, mark_a_done, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(w.stream), PM_SUCCESS);
    CHECK(atomic_load(&a_done) == 1);
    CHECK_RESULT(pm_stream_destroy(w.stream), PM_SUCCESS);
    return check_finish("cancel: pm_stream_synchronize");
}

static int event_synchronize_cancelled(void *unused)
{
    (void)unused;
    waiter w = {.call = synchronize_event};
    REQUIRE_RESULT_OR(pm_stream_create(&w.stream), PM_SUCCESS, 1);
    CHECK_RESULT(pm_event_create(&w.event), PM_SUCCESS);
    CHECK_RESULT(pm_stream_launch_host_func(w.stream, wait_gate, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_event_record(w.event, w.stream), PM_SUCCESS);
    cancel_at_gate(&w);
    CHECK_RESULT(pm_event_query(w.event), PM_SUCCESS);
    CHECK_RESULT(pm_event_record(w.event, w.stream), PM_SUCCESS);
    CHECK_RESULT(pm_event_synchronize(w.event), PM_SUCCESS);
    CHECK_RESULT(pm_event_destroy(w.event), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(w.stream), PM_SUCCESS);
    return check_finish("cancel: pm_event_synchronize");
}

/* A synchronous copy from pageable memory first waits for the legacy stream. */
static int copy_cancelled_behind_stream(void *unused)
{
    (void)unused;
    enum { BYTES = 8 << 20 };
    waiter w = {.call = copy_to_device, .bytes = BYTES};
    SCOPED_MALLOC uint8_t *host = malloc(BYTES);
    SCOPED_MALLOC uint8_t *back = malloc(BYTES);
    SCOPED_DEVICE pm_deviceptr device = device_alloc(BYTES);
    REQUIRE_OR(host && back && device, 1);
    fill(host, BYTES, 1);
    w.host = host;
    w.device = device;
    CHECK_RESULT(pm_stream_launch_host_func(NULL, wait_gate, NULL), PM_SUCCESS);
    cancel_at_gate(&w);
    CHECK_RESULT(pm_memcpy_dtoh(back, device, BYTES), PM_SUCCESS);
    CHECK(first_mismatch(back, BYTES, 1) == BYTES);
    return check_finish("cancel: a copy waiting for its stream");
}

/* The queries a thread may make with a cancellation request pending: each
 * reads files or the driver on some path (the first copy statistics plan
 * the ring, which reads the memlock limit's use from /proc), and the copy
 * settings' gate and the pool's lock are held meanwhile. */
typedef struct querier {
    pm_mem_pool_t pool;
    void *pinned;
    atomic_int calls_returned;
} querier;

static void *query_with_cancel_pending(void *arg)
{
    querier *q = arg;
    pthread_cleanup_push(unpoison_own_stack, NULL);
    int old;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    while (!atomic_load(&gate_open)) /* the main thread's request comes meanwhile */
        usleep(1000);
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, &old);
    pm_capabilities caps = {.struct_size = sizeof caps};
    pm_device_info info = {.struct_size = sizeof info};
    pm_copy_config config = {.struct_size = sizeof config};
    pm_setting setting = {.struct_size = sizeof setting};
    pm_copy_stats copy_stats = {.struct_size = sizeof copy_stats};
    pm_pool_stats pool_stats = {.struct_size = sizeof pool_stats};
    int count;
    unsigned flags;
    unsigned long long budget;
    uint64_t high;
    pm_deviceptr base, dptr;
    size_t size, needed;
    char json[4096];
    const pm_result results[] = {
        pm_init(0),
        pm_get_capabilities(&caps),
        pm_device_count(&count),
        pm_device_get_info(0, &info),
        pm_copy_get_config(&config),
        pm_get_setting(0, &setting),
        pm_copy_get_stats(&copy_stats),
        pm_mem_pool_get_stats(q->pool, &pool_stats),
        pm_mem_pool_stats_json(q->pool, json, sizeof json, &needed),
        pm_mem_pool_get_attribute(q->pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH, &high),
        pm_get_pinned_budget(&budget),
        pm_mem_host_get_flags(&flags, q->pinned),
        pm_mem_host_get_device_pointer(&dptr, q->pinned, 0),
        pm_mem_get_address_range(&base, &size, (pm_deviceptr)(uintptr_t)q->pinned),
    };
    int good = 0;
    for (size_t i = 0; i < sizeof results / sizeof results[0]; i++)
        good += results[i] == PM_SUCCESS;
    atomic_store(&q->calls_returned, good);
    pthread_testcancel();
    pthread_cleanup_pop(0);
    return NULL;
}

/* A request pending before the calls: every call returns, and what they
 * locked stays usable (a setting change and a trim hung before). */
static int queries_with_cancel_pending(void *unused)
{
    (void)unused;
    /* The memlock limit's use is read from /proc only where the limit is finite. */
    struct rlimit limit;
    if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0 && limit.rlim_cur == RLIM_INFINITY) {
        limit.rlim_cur = 256 << 20;
        setrlimit(RLIMIT_MEMLOCK, &limit);
    }
    querier q = {.calls_returned = -1};
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    REQUIRE_RESULT_OR(pm_mem_pool_create(&q.pool, &props), PM_SUCCESS, 1);
    REQUIRE_RESULT_OR(pm_mem_host_alloc(&q.pinned, 4096, 0), PM_SUCCESS, 1);
    void *block = NULL;
    CHECK_RESULT(pm_mem_alloc_from_pool(&block, 100, q.pool), PM_SUCCESS);
    pthread_t t;
    REQUIRE_OR(pthread_create(&t, NULL, query_with_cancel_pending, &q) == 0, 1);
    CHECK(pthread_cancel(t) == 0);
    atomic_store(&gate_open, 1);
    CHECK(joined_cancelled(t));
    CHECK(atomic_load(&q.calls_returned) == 14);
    pm_copy_config config = {.struct_size = sizeof config};
    CHECK_RESULT(pm_copy_get_config(&config), PM_SUCCESS);
    CHECK_RESULT(pm_copy_set_config(&config), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(block), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_trim_to(q.pool, 0), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(q.pool), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_host(q.pinned), PM_SUCCESS);
    return check_finish("cancel: queries with a request pending");
}

/* A thread that copies, allocates and registers in a loop until cancelled;
 * what a step holds between calls lies in held, which the main thread
 * releases once the thread is gone. */
typedef struct held {
    unsigned seed;
    size_t bytes;
    uint8_t *pageable, *back;
    void *to_register; /* page-aligned, 256 KiB */
    pm_deviceptr device;
    pm_stream_t stream;
    pm_event_t event;
    void *host;
    void *registered;
    pm_mem_pool_t pool;
    void *pooled;
    atomic_long rounds;
    atomic_int failures;
} held;

static void note(held *h, pm_result r)
{
    if (r != PM_SUCCESS && atomic_fetch_add(&h->failures, 1) < 5)
        fprintf(stderr, "a call gave %s (%s)\n", pm_result_name(r), pm_last_error_detail());
}

static void copy_steps(held *h)
{
    note(h, pm_memcpy_htod(h->device, h->pageable, h->bytes));
    pthread_testcancel();
    note(h, pm_memcpy_dtoh(h->back, h->device, h->bytes));
    pthread_testcancel();
    note(h, pm_memcpy_dtoh_async(h->back, h->device, h->bytes / 2, h->stream));
    pthread_testcancel();
    note(h, pm_event_record(h->event, h->stream));
    pthread_testcancel();
    note(h, pm_event_synchronize(h->event));
    pthread_testcancel();
    note(h, pm_memcpy(h->device + 4096, (pm_deviceptr)(uintptr_t)h->pageable, h->bytes - 4096));
    pthread_testcancel();
    note(h, pm_stream_synchronize(h->stream));
    pthread_testcancel();
}

static void memory_steps(held *h)
{
    enum { SMALL = 256 << 10 };
    note(h, pm_mem_host_alloc(&h->host, SMALL, PM_MEMHOSTALLOC_PORTABLE));
    pthread_testcancel();
    note(h, pm_mem_free_host(h->host));
    h->host = NULL;
    pthread_testcancel();
    note(h, pm_mem_host_register(h->to_register, SMALL, 0));
    h->registered = h->to_register;
    pthread_testcancel();
    note(h, pm_mem_host_unregister(h->registered));
    h->registered = NULL;
    pthread_testcancel();
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    note(h, pm_mem_pool_create(&h->pool, &props));
    pthread_testcancel();
    note(h, pm_mem_alloc_from_pool_async(&h->pooled, SMALL, h->pool, h->stream));
    pthread_testcancel();
    note(h, pm_mem_free_async(h->pooled, h->stream));
    h->pooled = NULL;
    pthread_testcancel();
    note(h, pm_mem_pool_destroy(h->pool));
    h->pool = NULL;
    pthread_testcancel();
}

static void *loop_until_cancelled(void *arg)
{
    held *h = arg;
    pthread_cleanup_push(unpoison_own_stack, NULL);
    for (;;) {
        copy_steps(h);
        memory_steps(h);
        atomic_fetch_add(&h->rounds, 1);
    }
    pthread_cleanup_pop(0);
    return NULL;
}

/* Whatever the cancelled thread held between two calls. */
static void release_held(held *h)
{
    if (h->pooled)
        CHECK_RESULT(pm_mem_free(h->pooled), PM_SUCCESS);
    if (h->pool)
        CHECK_RESULT(pm_mem_pool_destroy(h->pool), PM_SUCCESS);
    if (h->host)
        CHECK_RESULT(pm_mem_free_host(h->host), PM_SUCCESS);
    if (h->registered)
        CHECK_RESULT(pm_mem_host_unregister(h->registered), PM_SUCCESS);
    h->pooled = h->pool = NULL;
    h->host = h->registered = NULL;
}

/* Page-locked memory is given back once nothing holds it; a destroyed pool's
 * by the reaper, so this waits for it a while. */
static bool locked_back_to(unsigned long long baseline)
{
    for (int i = 0; i < 200 && locked_kib() > baseline; i++)
        usleep(10000);
    return locked_kib() <= baseline;
}

static int cancelled_at_random(void *unused)
{
    (void)unused;
    const size_t bytes = UNDER_TSAN ? 1 << 20 : 8 << 20;
    const int rounds = UNDER_TSAN ? 60 : 400;
    held h = {.bytes = bytes};
    SCOPED_MALLOC uint8_t *pageable = malloc(bytes);
    SCOPED_MALLOC uint8_t *back = malloc(bytes);
    SCOPED_MALLOC void *to_register = aligned_alloc(4096, 256 << 10);
    SCOPED_DEVICE pm_deviceptr device = device_alloc(bytes);
    SCOPED_STREAM pm_stream_t stream = NULL;
    REQUIRE_OR(pageable && back && to_register && device, 1);
    REQUIRE_RESULT_OR(pm_stream_create(&stream), PM_SUCCESS, 1);
    REQUIRE_RESULT_OR(pm_event_create(&h.event), PM_SUCCESS, 1);
    fill(pageable, bytes, 7);
    h.pageable = pageable;
    h.back = back;
    h.to_register = to_register;
    h.device = device;
    h.stream = stream;

    /* The engine, the ring and the default pool are made before the baseline;
     * a round's time spreads the cancellations over every step of the next. */
    copy_steps(&h);
    memory_steps(&h);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    copy_steps(&h);
    memory_steps(&h);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long round_us = (t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000;
    unsigned long long baseline = locked_kib();
    uint64_t random = 0x9E3779B97F4A7C15ull;
    long total = 0;
    for (int i = 0; i < rounds && !check_failures; i++) {
        atomic_store(&h.rounds, 0);
        pthread_t t;
        REQUIRE_OR(pthread_create(&t, NULL, loop_until_cancelled, &h) == 0, 1);
        usleep((useconds_t)(xorshift64(&random) % (uint64_t)(2 * round_us + 1)));
        CHECK(pthread_cancel(t) == 0);
        CHECK(joined_cancelled(t));
        total += atomic_load(&h.rounds);
        release_held(&h);
        /* Whatever the thread was doing, the stream and the engine still work. */
        CHECK_RESULT(pm_stream_synchronize(stream), PM_SUCCESS);
    }
    CHECK(atomic_load(&h.failures) == 0);
    memset(back, 0, bytes);
    CHECK_RESULT(pm_memcpy_htod(device, pageable, bytes), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_dtoh(back, device, bytes), PM_SUCCESS);
    CHECK(first_mismatch(back, bytes, 7) == bytes);
    CHECK_RESULT(pm_event_destroy(h.event), PM_SUCCESS);
    CHECK(locked_back_to(baseline));
    printf("%d threads cancelled after %ld rounds in all\n", rounds, total);
    return check_finish("cancel: copies, allocations and registrations at random");
}

static const struct {
    const char *name;
    int (*body)(void *);
    unsigned watchdog_s;
} cases[] = {
    {"stream_synchronize", stream_synchronize_cancelled, 30},
    {"event_synchronize", event_synchronize_cancelled, 30},
    {"copy_behind_stream", copy_cancelled_behind_stream, 30},
    {"queries_pending", queries_with_cancel_pending, 30},
    {"at_random", cancelled_at_random, 240},
};

/* Every case, or the one named. */
int main(int argc, char **argv)
{
    int failed = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (argc < 2 || strcmp(argv[1], cases[i].name) == 0)
            failed |= in_child(cases[i].body, NULL, cases[i].watchdog_s) != 0;
    printf("cancel: %s\n", failed ? "some cases failed" : "all cases passed");
    return failed;
}
