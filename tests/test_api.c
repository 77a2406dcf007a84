/* Result names, version, init and capabilities, bad input of every kind,
 * registrations that share a page, and the DLPack deleter. */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "child.h"
#include "copy_util.h"

static void results(void)
{
    CHECK(strcmp(pm_result_name(PM_SUCCESS), "PM_SUCCESS") == 0);
    CHECK(strcmp(pm_result_name(PM_ERROR_INVALID_VALUE), "PM_ERROR_INVALID_VALUE") == 0);
    CHECK(strcmp(pm_result_name(PM_ERROR_HOST_MEMORY_NOT_REGISTERED),
                 "PM_ERROR_HOST_MEMORY_NOT_REGISTERED") == 0);
    CHECK(strcmp(pm_result_name((pm_result)12345), "PM_ERROR_UNRECOGNIZED") == 0);
    CHECK(strlen(pm_result_string(PM_ERROR_OUT_OF_MEMORY)) > 10);
    CHECK(strlen(pm_result_string((pm_result)-7)) > 0);
    /* CUresult's values, fixed by the public contract. */
    CHECK(PM_ERROR_OUT_OF_MEMORY == 2 && PM_ERROR_NOT_INITIALIZED == 3 && PM_ERROR_NO_DEVICE == 100);
    CHECK(PM_ERROR_NOT_FOUND == 500 && PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED == 712);
    CHECK(PM_ERROR_NOT_PERMITTED == 800 && PM_ERROR_NOT_SUPPORTED == 801);
}

static void version_and_init(void)
{
    CHECK(pm_version() == PM_VERSION_NUMBER);
    CHECK(strlen(pm_version_string()) >= 5);
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    CHECK_RESULT(pm_init(1), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "flags") != NULL);
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    CHECK(on_backend("cuda") || on_backend("posix"));
}

static void capabilities(void)
{
    CHECK_RESULT(pm_get_capabilities(NULL), PM_ERROR_INVALID_VALUE);
    pm_capabilities c = {0};
    CHECK_RESULT(pm_get_capabilities(&c), PM_ERROR_INVALID_VALUE);
    c.struct_size = sizeof c;
    CHECK_RESULT(pm_get_capabilities(&c), PM_SUCCESS);
    CHECK(on_backend(c.backend));
    CHECK(c.page_size == (size_t)sysconf(_SC_PAGESIZE));
    CHECK(c.unified_addressing == 1 || strcmp(c.backend, "cuda") == 0);
    CHECK(strlen(c.huge_page_mode) > 0);
    /* An older, smaller struct is filled only as far as it goes. */
    union { pm_capabilities caps; unsigned char bytes[sizeof(pm_capabilities)]; } small;
    memset(&small, 0xAB, sizeof small);
    small.caps.struct_size = sizeof(size_t) + 8;
    CHECK_RESULT(pm_get_capabilities(&small.caps), PM_SUCCESS);
    CHECK(small.bytes[sizeof(size_t) + 8] == 0xAB);
}

/* Garbage pointers of every kind: the driver's codes, no crash. */
static void bad_pointers(void)
{
    pm_copy_stats before = {.struct_size = sizeof before};
    CHECK_RESULT(pm_copy_get_stats(&before), PM_SUCCESS);
    const unsigned long long pinned_before = before.pinned_bytes;
    void *const garbage[] = {(void *)1, (void *)(uintptr_t)-4096, (void *)(uintptr_t)0x1000,
                             (void *)(uintptr_t)0xdeadbeef000ull};
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        unsigned f;
        pm_deviceptr d;
        CHECK_RESULT(pm_mem_free_host(garbage[i]), PM_ERROR_INVALID_VALUE);
        CHECK_RESULT(pm_mem_host_unregister(garbage[i]), PM_ERROR_HOST_MEMORY_NOT_REGISTERED);
        CHECK_RESULT(pm_mem_host_get_flags(&f, garbage[i]), PM_ERROR_INVALID_VALUE);
        CHECK_RESULT(pm_mem_host_get_device_pointer(&d, garbage[i], 0), PM_ERROR_INVALID_VALUE);
        CHECK_RESULT(pm_mem_get_address_range(&d, NULL, (pm_deviceptr)(uintptr_t)garbage[i]),
                     PM_ERROR_NOT_FOUND);
    }
    /* A range that wraps around the address space, by pages or by bytes. */
    CHECK_RESULT(pm_mem_host_register((void *)(uintptr_t)-4096, 8192, 0), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_host_register((void *)4096, SIZE_MAX, 0), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_host_register((void *)4097, SIZE_MAX - 4095, 0), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_host_register((void *)(UINTPTR_MAX - 100), 200, 0), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_host_register((void *)(UINTPTR_MAX - 100), 102, 0), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_host_register((void *)UINTPTR_MAX, 2, 0), PM_ERROR_INVALID_VALUE);
    /* In the last page without wrapping: kernel address space, as elsewhere. */
    CHECK_RESULT(pm_mem_host_register((void *)(UINTPTR_MAX - 100), 101, 0), PM_ERROR_NOT_SUPPORTED);
    CHECK_RESULT(pm_mem_host_register((void *)(UINTPTR_MAX - 4095), 4096, 0),
                 PM_ERROR_NOT_SUPPORTED);
    CHECK_RESULT(pm_mem_host_register((void *)UINTPTR_MAX, 1, 0), PM_ERROR_NOT_SUPPORTED);
    /* None of them left a registration or pinned bytes behind. */
    CHECK_RESULT(pm_mem_host_unregister((void *)(UINTPTR_MAX - 100)),
                 PM_ERROR_HOST_MEMORY_NOT_REGISTERED);
    CHECK_RESULT(pm_mem_host_unregister((void *)UINTPTR_MAX), PM_ERROR_HOST_MEMORY_NOT_REGISTERED);
    unsigned top_flags;
    CHECK_RESULT(pm_mem_host_get_flags(&top_flags, (void *)(UINTPTR_MAX - 50)),
                 PM_ERROR_INVALID_VALUE);
    pm_copy_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_copy_get_stats(&st), PM_SUCCESS);
    CHECK(st.pinned_bytes == pinned_before);
    /* Never-mapped user space (kernel space is a contract row). */
    CHECK_RESULT(pm_mem_host_register((void *)4096, 4096, 0), PM_ERROR_INVALID_VALUE);
}

/* Failed calls leave nothing behind: the registry answers as before. */
static void failures_leave_no_trace(void)
{
    long page = sysconf(_SC_PAGESIZE);
    unsigned char *buf = mmap(NULL, 2 * (size_t)page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(buf != MAP_FAILED);
    CHECK_RESULT(pm_mem_host_register(buf, (size_t)page, 0), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_host_unregister(buf), PM_ERROR_HOST_MEMORY_NOT_REGISTERED);
    CHECK_RESULT(pm_mem_host_register(buf, (size_t)page, PM_MEMHOSTREGISTER_READ_ONLY), PM_SUCCESS);
    CHECK_RESULT(pm_mem_host_unregister(buf), PM_SUCCESS);
    munmap(buf, 2 * (size_t)page);
    void *p = NULL;
    for (int i = 0; i < 100; i++) {
        CHECK_RESULT(pm_mem_host_alloc(&p, (size_t)1 << 50, 0), PM_ERROR_OUT_OF_MEMORY);
        CHECK_RESULT(pm_mem_host_alloc(&p, 4096, 0x40), PM_ERROR_INVALID_VALUE);
    }
    CHECK(strlen(pm_last_error_detail()) > 0);
}

/* A thread whose calls all succeed: its detail stays "" (only failing calls
 * write it), whatever the library tried and recovered from inside. */
static void *only_successes(void *arg)
{
    (void)arg;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *p = NULL, *q = NULL;
    unsigned flags = 0;
    pm_deviceptr d = 0, base = 0;
    size_t size = 0;
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    REQUIRE_RESULT_OR(pm_mem_alloc_host(&p, 100), PM_SUCCESS, NULL);
    CHECK_RESULT(pm_mem_host_get_flags(&flags, p), PM_SUCCESS);
    CHECK_RESULT(pm_mem_host_get_device_pointer(&d, p, 0), PM_SUCCESS);
    CHECK_RESULT(pm_mem_get_address_range(&base, &size, (pm_deviceptr)(uintptr_t)p), PM_SUCCESS);
    CHECK_RESULT(pm_mem_host_alloc(&q, 5000, PM_MEMHOSTALLOC_WRITECOMBINED), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_host(q), PM_SUCCESS);
    uint8_t *buf = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE_OR(buf != MAP_FAILED, NULL);
    CHECK_RESULT(pm_mem_host_register(buf + 10, page, 0), PM_SUCCESS);
    CHECK_RESULT(pm_mem_host_unregister(buf + 10), PM_SUCCESS);
    pm_deviceptr dev = device_alloc(4096);
    REQUIRE_OR(dev != 0, NULL);
    CHECK_RESULT(pm_memcpy_htod(dev, p, 100), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_dtoh(buf, dev, 4096), PM_SUCCESS);
    device_free(dev);
    CHECK_RESULT(pm_mem_invalidate(buf, 2 * page), PM_SUCCESS);
    munmap(buf, 2 * page);
    CHECK_RESULT(pm_mem_free_host(p), PM_SUCCESS);
    pm_stream_t s = NULL;
    CHECK_RESULT(pm_stream_create(&s), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
    pm_copy_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_copy_get_stats(&st), PM_SUCCESS);
    CHECK(strcmp(pm_last_error_detail(), "") == 0);
    CHECK(pm_last_driver_error() == 0);
    if (strcmp(pm_last_error_detail(), "") != 0)
        fprintf(stderr, "detail after only successful calls: %s\n", pm_last_error_detail());
    return NULL;
}

/* The same for pools, where the environment allows them (memory to lock). */
static void *only_pool_successes(void *arg)
{
    (void)arg;
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    pm_mem_pool_t pool = NULL, dflt = NULL;
    void *p = NULL, *q = NULL;
    if (pm_mem_pool_create(&pool, &props) != PM_SUCCESS ||
        pm_mem_alloc_from_pool(&p, 100, pool) != PM_SUCCESS) {
        printf("skipped: only_pool_successes: no pool memory here (%s)\n", pm_last_error_detail());
        if (pool)
            pm_mem_pool_destroy(pool);
        return NULL;
    }
    unsigned flags = 0;
    CHECK_RESULT(pm_mem_host_get_flags(&flags, p), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_trim_to(pool, 0), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    CHECK_RESULT(pm_mem_get_default_pool(&dflt), PM_SUCCESS);
    CHECK_RESULT(pm_mem_alloc_from_pool(&q, 3000, dflt), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(q), PM_SUCCESS);
    CHECK(strcmp(pm_last_error_detail(), "") == 0);
    if (strcmp(pm_last_error_detail(), "") != 0)
        fprintf(stderr, "detail after only successful pool calls: %s\n", pm_last_error_detail());
    return NULL;
}

/* Pool memory given to the host calls: the driver's codes, and a detail
 * that names the call that frees it. */
static void pool_memory_to_host_calls(void)
{
    pm_mem_pool_t pool = NULL;
    void *p = NULL;
    REQUIRE_RESULT(pm_mem_get_default_pool(&pool), PM_SUCCESS);
    if (pm_mem_alloc_from_pool(&p, 1000, pool) != PM_SUCCESS)
        SKIP_CASE("no pool memory here");
    CHECK_RESULT(pm_mem_host_unregister(p), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "pool memory; use pm_mem_free") != NULL);
    CHECK_RESULT(pm_mem_free_host(p), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "pool memory; use pm_mem_free") != NULL);
    CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
}

static unsigned long long pinned_now(void)
{
    pm_copy_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_copy_get_stats(&st), PM_SUCCESS);
    return st.pinned_bytes;
}

/* VmLck: what this process has locked, in bytes. */
static unsigned long long locked_now(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    unsigned long long kib = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %llu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib << 10;
}

/* The driver registers bytes: registrations whose bytes do not overlap may
 * share a page. The page stays pinned until the last of them is undone (on
 * the POSIX backend: locked, as VmLck shows), and the budget counts it once. */
static void registrations_share_pages(void)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const bool posix = strcmp(pm_backend_name(), "posix") == 0;
    /* A guard page, two pages registrations share, a guard page. */
    uint8_t *map = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(map != MAP_FAILED);
    uint8_t *const p = map + page;
    const unsigned long long pinned = pinned_now(), locked = locked_now();
    CHECK_RESULT(pm_mem_host_register(p + 100, 100, 0), PM_SUCCESS);
    CHECK_RESULT(pm_mem_host_register(p + 300, 100, 0), PM_SUCCESS);
    CHECK_RESULT(pm_mem_host_register(p + 150, 100, 0), PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    CHECK_RESULT(pm_mem_host_register(p + 399, 2, 0), PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    CHECK_RESULT(pm_mem_host_register(p + 200, 100, 0), PM_SUCCESS); /* the gap, exactly */
    /* Across into the next page, which it shares with one more. */
    CHECK_RESULT(pm_mem_host_register(p + page - 10, 20, 0), PM_SUCCESS);
    CHECK_RESULT(pm_mem_host_register(p + page + 10, 1, PM_MEMHOSTREGISTER_PORTABLE), PM_SUCCESS);
    CHECK(pinned_now() == pinned + 2 * page);
    if (posix)
        CHECK(locked_now() == locked + 2 * page);
    unsigned f = 0;
    CHECK_RESULT(pm_mem_host_get_flags(&f, p + page + 10), PM_SUCCESS);
    CHECK(f == (PM_MEMHOSTREGISTER_PORTABLE | PM_MEMHOSTREGISTER_DEVICEMAP));
    CHECK_RESULT(pm_mem_host_get_flags(&f, p + page + 11), PM_ERROR_INVALID_VALUE);
    pm_deviceptr base = 0;
    size_t size = 0;
    CHECK_RESULT(pm_mem_get_address_range(&base, &size, (pm_deviceptr)(uintptr_t)(p + page)),
                 PM_SUCCESS);
    CHECK(base == (uintptr_t)(p + page - 10) && size == 20);
    CHECK_RESULT(pm_mem_host_unregister(p + 250), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_host_unregister(p + 50), PM_ERROR_HOST_MEMORY_NOT_REGISTERED);
    /* Undone one by one, the last of each page unpins it. */
    uint8_t *const order[] = {p + 100, p + page - 10, p + 300, p + 200, p + page + 10};
    const unsigned long long pages_left[] = {2, 2, 2, 1, 0};
    for (int i = 0; i < 5; i++) {
        CHECK_RESULT(pm_mem_host_unregister(order[i]), PM_SUCCESS);
        CHECK(pinned_now() == pinned + pages_left[i] * page);
        if (posix)
            CHECK(locked_now() == locked + pages_left[i] * page);
    }
    munmap(map, 4 * page);
}

/* Whether the mapping that holds addr is locked (mlock splits mappings at
 * what it locks, so this is the page's own state). */
static bool page_locked(const void *addr)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    bool inside = false, locked = false;
    while (f && fgets(line, sizeof line, f)) {
        uintptr_t lo, hi;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2) {
            if (inside)
                break;
            inside = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            locked = strstr(line, " lo") != NULL;
        }
    }
    if (f)
        fclose(f);
    return locked;
}

typedef struct sharer {
    uint8_t *pages; /* two pages every thread registers bytes of */
    int index;      /* which bytes of them are this thread's */
    int unlocked;   /* times its page was found unlocked while it held a registration */
} sharer;

static void *share_pages(void *arg)
{
    sharer *t = arg;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    /* Thread 0's third registration runs across from one page to the next. */
    uint8_t *const mine[] = {t->pages + 64 * t->index + 1, t->pages + page + 64 * t->index + 1,
                             t->index ? t->pages + 1024 + 64 * t->index : t->pages + page - 16};
    for (int round = 0; round < 400; round++) {
        uint8_t *q = mine[round % 3];
        size_t n = 32;
        if (pm_mem_host_register(q, n, 0) != PM_SUCCESS) {
            t->unlocked = -1;
            return NULL;
        }
        if (round % 5 == 0 && !page_locked(q))
            t->unlocked++;
        if (pm_mem_host_unregister(q) != PM_SUCCESS) {
            t->unlocked = -1;
            return NULL;
        }
    }
    return NULL;
}

/* Threads registering and unregistering bytes of the same two pages: a page
 * is locked whenever a registration holds it (an unregistration never unlocks
 * what another registration has just locked), and nothing stays locked or
 * counted once all are gone. */
static void pages_shared_by_threads(void)
{
    if (strcmp(pm_backend_name(), "posix") != 0)
        SKIP_CASE("locking is the driver's on this backend");
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *map = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(map != MAP_FAILED);
    const unsigned long long pinned = pinned_now(), locked = locked_now();
    enum { threads = 8 };
    pthread_t tid[threads];
    sharer t[threads];
    int started = 0;
    for (int i = 0; i < threads; i++) {
        t[i] = (sharer){map + page, i, 0};
        started += pthread_create(&tid[i], NULL, share_pages, &t[i]) == 0;
    }
    for (int i = 0; i < started; i++) {
        pthread_join(tid[i], NULL);
        CHECK(t[i].unlocked == 0);
    }
    CHECK(pinned_now() == pinned);
    CHECK(locked_now() == locked);
    CHECK(!page_locked(map + page) && !page_locked(map + 2 * page));
    munmap(map, 4 * page);
}

static void successes_leave_no_detail(void)
{
    void *(*const bodies[])(void *) = {only_successes, only_pool_successes};
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        pthread_t t;
        REQUIRE(pthread_create(&t, NULL, bodies[i], NULL) == 0);
        pthread_join(t, NULL);
    }
}

/* DLPack's DLManagedTensor on LP64: a 48-byte DLTensor, then manager_ctx
 * and the deleter. */
typedef struct managed_tensor {
    unsigned char dl_tensor[48];
    void *manager_ctx;
    void (*deleter)(void *);
} managed_tensor;

/* The deleter clears manager_ctx and touches nothing else. */
static void dlpack_deleter(void)
{
    managed_tensor m;
    memset(&m, 0xab, sizeof m);
    m.manager_ctx = &m;
    m.deleter = pm_dlpack_deleter;
    managed_tensor expected = m;
    expected.manager_ctx = NULL;
    m.deleter(&m);
    CHECK(m.manager_ctx == NULL);
    CHECK(memcmp(&m, &expected, sizeof m) == 0);
    pm_dlpack_deleter(NULL);
}

/* Device memory's range is its allocation, of the size asked for, on both
 * backends (the driver's answer, measured on an H200): one byte past it is
 * no part of it. */
static void device_memory_address_range(void)
{
    const size_t n = 1000;
    pm_deviceptr d = device_alloc(n), base = 0;
    REQUIRE(d != 0);
    size_t size = 0;
    CHECK_RESULT(pm_mem_get_address_range(&base, &size, d), PM_SUCCESS);
    CHECK(base == d && size == n);
    base = 0;
    CHECK_RESULT(pm_mem_get_address_range(&base, NULL, d + n - 1), PM_SUCCESS);
    CHECK(base == d);
    CHECK_RESULT(pm_mem_get_address_range(&base, &size, d + n), PM_ERROR_NOT_FOUND);
    device_free(d);
    CHECK_RESULT(pm_mem_get_address_range(&base, &size, d), PM_ERROR_NOT_FOUND);
}

/* The host-memory calls refuse device memory as the driver's do
 * (docs/driver-behavior.md): on POSIX, where it is the process's own
 * memory, a registration there had succeeded and lived on after
 * pm_device_free unmapped it. */
static void device_memory_is_no_host_memory(void)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    pm_deviceptr d = device_alloc(4 * page);
    REQUIRE(d != 0);
    uint8_t *p = (uint8_t *)(uintptr_t)d;
    unsigned flags;
    pm_deviceptr mapped;
    CHECK_RESULT(pm_mem_host_register(p, 4 * page, 0), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_host_register(p + 100, 1000, 0), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_host_register(p, page, PM_MEMHOSTREGISTER_PORTABLE),
                 PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_host_register(p, page, PM_MEMHOSTREGISTER_READ_ONLY),
                 PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_host_unregister(p), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_host_get_flags(&flags, p), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_host_get_device_pointer(&mapped, p, 0), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_free_host(p), PM_ERROR_INVALID_VALUE);
    pm_deviceptr base = 0;
    size_t size = 0;
    CHECK_RESULT(pm_mem_get_address_range(&base, &size, d + 200), PM_SUCCESS);
    CHECK(base == d && size == 4 * page);
    device_free(d);
}

/* A copy whose device range runs past its allocation's end is refused, each
 * way, small (the driver's own path on CUDA) and staged, with the detail
 * naming the side that wraps when one does; on POSIX htod and dtoh had
 * written past the end. */
static void copies_past_device_allocation(void)
{
    enum { ALLOC = 64 << 10, BIG = 4 << 20 };
    pm_deviceptr d = device_alloc(ALLOC);
    uint8_t *host = malloc(BIG);
    REQUIRE(d != 0 && host != NULL);
    memset(host, 1, BIG);
    const pm_deviceptr near_end = d + ALLOC - 100;
    CHECK_RESULT(pm_memcpy_htod(near_end, host, 1000), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_dtoh(host, near_end, 1000), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_htod(d, host, BIG), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_dtoh(host, d, BIG), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_htod_async(near_end, host, 1000, NULL), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_dtoh_async(host, near_end, 1000, NULL), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_htod(d, host, ALLOC), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_htod((pm_deviceptr)UINT64_MAX - 5, host, 10), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "device address") != NULL);
    CHECK_RESULT(pm_memcpy_dtoh((void *)(UINTPTR_MAX - 5), d, 10), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "host address") != NULL);
    free(host);
    device_free(d);
}

/* A copy that succeeds leaves the thread's detail as it was, even where it
 * took another way after a first failed (no staging ring within the pinned
 * budget: the driver's own path, or single DMAs for a batch). In a child of
 * its own, so that no earlier copy has made the ring. */
static int fallbacks_leave_the_detail(void *unused)
{
    (void)unused;
    enum { BYTES = 4 << 20 };
    unsigned long long budget = 0;
    REQUIRE_RESULT_OR(pm_get_pinned_budget(&budget), PM_SUCCESS, 1);
    pm_deviceptr d = device_alloc(BYTES);
    uint8_t *host = malloc(BYTES);
    REQUIRE_OR(d != 0 && host != NULL, 1);
    memset(host, 2, BYTES);
    CHECK_RESULT(pm_set_pinned_budget(64 << 10), PM_SUCCESS);
    CHECK_RESULT(pm_init(7), PM_ERROR_INVALID_VALUE); /* a known detail */
    char before[512];
    snprintf(before, sizeof before, "%s", pm_last_error_detail());
    CHECK_RESULT(pm_memcpy_htod(d, host, BYTES), PM_SUCCESS);
    CHECK(strcmp(pm_last_error_detail(), before) == 0);
    CHECK_RESULT(pm_memcpy_dtoh(host, d, BYTES), PM_SUCCESS);
    CHECK(strcmp(pm_last_error_detail(), before) == 0);
    pm_deviceptr dsts[2] = {d, d + (1 << 20)};
    pm_deviceptr srcs[2] = {(pm_deviceptr)(uintptr_t)host + (2 << 20), (pm_deviceptr)(uintptr_t)host};
    size_t sizes[2] = {1 << 20, 1 << 20};
    CHECK_RESULT(pm_memcpy_batch_async(dsts, srcs, sizes, 2, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    CHECK(strcmp(pm_last_error_detail(), before) == 0);
    pm_copy_stats stats = {.struct_size = sizeof stats};
    CHECK_RESULT(pm_copy_get_stats(&stats), PM_SUCCESS);
    CHECK(stats.staged_bytes == 0); /* the way this case is about was taken */
    CHECK_RESULT(pm_set_pinned_budget(budget), PM_SUCCESS);
    free(host);
    device_free(d);
    return check_finish("api: fallbacks leave the detail");
}

int main(void)
{
    /* Before any call here: a forked child cannot use pinmem. */
    CHECK(in_child(fallbacks_leave_the_detail, NULL, 60) == 0);
    successes_leave_no_detail(); /* first: the thread initialises the library */
    results();
    version_and_init();
    capabilities();
    bad_pointers();
    registrations_share_pages();
    pages_shared_by_threads();
    pool_memory_to_host_calls();
    failures_leave_no_trace();
    dlpack_deleter();
    device_memory_address_range();
    device_memory_is_no_host_memory();
    copies_past_device_allocation();
    return check_finish("api");
}
