/* The pool rows of docs/driver-behavior.md, what pinmem's pools answer beyond
 * the driver's, and bad input. */
#include <pthread.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backend/backend.h"
#include "budget.h"
#include "pool/pool_internal.h"
#include "pool_util.h"
#include "test_hooks.h"

static const size_t MiB = 1u << 20;

static void creation_rows(void)
{
    pm_mem_pool_t pool = NULL;
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}, .handle_types = 1};
    CHECK_RESULT(pm_mem_pool_create(&pool, &props), PM_ERROR_INVALID_VALUE);
    props = (pm_mem_pool_props){.location = {PM_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0}};
    CHECK_RESULT(pm_mem_pool_create(&pool, &props), PM_ERROR_INVALID_VALUE);
    props = (pm_mem_pool_props){.location = {PM_MEM_LOCATION_TYPE_HOST_NUMA, 999}};
    CHECK_RESULT(pm_mem_pool_create(&pool, &props), PM_ERROR_INVALID_VALUE);
    props = (pm_mem_pool_props){.location = {PM_MEM_LOCATION_TYPE_INVALID, 0}};
    CHECK_RESULT(pm_mem_pool_create(&pool, &props), PM_ERROR_INVALID_VALUE);
    props = (pm_mem_pool_props){.location = {(pm_mem_location_type)1, 0}};
    CHECK_RESULT(pm_mem_pool_create(&pool, &props), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_pool_create(&pool, NULL), PM_ERROR_INVALID_VALUE);
    props = (pm_mem_pool_props){.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    CHECK_RESULT(pm_mem_pool_create(NULL, &props), PM_ERROR_INVALID_VALUE);
    props.reserved[3] = 1;
    CHECK_RESULT(pm_mem_pool_create(&pool, &props), PM_ERROR_INVALID_VALUE);

    props = (pm_mem_pool_props){.location = {PM_MEM_LOCATION_TYPE_HOST_NUMA, 0}};
    CHECK_RESULT(pm_mem_pool_create(&pool, &props), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    props = (pm_mem_pool_props){.location = {PM_MEM_LOCATION_TYPE_HOST, 12345}};
    CHECK_RESULT(pm_mem_pool_create(&pool, &props), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

static void size_rows(void)
{
    NEED_PINNABLE(128 * MiB);
    pm_mem_pool_t pool = make_pool(64 * MiB);
    REQUIRE(pool != NULL);
    void *a = NULL, *b = NULL, *z = (void *)1;
    CHECK_RESULT(pm_mem_alloc_from_pool(&z, 0, pool), PM_SUCCESS);
    CHECK(z == NULL);
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&a, 40 * MiB, pool), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 64 * MiB);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == 40 * MiB);
    CHECK_RESULT(pm_mem_alloc_from_pool(&b, 40 * MiB, pool), PM_ERROR_OUT_OF_MEMORY);
    CHECK(strstr(pm_last_error_detail(), "max_size") != NULL);
    CHECK_RESULT(pm_mem_alloc_from_pool(&b, SIZE_MAX, pool), PM_ERROR_OUT_OF_MEMORY);
    CHECK_RESULT(pm_mem_free(a), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH) == 40 * MiB);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

static void attribute_rows(void)
{
    NEED_PINNABLE(64 * MiB); /* the first chunk, pinned whole */
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RELEASE_THRESHOLD) == PM_MEMPOOL_DEFAULT_RELEASE_THRESHOLD);
    int on = -1;
    for (int a = PM_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES;
         a <= PM_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES; a++) {
        CHECK_RESULT(pm_mem_pool_get_attribute(pool, (pm_mem_pool_attribute)a, &on), PM_SUCCESS);
        CHECK(on == 1);
        int off = 0;
        CHECK_RESULT(pm_mem_pool_set_attribute(pool, (pm_mem_pool_attribute)a, &off), PM_SUCCESS);
        CHECK_RESULT(pm_mem_pool_get_attribute(pool, (pm_mem_pool_attribute)a, &on), PM_SUCCESS);
        CHECK(on == 0);
    }
    void *p = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&p, 3 * MiB, pool), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
    uint64_t v = 5;
    CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH, &v),
                 PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &v),
                 PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v),
                 PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
                 PM_ERROR_INVALID_VALUE);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH) == 3 * MiB);
    v = 0;
    CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH, &v), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH) == 0);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 32 * MiB);
    CHECK_RESULT(pm_mem_pool_trim_to(pool, 0), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 32 * MiB);
    CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &v), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 0);
    CHECK_RESULT(pm_mem_pool_get_attribute(pool, (pm_mem_pool_attribute)99, &v), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_pool_get_attribute(pool, PM_MEMPOOL_ATTR_USED_MEM_HIGH, NULL),
                 PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_RELEASE_THRESHOLD, NULL),
                 PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

static void destroy_with_live_allocation(void)
{
    NEED_PINNABLE(64 * MiB); /* the first chunk, pinned whole */
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    void *small = NULL, *large = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&small, 1000, pool), PM_SUCCESS);
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&large, 5 * MiB, pool), PM_SUCCESS);
    unsigned long long before = locked_kib();
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_ERROR_INVALID_VALUE);
    void *p;
    CHECK_RESULT(pm_mem_alloc_from_pool(&p, 64, pool), PM_ERROR_INVALID_VALUE);
    memset(small, 1, 1000);
    unsigned f = 0;
    CHECK_RESULT(pm_mem_host_get_flags(&f, large), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(small), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(large), PM_SUCCESS);
    pm_capabilities caps = {.struct_size = sizeof caps};
    pm_get_capabilities(&caps);
    if (caps.pinning_limited_by_memlock_rlimit)
        CHECK(locked_kib() + 32 * 1024 <= before); /* the chunk went back */
}

/* Beyond the driver: pool memory answers every host-memory query, however
 * its chunks are pinned (a release threshold pins them in pieces that go
 * back one by one: VMM host granules on CUDA). */
static void pool_memory_queries(bool threshold)
{
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    uint64_t zero = 0;
    if (threshold)
        CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero),
                     PM_SUCCESS);
    static const size_t sizes[] = {64, 100, 4096, 70000, MiB, 3 * MiB + 5};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *p = NULL;
        REQUIRE_RESULT(pm_mem_alloc_from_pool((void **)&p, sizes[i], pool), PM_SUCCESS);
        uint8_t *q = p + sizes[i] - 1;
        unsigned f = 0;
        CHECK_RESULT(pm_mem_host_get_flags(&f, q), PM_SUCCESS);
        CHECK(f == (PM_MEMHOSTALLOC_PORTABLE | PM_MEMHOSTALLOC_DEVICEMAP));
        pm_deviceptr d = 0;
        CHECK_RESULT(pm_mem_host_get_device_pointer(&d, q, 0), PM_SUCCESS);
        CHECK(d == (uintptr_t)q);
        pm_deviceptr base = 0;
        size_t size = 0;
        CHECK_RESULT(pm_mem_get_address_range(&base, &size, (pm_deviceptr)(uintptr_t)q), PM_SUCCESS);
        CHECK(base == (uintptr_t)p && size == sizes[i]);
        CHECK_RESULT(pm_mem_free_host(p), PM_ERROR_INVALID_VALUE);
        CHECK_RESULT(pm_mem_host_unregister(p), PM_ERROR_INVALID_VALUE);
        CHECK_RESULT(pm_mem_host_register(p, 64, 0), PM_ERROR_INVALID_VALUE);
        if (sizes[i] > 1)
            CHECK_RESULT(pm_mem_free(p + 1), PM_ERROR_INVALID_VALUE);
        memset(p, 0xA5, sizes[i]);
        CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
        CHECK_RESULT(pm_mem_free(p), PM_ERROR_INVALID_VALUE);
        CHECK_RESULT(pm_mem_host_get_flags(&f, p), PM_ERROR_INVALID_VALUE);
        CHECK_RESULT(pm_mem_get_address_range(&base, &size, (pm_deviceptr)(uintptr_t)p),
                     PM_ERROR_NOT_FOUND);
    }
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

static void bad_input(void)
{
    pm_mem_pool_t pool = make_pool(0), bogus = (pm_mem_pool_t)(uintptr_t)0x1234;
    REQUIRE(pool != NULL);
    void *p = NULL;
    CHECK_RESULT(pm_mem_alloc_from_pool(NULL, 64, pool), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_alloc_from_pool(&p, 64, NULL), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_alloc_from_pool(&p, 64, bogus), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_pool_trim_to(bogus, 0), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_pool_destroy(NULL), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_free((void *)(uintptr_t)0x1000), PM_ERROR_INVALID_VALUE);
    int local;
    CHECK_RESULT(pm_mem_free(&local), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_free(NULL), PM_SUCCESS);
    void *host = NULL;
    REQUIRE_RESULT(pm_mem_alloc_host(&host, 4096), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(host), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_free_host(host), PM_SUCCESS);
    pm_mem_pool_t def = NULL, def2 = NULL;
    CHECK_RESULT(pm_mem_get_default_pool(&def), PM_SUCCESS);
    CHECK_RESULT(pm_mem_get_default_pool(&def2), PM_SUCCESS);
    CHECK(def == def2 && def != NULL);
    CHECK_RESULT(pm_mem_get_default_pool(NULL), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_pool_destroy(def), PM_ERROR_INVALID_VALUE);
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&p, 100, def), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
    pm_pool_stats st = {0};
    CHECK_RESULT(pm_mem_pool_get_stats(pool, &st), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_pool_get_stats(pool, NULL), PM_ERROR_INVALID_VALUE);
    char small[8];
    size_t needed = 0;
    CHECK_RESULT(pm_mem_pool_stats_json(pool, small, sizeof small, &needed), PM_ERROR_INVALID_VALUE);
    CHECK(needed > sizeof small);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* pm_mem_free on memory pinmem pinned another way names the call that frees it. */
static void free_of_other_memory(void)
{
    void *host = NULL;
    REQUIRE_RESULT(pm_mem_host_alloc(&host, 4096, 0), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(host), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "pm_mem_free_host") != NULL);
    CHECK_RESULT(pm_mem_free((char *)host + 100), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "pm_mem_free_host") != NULL);
    CHECK_RESULT(pm_mem_free_host(host), PM_SUCCESS);

    static char area[3 * 4096] __attribute__((aligned(4096)));
    REQUIRE_RESULT(pm_mem_host_register(area + 100, 5000, 0), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(area + 100), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "pm_mem_host_unregister") != NULL);
    CHECK_RESULT(pm_mem_free(area + 200), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "pm_mem_host_unregister") != NULL);
    CHECK_RESULT(pm_mem_host_unregister(area + 100), PM_SUCCESS);

    int local = 0;
    CHECK_RESULT(pm_mem_free(&local), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "not pool memory") != NULL);
    CHECK(strstr(pm_last_error_detail(), "pm_mem_free_host") == NULL);
}

/* No request is rounded up by more than 1/8; up to 512 bytes, to the next
 * multiple of 64. */
static void rounding(void)
{
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    /* Under a memlock limit, only the sizes that fit in a quarter of it, and
     * trimmed after each (thread caches keep up to 128 KiB of every class). */
    const size_t largest = pinnable() / 4;
    const bool limited = pinnable() != SIZE_MAX;
    uint64_t rng = 42;
    for (int i = 0; i < 3000; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        unsigned shift = (unsigned)(rng >> 59) % 26; /* 1 B to 64 MiB */
        size_t n = 1 + (size_t)((rng >> 20) % ((size_t)1 << (shift + 1)));
        if (n > largest)
            continue;
        uint64_t before = pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT);
        void *p = NULL;
        REQUIRE_RESULT(pm_mem_alloc_from_pool(&p, n, pool), PM_SUCCESS);
        uint64_t grew = pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) - before;
        uint64_t allowed = n <= 512 ? (n + 63) / 64 * 64 : n + n / 8;
        if (grew < n || grew > allowed)
            fprintf(stderr, "request %zu used %llu\n", n, (unsigned long long)grew);
        CHECK(grew >= n && grew <= allowed);
        CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
        if (limited)
            CHECK_RESULT(pm_mem_pool_trim_to(pool, 0), PM_SUCCESS);
    }
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* HOST_NUMA: the pages are on that node (move_pages with no target reports
 * where each page is). With policies_refused, the kernel refuses memory
 * policies, as a container's default seccomp profile does to a process
 * without CAP_SYS_NICE, and the machine counts as one of several nodes (a
 * hook): the pool still gives memory, unbound, its pages placed by threads on
 * the node's CPUs touching them first. */
static void numa_placement(bool policies_refused)
{
    NEED_PINNABLE(16 * MiB);
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST_NUMA, 0}};
    pm_mem_pool_t pool = NULL;
    atomic_store(&pm__fault_policies_refused, policies_refused);
    REQUIRE_RESULT(pm_mem_pool_create(&pool, &props), PM_SUCCESS);
    uint8_t *p = NULL;
    pm_result r = pm_mem_alloc_from_pool((void **)&p, 8 * MiB, pool);
    atomic_store(&pm__fault_policies_refused, false);
    REQUIRE_RESULT(r, PM_SUCCESS);
    if (policies_refused) {
        enum { mpol_bind = 2, mpol_f_addr = 2 };
        int mode = -1;
        unsigned long nodes[16] = {0};
        if (syscall(SYS_get_mempolicy, &mode, nodes, 1024ul, p, mpol_f_addr) == 0)
            CHECK(mode != mpol_bind);
        else
            printf("get_mempolicy unavailable here; the binding not checked\n");
    }
    void *pages[4] = {p, p + 2 * MiB, p + 4 * MiB, p + 8 * MiB - 1};
    int status[4] = {-1, -1, -1, -1};
    long rc = syscall(SYS_move_pages, 0, 4, pages, NULL, status, 0);
    if (rc != 0) {
        printf("move_pages unavailable here (%ld); placement not checked\n", rc);
    } else {
        for (int i = 0; i < 4; i++)
            CHECK(status[i] == 0);
        printf("HOST_NUMA 0 pool pages on nodes %d %d %d %d\n", status[0], status[1], status[2],
               status[3]);
    }
    CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

static void *run_on_node_zero(void *on_node)
{
    unsigned cpu = 0, node = 1;
    *(bool *)on_node = pm__run_on_node(0) && syscall(SYS_getcpu, &cpu, &node, NULL) == 0 &&
                            node == 0 && !pm__run_on_node(4095);
    return NULL;
}

/* The threads that place pages by touch run on the node's CPUs; a node that
 * does not exist leaves a thread where it was. */
static void numa_threads(void)
{
    if (access("/sys/devices/system/node/node0/cpulist", R_OK) != 0)
        SKIP_CASE("no NUMA nodes in sysfs here");
    bool matched = false;
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, run_on_node_zero, &matched) == 0);
    pthread_join(t, NULL);
    CHECK(matched);
}

static void stats(void)
{
    NEED_PINNABLE(64 * MiB); /* the first chunk, pinned whole */
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    void *a = NULL, *b = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&a, 100, pool), PM_SUCCESS);
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&b, 2 * MiB, pool), PM_SUCCESS);
    pm_pool_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_mem_pool_get_stats(pool, &st), PM_SUCCESS);
    CHECK(st.requested == 100 + 2 * MiB && st.used == 128 + 2 * MiB && st.live == 2);
    CHECK(st.allocs == 2 && st.frees == 0 && st.reserved == 32 * MiB && st.chunks_pinned == 1);
    CHECK(st.pin_ns > 0);
    /* The chunk's other pages are a hole; a page of 64 KiB holds the small block. */
    CHECK(st.free_in_empty_chunks == 0);
    CHECK(st.free_in_holes <= 30 * MiB - 64 * 1024 && st.free_in_holes >= 28 * MiB);
    char json[512];
    CHECK_RESULT(pm_mem_pool_stats_json(pool, json, sizeof json, NULL), PM_SUCCESS);
    CHECK(strstr(json, "\"live\":2") != NULL);
    CHECK(strstr(json, "\"free_in_empty_chunks\":0,\"free_in_holes\":") != NULL);
    printf("stats: %s\n", json);
    pm_mem_free(a);
    pm_mem_free(b);
    /* Kept, but every page free: the whole chunk is what trim would give back. */
    CHECK_RESULT(pm_mem_pool_trim_to(pool, 32 * MiB), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_get_stats(pool, &st), PM_SUCCESS);
    CHECK(st.reserved == 32 * MiB && st.free_in_empty_chunks == 32 * MiB && st.free_in_holes == 0);
    pm_pool_stats all = {.struct_size = sizeof all};
    CHECK_RESULT(pm_mem_pool_get_stats(NULL, &all), PM_SUCCESS);
    CHECK(all.reserved >= 32 * MiB);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* A thread remembers the run it last freed into. When that run is given back
 * and its pages (and span) become a large allocation, a free there must see
 * that the memo is stale: freeing the large block as a small one would keep
 * its bytes counted as used and cache it in the small class. */
static void stale_run_memo(void)
{
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    void *keep = NULL, *small = NULL, *big = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&keep, MiB, pool), PM_SUCCESS); /* keeps the chunk */
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&small, 64, pool), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(small), PM_SUCCESS); /* the memo: small's run */
    CHECK_RESULT(pm_mem_pool_trim_to(pool, 0), PM_SUCCESS); /* the run goes back */
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&big, 2 * MiB, pool), PM_SUCCESS);
    /* the lowest free pages, where the run was */
    CHECK((uintptr_t)small - (uintptr_t)big < 2 * MiB);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == 3 * MiB);
    CHECK_RESULT(pm_mem_free(big), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == MiB);
    CHECK_RESULT(pm_mem_free(big), PM_ERROR_INVALID_VALUE);
    void *again = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&again, 64, pool), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == MiB + 64);
    CHECK_RESULT(pm_mem_free(again), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(keep), PM_SUCCESS);
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* The least that any of the backend's ways of pinning a pool commits at
 * once: a max_size below it leaves no room for anything (VMM granules
 * everywhere, PINMEM_POOL_VMM=1, cannot shrink; docs/design.md). */
static size_t least_pool_commit(void)
{
    pm_result r;
    const pm__instance *inst = pm__instance_get(&r);
    if (!inst)
        return PM__POOL_PAGE;
    const size_t keep = inst->backend.pool_keep.granule_min,
                 give_back = inst->backend.pool_give_back.granule_min;
    const size_t least = keep < give_back ? keep : give_back;
    return least > PM__POOL_PAGE ? least : PM__POOL_PAGE;
}

/* A pool of max_size pins up to it, rounded down to what its chunks commit
 * at once, and never more: in granules, in smaller ones where max_size is
 * not a multiple of them and the backend can, or in a chunk pinned whole,
 * then no larger than max_size. */
static void fill_to_max_size(size_t max_size, bool threshold_zero)
{
    NEED_PINNABLE(2 * max_size); /* so that the memlock limit binds no chunk */
    pm_mem_pool_t pool = make_pool(max_size);
    REQUIRE(pool != NULL);
    uint64_t zero = 0;
    if (threshold_zero)
        CHECK_RESULT(pm_mem_pool_set_attribute(pool, PM_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero),
                     PM_SUCCESS);
    pm_pool_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_mem_pool_get_stats(pool, &st), PM_SUCCESS);
    if (st.granule > max_size && least_pool_commit() > max_size) {
        char why[160];
        snprintf(why, sizeof why,
                 "max_size %zu is below the %llu-byte granule that every way this backend "
                 "pins a pool commits at once",
                 max_size, st.granule);
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
        SKIP_CASE(why);
    }
    const size_t unit = st.granule ? st.granule : PM__POOL_PAGE;
    const size_t cap = max_size - max_size % unit;
    CHECK(cap > PM__POOL_SMALL_MAX); /* one large allocation can take it all */
    void *all = NULL, *more = NULL;
    pm_result r = pm_mem_alloc_from_pool(&all, cap, pool);
    CHECK_RESULT(r, PM_SUCCESS);
    if (r == PM_SUCCESS) {
        CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == cap);
        CHECK_RESULT(pm_mem_alloc_from_pool(&more, 1000, pool), PM_ERROR_OUT_OF_MEMORY);
        CHECK(strstr(pm_last_error_detail(), "max_size") != NULL);
        CHECK_RESULT(pm_mem_free(all), PM_SUCCESS);
    }
    /* In pieces: a small block's run, then the rest. */
    void *small = NULL, *rest = NULL;
    const size_t run = pm__class_run_pages(pm__class_of(1000)) * PM__POOL_PAGE;
    r = pm_mem_alloc_from_pool(&small, 1000, pool);
    CHECK_RESULT(r, PM_SUCCESS);
    if (r == PM_SUCCESS && cap - run > PM__POOL_SMALL_MAX) {
        r = pm_mem_alloc_from_pool(&rest, cap - run, pool);
        CHECK_RESULT(r, PM_SUCCESS);
        CHECK_RESULT(pm_mem_alloc_from_pool(&more, 2 * MiB, pool), PM_ERROR_OUT_OF_MEMORY);
        CHECK(strstr(pm_last_error_detail(), "max_size") != NULL);
        if (r == PM_SUCCESS)
            CHECK_RESULT(pm_mem_free(rest), PM_SUCCESS);
    }
    CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_HIGH) <= max_size);
    if (small)
        CHECK_RESULT(pm_mem_free(small), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* Every way of pinning, with the max_size of a test pool, one that no
 * granule divides, and one below the driver's VMM granule; and in whole
 * chunks, as CUDA pins pools that keep their memory, on every backend.
 * Sizes below a granule that cannot shrink, where no other way of pinning
 * takes less, are skipped: such a pool cannot hold anything. */
static void max_size_room(void)
{
    const size_t limits[] = {4 * MiB, 3 * MiB + 1, MiB + 64 * 1024};
    for (int whole = 0; whole <= 1; whole++) {
        atomic_store(&pm__pool_whole_chunks, whole);
        for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
            for (int threshold_zero = 0; threshold_zero <= 1; threshold_zero++)
                fill_to_max_size(limits[i], threshold_zero);
    }
    atomic_store(&pm__pool_whole_chunks, false);
}

static pm_result alloc_one_mib(pm_mem_pool_t pool)
{
    void *p = NULL;
    pm_result r = pm_mem_alloc_from_pool(&p, MiB, pool);
    if (r == PM_SUCCESS)
        CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
    return r;
}

static void *alloc_one_mib_thread(void *pool)
{
    return (void *)(intptr_t)alloc_one_mib(pool);
}

/* A full pool whose free block sits in one thread's cache still serves
 * another thread, and a request of another class on the same thread: the
 * allocation that runs out empties the caches into the pool and tries again. */
static void cached_blocks_serve_a_full_pool(void)
{
    const size_t max_size = 4 * MiB;
    NEED_PINNABLE(2 * max_size);
    pm_mem_pool_t pool = make_pool(max_size);
    REQUIRE(pool != NULL);
    void *blocks[8] = {0};
    int n = 0;
    while (n < 8 && pm_mem_alloc_from_pool(&blocks[n], MiB, pool) == PM_SUCCESS)
        n++;
    if (n < 2) {
        for (int i = 0; i < n; i++)
            CHECK_RESULT(pm_mem_free(blocks[i]), PM_SUCCESS);
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
        SKIP_CASE("a 4 MiB pool holds fewer than two 1 MiB blocks here");
    }
    CHECK(n < 8);
    CHECK_RESULT(pm_mem_free(blocks[--n]), PM_SUCCESS); /* into this thread's cache */
    pthread_t t;
    void *other = NULL;
    REQUIRE(pthread_create(&t, NULL, alloc_one_mib_thread, pool) == 0);
    pthread_join(t, &other);
    CHECK_RESULT((pm_result)(intptr_t)other, PM_SUCCESS);
    CHECK_RESULT(pm_mem_free(blocks[--n]), PM_SUCCESS);
    void *q = NULL;
    CHECK_RESULT(pm_mem_alloc_from_pool(&q, 600 << 10, pool), PM_SUCCESS);
    if (q)
        CHECK_RESULT(pm_mem_free(q), PM_SUCCESS);
    while (n > 0)
        CHECK_RESULT(pm_mem_free(blocks[--n]), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

/* A pinned budget smaller than a pool's first chunk sizes that chunk, as a
 * memlock limit does, rather than refuse a fresh pool's first small block. */
static void first_chunk_within_budget(void)
{
    NEED_PINNABLE(64 * MiB);
    /* 16 MiB more than what this process has pinned so far. */
    REQUIRE_RESULT(pm_set_pinned_budget(16 * MiB + pm__budget_pinned()), PM_SUCCESS);
    pm_mem_pool_t pool = make_pool(0);
    void *p = NULL;
    if (pool) {
        CHECK_RESULT(pm_mem_alloc_from_pool(&p, 100, pool), PM_SUCCESS);
        CHECK(pool_attr(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) <= 16 * MiB);
        if (p)
            CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    }
    CHECK_RESULT(pm_set_pinned_budget(0), PM_SUCCESS);
}

/* A request that grows the pool by a chunk and then fails to pin it leaves
 * no chunk behind: its address space goes back at once, not at a trim. */
static void failed_growth_keeps_no_chunk(void)
{
    NEED_PINNABLE(256 * MiB);
    pm_mem_pool_t pool = make_pool(0);
    REQUIRE(pool != NULL);
    /* A block too large for a thread cache: a cache holding blocks would
     * be emptied and the growth tried again, past the one-off fault. */
    void *first = NULL, *big = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&first, 2 * MiB, pool), PM_SUCCESS);
    for (int round = 0; round < 3; round++) {
        ((pm__pool *)pool)->fail_pin_countdown = 1;
        CHECK_RESULT(pm_mem_alloc_from_pool(&big, 96 * MiB, pool), PM_ERROR_OUT_OF_MEMORY);
        CHECK(strstr(pm_last_error_detail(), "injected") != NULL);
    }
    ((pm__pool *)pool)->fail_pin_countdown = 0;
    pm_pool_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_mem_pool_get_stats(pool, &st), PM_SUCCESS);
    printf("after three failed growths: %llu chunks added, %llu given back\n",
           st.chunks_pinned, st.chunks_released);
    CHECK(st.chunks_pinned - st.chunks_released == 1);
    CHECK_RESULT(pm_mem_free(first), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
}

int main(void)
{
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("backend: %s\n", pm_backend_name());
    creation_rows();
    size_rows();
    attribute_rows();
    destroy_with_live_allocation();
    pool_memory_queries(false);
    pool_memory_queries(true);
    bad_input();
    free_of_other_memory();
    rounding();
    numa_placement(false);
    numa_placement(true);
    numa_threads();
    stats();
    stale_run_memo();
    max_size_room();
    cached_blocks_serve_a_full_pool();
    first_chunk_within_budget();
    failed_growth_keeps_no_chunk();
    return check_finish("pool");
}
