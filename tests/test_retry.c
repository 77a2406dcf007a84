/* A failure under memory pressure does not stick: the threads pinmem starts
 * for itself (the POSIX default stream, the staging workers, the
 * registration cache's monitor) are started again by the next call that
 * needs them when a start failed. The test build's fault point makes the
 * next thread start fail, as a tight RLIMIT_AS or a full thread table would. */
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "copy_util.h"
#include "test_hooks.h"

static pm_copy_stats stats(void)
{
    pm_copy_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_copy_get_stats(&st), PM_SUCCESS);
    return st;
}

/* Before anything used the default stream. */
static void default_stream(void)
{
    if (strcmp(pm_backend_name(), "posix") != 0)
        SKIP_CASE("the driver makes the default stream");
    atomic_store(&pm__fault_thread_start, 1);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_ERROR_OUT_OF_MEMORY);
    CHECK(atomic_load(&pm__fault_thread_start) == 0); /* the start was tried */
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    uint8_t src[4096], dst[4096];
    pm_deviceptr dev = 0;
    REQUIRE_RESULT(pm_device_alloc(&dev, sizeof src), PM_SUCCESS);
    fill(src, sizeof src, 3);
    CHECK_RESULT(pm_memcpy_htod_async(dev, src, sizeof src, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_dtoh(dst, dev, sizeof dst), PM_SUCCESS);
    CHECK(first_mismatch(dst, sizeof dst, 3) == sizeof dst);
    pm_device_free(dev);
    /* A stream of the user's own fails as plainly, and the next one starts. */
    pm_stream_t s = NULL;
    atomic_store(&pm__fault_thread_start, 1);
    CHECK_RESULT(pm_stream_create(&s), PM_ERROR_OUT_OF_MEMORY);
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
}

/* Whether this kernel gives this process a userfaultfd with the events the
 * registration cache listens for. */
static bool userfaultfd_here(void)
{
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | 1 /* UFFD_USER_MODE_ONLY */);
    if (fd < 0)
        return false;
    const unsigned long long want =
        UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP;
    struct uffdio_api api = {.api = UFFD_API, .features = want};
    bool ok = ioctl(fd, UFFDIO_API, &api) == 0 && (api.features & want) == want;
    close(fd);
    return ok;
}

/* Before anything asked whether the cache hears unmaps. While the cache is
 * off, asking starts nothing. */
static void monitor(void)
{
    if (!userfaultfd_here())
        SKIP_CASE("no userfaultfd here");
    pm_copy_config c = {.struct_size = sizeof c};
    REQUIRE_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    if (c.registration_cache)
        SKIP_CASE("the registration cache is on from the start");
    atomic_store(&pm__fault_thread_start, 1);
    CHECK(stats().cache_listening == 0);
    CHECK(atomic_load(&pm__fault_thread_start) == 1); /* no start tried */
    pm_copy_config on = c;
    on.registration_cache = 1;
    REQUIRE_RESULT(pm_copy_set_config(&on), PM_SUCCESS);
    CHECK(stats().cache_listening == 0);
    CHECK(atomic_load(&pm__fault_thread_start) == 0);
    CHECK(stats().cache_listening == 1);
    atomic_store(&pm__fault_thread_start, 0);
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
}

/* A new engine whose first worker cannot start: the copy is right (the
 * caller copies alone), and the next staged copy starts the workers. */
static void workers(void)
{
    small_copy_config(0); /* three workers; a new engine */
    const size_t n = 1 << 20;
    uint8_t *src = malloc(n), *dst = malloc(n);
    pm_deviceptr dev = 0;
    if (!src || !dst || pm_device_alloc(&dev, n) != PM_SUCCESS) {
        CHECK(!"allocating the buffers failed");
        free(src);
        free(dst);
        return;
    }
    pm_copy_config c = {.struct_size = sizeof c};
    CHECK_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS); /* the default stream is up */
    atomic_store(&pm__fault_thread_start, 1);
    fill(src, n, 10);
    CHECK_RESULT(pm_memcpy_htod(dev, src, n), PM_SUCCESS);
    pm_copy_stats st = stats();
    if (st.staged_bytes == 0) {
        printf("skipped: %s: nothing was staged (no staging ring here)\n", __func__);
    } else {
        CHECK(atomic_load(&pm__fault_thread_start) == 0);
        CHECK(st.staging_threads < c.workers);
        CHECK_RESULT(pm_memcpy_dtoh(dst, dev, n), PM_SUCCESS); /* the next staged copy */
        CHECK(first_mismatch(dst, n, 10) == n);
        CHECK(stats().staging_threads == c.workers);
    }
    atomic_store(&pm__fault_thread_start, 0);
    pm_device_free(dev);
    free(src);
    free(dst);
}

int main(void)
{
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    default_stream();
    monitor();
    workers();
    return check_finish("test_retry");
}
