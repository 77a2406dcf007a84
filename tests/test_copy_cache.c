/* The registration cache never sends stale data: memory unmapped and mapped
 * again at the same address, discarded with MADV_DONTNEED, or freed and
 * malloc'ed again. Copies small enough for the driver's own path are staged
 * where they touch cached memory. An invalidation, or a user's registration,
 * that dooms an entry whose registration then fails returns, and a range
 * unmapped and mapped anew while the cache registers it is not cached. A
 * cached buffer moved or grown with mremap leaves nothing behind in the
 * cache's userfaultfd that could make a read(2) into its missing pages
 * fail. Shared memory is not cached, and unmaps are heard while an undo
 * waits. And a fault sweep: the k-th backend copy fails, or the staging ring
 * cannot be pinned: clean errors or the backend's own path, correct data
 * after, no thread left waiting, nothing left pinned. */
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "copy/copy.h"
#include "test_hooks.h"
#include "copy_util.h"

enum { buffer_bytes = 4 << 20 }; /* within an ordinary user's RLIMIT_MEMLOCK */

static pm_copy_stats stats(void)
{
    pm_copy_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_copy_get_stats(&st), PM_SUCCESS);
    return st;
}

/* Sends p to the device twice (the second through the cache, where it
 * registers) and checks what arrives. */
static void send_and_check(uint8_t *p, pm_deviceptr dev, unsigned seed, uint8_t *back)
{
    for (int twice = 0; twice < 2; twice++) {
        CHECK_RESULT(pm_memcpy_htod(dev, p, buffer_bytes), PM_SUCCESS);
        memset(back, 0, buffer_bytes);
        CHECK_RESULT(test_backend()->copy_dtoh(back, dev, buffer_bytes), PM_SUCCESS);
        size_t bad = first_mismatch(back, buffer_bytes, seed);
        if (bad != buffer_bytes)
            fprintf(stderr, "seed %u: byte %zu of %d is stale or wrong\n", seed, bad, buffer_bytes);
        CHECK(bad == buffer_bytes);
    }
}

/* And the other way: the device's bytes must land in the memory the CPU sees. */
static void receive_and_check(uint8_t *p, pm_deviceptr dev, unsigned seed, uint8_t *scratch)
{
    fill(scratch, buffer_bytes, seed);
    CHECK_RESULT(test_backend()->copy_htod(dev, scratch, buffer_bytes), PM_SUCCESS);
    memset(p, 0, buffer_bytes);
    CHECK_RESULT(pm_memcpy_dtoh(p, dev, buffer_bytes), PM_SUCCESS);
    CHECK(first_mismatch(p, buffer_bytes, seed) == buffer_bytes);
}

static uint8_t *map_at(void *where)
{
    void *p = mmap(where, buffer_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (where ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void unmap_and_map_again(pm_deviceptr dev, uint8_t *back)
{
    /* Between the munmap and the mmap another thread of the process (the
     * driver's, say) may map memory into the range; then the scenario did not
     * happen, and it is tried again with a new range. */
    for (int attempt = 0; attempt < 20; attempt++) {
        uint8_t *p = map_at(NULL);
        REQUIRE(p);
        fill(p, buffer_bytes, 1);
        send_and_check(p, dev, 1, back);
        CHECK_RESULT(munmap(p, buffer_bytes) == 0 ? PM_SUCCESS : PM_ERROR_UNKNOWN, PM_SUCCESS);
        uint8_t *q = map_at(p);
        if (!q)
            continue;
        fill(q, buffer_bytes, 2);
        send_and_check(q, dev, 2, back);
        receive_and_check(q, dev, 3, back);
        munmap(q, buffer_bytes);
        return;
    }
    CHECK(!"munmap + mmap at the same address: the range was taken by someone else every time");
}

static void discard(pm_deviceptr dev, uint8_t *back)
{
    uint8_t *p = map_at(NULL);
    REQUIRE(p);
    fill(p, buffer_bytes, 4);
    send_and_check(p, dev, 4, back);
    CHECK(madvise(p, buffer_bytes, MADV_DONTNEED) == 0);
    fill(p, buffer_bytes, 5);
    send_and_check(p, dev, 5, back);
    CHECK(madvise(p, buffer_bytes, MADV_DONTNEED) == 0);
    receive_and_check(p, dev, 6, back);
    munmap(p, buffer_bytes);
}

static void free_and_malloc(pm_deviceptr dev, uint8_t *back)
{
#ifdef M_MMAP_THRESHOLD /* glibc: fixed, so that freeing unmaps and malloc maps again */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
    uint8_t *p = malloc(buffer_bytes);
    REQUIRE(p);
    fill(p, buffer_bytes, 7);
    send_and_check(p, dev, 7, back);
    free(p);
    uint8_t *q = malloc(buffer_bytes);
    REQUIRE(q);
    printf("free + malloc: %s address\n", q == p ? "the same" : "a different");
    fill(q, buffer_bytes, 8);
    send_and_check(q, dev, 8, back);
    free(q);
}

static void unmap_buffer(uint8_t **p)
{
    if (*p)
        munmap(*p, buffer_bytes);
}

static void explicit_invalidate(pm_deviceptr dev, uint8_t *back)
{
    __attribute__((cleanup(unmap_buffer))) uint8_t *p = map_at(NULL);
    REQUIRE(p);
    fill(p, buffer_bytes, 9);
    send_and_check(p, dev, 9, back);
    unsigned long long before = stats().cache_invalidations;
    CHECK_RESULT(pm_mem_invalidate(p + 100, 10), PM_SUCCESS);
    if (stats().cache_listening && stats().cache_registrations)
        CHECK(stats().cache_invalidations == before + 1);
    /* A user's own registration of cached pages takes them over. */
    send_and_check(p, dev, 9, back);
    REQUIRE_PINNED(pm_mem_host_register(p, buffer_bytes, 0), "a 4 MiB registration");
    send_and_check(p, dev, 9, back);
    CHECK_RESULT(pm_mem_host_unregister(p), PM_SUCCESS);
}


/* Whether the copies between counters a and b moved driver_bytes and
 * staged_bytes by exactly these, saying what they moved where not. */
static bool moved(const char *what, const pm_copy_stats *a, const pm_copy_stats *b,
                  unsigned long long driver, unsigned long long staged)
{
    unsigned long long d = b->driver_bytes - a->driver_bytes,
                       s = b->staged_bytes - a->staged_bytes;
    if (d == driver && s == staged)
        return true;
    fprintf(stderr, "%s: %llu bytes by the driver's path and %llu staged, not %llu and %llu\n",
            what, d, s, driver, staged);
    return false;
}

/* The driver's own path would read through a registration the cache still
 * holds (one doomed but not yet undone is stale), so copies small enough for
 * that path are staged where they touch cached memory, and left to the
 * driver elsewhere: single copies both ways, and a batch's blocks. */
static void small_copies_of_cached_memory(pm_deviceptr dev, uint8_t *back)
{
    __attribute__((cleanup(unmap_buffer))) uint8_t *p = map_at(NULL);
    SCOPED_MALLOC uint8_t *plain = malloc(4096);
    REQUIRE(p && plain);
    fill(p, buffer_bytes, 10);
    pm_copy_stats st0 = stats();
    send_and_check(p, dev, 10, back);
    if (!stats().cache_listening || stats().cache_registrations == st0.cache_registrations) {
        printf("small copies of cached memory: skipped, nothing cached here\n");
        return;
    }
    memset(plain, 0x5a, 4096);
    pm_copy_stats a = stats();
    CHECK_RESULT(pm_memcpy_htod(dev, plain, 4096), PM_SUCCESS);
    pm_copy_stats b = stats();
    CHECK(moved("4 KiB from plain memory", &a, &b, 4096, 0));
    CHECK_RESULT(pm_memcpy_htod(dev + 8192, p + 8192, 4096), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_dtoh(p + 4096, dev, 4096), PM_SUCCESS);
    pm_copy_stats c = stats();
    CHECK(moved("4 KiB each way in cached memory", &b, &c, 0, 8192));
    /* Batches leave pageable blocks to the driver only when asked to. */
    pm_copy_config saved = {.struct_size = sizeof saved};
    CHECK_RESULT(pm_copy_get_config(&saved), PM_SUCCESS);
    pm_copy_config to_driver = saved;
    to_driver.batch = PM_COPY_BATCH_DRIVER;
    CHECK_RESULT(pm_copy_set_config(&to_driver), PM_SUCCESS);
    const pm_deviceptr dsts[3] = {dev + 65536, (pm_deviceptr)(uintptr_t)(p + 65536),
                                  dev + 131072};
    const pm_deviceptr srcs[3] = {(pm_deviceptr)(uintptr_t)(p + 16384), dev + 12288,
                                  (pm_deviceptr)(uintptr_t)plain};
    const size_t sizes[3] = {2048, 4096, 1024};
    CHECK_RESULT(pm_memcpy_batch_async(dsts, srcs, sizes, 3, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
    pm_copy_stats d = stats();
    CHECK(moved("a batch in and outside cached memory", &c, &d, 1024, 6144));
    /* What moved is what each copy named. */
    CHECK(memcmp(p + 4096, plain, 4096) == 0);
    CHECK(memcmp(p + 65536, p + 12288, 4096) == 0);
    CHECK_RESULT(test_backend()->copy_dtoh(back, dev + 65536, 2048), PM_SUCCESS);
    CHECK(memcmp(back, p + 16384, 2048) == 0);
}

/* Invalidating (or registering) memory the cache is registering that very
 * moment, where that registration then fails: the call returns. The
 * backend's cache_register is wrapped so that it waits until the other
 * thread has doomed the entry, then fails (as a driver refusal or the
 * pinned budget would), or succeeds on a private file mapping, which the
 * userfaultfd then refuses to watch. */
static pm_result (*real_cache_register)(void *, size_t);
static atomic_int register_outcome; /* 0: refuse; 1: the real call */
static atomic_int registering;      /* the wrapper has started */
static unsigned long long invalidations_before;

static unsigned long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000 + (unsigned long long)ts.tv_nsec / 1000000;
}

/* Waits until *flag is set, for 5 s at most. */
static void await_flag(atomic_int *flag)
{
    unsigned long long until = now_ms() + 5000;
    while (!atomic_load(flag) && now_ms() < until)
        usleep(100);
}

static pm_result slow_cache_register(void *p, size_t bytes)
{
    atomic_store(&registering, 1);
    unsigned long long until = now_ms() + 5000;
    while (stats().cache_invalidations == invalidations_before && now_ms() < until)
        usleep(100);
    if (atomic_load(&register_outcome) == 0)
        return PM_ERROR_OUT_OF_MEMORY;
    return real_cache_register(p, bytes);
}

typedef struct doomer {
    uint8_t *p;
    size_t n;
    bool by_register; /* pm_mem_host_register rather than pm_mem_invalidate */
    atomic_int done;
    pm_result result;
} doomer;

/* Once the cache is registering, dooms its entry. */
static void *doom_it(void *arg)
{
    doomer *d = arg;
    await_flag(&registering);
    if (d->by_register) {
        d->result = pm_mem_host_register(d->p, d->n, 0);
        if (d->result == PM_SUCCESS)
            pm_mem_host_unregister(d->p);
    } else {
        d->result = pm_mem_invalidate(d->p, d->n);
    }
    atomic_store(&d->done, 1);
    return NULL;
}

/* Maps n bytes: anonymous, or a private mapping of a temporary file. */
static uint8_t *map_kind(size_t n, bool file)
{
    int fd = -1;
    if (file) {
        char path[] = "/tmp/pinmem-regcache-XXXXXX";
        fd = mkstemp(path);
        if (fd < 0)
            return NULL;
        unlink(path);
        if (ftruncate(fd, (off_t)n) != 0) {
            close(fd);
            return NULL;
        }
    }
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | (file ? 0 : MAP_ANONYMOUS), fd,
                   0);
    if (fd >= 0)
        close(fd);
    return p == MAP_FAILED ? NULL : p;
}

/* false when the dooming call never returned (the test then ends: its
 * thread is stuck). */
static bool doom_during_failed_registration(bool file, bool by_register)
{
    const size_t n = 2 << 20;
    const char *how = file ? "private file mapping" : "registration refused";
    uint8_t *p = map_kind(n, file);
    pm_deviceptr dev = 0;
    if (!p || pm_device_alloc(&dev, n) != PM_SUCCESS) {
        CHECK(!"mapping the buffer or allocating device memory failed");
        if (p)
            munmap(p, n);
        return true;
    }
    fill(p, n, 31);
    pm_result ignored;
    pm__backend *b = &pm__instance_get(&ignored)->backend;
    real_cache_register = b->cache_register;
    atomic_store(&register_outcome, file ? 1 : 0);
    atomic_store(&registering, 0);
    invalidations_before = stats().cache_invalidations;
    unsigned long long registrations = stats().cache_registrations;
    doomer d = {.p = p, .n = n, .by_register = by_register};
    pthread_t t;
    bool started = pthread_create(&t, NULL, doom_it, &d) == 0;
    CHECK(started);
    b->cache_register = slow_cache_register;
    /* The cache registers p for this copy; the wrapper waits until the
     * other thread has doomed the entry; the registration fails, and the
     * copy is staged. */
    if (started)
        CHECK_RESULT(pm_memcpy_htod(dev, p, n), PM_SUCCESS);
    b->cache_register = real_cache_register;
    unsigned long long until = now_ms() + 10000;
    while (started && !atomic_load(&d.done) && now_ms() < until)
        usleep(1000);
    if (started && !atomic_load(&d.done)) {
        fprintf(stderr, "%s during a failed cached registration (%s) never returned\n",
                by_register ? "pm_mem_host_register" : "pm_mem_invalidate", how);
        CHECK(!"the dooming call returns");
        return false;
    }
    if (started)
        pthread_join(t, NULL);
    CHECK(atomic_load(&registering) == 1); /* the race was run */
    CHECK_RESULT(d.result, PM_SUCCESS);
    CHECK(stats().cache_registrations == registrations); /* nothing was cached */
    uint8_t *back = malloc(n);
    if (back) {
        CHECK_RESULT(test_backend()->copy_dtoh(back, dev, n), PM_SUCCESS);
        CHECK(first_mismatch(back, n, 31) == n);
        free(back);
    }
    munmap(p, n);
    pm_device_free(dev);
    return true;
}

/* Whether the cache's userfaultfd watches any mapping in [lo, hi) (the
 * kernel lists it in smaps: "um" missing pages, "uw" writes); in *missing,
 * whether it watches missing pages. */
static bool uffd_watched(uintptr_t lo, uintptr_t hi, bool *missing)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    unsigned long start = 0, end = 0;
    bool watched = false;
    *missing = false;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            start = a;
            end = b;
        } else if (strncmp(line, "VmFlags:", 8) == 0 && start < hi && lo < end) {
            bool um = strstr(line, " um") != NULL, uw = strstr(line, " uw") != NULL;
            watched |= um || uw;
            *missing |= um;
        }
    }
    if (f)
        fclose(f);
    return watched;
}

/* Whether this kernel lets a userfaultfd watch writes to anonymous memory
 * (where it cannot, the cache watches missing pages, and a mapping grown in
 * place stays watched: the kernel says nothing about it). */
static bool kernel_watches_writes(void)
{
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | 1 /* UFFD_USER_MODE_ONLY */);
    if (fd < 0)
        return false;
    struct uffdio_api api = {.api = UFFD_API};
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct uffdio_register reg = {.range = {.start = (uintptr_t)p, .len = 4096},
                                  .mode = UFFDIO_REGISTER_MODE_WP};
    bool ok = p != MAP_FAILED && ioctl(fd, UFFDIO_API, &api) == 0 &&
              ioctl(fd, UFFDIO_REGISTER, &reg) == 0;
    if (p != MAP_FAILED)
        munmap(p, 4096);
    close(fd);
    return ok;
}

/* read(2) of a few bytes of a file into p, which the kernel writes from
 * kernel mode (EFAULT where a user-mode-only userfaultfd watches p's missing
 * page). */
static bool read_into(void *p)
{
    int fd = open("/proc/self/stat", O_RDONLY);
    ssize_t got = fd >= 0 ? read(fd, p, 64) : -1;
    if (fd >= 0)
        close(fd);
    return got > 0;
}

/* Copies n bytes of p to the device (twice: the first registers, the second
 * hits); false when the cache registered nothing. */
static bool cache_it(uint8_t *p, size_t n, pm_deviceptr dev)
{
    unsigned long long before = stats().cache_registrations;
    fill(p, n, 41);
    CHECK_RESULT(pm_memcpy_htod(dev, p, n), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_htod(dev, p, n), PM_SUCCESS);
    return stats().cache_registrations > before;
}

/* mremap moves a cached buffer and grows it (as realloc of a large block
 * does): the entry is dropped, and neither the moved pages nor those it grew
 * by stay watched. */
static void mremap_moved(void)
{
    const size_t n = 4 << 20;
    pm_deviceptr dev = 0;
    REQUIRE_RESULT(pm_device_alloc(&dev, n), PM_SUCCESS);
    uint8_t *p = map_kind(n, false);
    /* where it moves to: reserved, then handed to mremap */
    uint8_t *target = mmap(NULL, 2 * n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!p || target == MAP_FAILED) {
        CHECK(!"mmap failed");
        pm_device_free(dev);
        return;
    }
    if (!cache_it(p, n, dev)) {
        munmap(p, n);
        munmap(target, 2 * n);
        pm_device_free(dev);
        SKIP_CASE("the cache registered nothing");
    }
    unsigned long long invalidations = stats().cache_invalidations;
    uint8_t *q = mremap(p, n, 2 * n, MREMAP_MAYMOVE | MREMAP_FIXED, target);
    CHECK(q == target);
    if (q == target) {
        CHECK_RESULT(pm_mem_invalidate(q, 1), PM_SUCCESS); /* after the monitor's turn */
        CHECK(stats().cache_invalidations == invalidations + 1);
        bool missing;
        bool watched = uffd_watched((uintptr_t)q, (uintptr_t)q + 2 * n, &missing);
        if (watched)
            fprintf(stderr, "mremap moved a cached buffer: the new range is still watched\n");
        CHECK(!watched);
        CHECK(read_into(q + n + 4096));     /* a page it grew by */
        CHECK(read_into(q + 2 * n - 4096)); /* its last */
        /* the moved bytes copy right (staged or cached afresh) */
        CHECK(first_mismatch(q, n, 41) == n);
        CHECK_RESULT(pm_memcpy_htod(dev, q, n), PM_SUCCESS);
        uint8_t *back = malloc(n);
        if (back) {
            CHECK_RESULT(test_backend()->copy_dtoh(back, dev, n), PM_SUCCESS);
            CHECK(first_mismatch(back, n, 41) == n);
            free(back);
        }
        munmap(q, 2 * n);
    } else {
        munmap(p, n);
        munmap(target, 2 * n);
    }
    pm_device_free(dev);
}

/* mremap grows a cached buffer in place: the kernel says nothing, the entry
 * stays right for the pages it had, and a read(2) into the pages it grew by
 * works. */
static void mremap_grown_in_place(void)
{
    const size_t n = 4 << 20;
    pm_deviceptr dev = 0;
    REQUIRE_RESULT(pm_device_alloc(&dev, n), PM_SUCCESS);
    /* room to grow into: reserved, the tail given back just before */
    uint8_t *p = mmap(NULL, 2 * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        CHECK(!"mmap failed");
        pm_device_free(dev);
        return;
    }
    munmap(p + n, n);
    if (!cache_it(p, n, dev)) {
        munmap(p, n);
        pm_device_free(dev);
        SKIP_CASE("the cache registered nothing");
    }
    bool missing;
    CHECK(uffd_watched((uintptr_t)p, (uintptr_t)p + n, &missing));
    const bool writes = kernel_watches_writes();
    CHECK(!missing || !writes); /* missing pages only where the kernel has nothing else */
    uint8_t *q = mremap(p, n, 2 * n, 0);
    if (q == MAP_FAILED) { /* another thread took the room meanwhile */
        munmap(p, n);
        pm_device_free(dev);
        SKIP_CASE("the room after the buffer was taken");
    }
    CHECK_RESULT(pm_mem_invalidate(q + 2 * n - 1, 1), PM_SUCCESS); /* no entry there */
    if (!writes) {
        printf("skipped: %s: the kernel watches missing pages only here\n", __func__);
    } else {
        CHECK(read_into(q + n + 4096));
        CHECK(read_into(q + 2 * n - 4096));
    }
    unsigned long long hits = stats().cache_hits;
    CHECK_RESULT(pm_memcpy_htod(dev, q, n), PM_SUCCESS); /* the entry still serves */
    CHECK(stats().cache_hits == hits + 1);
    munmap(q, 2 * n);
    pm_device_free(dev);
}

static void mremap_cases(void)
{
    small_copy_config(1);
    if (!stats().cache_listening)
        printf("skipped: %s: the registration cache cannot hear unmaps here\n", __func__);
    else {
        mremap_moved();
        mremap_grown_in_place();
    }
    small_copy_config(0);
}

/* Unmaps d->p and maps new memory in its place, with new bytes, once the
 * cache is registering it. */
static void *remap_it(void *arg)
{
    doomer *d = arg;
    await_flag(&registering);
    d->result = PM_ERROR_UNKNOWN;
    if (munmap(d->p, d->n) == 0 && map_at(d->p) == d->p) {
        fill(d->p, d->n, 33);
        d->result = PM_SUCCESS;
    }
    atomic_store(&d->done, 1);
    return NULL;
}

/* The other thread's remapping, which the driver's registration waits for. */
static doomer *remapping;

static pm_result register_after_remap(void *p, size_t bytes)
{
    atomic_store(&registering, 1);
    await_flag(&remapping->done);
    return real_cache_register(p, bytes);
}

/* A range unmapped and mapped anew while the cache registers it: the watch
 * starts before the driver pins, so the unmap is heard and nothing is
 * cached (pinned, the old pages would be sent for the new ones). */
static void remapped_while_registering(void)
{
    if (!kernel_watches_writes())
        SKIP_CASE("the kernel watches missing pages only here");
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(buffer_bytes);
    SCOPED_MALLOC uint8_t *back = malloc(buffer_bytes);
    uint8_t *p = map_at(NULL);
    REQUIRE(dev && back && p);
    fill(p, buffer_bytes, 32);
    pm_result ignored;
    pm__backend *b = &pm__instance_get(&ignored)->backend;
    real_cache_register = b->cache_register;
    atomic_store(&registering, 0);
    const unsigned long long registrations = stats().cache_registrations,
                             invalidations = stats().cache_invalidations;
    doomer d = {.p = p, .n = buffer_bytes};
    remapping = &d;
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, remap_it, &d) == 0);
    b->cache_register = register_after_remap;
    CHECK_RESULT(pm_memcpy_htod(dev, p, buffer_bytes), PM_SUCCESS);
    b->cache_register = real_cache_register;
    pthread_join(t, NULL);
    if (d.result != PM_SUCCESS) /* p is not ours to unmap now */
        SKIP_CASE("another thread took the range between the unmap and the map");
    CHECK(atomic_load(&registering) == 1); /* the race was run */
    CHECK(stats().cache_registrations == registrations);
    CHECK(stats().cache_invalidations == invalidations + 1);
    fill(p, buffer_bytes, 34); /* copies of the new memory send its bytes, cached or not */
    send_and_check(p, dev, 34, back);
    munmap(p, buffer_bytes);
}

/* false when a call hung. */
static bool failed_registrations(void)
{
    small_copy_config(1);
    if (!stats().cache_listening) {
        small_copy_config(0);
        printf("skipped: %s: the registration cache cannot hear unmaps here\n", __func__);
        return true;
    }
    for (int file = 0; file < 2; file++)
        for (int by_register = 0; by_register < 2; by_register++)
            if (!doom_during_failed_registration(file, by_register))
                return false;
    remapped_while_registering();
    small_copy_config(0);
    return true;
}

/* The monitor's undoing of doomed registrations, held back until released,
 * so that copies meet an entry doomed and still registered. */
static void (*real_cache_unregister)(void *, size_t);
static atomic_int undo_held;

static void held_cache_unregister(void *p, size_t bytes)
{
    unsigned long long until = now_ms() + 10000;
    while (atomic_load(&undo_held) && now_ms() < until)
        usleep(100);
    real_cache_unregister(p, bytes);
}

/* Swaps the backend's cache_unregister, then takes the cache's lock (a
 * lookup of p, which p's entry makes), which the monitor takes before it
 * calls it: the swap comes first for it. */
static void set_cache_unregister(pm__backend *b, void (*fn)(void *, size_t), const void *p)
{
    b->cache_unregister = fn;
    (void)pm__regcache_overlaps(p, 1);
}

/* Copies whose direction comes from their pointers (pm_memcpy, batches) ask
 * the driver what memory is, and the driver calls memory the cache
 * registered page-locked: they must pass the cache all the same, or once the
 * user has unmapped that memory and mapped new memory at its address, they
 * move the old pages' bytes until the monitor has undone the registration. */
static void unified_copies_of_cached_memory(pm_deviceptr dev, uint8_t *back)
{
    pm_result ignored;
    pm__backend *b = &pm__instance_get(&ignored)->backend;
    real_cache_unregister = b->cache_unregister;
    const size_t block = 1 << 20;
    for (int attempt = 0; attempt < 20; attempt++) {
        uint8_t *p = map_at(NULL);
        REQUIRE(p);
        fill(p, buffer_bytes, 11);
        pm_copy_stats st0 = stats();
        send_and_check(p, dev, 11, back);
        if (!stats().cache_listening || stats().cache_registrations == st0.cache_registrations) {
            printf("copies by pm_memcpy of cached memory: skipped, nothing cached here\n");
            munmap(p, buffer_bytes);
            return;
        }
        unsigned long long hits = stats().cache_hits;
        CHECK_RESULT(pm_memcpy(dev, (pm_deviceptr)(uintptr_t)p, buffer_bytes), PM_SUCCESS);
        CHECK(stats().cache_hits == hits + 1);
        atomic_store(&undo_held, 1);
        set_cache_unregister(b, held_cache_unregister, p);
        CHECK_RESULT(munmap(p, buffer_bytes) == 0 ? PM_SUCCESS : PM_ERROR_UNKNOWN, PM_SUCCESS);
        uint8_t *q = map_at(p);
        if (q) {
            const pm_deviceptr host = (pm_deviceptr)(uintptr_t)q;
            fill(q, buffer_bytes, 12);
            CHECK_RESULT(pm_memcpy(dev, host, buffer_bytes), PM_SUCCESS);
            CHECK_RESULT(test_backend()->copy_dtoh(back, dev, buffer_bytes), PM_SUCCESS);
            CHECK(first_mismatch(back, buffer_bytes, 12) == buffer_bytes);
            fill(back, buffer_bytes, 13);
            CHECK_RESULT(test_backend()->copy_htod(dev, back, buffer_bytes), PM_SUCCESS);
            CHECK_RESULT(pm_memcpy(host, dev, buffer_bytes), PM_SUCCESS);
            CHECK(first_mismatch(q, buffer_bytes, 13) == buffer_bytes);
            fill(q, buffer_bytes, 14);
            const size_t sizes[1] = {block};
            CHECK_RESULT(pm_memcpy_batch_async(&dev, &host, sizes, 1, NULL), PM_SUCCESS);
            CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
            CHECK_RESULT(test_backend()->copy_dtoh(back, dev, block), PM_SUCCESS);
            CHECK(first_mismatch(back, block, 14) == block);
        }
        atomic_store(&undo_held, 0);
        CHECK_RESULT(pm_mem_invalidate(q ? q : p, buffer_bytes), PM_SUCCESS); /* waits for the undo */
        set_cache_unregister(b, real_cache_unregister, q ? q : p);
        if (q) {
            munmap(q, buffer_bytes);
            return;
        }
    }
    CHECK(!"munmap + mmap at the same address: the range was taken by someone else every time");
}

/* An unmap's event is read while a registration is being undone: the thread
 * that reads events never waits on that work (the allocator, or a driver
 * call, can block it behind the very unmap that waits for its event). With
 * one undo held back, unmapping a second cached buffer returns at once,
 * where it would wait for the hold to end (10 s). */
static void events_read_while_undoing(pm_deviceptr dev, uint8_t *back)
{
    pm_result ignored;
    pm__backend *b = &pm__instance_get(&ignored)->backend;
    real_cache_unregister = b->cache_unregister;
    uint8_t *first = map_at(NULL), *second = map_at(NULL);
    REQUIRE(first && second);
    const unsigned long long registered = stats().cache_registrations;
    fill(first, buffer_bytes, 21);
    send_and_check(first, dev, 21, back);
    fill(second, buffer_bytes, 22);
    send_and_check(second, dev, 22, back);
    if (stats().cache_registrations < registered + 2) {
        printf("events read while undoing: skipped, nothing cached here\n");
        munmap(first, buffer_bytes);
        munmap(second, buffer_bytes);
        return;
    }
    atomic_store(&undo_held, 1);
    set_cache_unregister(b, held_cache_unregister, first);
    CHECK(munmap(first, buffer_bytes) == 0); /* its undo starts, and is held */
    const unsigned long long t0 = now_ms();
    CHECK(munmap(second, buffer_bytes) == 0);
    const unsigned long long took = now_ms() - t0;
    atomic_store(&undo_held, 0);
    printf("an unmap while another registration's undo is held: %llu ms\n", took);
    CHECK(took < 5000);
    /* Both undone (each waits for it) before the backend's call is put back. */
    CHECK_RESULT(pm_mem_invalidate(first, buffer_bytes), PM_SUCCESS);
    CHECK_RESULT(pm_mem_invalidate(second, buffer_bytes), PM_SUCCESS);
    set_cache_unregister(b, real_cache_unregister, back);
}

/* Shared memory is never cached: its pages can be dropped with no event in
 * this process (here the file is cut to nothing and grown again, and the
 * mapping reads zeros), so a registration of it would send old bytes. */
static void shared_memory_not_cached(pm_deviceptr dev, uint8_t *back)
{
    int fd = memfd_create("pinmem-test", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, buffer_bytes) == 0);
    uint8_t *p = mmap(NULL, buffer_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    REQUIRE(p != MAP_FAILED);
    const pm_copy_stats before = stats();
    fill(p, buffer_bytes, 31);
    send_and_check(p, dev, 31, back);
    CHECK(stats().cache_registrations == before.cache_registrations);
    CHECK(ftruncate(fd, 0) == 0 && ftruncate(fd, buffer_bytes) == 0);
    fill(p, buffer_bytes, 32);
    send_and_check(p, dev, 32, back);
    munmap(p, buffer_bytes);
    close(fd);
}

static void stale_scenarios(void)
{
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(buffer_bytes);
    SCOPED_MALLOC uint8_t *back = malloc(buffer_bytes);
    REQUIRE(dev && back);
    small_copy_config(1);
    pm_copy_stats st0 = stats();
    unmap_and_map_again(dev, back);
    discard(dev, back);
    free_and_malloc(dev, back);
    explicit_invalidate(dev, back);
    small_copies_of_cached_memory(dev, back);
    unified_copies_of_cached_memory(dev, back);
    events_read_while_undoing(dev, back);
    shared_memory_not_cached(dev, back);
    pm_copy_stats st = stats();
    printf("registration cache: %s; %llu registrations, %llu hits, %llu invalidations\n",
           st.cache_listening ? "hears unmaps" : "off (no userfaultfd here)",
           st.cache_registrations - st0.cache_registrations, st.cache_hits - st0.cache_hits,
           st.cache_invalidations - st0.cache_invalidations);
    if (st.cache_listening && st.cache_registrations > st0.cache_registrations) {
        CHECK(st.cache_hits > st0.cache_hits);
        /* munmap, two discards, free, invalidate, the user's registration */
        CHECK(st.cache_invalidations - st0.cache_invalidations >= 5);
    } else {
        CHECK(st.cache_registrations == st0.cache_registrations);
    }
    small_copy_config(0); /* undoes what the cache holds */
}

static void fault_sweep(void)
{
    small_copy_config(0);
    const size_t n = (1 << 20) + 777; /* 17 staged pieces */
    SCOPED_MALLOC uint8_t *src = malloc(n), *dst = malloc(n);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(n);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(src && dst && dev);
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    for (int dir = 0; dir < 2; dir++) {
        for (int k = 1;; k++) {
            fill(src, n, (unsigned)k);
            atomic_store(&pm__fault_backend_copy, k);
            pm_result r = dir == 0 ? pm_memcpy_htod_async(dev, src, n, s)
                                   : pm_memcpy_dtoh_async(dst, dev, n, s);
            bool fired = atomic_load(&pm__fault_backend_copy) == 0;
            atomic_store(&pm__fault_backend_copy, 0);
            CHECK(fired ? r == PM_ERROR_UNKNOWN : r == PM_SUCCESS);
            if (fired)
                CHECK(strstr(pm_last_error_detail(), "injected") != NULL);
            CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
            /* the engine is whole: a clean copy works */
            CHECK_RESULT(pm_memcpy_htod(dev, src, n), PM_SUCCESS);
            CHECK_RESULT(pm_memcpy_dtoh(dst, dev, n), PM_SUCCESS);
            CHECK(first_mismatch(dst, n, (unsigned)k) == n);
            if (!fired)
                break;
        }
    }
    /* The ring cannot be pinned (every other ring): the copies take the
     * backend's own path, say why, and come out right; no ring leaves
     * anything pinned behind it. */
    unsigned long long baseline = 0;
    for (unsigned k = 0; k < 6; k++) {
        pm_copy_config c = {.struct_size = sizeof c};
        CHECK_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
        c.buffers = c.buffers == 6 ? 5 : 6; /* a new ring for every k */
        CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
        if (k == 0)
            baseline = stats().pinned_bytes; /* no ring pinned */
        const bool fault = k % 2 == 1;
        atomic_store(&pm__fault_stage_pin, fault ? 1 : 0);
        pm_copy_stats before = stats();
        fill(src, n, 100 + k);
        CHECK_RESULT(pm_memcpy_htod(dev, src, n), PM_SUCCESS);
        atomic_store(&pm__fault_stage_pin, 0);
        CHECK_RESULT(pm_memcpy_dtoh(dst, dev, n), PM_SUCCESS);
        CHECK(first_mismatch(dst, n, 100 + k) == n);
        pm_copy_stats after = stats();
        if (fault) {
            CHECK(after.ring_pinned == 0);
            CHECK(strstr(after.ring_note, "injected") != NULL);
            CHECK(after.driver_bytes - before.driver_bytes >= n);
            CHECK(after.pinned_bytes == baseline);
        } else if (after.ring_pinned) {
            /* The ring, and one page of flags its DMAs write behind them. */
            CHECK(after.pinned_bytes == baseline + after.ring_buffers * after.ring_buffer_bytes +
                                            (unsigned long long)sysconf(_SC_PAGESIZE));
        }
    }
}

int main(void)
{
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    stale_scenarios();
    mremap_cases();
    if (!failed_registrations())
        return check_finish("test_copy_cache");
    fault_sweep();
    return check_finish("test_copy_cache");
}
