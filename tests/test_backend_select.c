/* PINMEM_BACKEND picks the backend once per process, so each setting runs in
 * its own child. Forcing cuda where there is no driver gives NO_DEVICE from
 * pm_init and from every later call, with a detail. */
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static int in_child(const char *backend, const char *device, int (*body)(void))
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        check_failures = 0; /* the child counts its own */
        if (backend)
            setenv("PINMEM_BACKEND", backend, 1);
        else
            unsetenv("PINMEM_BACKEND");
        if (device)
            setenv("PINMEM_DEVICE", device, 1);
        int rc = body();
        fflush(stdout);
        _exit(rc);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

static int driver_present(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    return h != NULL; /* left open: the driver is never unloaded */
}

static int expect_posix(void)
{
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    CHECK(strcmp(pm_last_error_detail(), "") == 0);
    CHECK(on_backend("posix"));
    return check_failures;
}

static int expect_invalid(void)
{
    CHECK_RESULT(pm_init(0), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "PINMEM_BACKEND") != NULL);
    void *p;
    CHECK_RESULT(pm_mem_alloc_host(&p, 4096), PM_ERROR_INVALID_VALUE);
    CHECK(pm_backend_name() == NULL); /* as documented: no backend, no name */
    return check_failures;
}

static int expect_no_device(void)
{
    CHECK_RESULT(pm_init(0), PM_ERROR_NO_DEVICE);
    CHECK(strstr(pm_last_error_detail(), "cuda") != NULL);
    printf("detail: %s\n", pm_last_error_detail());
    void *p = NULL;
    unsigned f;
    CHECK_RESULT(pm_mem_alloc_host(&p, 4096), PM_ERROR_NO_DEVICE);
    CHECK_RESULT(pm_mem_host_get_flags(&f, &f), PM_ERROR_NO_DEVICE);
    CHECK_RESULT(pm_mem_free_host(NULL), PM_ERROR_NO_DEVICE);
    CHECK(strlen(pm_last_error_detail()) > 0);
    CHECK(pm_backend_name() == NULL);
    return check_failures;
}

static int expect_cuda(void)
{
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    CHECK(on_backend("cuda"));
    return check_failures;
}

static int expect_auto(void)
{
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    /* Only calls that succeeded: whatever selection tried on the way (the
     * driver, where there is none) is not this thread's failure. */
    CHECK(strcmp(pm_last_error_detail(), "") == 0);
    CHECK(pm_last_driver_error() == 0);
    CHECK(on_backend(driver_present() ? "cuda" : "posix") || on_backend("posix"));
    return check_failures;
}

int main(void)
{
    int driver = driver_present();
    printf("CUDA driver library present: %s\n", driver ? "yes" : "no");
    CHECK(in_child("posix", NULL, expect_posix) == 0);
    CHECK(in_child("bogus", NULL, expect_invalid) == 0);
    CHECK(in_child(NULL, NULL, expect_auto) == 0);
    CHECK(in_child("auto", NULL, expect_auto) == 0);
    if (driver) {
        CHECK(in_child("cuda", NULL, expect_cuda) == 0);
        CHECK(in_child("cuda", "9999", expect_no_device) == 0);
    } else {
        CHECK(in_child("cuda", NULL, expect_no_device) == 0);
    }
    return check_finish("backend_select");
}
