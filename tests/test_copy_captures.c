/* Copies on one thread while another thread captures a graph in global
 * mode. The driver refuses waits (event and stream synchronization) and
 * registrations on the other threads then, and each refused call ends the
 * capture; its own copies of pageable memory are neither refused nor end
 * it. pinmem's copies of pageable memory must behave as the driver's: every
 * form, both ways, succeeds with the right bytes, and the capture survives.
 * On the cuda backend the capture is real; on posix the backend's test
 * model of one (test_hooks.h) refuses the same waits. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "copy_util.h"
#include "test_hooks.h"
#include "threads.h"

#ifdef PINMEM_HAVE_CUDA_HEADERS
#include <cuda.h>
#endif

/* Above the size the copy engine leaves to the driver, so that each copy is
 * staged; blocks of the batch likewise. */
enum { N = 4 << 20, BLOCKS = 4, BLOCK = N / BLOCKS };

/* The calling thread's capture mode is global (not relaxed): the driver's
 * answer on cuda, the model's on posix. */
static bool thread_mode_is_global(void);

/* What a thread beside the capture got, on a stream made before it began
 * (making one may itself be a call a capture forbids). */
typedef struct beside {
    pm_stream_t s;
    pm_deviceptr d;
    uint8_t *host, *back;
    pm_result wait;    /* wait_beside: its stream synchronization */
    bool copies_ok;    /* copy_beside: every copy succeeded with the right bytes */
    bool global_after; /* copy_beside: its mode afterwards is global again */
} beside;

/* Every form of pageable copy, both ways, each with its bytes checked. */
static bool copy_every_way(const beside *b)
{
    const pm_stream_t s = b->s;
    const pm_deviceptr d = b->d;
    uint8_t *host = b->host, *back = b->back;
    bool ok = true;
    fill(host, N, 1);
    ok &= pm_memcpy_htod(d, host, N) == PM_SUCCESS;
    memset(back, 0, N);
    ok &= pm_memcpy_dtoh(back, d, N) == PM_SUCCESS && first_mismatch(back, N, 1) == N;
    fill(host, N, 2);
    ok &= pm_memcpy_htod_async(d, host, N, s) == PM_SUCCESS;
    memset(back, 0, N);
    ok &= pm_memcpy_dtoh_async(back, d, N, s) == PM_SUCCESS && first_mismatch(back, N, 2) == N;
    fill(host, N, 3);
    ok &= pm_memcpy(d, (pm_deviceptr)(uintptr_t)host, N) == PM_SUCCESS;
    memset(back, 0, N);
    ok &= pm_memcpy_async((pm_deviceptr)(uintptr_t)back, d, N, s) == PM_SUCCESS &&
          first_mismatch(back, N, 3) == N;
    /* A batch of blocks laid out in reverse order on the device, then back. */
    pm_deviceptr dsts[BLOCKS], srcs[BLOCKS];
    size_t sizes[BLOCKS];
    fill(host, N, 4);
    for (unsigned i = 0; i < BLOCKS; i++) {
        dsts[i] = d + (size_t)(BLOCKS - 1 - i) * BLOCK;
        srcs[i] = (pm_deviceptr)(uintptr_t)(host + (size_t)i * BLOCK);
        sizes[i] = BLOCK;
    }
    ok &= pm_memcpy_batch_async(dsts, srcs, sizes, BLOCKS, s) == PM_SUCCESS;
    for (unsigned i = 0; i < BLOCKS; i++) {
        dsts[i] = (pm_deviceptr)(uintptr_t)(back + (size_t)i * BLOCK);
        srcs[i] = d + (size_t)(BLOCKS - 1 - i) * BLOCK;
    }
    memset(back, 0, N);
    ok &= pm_memcpy_batch_async(dsts, srcs, sizes, BLOCKS, s) == PM_SUCCESS &&
          first_mismatch(back, N, 4) == N;
    return ok;
}

static void *copy_beside(void *arg)
{
    beside *b = arg;
    b->copies_ok = copy_every_way(b);
    b->global_after = thread_mode_is_global();
    return NULL;
}

static void *wait_beside(void *arg)
{
    beside *b = arg;
    b->wait = pm_stream_synchronize(b->s);
    return NULL;
}

/* Runs fn(arg) on a thread of its own (false: it did not start). */
static bool on_a_thread(void *(*fn)(void *), beside *arg)
{
    pthread_t t;
    if (start_threads(&t, 1, fn, arg, 0) != 1)
        return false;
    join_threads(&t, 1);
    return true;
}

static void beside_free(beside *b)
{
    if (b->s)
        pm_stream_destroy(b->s);
    device_free(b->d);
    free(b->host);
    free(b->back);
}

static bool beside_make(beside *b)
{
    *b = (beside){.wait = PM_SUCCESS};
    b->d = device_alloc(N);
    b->host = malloc(N);
    b->back = malloc(N);
    return b->d && b->host && b->back && pm_stream_create(&b->s) == PM_SUCCESS;
}

#define SCOPED_BESIDE __attribute__((cleanup(beside_free)))

static void beside_the_model(void)
{
    if (!on_backend("posix"))
        SKIP_CASE("the model is the posix backend's; beside_a_capture covers cuda");
    SCOPED_BESIDE beside b;
    REQUIRE(beside_make(&b));
    atomic_store(&pm__fault_global_capture, true);
    bool ran = on_a_thread(wait_beside, &b) && on_a_thread(copy_beside, &b);
    atomic_store(&pm__fault_global_capture, false);
    REQUIRE(ran);
    CHECK_RESULT(b.wait, PM_ERROR_STREAM_CAPTURE_UNSUPPORTED); /* the model refuses waits */
    CHECK(b.copies_ok);
    CHECK(b.global_after);
}

#ifdef PINMEM_HAVE_CUDA_HEADERS
typedef struct capture_api {
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*ctx_push)(CUcontext);
    CUresult (*ctx_pop)(CUcontext *);
    CUresult (*begin)(CUstream, CUstreamCaptureMode);
    CUresult (*end)(CUstream, CUgraph *);
    CUresult (*destroy)(CUgraph);
    CUresult (*exchange_mode)(CUstreamCaptureMode *);
} capture_api;

static capture_api api;

static bool capture_api_load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
        return false;
    static const char *const names[] = {
        "cuDevicePrimaryCtxRetain", "cuDeviceGet",        "cuCtxPushCurrent_v2",
        "cuCtxPopCurrent_v2",       "cuStreamBeginCapture_v2", "cuStreamEndCapture",
        "cuGraphDestroy",           "cuThreadExchangeStreamCaptureMode"};
    void **slots = (void **)&api;
    _Static_assert(sizeof(capture_api) == sizeof names / sizeof names[0] * sizeof(void *),
                   "one name a slot");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(slots[i] = dlsym(lib, names[i])))
            return false;
    return true;
}

static bool thread_mode_is_global(void)
{
    if (!on_backend("cuda"))
        return !pm__test_thread_relaxed;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (api.exchange_mode(&mode) != CUDA_SUCCESS)
        return false;
    CUstreamCaptureMode was = mode;
    api.exchange_mode(&mode);
    return was == CU_STREAM_CAPTURE_MODE_GLOBAL;
}

/* Ends a capture: what the driver answered (the graph, if any, destroyed). */
static CUresult end_capture(pm_stream_t s)
{
    CUgraph graph = NULL;
    CUresult rc = api.end((CUstream)s, &graph);
    if (graph)
        api.destroy(graph);
    return rc;
}

static void beside_a_capture(void)
{
    if (!on_backend("cuda"))
        SKIP_CASE("needs the cuda backend");
    REQUIRE(capture_api_load());
    pm_capabilities caps = {.struct_size = sizeof caps};
    REQUIRE_RESULT(pm_get_capabilities(&caps), PM_SUCCESS);
    CUdevice dev;
    CUcontext ctx, popped;
    REQUIRE(api.device_get(&dev, caps.device_ordinal) == CUDA_SUCCESS);
    REQUIRE(api.primary_retain(&ctx, dev) == CUDA_SUCCESS);
    REQUIRE(api.ctx_push(ctx) == CUDA_SUCCESS);
    SCOPED_BESIDE beside b;
    SCOPED_STREAM pm_stream_t capturing = NULL;
    if (beside_make(&b) && pm_stream_create(&capturing) == PM_SUCCESS) {
        /* The driver's rule first: a plain wait beside the capture ends it. */
        CHECK(api.begin((CUstream)capturing, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
        CHECK(on_a_thread(wait_beside, &b));
        CHECK(end_capture(capturing) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        CHECK_RESULT(b.wait, PM_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        /* pinmem's copies beside it neither fail nor end it. */
        CHECK(api.begin((CUstream)capturing, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
        CHECK(on_a_thread(copy_beside, &b));
        CHECK(end_capture(capturing) == CUDA_SUCCESS);
        CHECK(b.copies_ok);
        CHECK(b.global_after);
    } else {
        CHECK(!"the case's memory and streams");
    }
    CHECK(api.ctx_pop(&popped) == CUDA_SUCCESS);
}
#else
static bool thread_mode_is_global(void) { return !pm__test_thread_relaxed; }
static void beside_a_capture(void) { SKIP_CASE("built without the CUDA headers"); }
#endif

int main(void)
{
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    beside_the_model();
    beside_a_capture();
    return check_finish("test_copy_captures");
}
