/* A program of the CUDA runtime (the tests' stand-in, libcudart.so.13), run
 * with and without LD_PRELOAD=libpinmem_preload.so and in every
 * PINMEM_PRELOAD mode. Every case checks what the program sees, which must
 * not depend on the preload (bytes, results, the last error, stream order),
 * and then what reached the runtime: calls pinmem served never do.
 *
 * usage: test_preload [CASE...]  (default: all cases) */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdlib.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "cudart.h"
#include "pm_dyn.h"

/* The stand-in runtime's own functions, beyond the ones preload.h lists. */
cudaError_t cudaHostAlloc(void **, size_t, unsigned);
cudaError_t cudaMallocHost(void **, size_t);
cudaError_t cudaFreeHost(void *);
cudaError_t cudaHostRegister(void *, size_t, unsigned);
cudaError_t cudaHostUnregister(void *);
cudaError_t cudaHostGetFlags(unsigned *, void *);
cudaError_t cudaHostGetDevicePointer(void **, void *, unsigned);
cudaError_t cudaMemcpy(void *, const void *, size_t, enum cudaMemcpyKind);
cudaError_t cudaMemcpy_ptds(void *, const void *, size_t, enum cudaMemcpyKind);
cudaError_t cudaMemcpyAsync(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
cudaError_t cudaMemcpyAsync_ptsz(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *, const void *);
cudaError_t cudaMalloc(void **, size_t);
cudaError_t cudaFree(void *);
cudaError_t cudaStreamCreate(cudaStream_t *);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *, unsigned);
cudaError_t cudaStreamDestroy(cudaStream_t);
cudaError_t cudaStreamSynchronize(cudaStream_t);
cudaError_t cudaStreamBeginCapture(cudaStream_t, enum cudaStreamCaptureMode);
cudaError_t cudaStreamEndCapture(cudaStream_t, void **);
cudaError_t cudaStreamIsCapturing(cudaStream_t, enum cudaStreamCaptureStatus *);
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *);
cudaError_t cudaLaunchHostFunc(cudaStream_t, void (*)(void *), void *);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
int fake_calls(const char *name);
int fake_replay(cudaStream_t s);
void fake_set_sticky(cudaError_t e);
void fake_load_pinmem(void);

/* What this run expects pinmem to serve. */
static bool alloc_on, copy_on;

/* The preload is in the process when the runtime's symbols resolve to it. */
static bool preloaded(void)
{
    Dl_info where;
    void *f = dlsym(RTLD_DEFAULT, "cudaHostAlloc");
    return f && dladdr(f, &where) && where.dli_fname && strstr(where.dli_fname, "pinmem_preload");
}

static void read_mode(void)
{
    if (!preloaded())
        return;
    const char *m = getenv("PINMEM_PRELOAD");
    bool all = !m || (strcmp(m, "off") && strcmp(m, "alloc") && strcmp(m, "copy"));
    alloc_on = all || strcmp(m, "alloc") == 0;
    copy_on = all || strcmp(m, "copy") == 0;
}

static bool pinmem_knows(void *p)
{
    unsigned flags;
    return pmd()->pm_mem_host_get_flags(&flags, p) == PM_SUCCESS;
}

/* Bytes pinmem's copy engine moved, whichever way: staged, or the driver's
 * own path where no staging ring could be pinned (an ordinary user's
 * memlock limit). */
static unsigned long long engine_bytes(void)
{
    pm_copy_stats s = {.struct_size = sizeof s};
    if (pmd()->pm_copy_get_stats(&s) != PM_SUCCESS)
        return 0;
    return s.staged_bytes + s.driver_bytes + s.cached_bytes + s.direct_bytes;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    uint64_t state = 0x9E3779B97F4A7C15ull ^ seed;
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)xorshift64(&state);
}

static bool matches(const uint8_t *p, size_t n, unsigned seed)
{
    uint64_t state = 0x9E3779B97F4A7C15ull ^ seed;
    for (size_t i = 0; i < n; i++)
        if (p[i] != (uint8_t)xorshift64(&state))
            return false;
    return true;
}

/* Copies above the direct-copy threshold the tests set (64 KiB) are
 * pinmem's to serve. */
enum { BIG = 4 << 20, SMALL = 32 << 10 };

/* ------------------------------------------------------------------ cases */

static void case_alloc(void)
{
    void *p = NULL;
    int before = fake_calls("cudaHostAlloc");
    REQUIRE(cudaHostAlloc(&p, 1 << 20, 0) == cudaSuccess && p);
    CHECK(fake_calls("cudaHostAlloc") == before + !alloc_on);
    CHECK(pinmem_knows(p) == alloc_on);
    memset(p, 0x5a, 1 << 20);
    unsigned flags = 0;
    CHECK(cudaHostGetFlags(&flags, p) == cudaSuccess && flags == cudaHostAllocMapped);
    CHECK(cudaHostGetFlags(&flags, (char *)p + 100) == cudaSuccess && flags == cudaHostAllocMapped);
    void *dev = NULL;
    CHECK(cudaHostGetDevicePointer(&dev, (char *)p + 8, 0) == cudaSuccess && dev == (char *)p + 8);
    struct cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeHost);
    before = fake_calls("cudaFreeHost");
    CHECK(cudaFreeHost(p) == cudaSuccess);
    CHECK(fake_calls("cudaFreeHost") == before + !alloc_on);

    REQUIRE(cudaHostAlloc(&p, 100, cudaHostAllocPortable | cudaHostAllocMapped) == cudaSuccess);
    CHECK(cudaHostGetFlags(&flags, p) == cudaSuccess && flags == 3);
    CHECK(cudaFreeHost(p) == cudaSuccess);

    before = fake_calls("cudaMallocHost");
    REQUIRE(cudaMallocHost(&p, 5000) == cudaSuccess && p);
    CHECK(fake_calls("cudaMallocHost") == before + !alloc_on);
    CHECK(pinmem_knows(p) == alloc_on);
    CHECK(cudaHostGetFlags(&flags, p) == cudaSuccess && flags == cudaHostAllocMapped);
    CHECK(cudaFreeHost(p) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
}

/* Whatever the runtime refuses, it answers itself. */
static void case_alloc_errors(void)
{
    void *p = NULL;
    int before = fake_calls("cudaHostAlloc");
    CHECK(cudaHostAlloc(NULL, 4096, 0) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaHostAlloc(&p, 4096, 0x100) == cudaErrorInvalidValue);
    p = (void *)&before;
    CHECK(cudaHostAlloc(&p, 0, 0) == cudaSuccess && p == NULL);
    CHECK(fake_calls("cudaHostAlloc") == before + 3);

    before = fake_calls("cudaHostAlloc");
    REQUIRE(cudaHostAlloc(&p, 4096, cudaHostAllocWriteCombined) == cudaSuccess);
    CHECK(fake_calls("cudaHostAlloc") == before + 1 && !pinmem_knows(p));
    CHECK(cudaFreeHost(p) == cudaSuccess);

    void *heap = malloc(4096);
    REQUIRE(heap);
    CHECK(cudaFreeHost(heap) == cudaErrorInvalidValue);
    CHECK(cudaPeekAtLastError() == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    free(heap);
    unsigned flags;
    CHECK(cudaHostGetFlags(&flags, &flags) == cudaErrorInvalidValue);

    REQUIRE(cudaMallocHost(&p, 4096) == cudaSuccess);
    CHECK(cudaHostGetFlags(NULL, p) == cudaErrorInvalidValue);
    void *dev;
    CHECK(cudaHostGetDevicePointer(&dev, p, 1) == cudaErrorInvalidValue);
    CHECK(cudaFreeHost(p) == cudaSuccess);
    CHECK(cudaFreeHost(p) == cudaErrorInvalidValue); /* twice: the runtime's answer */
    CHECK(cudaFreeHost(NULL) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);

    /* An allocation is not a registration, though the driver knows pinmem's
     * allocations as registrations: the runtime's answers for its own. */
    REQUIRE(cudaHostAlloc(&p, 1 << 20, 0) == cudaSuccess);
    CHECK(cudaHostRegister(p, 4096, 0) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaHostRegister((char *)p + 8192, 4096, 0) == cudaErrorInvalidValue);
    /* A range around the whole allocation (the stand-in runtime, checking
     * only its ends, would take it; the real one refuses). */
    if (alloc_on)
        CHECK(cudaHostRegister((char *)p - 4096, (1 << 20) + 8192, 0) == cudaErrorInvalidValue);
    CHECK(cudaHostUnregister(p) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaFreeHost((char *)p + 4096) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaHostGetFlags(&flags, p) == cudaSuccess && flags == cudaHostAllocMapped);
    CHECK(pinmem_knows(p) == alloc_on);
    CHECK(cudaFreeHost(p) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
}

/* After a fault the context's error is sticky: the queries pinmem answers
 * for its memory give it too. */
static void case_sticky_error(void)
{
    void *p = NULL, *dev = NULL;
    unsigned flags = 0;
    REQUIRE(cudaMallocHost(&p, 1 << 20) == cudaSuccess && p);
    fake_set_sticky(cudaErrorIllegalAddress);
    CHECK(cudaHostGetFlags(&flags, p) == cudaErrorIllegalAddress);
    CHECK(cudaHostGetDevicePointer(&dev, p, 0) == cudaErrorIllegalAddress);
    CHECK(cudaPeekAtLastError() == cudaErrorIllegalAddress);
    fake_set_sticky(cudaSuccess);
    (void)cudaGetLastError();
    CHECK(cudaHostGetFlags(&flags, p) == cudaSuccess && flags == cudaHostAllocMapped);
    CHECK(cudaFreeHost(p) == cudaSuccess);
}

static void case_register(void)
{
    const size_t n = 1 << 20;
    uint8_t *buf = aligned_alloc(4096, n), *other = aligned_alloc(4096, n);
    if (!buf || !other) {
        free(buf);
        free(other);
        SKIP_CASE("no memory");
    }
    int before = fake_calls("cudaHostRegister");
    CHECK(cudaHostRegister(buf, n, 0) == cudaSuccess);
    CHECK(fake_calls("cudaHostRegister") == before + !alloc_on);
    CHECK(pinmem_knows(buf) == alloc_on);
    unsigned flags = 0;
    CHECK(cudaHostGetFlags(&flags, buf + 5) == cudaSuccess && flags == cudaHostRegisterMapped);
    CHECK(cudaHostRegister(buf, n, 0) == cudaErrorHostMemoryAlreadyRegistered);
    CHECK(cudaGetLastError() == cudaErrorHostMemoryAlreadyRegistered);
    CHECK(cudaHostRegister(other, n, cudaHostRegisterPortable) == cudaSuccess);
    CHECK(pinmem_knows(other) == alloc_on); /* the failure above turned nothing off */
    CHECK(cudaHostGetFlags(&flags, other) == cudaSuccess && flags == 3);
    before = fake_calls("cudaHostUnregister");
    CHECK(cudaHostUnregister(buf) == cudaSuccess);
    CHECK(cudaHostUnregister(other) == cudaSuccess);
    CHECK(fake_calls("cudaHostUnregister") == before + 2 * !alloc_on);
    CHECK(cudaHostUnregister(buf) == cudaErrorHostMemoryNotRegistered);
    CHECK(cudaHostUnregister(NULL) == cudaErrorInvalidValue);
    CHECK(cudaHostRegister(buf, n, cudaHostRegisterIoMemory) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    free(buf);
    free(other);
}

typedef struct copy_env {
    uint8_t *src, *dst;
    void *dev, *dev2;
    cudaStream_t s;
} copy_env;

static bool copy_env_open(copy_env *e)
{
    *e = (copy_env){0};
    e->src = malloc(BIG);
    e->dst = malloc(BIG);
    if (!e->src || !e->dst || cudaMalloc(&e->dev, BIG) != cudaSuccess ||
        cudaMalloc(&e->dev2, BIG) != cudaSuccess || cudaStreamCreate(&e->s) != cudaSuccess)
        return false;
    fill(e->src, BIG, 1);
    return true;
}

static void copy_env_close(copy_env *e)
{
    if (e->s)
        cudaStreamDestroy(e->s);
    cudaFree(e->dev);
    cudaFree(e->dev2);
    free(e->src);
    free(e->dst);
}

static void case_copy_sync(void)
{
    copy_env e;
    if (!copy_env_open(&e)) {
        copy_env_close(&e);
        SKIP_CASE("no memory");
    }
    int before = fake_calls("cudaMemcpy");
    unsigned long long moved = engine_bytes();
    CHECK(cudaMemcpy(e.dev, e.src, BIG, cudaMemcpyHostToDevice) == cudaSuccess);
    memset(e.dst, 0, BIG);
    CHECK(cudaMemcpy(e.dst, e.dev, BIG, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(matches(e.dst, BIG, 1));
    fill(e.src, BIG, 2);
    CHECK(cudaMemcpy(e.dev, e.src, BIG, cudaMemcpyDefault) == cudaSuccess);
    CHECK(cudaMemcpy(e.dst, e.dev, BIG, cudaMemcpyDefault) == cudaSuccess);
    CHECK(matches(e.dst, BIG, 2));
    CHECK(fake_calls("cudaMemcpy") == before + 4 * !copy_on);
    CHECK((engine_bytes() >= moved + 4ull * BIG) == copy_on);

    /* The runtime's: small copies, device to device, host to host, a pinned
     * host side, and a kind the pointers do not match. */
    before = fake_calls("cudaMemcpy");
    CHECK(cudaMemcpy(e.dev, e.src, SMALL, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(e.dev2, e.dev, BIG, cudaMemcpyDeviceToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(e.dst, e.src, BIG, cudaMemcpyHostToHost) == cudaSuccess);
    CHECK(cudaMemcpy(e.dev2, e.dev, BIG, cudaMemcpyHostToDevice) == cudaSuccess);
    int expected = 4;
    void *pinned = NULL;
    if (cudaMallocHost(&pinned, BIG) == cudaSuccess) {
        CHECK(cudaMemcpy(e.dev, pinned, BIG, cudaMemcpyHostToDevice) == cudaSuccess);
        CHECK(cudaFreeHost(pinned) == cudaSuccess);
        expected++;
    }
    CHECK(fake_calls("cudaMemcpy") == before + expected);
    CHECK(cudaGetLastError() == cudaSuccess);
    copy_env_close(&e);
}

static void case_copy_async(void)
{
    copy_env e;
    if (!copy_env_open(&e)) {
        copy_env_close(&e);
        SKIP_CASE("no memory");
    }
    int before = fake_calls("cudaMemcpyAsync");
    CHECK(cudaMemcpyAsync(e.dev, e.src, BIG, cudaMemcpyHostToDevice, e.s) == cudaSuccess);
    memset(e.src, 0, BIG); /* the source was read when the call returned */
    CHECK(cudaMemcpyAsync(e.dst, e.dev, BIG, cudaMemcpyDeviceToHost, e.s) == cudaSuccess);
    CHECK(matches(e.dst, BIG, 1)); /* a pageable destination is written on return */
    fill(e.src, BIG, 3);
    CHECK(cudaMemcpyAsync(e.dev, e.src, BIG, cudaMemcpyHostToDevice, NULL) == cudaSuccess);
    CHECK(cudaMemcpyAsync(e.dst, e.dev, BIG, cudaMemcpyDefault, cudaStreamLegacy) == cudaSuccess);
    CHECK(matches(e.dst, BIG, 3));
    CHECK(fake_calls("cudaMemcpyAsync") == before + 4 * !copy_on);
    CHECK(cudaStreamSynchronize(e.s) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    copy_env_close(&e);
}

static void case_copy_errors(void)
{
    copy_env e;
    if (!copy_env_open(&e)) {
        copy_env_close(&e);
        SKIP_CASE("no memory");
    }
    int before = fake_calls("cudaMemcpy");
    CHECK(cudaMemcpy(e.dev, e.src, BIG, (enum cudaMemcpyKind)7) == cudaErrorInvalidMemcpyDirection);
    CHECK(cudaGetLastError() == cudaErrorInvalidMemcpyDirection);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaMemcpy(e.dev, e.src, 0, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(fake_calls("cudaMemcpy") == before + 2);
    cudaStream_t bogus = (cudaStream_t)(uintptr_t)0x1234;
    CHECK(cudaMemcpyAsync(e.dev, e.src, BIG, cudaMemcpyHostToDevice, bogus) ==
          cudaErrorInvalidResourceHandle);
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);

    /* A call served without the runtime leaves its last error as it was, as
     * a successful runtime call does. */
    CHECK(cudaMemcpy(e.dev, e.src, BIG, (enum cudaMemcpyKind)9) == cudaErrorInvalidMemcpyDirection);
    CHECK(cudaMemcpy(e.dev, e.src, BIG, cudaMemcpyHostToDevice) == cudaSuccess);
    void *p = NULL;
    CHECK(cudaHostAlloc(&p, 4096, 0) == cudaSuccess);
    CHECK(cudaFreeHost(p) == cudaSuccess);
    CHECK(cudaPeekAtLastError() == cudaErrorInvalidMemcpyDirection);
    CHECK(cudaGetLastError() == cudaErrorInvalidMemcpyDirection);
    CHECK(cudaGetLastError() == cudaSuccess);
    copy_env_close(&e);
}

/* A copy on a capturing stream becomes the runtime's node of the capture. */
static void case_capture(void)
{
    copy_env e;
    if (!copy_env_open(&e)) {
        copy_env_close(&e);
        SKIP_CASE("no memory");
    }
    memset(e.dst, 0, BIG);
    REQUIRE(cudaMemcpy(e.dev, e.dst, BIG, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(e.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    int before = fake_calls("cudaMemcpyAsync");
    CHECK(cudaMemcpyAsync(e.dev, e.src, BIG, cudaMemcpyHostToDevice, e.s) == cudaSuccess);
    CHECK(fake_calls("cudaMemcpyAsync") == before + 1);
    /* The legacy stream may not be used while a stream captures. */
    CHECK(cudaMemcpyAsync(e.dev2, e.src, BIG, cudaMemcpyHostToDevice, NULL) ==
          cudaErrorStreamCaptureImplicit);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureImplicit);
    void *graph;
    CHECK(cudaStreamEndCapture(e.s, &graph) == cudaSuccess);
    CHECK(cudaMemcpy(e.dst, e.dev, BIG, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(!matches(e.dst, BIG, 1)); /* captured, not run */
    CHECK(fake_replay(e.s) == 1);
    CHECK(cudaMemcpy(e.dst, e.dev, BIG, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(matches(e.dst, BIG, 1));
    copy_env_close(&e);
}

/* The calling thread's capture mode, read with the exchange; -1 when it
 * cannot be. */
static int capture_mode(void)
{
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess)
        return -1;
    enum cudaStreamCaptureMode back = mode;
    return cudaThreadExchangeStreamCaptureMode(&back) == cudaSuccess ? (int)mode : -1;
}

static int exchanges(void)
{
    return fake_calls("cudaThreadExchangeStreamCaptureMode");
}

static int copies_run_by_runtime(void)
{
    return fake_calls("cudaMemcpy") + fake_calls("cudaMemcpy_ptds") +
           fake_calls("cudaMemcpyAsync") + fake_calls("cudaMemcpyAsync_ptsz");
}

/* Another thread's pageable copies, in every form, while the main thread
 * captures in global mode: served, and the capture survives them. */
static void *copy_beside_capture(void *arg)
{
    copy_env *e = arg;
    int before = copies_run_by_runtime();
    unsigned long long moved = engine_bytes();
    int ex = exchanges();
    CHECK(cudaMemcpy(e->dev, e->src, BIG, cudaMemcpyHostToDevice) == cudaSuccess);
    /* One exchange into relaxed mode and one back, for the stream's wait. */
    CHECK(exchanges() == ex + 2 * copy_on);
    memset(e->dst, 0, BIG);
    CHECK(cudaMemcpy(e->dst, e->dev, BIG, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(matches(e->dst, BIG, 1));
    CHECK(capture_mode() == cudaStreamCaptureModeGlobal);

    fill(e->src, BIG, 2);
    ex = exchanges();
    CHECK(cudaMemcpyAsync(e->dev2, e->src, BIG, cudaMemcpyHostToDevice, e->s) == cudaSuccess);
    CHECK(cudaMemcpyAsync(e->dst, e->dev2, BIG, cudaMemcpyDeviceToHost, e->s) == cudaSuccess);
    CHECK(exchanges() == ex); /* no wait of the preload's own there */
    CHECK(matches(e->dst, BIG, 2));

    fill(e->src, BIG, 3);
    CHECK(cudaMemcpy_ptds(e->dev, e->src, BIG, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpyAsync_ptsz(e->dst, e->dev, BIG, cudaMemcpyDeviceToHost, NULL) == cudaSuccess);
    CHECK(matches(e->dst, BIG, 3));
    fill(e->src, BIG, 4);
    CHECK(cudaMemcpyAsync_ptsz(e->dev2, e->src, BIG, cudaMemcpyHostToDevice,
                               cudaStreamPerThread) == cudaSuccess);
    CHECK(cudaMemcpy_ptds(e->dst, e->dev2, BIG, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(matches(e->dst, BIG, 4));
    CHECK(copies_run_by_runtime() == before + 8 * !copy_on);
    CHECK((engine_bytes() >= moved + 8ull * BIG) == copy_on);
    CHECK(capture_mode() == cudaStreamCaptureModeGlobal);

    /* A mode of the program's own is given back as it was. */
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    REQUIRE_OR(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess, NULL);
    CHECK(cudaMemcpy(e->dev, e->src, BIG, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(capture_mode() == cudaStreamCaptureModeThreadLocal);
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);

    /* A copy the runtime does itself costs no exchange. */
    ex = exchanges();
    CHECK(cudaMemcpy(e->dev, e->src, SMALL, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(exchanges() == ex);
    CHECK(cudaGetLastError() == cudaSuccess);
    return NULL;
}

/* The runtime's rule: a synchronization in global mode beside another
 * thread's global capture is refused and invalidates it; in relaxed mode it
 * runs. */
static void *synchronize_beside_capture(void *arg)
{
    copy_env *e = arg;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    REQUIRE_OR(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess, NULL);
    CHECK(mode == cudaStreamCaptureModeGlobal);
    CHECK(cudaStreamSynchronize(e->s) == cudaSuccess);
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    CHECK(mode == cudaStreamCaptureModeRelaxed);
    CHECK(cudaStreamSynchronize(e->s) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureUnsupported);
    return NULL;
}

/* A non-blocking stream of the main thread's, captured in global mode while
 * another thread runs fn. */
static void beside_capture(void *(*fn)(void *), cudaError_t ends)
{
    copy_env e;
    cudaStream_t capturing = NULL;
    if (!copy_env_open(&e) ||
        cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking) != cudaSuccess) {
        copy_env_close(&e);
        SKIP_CASE("no memory");
    }
    pthread_t t;
    void *graph;
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CHECK(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal) == cudaSuccess);
    if (pthread_create(&t, NULL, fn, &e) == 0) {
        pthread_join(t, NULL);
        CHECK(cudaStreamIsCapturing(capturing, &status) == cudaSuccess);
        CHECK(status == (ends == cudaSuccess ? cudaStreamCaptureStatusActive
                                             : cudaStreamCaptureStatusInvalidated));
        CHECK(cudaStreamEndCapture(capturing, &graph) == ends);
        CHECK(cudaGetLastError() == ends);
    } else
        CHECK(!"thread started");
    CHECK(cudaStreamDestroy(capturing) == cudaSuccess);
    copy_env_close(&e);
}

static void case_capture_rule(void)
{
    beside_capture(synchronize_beside_capture, cudaErrorStreamCaptureInvalidated);
}

static void case_capture_elsewhere(void)
{
    beside_capture(copy_beside_capture, cudaSuccess);
}

/* A host function queued before a copy on the same default stream runs
 * first: it writes the device buffer late, and the copy must land after. */
typedef struct late {
    void *dev;
    uint8_t value;
} late;

static void late_fill(void *arg)
{
    late *l = arg;
    usleep(50 * 1000);
    memset(l->dev, l->value, BIG);
}

static bool all_bytes(const uint8_t *p, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

/* What a host function the runtime runs gets from the calls on host memory
 * made before it. */
typedef struct inside_answers {
    void *pinned, *registered;
    cudaError_t free_host, unregister, alloc;
} inside_answers;

static void calls_inside(void *arg)
{
    inside_answers *a = arg;
    void *p = NULL;
    a->free_host = cudaFreeHost(a->pinned);
    a->unregister = cudaHostUnregister(a->registered);
    a->alloc = cudaHostAlloc(&p, 4096, 0);
}

/* Inside a host function the runtime refuses every call on host memory;
 * memory the preload pinned stays pinned, and its frees after the function
 * succeed as the runtime's would. */
static void case_host_func(void)
{
    static char buf[1 << 20] __attribute__((aligned(4096)));
    inside_answers a = {.registered = buf};
    cudaStream_t s = NULL;
    REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
    REQUIRE(cudaHostAlloc(&a.pinned, 1 << 20, 0) == cudaSuccess);
    REQUIRE(cudaHostRegister(buf, 1 << 20, 0) == cudaSuccess);
    REQUIRE(cudaLaunchHostFunc(s, calls_inside, &a) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(a.free_host == cudaErrorNotPermitted);
    CHECK(a.unregister == cudaErrorNotPermitted);
    CHECK(a.alloc == cudaErrorNotPermitted);
    CHECK(pinmem_knows(a.pinned) == alloc_on);
    CHECK(cudaFreeHost(a.pinned) == cudaSuccess);
    CHECK(cudaHostUnregister(buf) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

static void case_default_streams(void)
{
    copy_env e;
    if (!copy_env_open(&e)) {
        copy_env_close(&e);
        SKIP_CASE("no memory");
    }
    late l = {e.dev, 0xAA};
    int before = fake_calls("cudaMemcpyAsync") + fake_calls("cudaMemcpyAsync_ptsz") +
                 fake_calls("cudaMemcpy_ptds");
    /* The legacy default stream. */
    REQUIRE(cudaLaunchHostFunc(NULL, late_fill, &l) == cudaSuccess);
    CHECK(cudaMemcpyAsync(e.dev, e.src, BIG, cudaMemcpyHostToDevice, NULL) == cudaSuccess);
    CHECK(cudaStreamSynchronize(NULL) == cudaSuccess);
    CHECK(cudaMemcpy(e.dst, e.dev, BIG, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(matches(e.dst, BIG, 1));
    /* The per-thread default stream: stream 0 of the _ptsz form, and
     * cudaStreamPerThread by name. */
    REQUIRE(cudaLaunchHostFunc(cudaStreamPerThread, late_fill, &l) == cudaSuccess);
    CHECK(cudaMemcpyAsync_ptsz(e.dev, e.src, BIG, cudaMemcpyHostToDevice, NULL) == cudaSuccess);
    CHECK(cudaStreamSynchronize(cudaStreamPerThread) == cudaSuccess);
    CHECK(cudaMemcpy(e.dst, e.dev, BIG, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(matches(e.dst, BIG, 1));
    REQUIRE(cudaLaunchHostFunc(cudaStreamPerThread, late_fill, &l) == cudaSuccess);
    CHECK(cudaMemcpyAsync(e.dev, e.src, BIG, cudaMemcpyHostToDevice, cudaStreamPerThread) ==
          cudaSuccess);
    CHECK(cudaStreamSynchronize(cudaStreamPerThread) == cudaSuccess);
    CHECK(cudaMemcpy(e.dst, e.dev, BIG, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(matches(e.dst, BIG, 1));
    /* Into pageable memory on the per-thread stream: the host function's
     * bytes, on return. */
    l.value = 0x3C;
    REQUIRE(cudaLaunchHostFunc(cudaStreamPerThread, late_fill, &l) == cudaSuccess);
    CHECK(cudaMemcpy_ptds(e.dst, e.dev, BIG, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(all_bytes(e.dst, BIG, 0x3C));
    l.value = 0x5D;
    REQUIRE(cudaLaunchHostFunc(cudaStreamPerThread, late_fill, &l) == cudaSuccess);
    CHECK(cudaMemcpyAsync_ptsz(e.dst, e.dev, BIG, cudaMemcpyDeviceToHost, NULL) == cudaSuccess);
    CHECK(all_bytes(e.dst, BIG, 0x5D));
    CHECK(fake_calls("cudaMemcpyAsync") + fake_calls("cudaMemcpyAsync_ptsz") +
              fake_calls("cudaMemcpy_ptds") ==
          before + 5 * !copy_on);
    CHECK(cudaGetLastError() == cudaSuccess);
    copy_env_close(&e);
}

/* Threads copying at once on their own per-thread default streams. */
static void *copier(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    copy_env e;
    bool ok = copy_env_open(&e);
    for (int round = 0; ok && round < 4; round++) {
        fill(e.src, BIG, seed + round);
        ok = cudaMemcpyAsync_ptsz(e.dev, e.src, BIG, cudaMemcpyHostToDevice, NULL) == cudaSuccess &&
             cudaMemcpy_ptds(e.dst, e.dev, BIG, cudaMemcpyDeviceToHost) == cudaSuccess &&
             matches(e.dst, BIG, seed + round);
    }
    copy_env_close(&e);
    return ok ? arg : NULL;
}

static void case_threads(void)
{
    enum { THREADS = 4 };
    pthread_t t[THREADS];
    int started = 0;
    for (int i = 0; i < THREADS; i++)
        started += pthread_create(&t[i], NULL, copier, (void *)(uintptr_t)(100 + i)) == 0;
    REQUIRE(started == THREADS);
    for (int i = 0; i < THREADS; i++) {
        void *got = NULL;
        pthread_join(t[i], &got);
        CHECK(got == (void *)(uintptr_t)(100 + i));
    }
}

/* A forked child's notes from the preload are its own, not the test's. */
static void quiet_stderr(void)
{
    int quiet = open("/dev/null", O_WRONLY);
    if (quiet >= 0)
        dup2(quiet, STDERR_FILENO);
}

/* Pins and frees until told to stop, so that a fork catches it midway
 * (a registration looks through the whole table of pointers). */
static void *churn(void *arg)
{
    atomic_bool *stop = arg;
    uint8_t *page = aligned_alloc(4096, 4096);
    while (page && !atomic_load(stop)) {
        void *p = NULL;
        if (cudaHostAlloc(&p, 4096, 0) == cudaSuccess) {
            if (cudaHostRegister(page, 4096, 0) == cudaSuccess)
                cudaHostUnregister(page);
            cudaFreeHost(p);
        }
    }
    free(page);
    return NULL;
}

/* Waits up to ten seconds for a child (sanitizers and a busy machine slow
 * it); a child still running then is killed and counted as hung. */
static bool child_finished(pid_t pid)
{
    for (int waited_ms = 0; waited_ms < 10000; waited_ms++) {
        int status;
        pid_t got = waitpid(pid, &status, WNOHANG);
        if (got == pid)
            return WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (got < 0)
            return false;
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return false;
}

/* A child forked while another thread pins and frees answers its own calls:
 * the preload's table of pointers must not stay locked in the child. */
static void case_fork_while_pinning(void)
{
    enum { FORKS = 200, CHURNERS = 3 };
    static uint8_t page[4096] __attribute__((aligned(4096)));
    /* Loaded first: a fork during loading is not this case (the stand-in's
     * own loading would not survive it, as the real runtime's is its own). */
    fake_load_pinmem();
    void *warm = NULL;
    if (cudaHostAlloc(&warm, 4096, 0) == cudaSuccess)
        cudaFreeHost(warm);
    atomic_bool stop = false;
    pthread_t t[CHURNERS];
    int started = 0;
    while (started < CHURNERS && pthread_create(&t[started], NULL, churn, &stop) == 0)
        started++;
    int finished = 0, forked = 0;
    for (int i = 0; i < FORKS; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            /* The answers do not matter here (a forked child may not use the
             * runtime), only that each call returns; the preload's notes on
             * them are the child's. */
            void *p = NULL;
            quiet_stderr();
            cudaHostRegister(page, sizeof page, 0);
            cudaHostUnregister(page);
            if (cudaHostAlloc(&p, 4096, 0) == cudaSuccess)
                cudaFreeHost(p);
            _exit(0);
        }
        if (pid < 0)
            break;
        forked++;
        finished += child_finished(pid);
    }
    atomic_store(&stop, true);
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    CHECK(started == CHURNERS);
    CHECK(forked == FORKS);
    CHECK(finished == forked);
    cudaGetLastError();
}

static const struct {
    const char *name;
    void (*run)(void);
} cases[] = {
    {"alloc", case_alloc},
    {"alloc_errors", case_alloc_errors},
    {"sticky_error", case_sticky_error},
    {"register", case_register},
    {"copy_sync", case_copy_sync},
    {"copy_async", case_copy_async},
    {"copy_errors", case_copy_errors},
    {"capture", case_capture},
    {"capture_rule", case_capture_rule},
    {"capture_elsewhere", case_capture_elsewhere},
    {"default_streams", case_default_streams},
    {"host_func", case_host_func},
    {"threads", case_threads},
    {"fork_while_pinning", case_fork_while_pinning},
};

int main(int argc, char **argv)
{
    read_mode();
    printf("preload: %s, pinmem serves%s%s%s\n", preloaded() ? "loaded" : "absent",
           alloc_on ? " pinning" : "", copy_on ? " copies" : "",
           alloc_on || copy_on ? "" : " nothing");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool chosen = argc < 2;
        for (int a = 1; a < argc; a++)
            chosen = chosen || strcmp(argv[a], cases[i].name) == 0;
        if (chosen)
            cases[i].run();
    }
    return check_finish("test_preload");
}
