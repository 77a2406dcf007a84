/* pm_memcpy / pm_memcpy_async and pm_device_alloc / pm_device_free: every
 * pair of memory kinds (pageable, host allocation, pool, registered, device)
 * both ways, synchronous and asynchronous, sizes from 1 byte to 64 MiB at
 * random offsets, byte for byte with the bytes around the destination
 * checked untouched; stream order; eight threads at once; bad arguments;
 * streams that capture a graph. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "copy_util.h"
#include "test_hooks.h"

#ifdef PINMEM_HAVE_CUDA_HEADERS
#include <cuda.h>
#include <dlfcn.h>
#endif

enum kind { PAGEABLE, HOST_ALLOC, POOL, REGISTERED, DEVICE, KINDS };
static const char *const kind_names[KINDS] = {"pageable", "host alloc", "pool", "registered",
                                              "device"};

static pm_mem_pool_t pool;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

typedef struct mem {
    enum kind kind;
    size_t n;
    uint8_t *host;   /* host kinds */
    pm_deviceptr dev; /* DEVICE */
} mem;

static pm_deviceptr addr(const mem *m, size_t off)
{
    return m->kind == DEVICE ? m->dev + off : (pm_deviceptr)(uintptr_t)(m->host + off);
}

static bool pinned_kind(enum kind k) { return k == HOST_ALLOC || k == POOL || k == REGISTERED; }

/* false (and nothing held) when the memory could not be had: pinned kinds are
 * bounded by the memlock limit of an ordinary user. */
static bool mem_make(mem *m, enum kind k, size_t n)
{
    *m = (mem){.kind = k, .n = n};
    pm_result r = PM_SUCCESS;
    switch (k) {
    case PAGEABLE:
        m->host = malloc(n);
        r = m->host ? PM_SUCCESS : PM_ERROR_OUT_OF_MEMORY;
        break;
    case HOST_ALLOC:
        r = pm_mem_alloc_host((void **)&m->host, n);
        break;
    case POOL:
        r = pm_mem_alloc_from_pool((void **)&m->host, n, pool);
        break;
    case REGISTERED:
        m->host = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
        r = m->host ? pm_mem_host_register(m->host, n, 0) : PM_ERROR_OUT_OF_MEMORY;
        if (r != PM_SUCCESS) {
            free(m->host);
            m->host = NULL;
        }
        break;
    case DEVICE:
        r = pm_device_alloc(&m->dev, n);
        break;
    default:
        break;
    }
    return r == PM_SUCCESS;
}

static void mem_free(mem *m)
{
    switch (m->kind) {
    case PAGEABLE:
        free(m->host);
        break;
    case HOST_ALLOC:
        CHECK_RESULT(pm_mem_free_host(m->host), PM_SUCCESS);
        break;
    case POOL:
        CHECK_RESULT(pm_mem_free(m->host), PM_SUCCESS);
        break;
    case REGISTERED:
        CHECK_RESULT(pm_mem_host_unregister(m->host), PM_SUCCESS);
        free(m->host);
        break;
    case DEVICE:
        CHECK_RESULT(pm_device_free(m->dev), PM_SUCCESS);
        break;
    default:
        break;
    }
}

/* Writes and reads through the engine's own entry points, not the calls under
 * test. They run on the default stream: a write of device memory from
 * pageable memory returns once the source is read (as cuMemcpyHtoD does),
 * possibly before the bytes land, and ordered only before the default
 * stream's later work. */
static void mem_write(mem *m, size_t off, const uint8_t *data, size_t n)
{
    if (m->kind == DEVICE)
        CHECK_RESULT(pm_memcpy_htod(m->dev + off, data, n), PM_SUCCESS);
    else
        memcpy(m->host + off, data, n);
}

static void mem_read(const mem *m, size_t off, uint8_t *out, size_t n)
{
    if (m->kind == DEVICE)
        CHECK_RESULT(pm_memcpy_dtoh(out, m->dev + off, n), PM_SUCCESS);
    else
        memcpy(out, m->host + off, n);
}

static void random_bytes(uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x = xorshift64(&rng);
        memcpy(p + i, &x, 8);
    }
    for (; i < n; i++)
        p[i] = (uint8_t)xorshift64(&rng);
}

static bool all_bytes(const uint8_t *p, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

/* One copy of n bytes from src + so to dst + doff; dst's other bytes keep 0xA5. */
static void check_copy(mem *dst, size_t doff, mem *src, size_t so, size_t n, bool async,
                       pm_stream_t s)
{
    uint8_t *want = malloc(n), *got = malloc(dst->n);
    REQUIRE(want && got);
    random_bytes(want, n);
    mem_write(src, so, want, n);
    memset(got, 0xA5, dst->n);
    mem_write(dst, 0, got, dst->n);
    pm_deviceptr to = addr(dst, doff), from = addr(src, so);
    if (async) {
        /* s does not wait for the default stream (on cuda it is created
         * non-blocking), so the writes above must be done before the copy. */
        CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_async(to, from, n, s), PM_SUCCESS);
        /* a pageable source may be reused as soon as the call returns */
        if (src->kind == PAGEABLE)
            memset(src->host + so, 0x3C, n);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    } else {
        CHECK_RESULT(pm_memcpy(to, from, n), PM_SUCCESS);
    }
    mem_read(dst, 0, got, dst->n);
    size_t bad = SIZE_MAX;
    /* memcmp first: under TSan a loop's every byte costs a check */
    if (!all_bytes(got, doff, 0xA5) || memcmp(got + doff, want, n) != 0 ||
        !all_bytes(got + doff + n, dst->n - doff - n, 0xA5))
        for (size_t i = 0; i < dst->n && bad == SIZE_MAX; i++)
            if (got[i] != (i >= doff && i - doff < n ? want[i - doff] : 0xA5))
                bad = i;
    if (bad != SIZE_MAX)
        fprintf(stderr, "%s -> %s, %zu bytes (%s, offsets %zu/%zu): byte %zu wrong\n",
                kind_names[src->kind], kind_names[dst->kind], n, async ? "async" : "sync", so,
                doff, bad);
    CHECK(bad == SIZE_MAX);
    free(want);
    free(got);
}

/* Both buffers of one pair, n bytes plus room for the offsets. */
static bool pair_copy(enum kind from, enum kind to, size_t n, bool async, pm_stream_t s)
{
    mem src, dst;
    if (!mem_make(&src, from, n + 64))
        return false;
    if (!mem_make(&dst, to, n + 64)) {
        mem_free(&src);
        return false;
    }
    check_copy(&dst, (size_t)(xorshift64(&rng) % 64), &src, (size_t)(xorshift64(&rng) % 64), n,
               async, s);
    mem_free(&src);
    mem_free(&dst);
    return true;
}

static void every_pair(void)
{
    static const size_t sizes[] = {1, 2, 3, 15, 4095, 4096, 4097, (64 << 10) + 7,
                                   (1 << 20) + 3, (3 << 20) + 11};
    pm_stream_t s;
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    int skipped = 0;
    for (int from = 0; from < KINDS; from++)
        for (int to = 0; to < KINDS; to++)
            for (int async = 0; async < 2; async++)
                for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
                    skipped += !pair_copy(from, to, sizes[i], async, s);
    if (skipped)
        printf("every_pair: %d copies skipped (pinned memory beyond the memlock limit)\n",
               skipped);
    CHECK(skipped == 0 || test_backend()->pinnable_bytes() < ((size_t)16 << 20));
    CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
}

/* 64 MiB (16 under TSan): each kind once as source and once as destination,
 * both ways. */
static void large(void)
{
    static const enum kind pairs[][2] = {{PAGEABLE, DEVICE}, {DEVICE, PAGEABLE},
                                         {DEVICE, DEVICE},   {HOST_ALLOC, POOL},
                                         {POOL, REGISTERED}, {REGISTERED, HOST_ALLOC},
                                         {PAGEABLE, PAGEABLE}};
    const size_t n = (size_t)(UNDER_TSAN ? 16 : 64) << 20;
    pm_stream_t s;
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    /* two pinned buffers of n bytes and the staging ring */
    bool room = test_backend()->pinnable_bytes() >= 3 * n;
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        if (!room && (pinned_kind(pairs[i][0]) || pinned_kind(pairs[i][1]))) {
            printf("skipped: large: %s -> %s (%zu MiB pinned is past the memlock limit)\n",
                   kind_names[pairs[i][0]], kind_names[pairs[i][1]], n >> 20);
            continue;
        }
        for (int async = 0; async < 2; async++)
            CHECK(pair_copy(pairs[i][0], pairs[i][1], n, async, s));
    }
    CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
}

/* Stream order: work held at a gate on the stream writes a page-locked
 * buffer; copies queued after it must see what it wrote. */
static atomic_int gate;
static uint8_t gate_pattern[1 << 16];

typedef struct gated_write {
    uint8_t *dst;
    size_t n;
} gated_write;

static void write_behind_gate(void *arg)
{
    gated_write *w = arg;
    while (!atomic_load(&gate))
        usleep(200);
    memcpy(w->dst, gate_pattern, w->n);
}

static void *open_gate_later(void *arg)
{
    (void)arg;
    usleep(20000);
    atomic_store(&gate, 1);
    return NULL;
}

static void ordering(void)
{
    const size_t n = sizeof gate_pattern;
    random_bytes(gate_pattern, n);
    mem pinned, d1, d2;
    REQUIRE(mem_make(&pinned, HOST_ALLOC, n));
    if (!mem_make(&d1, DEVICE, n) || !mem_make(&d2, DEVICE, n)) {
        CHECK(!"device memory");
        return;
    }
    uint8_t *out = calloc(1, n), *host_out = calloc(1, n);
    REQUIRE(out && host_out);
    memset(pinned.host, 0, n);
    pm_stream_t s;
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);

    /* pinned -> device -> device -> pageable, all behind the gate */
    atomic_store(&gate, 0);
    gated_write w = {pinned.host, n};
    CHECK_RESULT(pm_stream_launch_host_func(s, write_behind_gate, &w), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_async(d1.dev, addr(&pinned, 0), n, s), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_async(d2.dev, d1.dev, n, s), PM_SUCCESS);
    pthread_t opener;
    REQUIRE(pthread_create(&opener, NULL, open_gate_later, NULL) == 0);
    /* into pageable memory: returns only when the bytes are there */
    CHECK_RESULT(pm_memcpy_async((pm_deviceptr)(uintptr_t)out, d2.dev, n, s), PM_SUCCESS);
    CHECK(memcmp(out, gate_pattern, n) == 0);
    pthread_join(opener, NULL);

    /* host to host waits for the stream's earlier work too */
    memset(pinned.host, 0, n);
    atomic_store(&gate, 0);
    CHECK_RESULT(pm_stream_launch_host_func(s, write_behind_gate, &w), PM_SUCCESS);
    REQUIRE(pthread_create(&opener, NULL, open_gate_later, NULL) == 0);
    CHECK_RESULT(pm_memcpy_async((pm_deviceptr)(uintptr_t)host_out, addr(&pinned, 0), n, s),
                 PM_SUCCESS);
    CHECK(memcmp(host_out, gate_pattern, n) == 0);
    pthread_join(opener, NULL);

    CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
    mem_free(&pinned);
    mem_free(&d1);
    mem_free(&d2);
    free(out);
    free(host_out);
}

/* The synchronous form is ordered after the default stream's earlier work. */
static void sync_after_default_stream(void)
{
    const size_t n = sizeof gate_pattern;
    random_bytes(gate_pattern, n);
    mem pinned, d;
    REQUIRE(mem_make(&pinned, HOST_ALLOC, n));
    REQUIRE(mem_make(&d, DEVICE, n));
    uint8_t *out = calloc(1, n);
    REQUIRE(out);
    memset(pinned.host, 0, n);
    atomic_store(&gate, 0);
    gated_write w = {pinned.host, n};
    CHECK_RESULT(pm_stream_launch_host_func(NULL, write_behind_gate, &w), PM_SUCCESS);
    pthread_t opener;
    REQUIRE(pthread_create(&opener, NULL, open_gate_later, NULL) == 0);
    CHECK_RESULT(pm_memcpy(d.dev, addr(&pinned, 0), n), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy((pm_deviceptr)(uintptr_t)out, d.dev, n), PM_SUCCESS);
    CHECK(memcmp(out, gate_pattern, n) == 0);
    pthread_join(opener, NULL);
    mem_free(&pinned);
    mem_free(&d);
    free(out);
}

static void *copy_thread(void *arg)
{
    uint64_t seed = (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull + 1;
    static const enum kind kinds[] = {PAGEABLE, POOL, DEVICE};
    pm_stream_t s;
    if (pm_stream_create(&s) != PM_SUCCESS) {
        CHECK(!"stream");
        return NULL;
    }
    for (int i = 0; i < 40; i++) {
        enum kind from = kinds[xorshift64(&seed) % 3], to = kinds[xorshift64(&seed) % 3];
        size_t n = 1 + (size_t)(xorshift64(&seed) % (256 << 10));
        mem src, dst;
        /* pool memory may be past an ordinary user's memlock limit */
        const bool may_fail = test_backend()->pinnable_bytes() < ((size_t)64 << 20);
        if (!mem_make(&src, from, n)) {
            CHECK(may_fail && pinned_kind(from));
            continue;
        }
        if (!mem_make(&dst, to, n)) {
            CHECK(may_fail && pinned_kind(to));
            mem_free(&src);
            continue;
        }
        uint8_t *want = malloc(n), *got = malloc(n);
        for (size_t j = 0; j < n; j++)
            want[j] = (uint8_t)(xorshift64(&seed) >> 7);
        mem_write(&src, 0, want, n);
        if (i % 2)
            CHECK_RESULT(pm_memcpy(addr(&dst, 0), addr(&src, 0), n), PM_SUCCESS);
        else {
            CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS); /* the write, as in check_copy */
            CHECK_RESULT(pm_memcpy_async(addr(&dst, 0), addr(&src, 0), n, s), PM_SUCCESS);
            CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
        }
        mem_read(&dst, 0, got, n);
        CHECK(memcmp(want, got, n) == 0);
        free(want);
        free(got);
        mem_free(&src);
        mem_free(&dst);
    }
    CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
    return NULL;
}

static void eight_threads(void)
{
    pthread_t t[8];
    for (uintptr_t i = 0; i < 8; i++)
        REQUIRE(pthread_create(&t[i], NULL, copy_thread, (void *)(i + 1)) == 0);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
}

/* Host to device and back go through the copy engine; device to device and
 * host to host do not. */
static void engine_takes_host_device(void)
{
    const size_t n = 1 << 20;
    mem h, d, d2;
    REQUIRE(mem_make(&h, PAGEABLE, n));
    REQUIRE(mem_make(&d, DEVICE, n));
    REQUIRE(mem_make(&d2, DEVICE, n));
    memset(h.host, 7, n);
    pm_copy_stats a = {.struct_size = sizeof a}, b = a, c = a;
    CHECK_RESULT(pm_copy_get_stats(&a), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy(d.dev, addr(&h, 0), n), PM_SUCCESS);
    CHECK_RESULT(pm_copy_get_stats(&b), PM_SUCCESS);
    /* staged, or where no staging ring could be pinned (memlock), the driver's path */
    CHECK(b.staged_bytes - a.staged_bytes + b.driver_bytes - a.driver_bytes == n);
    CHECK_RESULT(pm_memcpy(d2.dev, d.dev, n), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy(addr(&h, 0), addr(&h, 0) + n / 2, n / 2), PM_SUCCESS);
    CHECK_RESULT(pm_copy_get_stats(&c), PM_SUCCESS);
    CHECK(c.staged_bytes == b.staged_bytes && c.direct_bytes == b.direct_bytes &&
          c.driver_bytes == b.driver_bytes);
    mem_free(&h);
    mem_free(&d);
    mem_free(&d2);
}

/* ------------------------------------------------------------- captures */

#define AT(p) ((pm_deviceptr)(uintptr_t)(p))

static bool device_holds(pm_deviceptr d, size_t n, uint8_t v)
{
    uint8_t *out = malloc(n);
    bool ok = out && pm_memcpy_dtoh(out, d, n) == PM_SUCCESS && all_bytes(out, n, v);
    free(out);
    return ok;
}

/* What a capture holds: device memory d (n bytes of 0x11), pageable memory
 * (0x3C), memory whose first page is registered and the rest pageable
 * (0x3C), and page-locked memory from pm_mem_alloc_host (0x5A, and an empty
 * one for results). */
typedef struct capture_case {
    size_t n;
    pm_deviceptr d;
    uint8_t *pageable, *mixed, *pinned, *pinned_out;
    bool registered; /* mixed's first page */
} capture_case;

static bool capture_case_make(capture_case *c, size_t n)
{
    *c = (capture_case){.n = n};
    c->d = device_alloc(n);
    c->pageable = malloc(n);
    c->mixed = aligned_alloc(4096, n);
    if (!c->d || !c->pageable || !c->mixed ||
        pm_mem_alloc_host((void **)&c->pinned, n) != PM_SUCCESS ||
        pm_mem_alloc_host((void **)&c->pinned_out, n) != PM_SUCCESS ||
        !(c->registered = pm_mem_host_register(c->mixed, 4096, 0) == PM_SUCCESS))
        return false;
    memset(c->pageable, 0x11, n);
    CHECK_RESULT(pm_memcpy_htod(c->d, c->pageable, n), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    memset(c->pageable, 0x3C, n);
    memset(c->mixed, 0x3C, n);
    memset(c->pinned, 0x5A, n);
    memset(c->pinned_out, 0, n);
    return true;
}

static void capture_case_free(capture_case *c)
{
    if (c->registered)
        CHECK_RESULT(pm_mem_host_unregister(c->mixed), PM_SUCCESS);
    free(c->mixed);
    free(c->pageable);
    pm_mem_free_host(c->pinned);
    pm_mem_free_host(c->pinned_out);
    device_free(c->d);
}

/* On s, which captures: every copy with pageable host memory on a side, all
 * of it or past a page-locked first piece, is refused, naming the rule. */
static void pageable_refused(const capture_case *c, pm_stream_t s)
{
    const pm_result no = PM_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    const size_t n = c->n;
    CHECK_RESULT(pm_memcpy_async(c->d, AT(c->pageable), n, s), no);
    CHECK(strstr(pm_last_error_detail(), "page-locked") != NULL);
    CHECK_RESULT(pm_memcpy_async(AT(c->pageable), c->d, n, s), no);
    CHECK_RESULT(pm_memcpy_htod_async(c->d, c->pageable, n, s), no);
    CHECK(strstr(pm_last_error_detail(), "page-locked") != NULL);
    CHECK_RESULT(pm_memcpy_dtoh_async(c->pageable, c->d, n, s), no);
    CHECK_RESULT(pm_memcpy_htod_async(c->d, c->mixed, n, s), no);
    CHECK_RESULT(pm_memcpy_dtoh_async(c->mixed, c->d, n, s), no);
    CHECK_RESULT(pm_memcpy_async(c->d, AT(c->mixed), n, s), no);
    CHECK_RESULT(pm_memcpy_async(AT(c->pinned_out), AT(c->pageable), n, s), no);
    CHECK_RESULT(pm_memcpy_async(AT(c->pageable), AT(c->pinned), n, s), no);
}

/* Nothing a refused copy was given moved. */
static void nothing_moved(const capture_case *c)
{
    CHECK(device_holds(c->d, c->n, 0x11));
    CHECK(all_bytes(c->pageable, c->n, 0x3C));
    CHECK(all_bytes(c->mixed, c->n, 0x3C));
}

/* The posix backend captures nothing; the test build's hook makes it say
 * that one stream does. Page-locked host memory and device memory are
 * copied as the backend takes them (at once, there being no graph). */
static void capture_refuses_pageable(void)
{
    if (!on_backend("posix"))
        SKIP_CASE("the hook is the posix backend's; capture_on_the_gpu covers cuda");
    pm_stream_t s SCOPED_STREAM = NULL, other SCOPED_STREAM = NULL;
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&other), PM_SUCCESS);
    capture_case c;
    const size_t n = 3 * 4096;
    if (!capture_case_make(&c, n)) {
        capture_case_free(&c);
        if (memlock_binds())
            SKIP_CASE("the page-locked memory needs more than RLIMIT_MEMLOCK leaves");
        CHECK(!"capture_case_make");
        return;
    }
    pm_deviceptr d2 = device_alloc(n);
    atomic_store(&pm__fault_capturing_stream, s);
    pageable_refused(&c, s);
    CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    nothing_moved(&c);
    CHECK_RESULT(pm_memcpy_async(d2, AT(c.pinned), n, s), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_htod_async(d2, c.pinned, n / 2, s), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_dtoh_async(c.pinned_out, d2, n, s), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_async(c.d, d2, n, s), PM_SUCCESS); /* device to device */
    CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    CHECK(all_bytes(c.pinned_out, n, 0x5A));
    CHECK(device_holds(c.d, n, 0x5A));
    /* a stream that does not capture takes pageable memory as ever */
    CHECK_RESULT(pm_memcpy_async(d2, AT(c.pageable), n, other), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(other), PM_SUCCESS);
    CHECK(device_holds(d2, n, 0x3C));
    atomic_store(&pm__fault_capturing_stream, NULL);
    device_free(d2);
    capture_case_free(&c);
}

#ifdef PINMEM_HAVE_CUDA_HEADERS
/* The driver's graph calls, which pinmem does not wrap. */
typedef struct graph_api {
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*primary_release)(CUdevice);
    CUresult (*ctx_push)(CUcontext);
    CUresult (*ctx_pop)(CUcontext *);
    CUresult (*begin)(CUstream, CUstreamCaptureMode);
    CUresult (*end)(CUstream, CUgraph *);
    CUresult (*nodes)(CUgraph, CUgraphNode *, size_t *);
    CUresult (*instantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*launch)(CUgraphExec, CUstream);
    CUresult (*exec_destroy)(CUgraphExec);
    CUresult (*destroy)(CUgraph);
    CUresult (*host_alloc)(void **, size_t, unsigned);
    CUresult (*free_host)(void *);
} graph_api;

static bool graph_api_load(graph_api *g)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
        lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib)
        return false;
    static const char *const names[] = {
        "cuDeviceGet",      "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2",
        "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2",   "cuStreamBeginCapture_v2",
        "cuStreamEndCapture", "cuGraphGetNodes",        "cuGraphInstantiateWithFlags",
        "cuGraphLaunch",    "cuGraphExecDestroy",       "cuGraphDestroy",
        "cuMemHostAlloc",   "cuMemFreeHost",
    };
    void **slots = (void **)g;
    _Static_assert(sizeof(graph_api) == sizeof names / sizeof names[0] * sizeof(void *),
                   "one name a slot");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(slots[i] = dlsym(lib, names[i])))
            return false;
    return true;
}

/* A real capture: the refused copies add nothing to the graph, the copies
 * of page-locked memory (pinmem's, and the driver's own from cuMemHostAlloc)
 * are its nodes, and a replay moves the bytes the host memory holds at the
 * replay. */
static void capture_on_the_gpu(void)
{
    if (!on_backend("cuda"))
        SKIP_CASE("needs the cuda backend");
    graph_api g;
    REQUIRE(graph_api_load(&g));
    pm_capabilities caps = {.struct_size = sizeof caps};
    REQUIRE_RESULT(pm_get_capabilities(&caps), PM_SUCCESS);
    CUdevice dev;
    CUcontext ctx, popped;
    REQUIRE(g.device_get(&dev, caps.device_ordinal) == CUDA_SUCCESS);
    REQUIRE(g.primary_retain(&ctx, dev) == CUDA_SUCCESS);
    CHECK(g.ctx_push(ctx) == CUDA_SUCCESS); /* pinmem works in the calling thread's context */
    pm_stream_t s = NULL;
    capture_case c = {0};
    const size_t n = (1 << 20) + 4096;
    uint8_t *theirs = NULL;
    if (g.host_alloc((void **)&theirs, n, 0) != CUDA_SUCCESS)
        theirs = NULL;
    if (theirs && pm_stream_create(&s) == PM_SUCCESS && capture_case_make(&c, n)) {
        CUgraph graph = NULL;
        CUgraphExec exec = NULL;
        size_t nodes = 0;
        CHECK(g.begin((CUstream)s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
        pageable_refused(&c, s);
        CHECK_RESULT(pm_memcpy_async(c.d, AT(c.pinned), n, s), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_dtoh_async(c.pinned_out, c.d, n, s), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_htod_async(c.d, theirs, n, s), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_async(c.d, AT(theirs), n, s), PM_SUCCESS);
        CHECK(g.end((CUstream)s, &graph) == CUDA_SUCCESS);
        CHECK(graph && g.nodes(graph, NULL, &nodes) == CUDA_SUCCESS && nodes == 4);
        if (nodes != 4)
            fprintf(stderr, "capture_on_the_gpu: the graph has %zu nodes, not 4\n", nodes);
        nothing_moved(&c);
        CHECK(all_bytes(c.pinned_out, n, 0));
        memset(c.pinned, 0x77, n);
        memset(theirs, 0x66, n);
        CHECK(graph && g.instantiate(&exec, graph, 0) == CUDA_SUCCESS);
        CHECK(exec && g.launch(exec, (CUstream)s) == CUDA_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
        CHECK(all_bytes(c.pinned_out, n, 0x77));
        CHECK(device_holds(c.d, n, 0x66));
        if (exec)
            g.exec_destroy(exec);
        if (graph)
            g.destroy(graph);
    } else {
        CHECK(!"a stream and the memory of the case");
    }
    capture_case_free(&c);
    if (s)
        CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
    if (theirs)
        g.free_host(theirs);
    CHECK(g.ctx_pop(&popped) == CUDA_SUCCESS);
    g.primary_release(dev);
}
#else
static void capture_on_the_gpu(void) { CHECK(!on_backend("cuda")); }
#endif

/* ------------------------------------------------------ read-only memory */

static bool detail_says(const char *words) { return strstr(pm_last_error_detail(), words); }

/* No copy writes into a READ_ONLY registration: the driver answers every
 * such copy INVALID_VALUE, and so does pinmem, before anything moves (a
 * destination that starts in pageable memory and runs into the registration
 * included, and a batch whose other elements are good). Reading it is fine.
 * The pages stay writable to the process, so a copy that wrongly went
 * ahead shows as changed bytes rather than a fault. */
static void read_only_destinations(void)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *base = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                         -1, 0);
    REQUIRE(base != MAP_FAILED);
    memset(base, 0xAB, 4 * page);
    uint8_t *ro = base + page, *other = malloc(page);
    pm_deviceptr d = 0;
    pm_stream_t s = NULL;
    bool registered = false;
    if (!other || pm_device_alloc(&d, 2 * page) != PM_SUCCESS || pm_stream_create(&s) != PM_SUCCESS)
        goto done;
    memset(other, 0x77, page);
    CHECK_RESULT(pm_memcpy_htod(d, other, page), PM_SUCCESS);
    CHECK_RESULT(pm_mem_host_register(ro, 2 * page, PM_MEMHOSTREGISTER_READ_ONLY), PM_SUCCESS);
    registered = true;
    CHECK_RESULT(pm_memcpy_dtoh(ro, d, page), PM_ERROR_INVALID_VALUE);
    CHECK(detail_says("READ_ONLY"));
    CHECK_RESULT(pm_memcpy_dtoh_async(ro + 10, d, 100, s), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy(AT(ro), d, page), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_async(AT(ro + page), AT(other), 64, s), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_dtoh(base + page - 64, d, 128), PM_ERROR_INVALID_VALUE);
    pm_deviceptr dsts[2] = {AT(other), AT(ro + 64)}, srcs[2] = {d, d};
    size_t sizes[2] = {64, 64};
    CHECK_RESULT(pm_memcpy_batch_async(dsts, srcs, sizes, 2, s), PM_ERROR_INVALID_VALUE);
    CHECK(detail_says("element 1") && detail_says("READ_ONLY"));
    srcs[1] = AT(other);
    CHECK_RESULT(pm_memcpy_batch_async(dsts + 1, srcs + 1, sizes, 1, s), PM_ERROR_INVALID_VALUE);
    /* Both name the first read-only byte of a destination that runs into it. */
    char where[32];
    snprintf(where, sizeof where, "%p", (void *)ro);
    dsts[0] = AT(base + page - 64);
    sizes[0] = 128;
    CHECK_RESULT(pm_memcpy_batch_async(dsts, srcs, sizes, 1, s), PM_ERROR_INVALID_VALUE);
    CHECK(detail_says("element 0") && detail_says(where));
    CHECK_RESULT(pm_memcpy_async(dsts[0], srcs[0], 128, s), PM_ERROR_INVALID_VALUE);
    CHECK(detail_says(where));
    CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    CHECK(all_bytes(base, 4 * page, 0xAB));
    CHECK(all_bytes(other, page, 0x77));
    /* Read from it, and write beside it. */
    CHECK_RESULT(pm_memcpy_htod(d + page, ro, page), PM_SUCCESS);
    CHECK(device_holds(d + page, page, 0xAB));
    CHECK_RESULT(pm_memcpy_dtoh(base + page - 64, d, 64), PM_SUCCESS);
    CHECK(all_bytes(base + page - 64, 64, 0x77));
done:
    if (registered)
        CHECK_RESULT(pm_mem_host_unregister(ro), PM_SUCCESS);
    if (s)
        pm_stream_destroy(s);
    device_free(d);
    free(other);
    munmap(base, 4 * page);
}

static void bad_arguments(void)
{
    const bool posix = on_backend("posix");
    uint8_t *h = malloc(64);
    REQUIRE(h);
    pm_deviceptr hp = (pm_deviceptr)(uintptr_t)h, d = 0, d2 = 0;
    REQUIRE_RESULT(pm_device_alloc(&d, 64), PM_SUCCESS);
    REQUIRE_RESULT(pm_device_alloc(&d2, 64), PM_SUCCESS);
    CHECK(d % 256 == 0);

    CHECK_RESULT(pm_memcpy(0, hp, 16), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy(d, 0, 16), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_async(0, d, 16, NULL), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy(0, 0, 0), PM_SUCCESS); /* size 0: nothing to do, as the driver */
    CHECK_RESULT(pm_memcpy_async(d, hp, 0, NULL), PM_SUCCESS);
    /* overlapping ranges of one buffer, host and device; neighbours are fine */
    CHECK_RESULT(pm_memcpy(hp + 8, hp, 16), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy(hp, hp, 16), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_async(d, d + 15, 16, NULL), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy(hp + 16, hp, 16), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy(d + 32, d, 32), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy(d2, d, 64), PM_SUCCESS);
    /* wrapping around the address space */
    CHECK_RESULT(pm_memcpy(UINT64_MAX - 4, hp, 16), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy(hp, UINT64_MAX - 4, 16), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "wrap") != NULL);
    if (posix) {
        /* a device range past its allocation's end; streams that are not live */
        CHECK_RESULT(pm_memcpy(d + 56, hp, 16), PM_ERROR_INVALID_VALUE);
        CHECK_RESULT(pm_memcpy_async(hp, d + 60, 8, NULL), PM_ERROR_INVALID_VALUE);
        CHECK_RESULT(pm_memcpy_async(d, hp, 16, (pm_stream_t)(uintptr_t)0x1234),
                     PM_ERROR_INVALID_HANDLE);
        pm_stream_t s;
        CHECK_RESULT(pm_stream_create(&s), PM_SUCCESS);
        CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_async(d, hp, 16, s), PM_ERROR_INVALID_HANDLE);
    }

    CHECK_RESULT(pm_device_alloc(NULL, 16), PM_ERROR_INVALID_VALUE);
    pm_deviceptr none = 0;
    CHECK_RESULT(pm_device_alloc(&none, 0), PM_ERROR_INVALID_VALUE);
    CHECK(none == 0);
    CHECK_RESULT(pm_device_free(0), PM_SUCCESS);
    CHECK_RESULT(pm_device_free(d + 8), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_device_free(hp), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_device_free(d), PM_SUCCESS);
    CHECK_RESULT(pm_device_free(d), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_device_free(d2), PM_SUCCESS);
    CHECK_RESULT(pm_device_alloc(&d, (size_t)1 << 62), PM_ERROR_OUT_OF_MEMORY);
    free(h);
}

int main(void)
{
    if (pm_init(0) != PM_SUCCESS)
        SKIP("no backend");
    printf("backend: %s\n", pm_backend_name());
    small_copy_config(0);
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    if (pm_mem_pool_create(&pool, &props) != PM_SUCCESS) {
        fprintf(stderr, "pool: %s\n", pm_last_error_detail());
        return 1;
    }
    bad_arguments();
    engine_takes_host_device();
    every_pair();
    large();
    ordering();
    sync_after_default_stream();
    capture_refuses_pageable();
    capture_on_the_gpu();
    read_only_destinations();
    eight_threads();
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    return check_finish("test_memcpy");
}
