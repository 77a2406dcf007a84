/* Copies by a thread in a context the user made (cuCtxCreate) on the CUDA
 * backend. pinmem keeps nothing in a context it does not hold (the user may
 * destroy it): a copy of several slices on the per-thread default stream
 * runs on a lane made for it and released at its end, keeping its place in
 * the thread's stream, and the staging ring's buffers wait behind flags
 * rather than the context's events, which die with it. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "context_util.h"
#include "copy_util.h"

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

/* As test_copy's per_thread_stream, in the user's context: while the
 * thread's own stream waits at a gate, a copy of eight slices on it returns
 * without changing the device memory, and a copy back queued behind it
 * reads the new bytes once the gate is open. */
static void per_thread_stream_in_their_context(void)
{
    pm_copy_config c = {.struct_size = sizeof c};
    REQUIRE_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    const size_t n = 8 * c.slice_bytes;
    SCOPED_MALLOC uint8_t *src = malloc(n);
    SCOPED_HOST uint8_t *seen = NULL;
    REQUIRE(src);
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&seen, n), "a host allocation of eight slices");
    REQUIRE(api.push(theirs) == CUDA_SUCCESS);
    const CUdeviceptr dev = their_alloc(n);
    pm_stream_t other = NULL;
    CHECK_RESULT(pm_stream_create(&other), PM_SUCCESS);
    const pm_stream_t own = PM_STREAM_PER_THREAD;
    for (unsigned k = 0; dev && other && k < 16; k++) {
        fill(src, n, 30 + k);
        CHECK_RESULT(pm_memcpy_htod(dev, src, n), PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
        fill(src, n, 130 + k);
        atomic_store(&gate_open, 0);
        CHECK_RESULT(pm_stream_launch_host_func(own, wait_gate_a_while, NULL), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_htod_async(dev, src, n, own), PM_SUCCESS);
        CHECK(!atomic_load(&gate_open)); /* returned without waiting for the stream */
        CHECK_RESULT(pm_memcpy_dtoh_async(seen, dev, n, other), PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(other), PM_SUCCESS);
        CHECK(first_mismatch(seen, n, 30 + k) == n); /* nothing arrived past the gate */
        CHECK_RESULT(pm_memcpy_dtoh_async(seen, dev, n, own), PM_SUCCESS);
        atomic_store(&gate_open, 1);
        CHECK_RESULT(pm_stream_synchronize(own), PM_SUCCESS);
        CHECK(first_mismatch(seen, n, 130 + k) == n);
    }
    atomic_store(&gate_open, 1);
    if (other)
        CHECK_RESULT(pm_stream_destroy(other), PM_SUCCESS);
    if (dev)
        CHECK(api.mem_free(dev) == CUDA_SUCCESS);
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
                                         copies_after_a_context_is_gone};
    return their_context_main("copy_contexts", cases, sizeof cases / sizeof cases[0]);
#else
    return their_context_main("copy_contexts", NULL, 0);
#endif
}
