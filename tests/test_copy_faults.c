/* The staging engine when a wait for a staging buffer's DMA fails (a driver
 * refuses waits on a thread while another thread captures a graph, for
 * one): the buffer may still be read or written by that DMA, so no copy may
 * write into it or give it to another copy as free, and a copy that could
 * not wait fails rather than report bytes it did not move. And when the flag
 * written behind a DMA is not: the wait falls back on the marker. Streams
 * held behind a gate keep the DMAs queued for as long as each case needs. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "copy_util.h"
#include "test_hooks.h"
#include "threads.h"

/* One buffer of one slice: every staged copy of N bytes uses the same
 * buffer, and only its caller runs it. */
enum { N = 16 << 10 };

typedef struct gate {
    atomic_int open;
} gate;

static void wait_at(void *arg)
{
    gate *g = arg;
    while (!atomic_load(&g->open)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* Opens a gate after a while, from a thread of its own. */
static void *open_later(void *arg)
{
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
    atomic_store(&((gate *)arg)->open, 1);
    return NULL;
}

/* Device memory set and read through page-locked memory, which never takes
 * the staging ring. */
static bool device_set(pm_deviceptr d, uint8_t *pinned, unsigned seed)
{
    fill(pinned, N, seed);
    return pm_memcpy_htod(d, pinned, N) == PM_SUCCESS;
}

static bool device_holds(pm_deviceptr d, uint8_t *pinned, unsigned seed)
{
    memset(pinned, 0, N);
    return pm_memcpy_dtoh(pinned, d, N) == PM_SUCCESS && first_mismatch(pinned, N, seed) == N;
}

static void one_buffer_config(void)
{
    pm_copy_config c = {.struct_size = sizeof c};
    CHECK_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    c.buffers = 1;
    c.slice_bytes = N;
    c.chunk_bytes = 64 << 10;
    c.direct_max = c.dtoh_direct_max = 4 << 10;
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
}

/* A copy of N bytes from the device into host on s, the next pass through
 * the fault point failing; *fired: whether it did. */
static pm_result dtoh_failing_at(pm__countdown *point, uint8_t *host, pm_deviceptr from,
                                 pm_stream_t s, bool *fired)
{
    atomic_store(point, 1);
    pm_result r = pm_memcpy_dtoh_async(host, from, N, s);
    *fired = atomic_load(point) == 0;
    atomic_store(point, 0);
    return r;
}

/* A device-to-host copy whose wait for its own DMA fails: the copy fails,
 * and the next copy through the buffer waits until that DMA is done before
 * it fills the buffer (else the DMA, still queued, overwrites what the next
 * copy put there). */
static void failed_wait_for_own_dma(void)
{
    SCOPED_HOST uint8_t *pinned = NULL;
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&pinned, N), "a 16 KiB host allocation");
    SCOPED_MALLOC uint8_t *host = malloc(N);
    SCOPED_DEVICE pm_deviceptr from = device_alloc(N);
    SCOPED_DEVICE pm_deviceptr to = device_alloc(N);
    SCOPED_STREAM pm_stream_t out = NULL;
    SCOPED_STREAM pm_stream_t in = NULL;
    REQUIRE(host && from && to);
    REQUIRE_RESULT(pm_stream_create(&out), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&in), PM_SUCCESS);
    REQUIRE(device_set(from, pinned, 11));
    /* A copy that succeeds first, so the buffer owes nothing to earlier cases. */
    REQUIRE_RESULT(pm_memcpy_dtoh_async(host, from, N, out), PM_SUCCESS);
    gate out_gate = {0}, in_gate = {0};
    REQUIRE_RESULT(pm_stream_launch_host_func(out, wait_at, &out_gate), PM_SUCCESS);
    bool fired = false;
    pm_result r = dtoh_failing_at(&pm__fault_marker_wait, host, from, out, &fired);
    CHECK(fired);
    CHECK_RESULT(r, PM_ERROR_UNKNOWN);
    CHECK_RESULT(pm_stream_launch_host_func(in, wait_at, &in_gate), PM_SUCCESS);
    pthread_t opener;
    unsigned started = start_threads(&opener, 1, open_later, &out_gate, sizeof out_gate);
    if (started == 0)
        atomic_store(&out_gate.open, 1);
    CHECK(started == 1);
    fill(host, N, 12);
    CHECK_RESULT(pm_memcpy_htod_async(to, host, N, in), PM_SUCCESS);
    join_threads(&opener, started);
    CHECK_RESULT(pm_stream_synchronize(out), PM_SUCCESS);
    atomic_store(&in_gate.open, 1);
    CHECK_RESULT(pm_stream_synchronize(in), PM_SUCCESS);
    CHECK(device_holds(to, pinned, 12));
}

/* A copy (either way) whose wait for the buffer's previous DMA, a
 * host-to-device one still queued, fails: it fails without touching the
 * buffer, and the earlier copy delivers its own bytes. */
static void failed_wait_for_previous_dma(bool second_to_device)
{
    SCOPED_HOST uint8_t *pinned = NULL;
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&pinned, N), "a 16 KiB host allocation");
    SCOPED_MALLOC uint8_t *host = malloc(N);
    SCOPED_DEVICE pm_deviceptr first = device_alloc(N);
    SCOPED_DEVICE pm_deviceptr second = device_alloc(N);
    SCOPED_STREAM pm_stream_t held = NULL;
    SCOPED_STREAM pm_stream_t other = NULL;
    REQUIRE(host && first && second);
    REQUIRE_RESULT(pm_stream_create(&held), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&other), PM_SUCCESS);
    REQUIRE(device_set(second, pinned, 23));
    gate g = {0};
    REQUIRE_RESULT(pm_stream_launch_host_func(held, wait_at, &g), PM_SUCCESS);
    fill(host, N, 21);
    pm_result r = pm_memcpy_htod_async(first, host, N, held);
    if (r != PM_SUCCESS)
        atomic_store(&g.open, 1);
    REQUIRE_RESULT(r, PM_SUCCESS);
    fill(host, N, 22);
    atomic_store(&pm__fault_marker_wait, 1);
    r = second_to_device ? pm_memcpy_htod_async(second, host, N, other)
                         : pm_memcpy_dtoh_async(host, second, N, other);
    bool fired = atomic_load(&pm__fault_marker_wait) == 0;
    atomic_store(&pm__fault_marker_wait, 0);
    CHECK(fired);
    CHECK_RESULT(r, PM_ERROR_UNKNOWN);
    atomic_store(&g.open, 1);
    CHECK_RESULT(pm_stream_synchronize(held), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(other), PM_SUCCESS);
    CHECK(device_holds(first, pinned, 21));
}

/* A buffer whose flag write fails is waited for by its marker: a copy from
 * the device into pageable memory, queued behind a held stream, returns only
 * once its DMA is done, although its flag never comes. */
static void failed_flag_write(void)
{
    SCOPED_HOST uint8_t *pinned = NULL;
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&pinned, N), "a 16 KiB host allocation");
    SCOPED_MALLOC uint8_t *host = malloc(N);
    SCOPED_DEVICE pm_deviceptr from = device_alloc(N);
    SCOPED_STREAM pm_stream_t held = NULL;
    REQUIRE(host && from);
    REQUIRE_RESULT(pm_stream_create(&held), PM_SUCCESS);
    REQUIRE(device_set(from, pinned, 31));
    /* A copy whose flag comes first: the next one's wait may not take its value. */
    REQUIRE_RESULT(pm_memcpy_dtoh_async(host, from, N, held), PM_SUCCESS);
    REQUIRE(device_set(from, pinned, 32));
    gate g = {0};
    REQUIRE_RESULT(pm_stream_launch_host_func(held, wait_at, &g), PM_SUCCESS);
    pthread_t opener;
    unsigned started = start_threads(&opener, 1, open_later, &g, sizeof g);
    if (started == 0)
        atomic_store(&g.open, 1);
    memset(host, 0, N);
    bool fired = false;
    pm_result r = dtoh_failing_at(&pm__fault_flag_write, host, from, held, &fired);
    CHECK(fired);
    CHECK_RESULT(r, PM_SUCCESS);
    CHECK(first_mismatch(host, N, 32) == N);
    join_threads(&opener, started);
    CHECK_RESULT(pm_stream_synchronize(held), PM_SUCCESS);
}

/* A new shape of engine (pm_copy_set_config) frees the ring while a staged
 * copy's DMA out of it is still queued behind a held stream: the ring goes
 * once that DMA is done, though another thread captures in global mode (the
 * stopping thread's wait is relaxed, as a copy's is), and stays where the
 * wait fails; either way the DMA delivers the copy's bytes. */
static void new_shape_while_queued(bool wait_fails)
{
    SCOPED_HOST uint8_t *pinned = NULL;
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&pinned, N), "a 16 KiB host allocation");
    SCOPED_MALLOC uint8_t *host = malloc(N);
    SCOPED_DEVICE pm_deviceptr to = device_alloc(N);
    SCOPED_STREAM pm_stream_t held = NULL;
    REQUIRE(host && to);
    REQUIRE_RESULT(pm_stream_create(&held), PM_SUCCESS);
    gate g = {0};
    REQUIRE_RESULT(pm_stream_launch_host_func(held, wait_at, &g), PM_SUCCESS);
    fill(host, N, wait_fails ? 41 : 42);
    pm_result r = pm_memcpy_htod_async(to, host, N, held);
    pthread_t opener;
    unsigned started = 0;
    if (r == PM_SUCCESS && !wait_fails)
        started = start_threads(&opener, 1, open_later, &g, sizeof g);
    if (started == 0 && !wait_fails)
        atomic_store(&g.open, 1);
    memset(host, 0, N); /* the copy returned: its bytes are in the ring */
    pm_copy_config c = {.struct_size = sizeof c};
    CHECK_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    c.chunk_bytes *= 2; /* a new shape: the engine stops and frees its ring */
    if (wait_fails)
        atomic_store(&pm__fault_marker_wait, 1);
    else
        atomic_store(&pm__fault_global_capture, true);
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    atomic_store(&pm__fault_global_capture, false);
    CHECK(!wait_fails || atomic_load(&pm__fault_marker_wait) == 0);
    atomic_store(&pm__fault_marker_wait, 0);
    atomic_store(&g.open, 1);
    join_threads(&opener, started);
    CHECK_RESULT(r, PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(held), PM_SUCCESS);
    CHECK(device_holds(to, pinned, wait_fails ? 41 : 42));
    one_buffer_config();
}

/* Opens the gate's wait and notes that the stream went past it. */
typedef struct marked_gate {
    gate g;
    atomic_int passed;
} marked_gate;

static void wait_and_mark(void *arg)
{
    marked_gate *m = arg;
    wait_at(&m->g);
    atomic_store(&m->passed, 1);
}

/* A synchronous copy whose page-locked first part is queued on the default
 * stream, held at a gate, and whose pageable rest fails: it returns only
 * once the default stream is past what it queued, since the caller may free
 * either side as soon as it returns. */
static void failed_sync_copy_waits(void)
{
    enum { PART = 64 << 10 };
    SCOPED_MALLOC uint8_t *host = aligned_alloc(4096, 2 * PART);
    SCOPED_DEVICE pm_deviceptr to = device_alloc(2 * PART);
    REQUIRE(host && to);
    REQUIRE_PINNED(pm_mem_host_register(host, PART, 0), "a 64 KiB registration");
    fill(host, 2 * PART, 51);
    marked_gate m = {0};
    pm_result r = pm_stream_launch_host_func(NULL, wait_and_mark, &m);
    pthread_t opener;
    unsigned started = r == PM_SUCCESS ? start_threads(&opener, 1, open_later, &m.g, sizeof m.g) : 0;
    if (started == 0)
        atomic_store(&m.g.open, 1);
    CHECK_RESULT(r, PM_SUCCESS);
    CHECK(started == 1);
    atomic_store(&pm__fault_backend_copy, 2); /* the registered part's DMA, then the staged one's */
    r = pm_memcpy_htod(to, host, 2 * PART);
    bool fired = atomic_load(&pm__fault_backend_copy) == 0;
    atomic_store(&pm__fault_backend_copy, 0);
    CHECK(fired);
    CHECK(r != PM_SUCCESS);
    CHECK(atomic_load(&m.passed)); /* nothing the failed copy queued is still to run */
    join_threads(&opener, started);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    CHECK_RESULT(pm_mem_host_unregister(host), PM_SUCCESS);
}

int main(void)
{
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    one_buffer_config();
    failed_wait_for_own_dma();
    failed_wait_for_previous_dma(true);
    failed_wait_for_previous_dma(false);
    failed_flag_write();
    new_shape_while_queued(false);
    new_shape_while_queued(true);
    failed_sync_copy_waits();
    return check_finish("test_copy_faults");
}
