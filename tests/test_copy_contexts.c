/* Copies by a thread in a context the user made (cuCtxCreate) on the CUDA
 * backend. pinmem keeps nothing in a context it does not hold (the user may
 * destroy it): a copy of several slices on the per-thread default stream
 * runs on a lane made for it and released at its end, keeping its place in
 * the thread's stream; a copy of pinmem's device memory runs on a lane in
 * pinmem's context, keeping its place in whichever stream it was queued on;
 * a copy that finds every lane taken makes one for itself; and the staging
 * ring's buffers wait behind flags rather than the context's events, which
 * die with it. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "context_util.h"
#include "copy_util.h"
#include "test_hooks.h"

#ifdef PINMEM_HAVE_CUDA_HEADERS
static atomic_int gate_open;

/* The stream's work waits here until the case opens the gate, or 3 s pass,
 * so that a case whose check fails still ends. */
static void wait_gate_a_while(void *arg)
{
    (void)arg;
    for (int waited_ms = 0; !atomic_load(&gate_open) && waited_ms < 3000; waited_ms++)
        usleep(1000);
}

static CUdeviceptr their_alloc(size_t n)
{
    CUdeviceptr d = 0;
    CHECK(api.mem_alloc(&d, n) == CUDA_SUCCESS);
    return d;
}

/* As test_copy's per_thread_stream, in the user's context: while stream s
 * waits at a gate, a copy of eight slices on it into dev returns without
 * changing the device memory, and a copy back queued behind it reads the new
 * bytes once the gate is open. */
static void gated_rounds(pm_deviceptr dev, size_t n, pm_stream_t s, const char *what)
{
    SCOPED_MALLOC uint8_t *src = malloc(n);
    SCOPED_HOST uint8_t *seen = NULL;
    REQUIRE(src);
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&seen, n), "a host allocation of eight slices");
    pm_stream_t other = NULL;
    CHECK_RESULT(pm_stream_create(&other), PM_SUCCESS);
    const int failures_before = check_failures;
    for (unsigned k = 0; other && k < 16 && check_failures == failures_before; k++) {
        fill(src, n, 30 + k);
        CHECK_RESULT(pm_memcpy_htod(dev, src, n), PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
        fill(src, n, 130 + k);
        atomic_store(&gate_open, 0);
        CHECK_RESULT(pm_stream_launch_host_func(s, wait_gate_a_while, NULL), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_htod_async(dev, src, n, s), PM_SUCCESS);
        CHECK(!atomic_load(&gate_open)); /* returned without waiting for s */
        CHECK_RESULT(pm_memcpy_dtoh_async(seen, dev, n, other), PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(other), PM_SUCCESS);
        CHECK(first_mismatch(seen, n, 30 + k) == n); /* nothing arrived past the gate */
        CHECK_RESULT(pm_memcpy_dtoh_async(seen, dev, n, s), PM_SUCCESS);
        atomic_store(&gate_open, 1);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
        CHECK(first_mismatch(seen, n, 130 + k) == n);
        if (check_failures != failures_before)
            fprintf(stderr, "  %s: round %u failed\n", what, k);
    }
    atomic_store(&gate_open, 1);
    if (other)
        CHECK_RESULT(pm_stream_destroy(other), PM_SUCCESS);
}

static size_t eight_slices(void)
{
    pm_copy_config c = {.struct_size = sizeof c};
    REQUIRE_RESULT_OR(pm_copy_get_config(&c), PM_SUCCESS, 0);
    return 8 * c.slice_bytes;
}

/* The per-thread stream in the user's context, into that context's memory:
 * the copy runs on a lane made for it. */
static void per_thread_stream_in_their_context(void)
{
    const size_t n = eight_slices();
    REQUIRE(n && api.push(theirs) == CUDA_SUCCESS);
    const CUdeviceptr dev = their_alloc(n);
    if (dev) {
        gated_rounds(dev, n, PM_STREAM_PER_THREAD, "their memory, the thread's own stream");
        CHECK(api.mem_free(dev) == CUDA_SUCCESS);
    }
    CUcontext popped;
    CHECK(api.pop(&popped) == CUDA_SUCCESS && popped == theirs);
}

/* gated_rounds into ours on a stream made in the user's context (current),
 * on its per-thread stream and on its legacy stream; what names the case. */
static void rounds_on_their_streams(pm_deviceptr ours, size_t n, const char *what)
{
    char name[128];
    pm_stream_t made = NULL;
    CHECK_RESULT(pm_stream_create(&made), PM_SUCCESS);
    if (made) {
        snprintf(name, sizeof name, "%s, a stream made in their context", what);
        gated_rounds(ours, n, made, name);
        CHECK_RESULT(pm_stream_destroy(made), PM_SUCCESS);
    }
    snprintf(name, sizeof name, "%s, the thread's own stream", what);
    gated_rounds(ours, n, PM_STREAM_PER_THREAD, name);
    snprintf(name, sizeof name, "%s, the legacy stream", what);
    gated_rounds(ours, n, PM_STREAM_LEGACY, name);
}

/* Streams of the user's context, into memory of pinmem's context: such
 * copies run on a lane in pinmem's context (DMAs queued from the user's into
 * it cost more each) that follows the caller's stream and that the caller's
 * stream follows, whichever handle names it. */
static void their_streams_into_our_memory(void)
{
    const size_t n = eight_slices();
    REQUIRE(n);
    SCOPED_DEVICE pm_deviceptr ours = device_alloc(n);
    REQUIRE(ours);
    REQUIRE(api.push(theirs) == CUDA_SUCCESS);
    rounds_on_their_streams(ours, n, "our memory");
    CUcontext popped;
    CHECK(api.pop(&popped) == CUDA_SUCCESS && popped == theirs);
}

static unsigned long long demoted_bytes(void)
{
    pm_copy_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_copy_get_stats(&st), PM_SUCCESS);
    return st.demoted_bytes;
}

/* Two synchronous copies of n bytes to dev and back, byte for byte; whether
 * either used demoting stores. */
static bool two_timed_copies(pm_deviceptr dev, uint8_t *src, uint8_t *back, size_t n,
                             unsigned seed)
{
    const unsigned long long before = demoted_bytes();
    for (unsigned k = 0; k < 2; k++) {
        fill(src, n, seed + k);
        memset(back, 0, n);
        CHECK_RESULT(pm_memcpy_htod(dev, src, n), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_dtoh(back, dev, n), PM_SUCCESS);
        CHECK(first_mismatch(back, n, seed + k) == n);
    }
    return demoted_bytes() > before;
}

/* With every kept lane taken, copies from the user's context into pinmem's
 * memory run on a one-off lane in pinmem's context, released at their end:
 * each stream keeps its order, and a synchronous copy from 64 MiB still
 * times itself for the store choice (on the caller's stream, as the lane is
 * gone). Where the engine demotes, the choice's first trials take the two
 * kinds in turn only if each timing is reported, so a lost timing shows as
 * a second copy without demoting stores. */
static void our_memory_with_every_lane_taken(void)
{
    const size_t n = eight_slices(), timed = (size_t)64 << 20;
    REQUIRE(n);
    SCOPED_DEVICE pm_deviceptr ours = device_alloc(timed);
    SCOPED_MALLOC uint8_t *src = malloc(timed);
    SCOPED_MALLOC uint8_t *back = malloc(timed);
    REQUIRE(ours && src && back);
    /* In pinmem's context: the first two timed copies of their size class. */
    const bool demotes = two_timed_copies(ours, src, back, timed, 90);
    if (!demotes)
        printf("  (demoting stores not used here: the timing is not seen)\n");
    REQUIRE(api.push(theirs) == CUDA_SUCCESS);
    atomic_store(&pm__fault_lanes_taken, true);
    rounds_on_their_streams(ours, n, "every lane taken");
    const bool demoted = two_timed_copies(ours, src, back, timed, 95);
    CHECK(demoted || !demotes);
    atomic_store(&pm__fault_lanes_taken, false);
    CUcontext popped;
    CHECK(api.pop(&popped) == CUDA_SUCCESS && popped == theirs);
}

/* One copy each way of n bytes through the staging ring in a context made
 * for it, which is then destroyed, its stream's work done. */
static void copy_in_a_brief_context(CUdevice device, uint8_t *src, uint8_t *back, size_t n,
                                    bool async)
{
    CUcontext brief = NULL;
    REQUIRE(api.create(&brief, 0, device) == CUDA_SUCCESS); /* current now */
    const CUdeviceptr dev = their_alloc(n);
    pm_stream_t s = NULL;
    CHECK_RESULT(pm_stream_create(&s), PM_SUCCESS);
    if (dev && s) {
        CHECK_RESULT(async ? pm_memcpy_htod_async(dev, src, n, s) : pm_memcpy_htod(dev, src, n),
                     PM_SUCCESS);
        CHECK_RESULT(async ? pm_memcpy_dtoh_async(back, dev, n, s) : pm_memcpy_dtoh(back, dev, n),
                     PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    }
    if (s)
        CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
    if (dev)
        CHECK(api.mem_free(dev) == CUDA_SUCCESS);
    CUcontext popped;
    CHECK(api.pop(&popped) == CUDA_SUCCESS && popped == brief);
    CHECK(api.destroy(brief) == CUDA_SUCCESS);
}

/* The staging ring's buffers hold nothing of a context that is gone (its
 * events die with it): after copies in a context the user destroys, copies
 * in pinmem's own context go on. While the buffers' markers there were that
 * context's events, they failed with CUDA_ERROR_CONTEXT_IS_DESTROYED or
 * crashed in the driver (7 runs of 8 on an H200). */
static void copies_after_a_context_is_gone(void)
{
    pm_capabilities caps = {.struct_size = sizeof caps};
    CUdevice device;
    REQUIRE_RESULT(pm_get_capabilities(&caps), PM_SUCCESS);
    REQUIRE(api.device_get(&device, caps.device_ordinal) == CUDA_SUCCESS);
    const size_t most = (size_t)256 << 20;
    SCOPED_MALLOC uint8_t *src = malloc(most);
    SCOPED_MALLOC uint8_t *back = malloc(most);
    SCOPED_DEVICE pm_deviceptr ours = device_alloc(most);
    REQUIRE(src && back && ours);
    const size_t sizes[] = {(size_t)16 << 20, most};
    for (unsigned k = 0; k < 4; k++) {
        const size_t n = sizes[k % 2];
        fill(src, n, 70 + k);
        copy_in_a_brief_context(device, src, back, n, k >= 2);
        CHECK(first_mismatch(back, n, 70 + k) == n);
        fill(src, n, 170 + k);
        memset(back, 0, n);
        CHECK_RESULT(pm_memcpy_htod(ours, src, n), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_dtoh(back, ours, n), PM_SUCCESS);
        CHECK(first_mismatch(back, n, 170 + k) == n);
    }
}
#endif

int main(void)
{
#ifdef PINMEM_HAVE_CUDA_HEADERS
    static const context_case cases[] = {per_thread_stream_in_their_context,
                                         their_streams_into_our_memory,
                                         our_memory_with_every_lane_taken,
                                         copies_after_a_context_is_gone};
    return their_context_main("copy_contexts", cases, sizeof cases / sizeof cases[0]);
#else
    return their_context_main("copy_contexts", NULL, 0);
#endif
}
