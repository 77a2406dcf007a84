/* Every device the backend sees: pm_device_count, pm_device_get_info, the
 * device a pointer's memory belongs to, PINMEM_DEVICE at init, and that
 * the pinned memory pinmem makes for itself (pool chunks, the staging ring)
 * is PORTABLE. One GPU, or the POSIX backend's one simulated device, runs
 * every case but those that need a second device, which skip saying so. */
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "copy/copy.h"
#include "instance.h"
#include "test_hooks.h"

#ifdef PINMEM_HAVE_CUDA_HEADERS
#include "backend/cuda_loader.h"
#endif

static const pm__backend *backend(void)
{
    pm_result r;
    pm__instance *inst = pm__instance_get(&r);
    return inst ? &inst->backend : NULL;
}

static int device_count(void)
{
    int n = 0;
    return pm_device_count(&n) == PM_SUCCESS ? n : 0;
}

static void count_is_at_least_one(void)
{
    int n = -5;
    REQUIRE_RESULT(pm_device_count(&n), PM_SUCCESS);
    CHECK(n >= 1);
    CHECK(!on_backend("posix") || n == 1);
    CHECK_RESULT(pm_device_count(NULL), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "NULL") != NULL);
}

/* Each ordinal answers for itself; exactly one is the device in use, and it
 * agrees with pm_get_capabilities. */
static void info_for_every_ordinal(void)
{
    int n = device_count();
    REQUIRE(n >= 1);
    pm_capabilities caps = {.struct_size = sizeof caps};
    REQUIRE_RESULT(pm_get_capabilities(&caps), PM_SUCCESS);
    int in_use = 0;
    for (int i = 0; i < n; i++) {
        pm_device_info d;
        memset(&d, 0x5A, sizeof d);
        d.struct_size = sizeof d;
        REQUIRE_RESULT(pm_device_get_info(i, &d), PM_SUCCESS);
        printf("device %d: %s, bus %s, NUMA node %d, PCIe gen %d x%d%s\n", d.ordinal, d.name,
               d.pci_bus_id[0] ? d.pci_bus_id : "none", d.host_numa_node, d.pcie_generation,
               d.pcie_width, d.in_use ? " (in use)" : "");
        CHECK(d.struct_size == sizeof d);
        CHECK(d.ordinal == i);
        CHECK(d.in_use == 0 || d.in_use == 1);
        CHECK(d.name[0] != '\0' && memchr(d.name, '\0', sizeof d.name) != NULL);
        CHECK(memchr(d.pci_bus_id, '\0', sizeof d.pci_bus_id) != NULL);
        CHECK(d.host_numa_node >= -1);
        CHECK(d.pcie_generation >= 0 && d.pcie_generation <= 6);
        CHECK(d.pcie_width >= 0 && d.pcie_width <= 32);
        CHECK(d.unified_addressing == 0 || d.unified_addressing == 1);
        in_use += d.in_use;
        if (on_backend("cuda"))
            CHECK(strlen(d.pci_bus_id) >= 12); /* the driver places every device */
        if (!d.in_use)
            continue;
        CHECK(d.ordinal == (on_backend("cuda") ? caps.device_ordinal : 0));
        CHECK(d.can_map_host_memory == caps.can_map_host_memory);
        CHECK(d.unified_addressing == caps.unified_addressing);
        CHECK(d.can_use_host_pointer_for_registered_mem ==
              caps.can_use_host_pointer_for_registered_mem);
        CHECK(d.read_only_host_register_supported == caps.read_only_host_register_supported);
        CHECK(d.pageable_memory_access_uses_host_page_tables ==
              caps.pageable_memory_access_uses_host_page_tables);
        if (on_backend("cuda"))
            CHECK(strcmp(d.name, caps.device_name) == 0);
    }
    CHECK(in_use == 1);
}

/* INVALID_DEVICE, as cuDeviceGet answers, with a detail naming the count;
 * nothing written. */
static void ordinals_that_do_not_exist(void)
{
    int n = device_count();
    REQUIRE(n >= 1);
    char count[32];
    snprintf(count, sizeof count, "has %d device", n);
    int bad[] = {-1, n, n + 1, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pm_device_info d;
        memset(&d, 0x5A, sizeof d);
        d.struct_size = sizeof d;
        CHECK_RESULT(pm_device_get_info(bad[i], &d), PM_ERROR_INVALID_DEVICE);
        CHECK(strstr(pm_last_error_detail(), count) != NULL);
        CHECK(d.name[0] == 0x5A && d.ordinal == 0x5A5A5A5A);
    }
}

/* The versioned-struct rule: NULL, a struct_size too small to hold itself
 * or larger than this library's is INVALID_VALUE; an older, smaller struct
 * is filled as far as it goes and no further. */
static void struct_size_checked(void)
{
    CHECK_RESULT(pm_device_get_info(0, NULL), PM_ERROR_INVALID_VALUE);
    union {
        pm_device_info d;
        unsigned char bytes[sizeof(pm_device_info) + 64];
    } u;
    size_t bad[] = {0, 4, sizeof(size_t) - 1, sizeof u.d + 1, sizeof u.d + 64};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(u.bytes, 0x5A, sizeof u.bytes);
        u.d.struct_size = bad[i];
        CHECK_RESULT(pm_device_get_info(0, &u.d), PM_ERROR_INVALID_VALUE);
        CHECK(strstr(pm_last_error_detail(), "struct_size") != NULL);
    }
    /* A struct that ended after the name. */
    size_t old = offsetof(pm_device_info, pci_bus_id);
    memset(u.bytes, 0x5A, sizeof u.bytes);
    u.d.struct_size = old;
    REQUIRE_RESULT(pm_device_get_info(0, &u.d), PM_SUCCESS);
    CHECK(u.d.struct_size == old);
    CHECK(u.d.ordinal == 0 && u.d.name[0] != 0x5A);
    bool untouched = true;
    for (size_t i = old; i < sizeof u.bytes; i++)
        untouched = untouched && u.bytes[i] == 0x5A;
    CHECK(untouched);
}

/* PINMEM_DEVICE is read once, at init, and a child forked after init
 * cannot use pinmem: each value runs in a new process of this program
 * ("init" as its argument), which prints pm_init's result and detail.
 * Returns whether the detail names PINMEM_DEVICE, or -1 when the child did
 * not answer. */
static int init_with_device(const char *device, const char *backend_name, pm_result *r)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    int pipefd[2];
    if (n <= 0 || pipe(pipefd) != 0)
        return -1;
    self[n] = '\0';
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], STDOUT_FILENO);
        setenv("PINMEM_DEVICE", device, 1);
        if (backend_name)
            setenv("PINMEM_BACKEND", backend_name, 1);
        else
            unsetenv("PINMEM_BACKEND");
        execl(self, self, "init", (char *)NULL);
        _exit(127);
    }
    close(pipefd[1]);
    char line[700] = "";
    size_t got = 0;
    ssize_t k;
    while (pid > 0 && got < sizeof line - 1 &&
           (k = read(pipefd[0], line + got, sizeof line - 1 - got)) > 0)
        got += (size_t)k;
    close(pipefd[0]);
    int status = 0;
    if (pid > 0)
        waitpid(pid, &status, 0);
    line[got] = '\0';
    int code = -1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || sscanf(line, "%d", &code) != 1)
        return -1;
    *r = (pm_result)code;
    line[strcspn(line, "\n")] = '\0';
    printf("PINMEM_DEVICE=%s%s%s: %s\n", device, backend_name ? ", PINMEM_BACKEND=" : "",
           backend_name ? backend_name : "", line);
    return strstr(line, "PINMEM_DEVICE") != NULL ? 1 : 0;
}

/* The child's side of init_with_device. */
static int init_only(void)
{
    pm_result r = pm_init(0);
    printf("%d %s\n", (int)r, pm_last_error_detail());
    return 0;
}

/* An ordinal past the count is refused at init, by whichever backend would
 * serve (posix simulates one device), never quietly replaced by another
 * backend that ignores it; the last ordinal is taken. */
static void pinmem_device_past_the_count(void)
{
    int n = device_count();
    REQUIRE(n >= 1);
    char past[16], last[16];
    snprintf(past, sizeof past, "%d", n);
    snprintf(last, sizeof last, "%d", n - 1);
    /* Unnamed, the child picks the backend as the parent did: by the
     * environment's PINMEM_BACKEND where it names one (with it unset, posix
     * would count one device where cuda counts several). */
    const char *forced = getenv("PINMEM_BACKEND");
    const char *names[] = {forced && *forced && strcmp(forced, "auto") != 0 ? forced : NULL,
                           on_backend("cuda") ? "cuda" : "posix"};
    for (size_t i = 0; i < 2; i++) {
        pm_result r = PM_SUCCESS;
        int named = init_with_device(past, names[i], &r);
        REQUIRE(named >= 0);
        /* Forcing cuda wraps the backend's failure in NO_DEVICE (pm_init). */
        CHECK(r == PM_ERROR_INVALID_DEVICE ||
              (names[i] && strcmp(names[i], "cuda") == 0 && r == PM_ERROR_NO_DEVICE));
        CHECK(named == 1);
        REQUIRE(init_with_device("9999", names[i], &r) >= 0);
        CHECK(r != PM_SUCCESS);
        r = PM_ERROR_UNKNOWN;
        REQUIRE(init_with_device(last, names[i], &r) >= 0);
        CHECK_RESULT(r, PM_SUCCESS);
    }
}

/* Device memory from pm_device_alloc belongs to the device in use, at its
 * base and inside it; host memory is no device's. */
static void pointer_device_of_device_memory(void)
{
    const pm__backend *b = backend();
    REQUIRE(b);
    pm_deviceptr d = 0;
    REQUIRE_RESULT(pm_device_alloc(&d, 1 << 20), PM_SUCCESS);
    int ordinal = -7;
    CHECK_RESULT(b->pointer_device(d, &ordinal), PM_SUCCESS);
    CHECK(ordinal == b->device_in_use);
    ordinal = -7;
    CHECK_RESULT(b->pointer_device(d + 12345, &ordinal), PM_SUCCESS);
    CHECK(ordinal == b->device_in_use);
    CHECK_RESULT(pm_device_free(d), PM_SUCCESS);
    static char pageable[4096];
    CHECK_RESULT(b->pointer_device((pm_deviceptr)(uintptr_t)pageable, &ordinal),
                 PM_ERROR_INVALID_VALUE);
    void *pinned = NULL;
    REQUIRE_RESULT(pm_mem_alloc_host(&pinned, 4096), PM_SUCCESS);
    CHECK_RESULT(b->pointer_device((pm_deviceptr)(uintptr_t)pinned, &ordinal),
                 PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_free_host(pinned), PM_SUCCESS);
}

/* pm_device_alloc_on gives each device's memory, whatever the calling
 * thread's context, and refuses ordinals that name no device; a staged copy
 * from a thread without a context reaches every device's memory. */
static void alloc_on_every_device(void)
{
    const pm__backend *b = backend();
    REQUIRE(b);
    int n = device_count();
    pm_deviceptr d = 0;
    CHECK_RESULT(pm_device_alloc_on(&d, 4096, -1), PM_ERROR_INVALID_DEVICE);
    CHECK_RESULT(pm_device_alloc_on(&d, 4096, n), PM_ERROR_INVALID_DEVICE);
    CHECK_RESULT(pm_device_alloc_on(NULL, 4096, 0), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_device_alloc_on(&d, 0, 0), PM_ERROR_INVALID_VALUE);
    const size_t bytes = (size_t)8 << 20; /* staged, not the driver's own path */
    unsigned char *src = malloc(bytes), *back = malloc(bytes);
    REQUIRE(src && back);
    for (int i = 0; i < n; i++) {
        REQUIRE_RESULT(pm_device_alloc_on(&d, bytes, i), PM_SUCCESS);
        int ordinal = -7;
        CHECK_RESULT(b->pointer_device(d, &ordinal), PM_SUCCESS);
        CHECK(ordinal == i);
        for (size_t k = 0; k < bytes; k++)
            src[k] = (unsigned char)(k * 31 + (size_t)i);
        memset(back, 0, bytes);
        CHECK_RESULT(pm_memcpy_htod(d, src, bytes), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_dtoh(back, d, bytes), PM_SUCCESS);
        CHECK(memcmp(src, back, bytes) == 0);
        CHECK_RESULT(pm_device_free(d), PM_SUCCESS);
    }
    free(src);
    free(back);
}

/* What the driver itself says of memory pinmem pinned (cuda only: posix
 * has no driver to ask, and one device). */
static void driver_says_portable(const pm__backend *b, void *p, bool must)
{
    if (!on_backend("cuda"))
        return;
    unsigned flags = 0;
    pm_result r = b->foreign_get_flags(&flags, p);
    printf("driver's flags for %p: %s 0x%x\n", p, pm_result_name(r), flags);
    if (must) {
        CHECK_RESULT(r, PM_SUCCESS);
        CHECK(flags & PM_MEMHOSTALLOC_PORTABLE);
    }
}

/* Pool chunks are shared by every user of the process, so every device's
 * context must be able to use them: pinmem answers PORTABLE for pool
 * memory, and on cuda the driver does for registered chunks (VMM granules
 * are mapped for every device instead; what the driver's flags say of
 * them is printed, not checked). */
static void pool_memory_is_portable(void)
{
    const pm__backend *b = backend();
    REQUIRE(b);
    pm_mem_pool_t pool = NULL;
    REQUIRE_RESULT(pm_mem_get_default_pool(&pool), PM_SUCCESS);
    void *p = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&p, 64 << 10, pool), PM_SUCCESS);
    REQUIRE(p);
    unsigned flags = 0;
    CHECK_RESULT(pm_mem_host_get_flags(&flags, p), PM_SUCCESS);
    CHECK(flags == (PM_MEMHOSTALLOC_PORTABLE | PM_MEMHOSTALLOC_DEVICEMAP));
    driver_says_portable(b, p, b->pool_keep.granule_min == 0);
    CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);

    /* A pool that gives memory back pins with the other chunk ops. */
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    pm_mem_pool_t giving = NULL;
    REQUIRE_RESULT(pm_mem_pool_create(&giving, &props), PM_SUCCESS);
    uint64_t zero = 0;
    CHECK_RESULT(pm_mem_pool_set_attribute(giving, PM_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero),
                 PM_SUCCESS);
    p = NULL;
    CHECK_RESULT(pm_mem_alloc_from_pool(&p, 64 << 10, giving), PM_SUCCESS);
    if (p) {
        CHECK_RESULT(pm_mem_host_get_flags(&flags, p), PM_SUCCESS);
        CHECK(flags == (PM_MEMHOSTALLOC_PORTABLE | PM_MEMHOSTALLOC_DEVICEMAP));
        driver_says_portable(b, p, b->pool_give_back.granule_min == 0);
        CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
    }
    CHECK_RESULT(pm_mem_pool_destroy(giving), PM_SUCCESS);
}

/* The staging ring is one host_alloc with flags 0, shared by every copy of
 * the process: the backend pins it PORTABLE whatever the flags. */
static void ring_memory_is_portable(void)
{
    const pm__backend *b = backend();
    REQUIRE(b);
    if (!on_backend("cuda"))
        SKIP_CASE("no driver to ask: the posix backend has one device, which uses all it pins");
    void *base = NULL;
    size_t pin_len = 0;
    unsigned tag = 0;
    REQUIRE_RESULT(b->host_alloc(1 << 20, 0, -1, &base, &pin_len, &tag), PM_SUCCESS);
    driver_says_portable(b, base, true);
    CHECK_RESULT(b->host_free(base, pin_len, tag), PM_SUCCESS);
}

/* The NUMA policy of the page at p: its mode, and in *node the lowest node of
 * its mask (-1: none); false where the kernel does not say. */
static bool page_policy(void *p, int *mode, int *node)
{
    enum { mpol_f_addr = 2 };
    unsigned long mask[4096 / (8 * sizeof(unsigned long))] = {0};
    if (syscall(SYS_get_mempolicy, mode, mask, (unsigned long)4096 + 1, p, mpol_f_addr) != 0)
        return false;
    const unsigned bits = 8 * sizeof(unsigned long);
    *node = -1;
    for (unsigned i = 0; i < 4096 && *node < 0; i++)
        if (mask[i / bits] >> (i % bits) & 1)
            *node = (int)i;
    return true;
}

/* The first device's ring, pinned anew (a new shape of engine stops the
 * engines, and a staged copy starts the first device's again). */
static void *repin_ring(unsigned buffers)
{
    pm_copy_config c = {.struct_size = sizeof c};
    REQUIRE_RESULT_OR(pm_copy_get_config(&c), PM_SUCCESS, NULL);
    c.buffers = buffers;
    REQUIRE_RESULT_OR(pm_copy_set_config(&c), PM_SUCCESS, NULL);
    const size_t n = (size_t)2 << 20;
    unsigned char *src = calloc(1, n);
    pm_deviceptr d = 0;
    CHECK_RESULT(pm_device_alloc(&d, n), PM_SUCCESS);
    if (src && d)
        CHECK_RESULT(pm_memcpy_htod(d, src, n), PM_SUCCESS);
    if (d)
        pm_device_free(d);
    free(src);
    pm__ring_plan ring = pm__staging_ring(pm__copy_enter());
    pm__copy_leave();
    return ring.pinned ? ring.base : NULL;
}

/* An engine's ring is bound to its device's nearest NUMA node where the
 * machine has several, and left to the process's policy where it has one;
 * the hook that binds it on one node shows the binding itself. */
static void ring_on_its_device_node(void)
{
    pm_device_info info = {.struct_size = sizeof info};
    REQUIRE_RESULT(pm_device_get_info(0, &info), PM_SUCCESS);
    if (info.host_numa_node < 0)
        SKIP_CASE("the first device's NUMA node is not known");
    int probe_mode, probe_node;
    if (!page_policy(&info, &probe_mode, &probe_node))
        SKIP_CASE("the kernel refuses memory policies here (get_mempolicy)");
    pm_copy_config saved = {.struct_size = sizeof saved};
    REQUIRE_RESULT(pm_copy_get_config(&saved), PM_SUCCESS);
    const bool one_node = pm__only_numa_node() >= 0;
    for (int forced = 0; forced < 2; forced++) {
        atomic_store(&pm__fault_ring_on_node, forced == 1);
        void *ring = repin_ring(saved.buffers + 1 + (unsigned)forced);
        int mode = -1, node = -1;
        CHECK(ring && page_policy(ring, &mode, &node));
        const bool bound = !one_node || forced;
        if (bound) {
            CHECK(mode == 2); /* MPOL_BIND */
            CHECK(node == info.host_numa_node);
        } else {
            CHECK(mode != 2);
        }
    }
    atomic_store(&pm__fault_ring_on_node, false);
    CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
}

/* ------------------------------------------------- cases for two devices */

#define NEED_TWO_DEVICES()                  \
    do {                                    \
        if (device_count() < 2)             \
            SKIP_CASE("needs two GPUs");    \
    } while (0)

static void devices_are_distinct(void)
{
    NEED_TWO_DEVICES();
    int n = device_count();
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            pm_device_info a = {.struct_size = sizeof a}, c = {.struct_size = sizeof c};
            REQUIRE_RESULT(pm_device_get_info(i, &a), PM_SUCCESS);
            REQUIRE_RESULT(pm_device_get_info(j, &c), PM_SUCCESS);
            CHECK(strcmp(a.pci_bus_id, c.pci_bus_id) != 0);
            CHECK(!(a.in_use && c.in_use));
        }
}

#ifdef PINMEM_HAVE_CUDA_HEADERS
/* Runs fn(arg) with the primary context of device ordinal current on the
 * calling thread. */
static pm_result in_device_context(int ordinal, void (*fn)(void *), void *arg)
{
    pm_result r = PM_SUCCESS;
    const pm__cuda_api *cu = pm__cuda_api_load(&r);
    if (!cu)
        return r;
    CUdevice dev;
    CUcontext ctx, popped;
    if (cu->device_get(&dev, ordinal) != CUDA_SUCCESS ||
        cu->primary_ctx_retain(&ctx, dev) != CUDA_SUCCESS)
        return PM_ERROR_INVALID_DEVICE;
    if (cu->ctx_push(ctx) != CUDA_SUCCESS) {
        cu->primary_ctx_release(dev);
        return PM_ERROR_INVALID_CONTEXT;
    }
    fn(arg);
    cu->ctx_pop(&popped);
    cu->primary_ctx_release(dev);
    return PM_SUCCESS;
}

typedef struct other_device {
    int ordinal;     /* the device whose context is current */
    void *host;      /* pinned host memory to copy from */
    size_t bytes;
    pm_result alloc, copy, back, owner;
    int answered;    /* pointer_device's answer for the device memory */
    bool same;       /* the bytes came back */
} other_device;

/* In the other device's context: device memory there, a copy from host
 * memory to it and back, as pinmem's and the driver's calls do them. */
static void copy_through_other_device(void *arg)
{
    other_device *o = arg;
    const pm__backend *b = backend();
    pm_deviceptr d = 0;
    o->alloc = pm_device_alloc(&d, o->bytes);
    if (o->alloc != PM_SUCCESS)
        return;
    o->owner = b->pointer_device(d, &o->answered);
    unsigned char *back = malloc(o->bytes);
    memset(o->host, 0xC3, o->bytes);
    o->copy = b->copy_htod(d, o->host, o->bytes);
    o->back = back ? b->copy_dtoh(back, d, o->bytes) : PM_ERROR_OUT_OF_MEMORY;
    o->same = back && o->copy == PM_SUCCESS && o->back == PM_SUCCESS &&
              memcmp(back, o->host, o->bytes) == 0;
    free(back);
    pm_device_free(d);
}

/* Device memory made in another device's context is that device's; pool
 * memory (PORTABLE) copies to it from that context. */
static void portable_memory_on_another_device(void)
{
    NEED_TWO_DEVICES();
    const pm__backend *b = backend();
    REQUIRE(b);
    int other = b->device_in_use == 0 ? 1 : 0;
    pm_mem_pool_t pool = NULL;
    REQUIRE_RESULT(pm_mem_get_default_pool(&pool), PM_SUCCESS);
    void *p = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool(&p, 1 << 20, pool), PM_SUCCESS);
    other_device o = {.ordinal = other, .host = p, .bytes = 1 << 20, .answered = -1};
    CHECK_RESULT(in_device_context(other, copy_through_other_device, &o), PM_SUCCESS);
    CHECK_RESULT(o.alloc, PM_SUCCESS);
    CHECK_RESULT(o.owner, PM_SUCCESS);
    CHECK(o.answered == other);
    CHECK_RESULT(o.copy, PM_SUCCESS);
    CHECK_RESULT(o.back, PM_SUCCESS);
    CHECK(o.same);
    CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
}

/* The driver's answer for memory pinned without PORTABLE, used from
 * another device's context, is still to be measured
 * (docs/driver-behavior.md, "Several devices"): this prints it, for the
 * driver's own cuMemHostAlloc and for pinmem's pm_mem_host_alloc. */
static void non_portable_memory_on_another_device(void)
{
    NEED_TWO_DEVICES();
    const pm__backend *b = backend();
    REQUIRE(b);
    pm_result r = PM_SUCCESS;
    const pm__cuda_api *cu = pm__cuda_api_load(&r);
    REQUIRE(cu);
    int other = b->device_in_use == 0 ? 1 : 0;
    size_t bytes = 1 << 20;
    /* The driver's own, made in the device in use's primary context. */
    CUdevice dev;
    CUcontext ctx, popped;
    REQUIRE(cu->device_get(&dev, b->device_in_use) == CUDA_SUCCESS);
    REQUIRE(cu->primary_ctx_retain(&ctx, dev) == CUDA_SUCCESS);
    void *raw = NULL;
    CUresult rc = CUDA_ERROR_UNKNOWN;
    if (cu->ctx_push(ctx) == CUDA_SUCCESS) {
        rc = cu->mem_host_alloc(&raw, bytes, 0);
        cu->ctx_pop(&popped);
    }
    if (rc == CUDA_SUCCESS) {
        other_device o = {.ordinal = other, .host = raw, .bytes = bytes, .answered = -1};
        CHECK_RESULT(in_device_context(other, copy_through_other_device, &o), PM_SUCCESS);
        printf("driver's cuMemHostAlloc(0) memory from device %d's context: alloc %s, copy %s, "
               "back %s, bytes %s\n",
               other, pm_result_name(o.alloc), pm_result_name(o.copy), pm_result_name(o.back),
               o.same ? "the same" : "differ");
        cu->mem_free_host(raw);
    }
    cu->primary_ctx_release(dev);
    CHECK(rc == CUDA_SUCCESS);
    void *mine = NULL;
    REQUIRE_RESULT(pm_mem_host_alloc(&mine, bytes, 0), PM_SUCCESS);
    other_device o = {.ordinal = other, .host = mine, .bytes = bytes, .answered = -1};
    CHECK_RESULT(in_device_context(other, copy_through_other_device, &o), PM_SUCCESS);
    printf("pm_mem_host_alloc(0) memory from device %d's context: alloc %s, copy %s, back %s, "
           "bytes %s\n",
           other, pm_result_name(o.alloc), pm_result_name(o.copy), pm_result_name(o.back),
           o.same ? "the same" : "differ");
    CHECK_RESULT(pm_mem_free_host(mine), PM_SUCCESS);
}

/* What one kind of pinned memory answers to the host-memory queries. */
typedef struct host_answers {
    pm_result flags_r, pointer_r, range_r;
    unsigned flags;
    bool pointer_is_p; /* the device pointer is the host address (unified addressing) */
    bool range_is_p;   /* the range is [p, p + bytes) */
} host_answers;

typedef struct host_query {
    void *p;
    size_t bytes;
    bool driver; /* asked of the driver, else of pinmem */
    host_answers got;
} host_query;

/* In the current context: the flags, device pointer and address range of q->p. */
static void ask_host_queries(void *arg)
{
    host_query *q = arg;
    host_answers *a = &q->got;
    pm_deviceptr dptr = 0, base = 0;
    size_t size = 0;
    if (q->driver) {
        pm_result r = PM_SUCCESS;
        const pm__cuda_api *cu = pm__cuda_api_load(&r);
        CUdeviceptr d = 0, b = 0;
        a->flags_r = (pm_result)cu->mem_host_get_flags(&a->flags, q->p);
        a->pointer_r = (pm_result)cu->mem_host_get_device_pointer(&d, q->p, 0);
        a->range_r = (pm_result)cu->mem_get_address_range(&b, &size, (CUdeviceptr)(uintptr_t)q->p);
        dptr = d;
        base = b;
    } else {
        a->flags_r = pm_mem_host_get_flags(&a->flags, q->p);
        a->pointer_r = pm_mem_host_get_device_pointer(&dptr, q->p, 0);
        a->range_r = pm_mem_get_address_range(&base, &size, (pm_deviceptr)(uintptr_t)q->p);
    }
    a->pointer_is_p = dptr == (pm_deviceptr)(uintptr_t)q->p;
    a->range_is_p = base == (pm_deviceptr)(uintptr_t)q->p && size == q->bytes;
}

enum { host_kinds = 3 };
static const char *const host_kind_names[host_kinds] = {"alloc(0)", "alloc(PORTABLE)",
                                                        "register(0)"};

typedef struct driver_pin {
    int kind;
    size_t bytes;
    void *p; /* the memory to register, or the allocation made */
    CUresult rc;
} driver_pin;

static void pin_with_driver(void *arg)
{
    driver_pin *d = arg;
    pm_result r = PM_SUCCESS;
    const pm__cuda_api *cu = pm__cuda_api_load(&r);
    d->rc = !cu             ? CUDA_ERROR_NOT_INITIALIZED
            : d->kind == 2 ? cu->mem_host_register(d->p, d->bytes, 0)
                           : cu->mem_host_alloc(&d->p, d->bytes,
                                                d->kind == 1 ? CU_MEMHOSTALLOC_PORTABLE : 0);
}

/* Makes kind k of pinned memory with the driver in the device in use's
 * primary context (driver) or with pinmem; NULL where it could not. */
static void *pin_kind(int k, size_t bytes, bool driver, void *registered)
{
    if (driver) {
        driver_pin d = {k, bytes, registered, CUDA_ERROR_UNKNOWN};
        pm_result r = in_device_context(backend()->device_in_use, pin_with_driver, &d);
        return r == PM_SUCCESS && d.rc == CUDA_SUCCESS ? d.p : NULL;
    }
    void *p = NULL;
    pm_result r = k == 2 ? pm_mem_host_register(registered, bytes, 0)
                         : pm_mem_host_alloc(&p, bytes, k == 1 ? PM_MEMHOSTALLOC_PORTABLE : 0);
    return r == PM_SUCCESS ? (k == 2 ? registered : p) : NULL;
}

static void unpin_with_driver(void *arg)
{
    driver_pin *d = arg;
    pm_result r = PM_SUCCESS;
    const pm__cuda_api *cu = pm__cuda_api_load(&r);
    d->rc = !cu             ? CUDA_ERROR_NOT_INITIALIZED
            : d->kind == 2 ? cu->mem_host_unregister(d->p)
                           : cu->mem_free_host(d->p);
}

static void unpin_kind(int k, void *p, bool driver)
{
    if (driver) {
        driver_pin d = {k, 0, p, CUDA_ERROR_UNKNOWN};
        CHECK_RESULT(in_device_context(backend()->device_in_use, unpin_with_driver, &d),
                     PM_SUCCESS);
        CHECK(d.rc == CUDA_SUCCESS);
    } else {
        CHECK_RESULT(k == 2 ? pm_mem_host_unregister(p) : pm_mem_free_host(p), PM_SUCCESS);
    }
}

/* Pinned memory of each kind, made on the device in use, asked about in
 * another device's context: pinmem answers as the driver does
 * (docs/driver-behavior.md, "Several devices"). */
static void host_queries_on_another_device(void)
{
    NEED_TWO_DEVICES();
    const pm__backend *b = backend();
    REQUIRE(b);
    const int other = b->device_in_use == 0 ? 1 : 0;
    const size_t bytes = (size_t)1 << 20;
    for (int k = 0; k < host_kinds; k++) {
        host_query q[2] = {{.bytes = bytes, .driver = true}, {.bytes = bytes, .driver = false}};
        void *plain[2] = {NULL, NULL};
        for (int i = 0; i < 2; i++) {
            plain[i] = k == 2 ? aligned_alloc(4096, bytes) : NULL;
            q[i].p = k == 2 && !plain[i] ? NULL : pin_kind(k, bytes, q[i].driver, plain[i]);
            CHECK(q[i].p != NULL);
            if (q[i].p)
                CHECK_RESULT(in_device_context(other, ask_host_queries, &q[i]), PM_SUCCESS);
        }
        const host_answers *d = &q[0].got, *m = &q[1].got;
        printf("%s from device %d's context, driver / pinmem: flags %s 0x%x / %s 0x%x, device "
               "pointer %s%s / %s%s, range %s%s / %s%s\n",
               host_kind_names[k], other, pm_result_name(d->flags_r), d->flags,
               pm_result_name(m->flags_r), m->flags, pm_result_name(d->pointer_r),
               d->pointer_is_p ? " (p)" : "", pm_result_name(m->pointer_r),
               m->pointer_is_p ? " (p)" : "", pm_result_name(d->range_r),
               d->range_is_p ? " (p, bytes)" : "", pm_result_name(m->range_r),
               m->range_is_p ? " (p, bytes)" : "");
        if (q[0].p && q[1].p) {
            CHECK_RESULT(m->flags_r, d->flags_r);
            CHECK(d->flags_r != PM_SUCCESS || m->flags == d->flags);
            CHECK_RESULT(m->pointer_r, d->pointer_r);
            CHECK(d->pointer_r != PM_SUCCESS || m->pointer_is_p == d->pointer_is_p);
            CHECK_RESULT(m->range_r, d->range_r);
            CHECK(d->range_r != PM_SUCCESS || m->range_is_p == d->range_is_p);
        }
        for (int i = 0; i < 2; i++) {
            if (q[i].p)
                unpin_kind(k, q[i].p, q[i].driver);
            free(plain[i]);
        }
    }
}

typedef struct device_copy {
    int ordinal;
    size_t bytes;
    pm_result alloc, to, from;
    bool same;
} device_copy;

/* Pageable memory to the device of the current context and back, through
 * the copy engine. */
static void pageable_round_trip(void *arg)
{
    device_copy *c = arg;
    unsigned char *src = malloc(c->bytes), *back = malloc(c->bytes);
    pm_deviceptr d = 0;
    c->alloc = src && back ? pm_device_alloc(&d, c->bytes) : PM_ERROR_OUT_OF_MEMORY;
    if (c->alloc == PM_SUCCESS) {
        for (size_t i = 0; i < c->bytes; i++)
            src[i] = (unsigned char)(i * 7 + (size_t)c->ordinal);
        c->to = pm_memcpy_htod(d, src, c->bytes);
        c->from = pm_memcpy_dtoh(back, d, c->bytes);
        c->same = c->to == PM_SUCCESS && c->from == PM_SUCCESS &&
                  memcmp(src, back, c->bytes) == 0;
        pm_device_free(d);
    }
    free(src);
    free(back);
}

static void *copy_on_device(void *arg)
{
    device_copy *c = arg;
    if (in_device_context(c->ordinal, pageable_round_trip, c) != PM_SUCCESS)
        c->alloc = PM_ERROR_INVALID_CONTEXT;
    return NULL;
}

/* Two threads, each copying pageable memory to its own device and back at
 * the same time: every byte arrives, and each device's copies ran on an
 * engine of its own (two engines' workers run). */
static void copies_to_two_devices_at_once(void)
{
    NEED_TWO_DEVICES();
    pm_copy_config config = {.struct_size = sizeof config};
    CHECK_RESULT(pm_copy_get_config(&config), PM_SUCCESS);
    device_copy c[2] = {{.ordinal = 0, .bytes = 64 << 20}, {.ordinal = 1, .bytes = 64 << 20}};
    pthread_t t[2];
    bool started[2];
    for (int i = 0; i < 2; i++)
        started[i] = pthread_create(&t[i], NULL, copy_on_device, &c[i]) == 0;
    for (int i = 0; i < 2; i++) {
        if (!started[i]) {
            CHECK(started[i]);
            continue;
        }
        pthread_join(t[i], NULL);
        CHECK_RESULT(c[i].alloc, PM_SUCCESS);
        CHECK_RESULT(c[i].to, PM_SUCCESS);
        CHECK_RESULT(c[i].from, PM_SUCCESS);
        CHECK(c[i].same);
    }
    pm_copy_stats stats = {.struct_size = sizeof stats};
    CHECK_RESULT(pm_copy_get_stats(&stats), PM_SUCCESS);
    CHECK(stats.staging_threads == 2 * config.workers);
}

typedef struct foreign_stream {
    int ordinal;       /* the device whose stream it is */
    CUstream stream;   /* made in that device's primary context */
} foreign_stream;

static void make_stream(void *arg)
{
    foreign_stream *f = arg;
    const pm__cuda_api *cu = pm__cuda_api_load(&(pm_result){0});
    if (cu && cu->stream_create(&f->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        f->stream = NULL;
}

static void destroy_stream(void *arg)
{
    foreign_stream *f = arg;
    const pm__cuda_api *cu = pm__cuda_api_load(&(pm_result){0});
    if (cu && f->stream)
        cu->stream_destroy(f->stream);
}

typedef struct stream_copy {
    foreign_stream *f;
    pm_deviceptr d;
    size_t bytes;
    pm_result to, from, synced, freed, recorded;
    bool same;
} stream_copy;

/* Pageable memory to the other device and back on that device's stream,
 * staged, with a pool block freed in its order and an event recorded on it
 * and then on the legacy stream: every marker the calls make belongs to the
 * stream's context, whichever context the calling thread has. */
static void copy_on_foreign_stream(void *arg)
{
    stream_copy *c = arg;
    pm_stream_t s = (pm_stream_t)c->f->stream;
    unsigned char *src = malloc(c->bytes), *back = calloc(1, c->bytes);
    if (!src || !back) {
        c->to = PM_ERROR_OUT_OF_MEMORY;
        free(src);
        free(back);
        return;
    }
    for (size_t k = 0; k < c->bytes; k++)
        src[k] = (unsigned char)(k * 17 + 3);
    c->to = pm_memcpy_htod_async(c->d, src, c->bytes, s);
    c->from = pm_memcpy_dtoh_async(back, c->d, c->bytes, s);
    c->synced = pm_stream_synchronize(s);
    c->same = memcmp(src, back, c->bytes) == 0;
    void *block = NULL;
    pm_mem_pool_t pool = NULL;
    c->freed = pm_mem_get_default_pool(&pool);
    if (c->freed == PM_SUCCESS)
        c->freed = pm_mem_alloc_from_pool_async(&block, 4096, pool, s);
    if (c->freed == PM_SUCCESS)
        c->freed = pm_mem_free_async(block, s);
    pm_event_t e = NULL;
    c->recorded = pm_event_create(&e);
    if (c->recorded == PM_SUCCESS) {
        c->recorded = pm_event_record(e, s);
        if (c->recorded == PM_SUCCESS)
            c->recorded = pm_event_record(e, NULL);
        if (c->recorded == PM_SUCCESS)
            c->recorded = pm_event_synchronize(e);
        pm_event_destroy(e);
    }
    c->synced = c->synced == PM_SUCCESS ? pm_stream_synchronize(s) : c->synced;
    free(src);
    free(back);
}

/* The other device's stream, used from a thread in the device in use's
 * context and from one without a context. */
static void streams_of_another_device(void)
{
    NEED_TWO_DEVICES();
    const pm__backend *b = backend();
    REQUIRE(b);
    int other = b->device_in_use == 0 ? 1 : 0;
    foreign_stream f = {.ordinal = other};
    REQUIRE_RESULT(in_device_context(other, make_stream, &f), PM_SUCCESS);
    REQUIRE(f.stream);
    pm_deviceptr d = 0;
    const pm_result allocated = pm_device_alloc_on(&d, (size_t)8 << 20, other);
    CHECK_RESULT(allocated, PM_SUCCESS);
    if (allocated == PM_SUCCESS) {
        for (int how = 0; how < 2; how++) {
            stream_copy c = {.f = &f, .d = d, .bytes = (size_t)8 << 20};
            if (how == 0)
                CHECK_RESULT(in_device_context(b->device_in_use, copy_on_foreign_stream, &c),
                             PM_SUCCESS);
            else
                copy_on_foreign_stream(&c);
            CHECK_RESULT(c.to, PM_SUCCESS);
            CHECK_RESULT(c.from, PM_SUCCESS);
            CHECK_RESULT(c.synced, PM_SUCCESS);
            CHECK(c.same);
            CHECK_RESULT(c.freed, PM_SUCCESS);
            CHECK_RESULT(c.recorded, PM_SUCCESS);
        }
        CHECK_RESULT(pm_device_free(d), PM_SUCCESS);
    }
    CHECK_RESULT(in_device_context(other, destroy_stream, &f), PM_SUCCESS);
}
#else
static void streams_of_another_device(void) { NEED_TWO_DEVICES(); }
static void portable_memory_on_another_device(void) { NEED_TWO_DEVICES(); }
static void non_portable_memory_on_another_device(void) { NEED_TWO_DEVICES(); }
static void host_queries_on_another_device(void) { NEED_TWO_DEVICES(); }
static void copies_to_two_devices_at_once(void) { NEED_TWO_DEVICES(); }
#endif

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "init") == 0)
        return init_only();
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    printf("backend %s, %d device(s)\n", pm_backend_name(), device_count());
    count_is_at_least_one();
    info_for_every_ordinal();
    ordinals_that_do_not_exist();
    struct_size_checked();
    pinmem_device_past_the_count();
    pointer_device_of_device_memory();
    alloc_on_every_device();
    pool_memory_is_portable();
    ring_memory_is_portable();
    ring_on_its_device_node();
    devices_are_distinct();
    portable_memory_on_another_device();
    non_portable_memory_on_another_device();
    host_queries_on_another_device();
    copies_to_two_devices_at_once();
    streams_of_another_device();
    return check_finish("devices");
}
