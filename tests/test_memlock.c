/* RLIMIT_MEMLOCK and what lifts it, each in a child with a 64 KiB limit:
 *  - without CAP_IPC_LOCK (root becomes nobody; a user that has the
 *    capability drops it): pinning past the limit fails cleanly, fast, names
 *    the limit, and leaves nothing locked; the capability says the limit binds;
 *  - with CAP_IPC_LOCK (root as it is, and a non-root user given the
 *    capability): the limit does not bind, pinning past it works, and the
 *    capability says so; dropping the capability later makes the limit bind;
 *  - with CAP_IPC_LOCK in a user namespace of its own: the limit binds.
 * On the CUDA backend the driver ignores the limit, as it does for
 * cuMemHostAlloc. */
#include <errno.h>
#include <grp.h>
#include <sched.h>
#include <linux/capability.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static const rlim_t small_limit = 64 << 10;

/* CAP_IPC_LOCK in the effective set, and in the permitted one (raw system
 * calls: no libcap). */
static bool ipc_lock(bool permitted)
{
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2] = {{0}};
    if (syscall(SYS_capget, &h, d) != 0)
        return false;
    return ((permitted ? d[0].permitted : d[0].effective) >> CAP_IPC_LOCK) & 1;
}

/* Raises or drops CAP_IPC_LOCK in the effective set (raising needs it permitted). */
static bool set_ipc_lock(bool on)
{
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2] = {{0}};
    if (syscall(SYS_capget, &h, d) != 0)
        return false;
    if (on)
        d[0].effective |= 1u << CAP_IPC_LOCK;
    else
        d[0].effective &= ~(1u << CAP_IPC_LOCK);
    return syscall(SYS_capset, &h, d) == 0;
}

static bool set_small_limit(void)
{
    struct rlimit rl = {small_limit, small_limit};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
        perror("setrlimit");
        return false;
    }
    return true;
}

/* Root becomes nobody, keeping its permitted capabilities when keep is set
 * (then nothing is effective until raised). */
static bool become_nobody(bool keep)
{
    if (keep && prctl(PR_SET_KEEPCAPS, 1L, 0L, 0L, 0L) != 0)
        return false;
    return setgroups(0, NULL) == 0 && setgid(65534) == 0 && setuid(65534) == 0;
}

static int limit_binds(void)
{
    pm_capabilities c = {.struct_size = sizeof c};
    CHECK_RESULT(pm_get_capabilities(&c), PM_SUCCESS);
    return c.pinning_limited_by_memlock_rlimit;
}

/* Peak resident memory of this process (VmHWM), in KiB. */
static unsigned long long peak_rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* An allocation or registration the limit dooms fails before any of its
 * memory is touched: no growth of the peak resident size (faulting it in
 * first would add all of it), nothing locked. */
static void doomed_requests_are_cheap(void)
{
    const size_t huge = (size_t)512 << 20;
    const unsigned long long peak_before = peak_rss_kib();
    const double t0 = seconds_now();
    void *p = NULL;
    CHECK_RESULT(pm_mem_alloc_host(&p, huge), PM_ERROR_OUT_OF_MEMORY);
    CHECK(strstr(pm_last_error_detail(), "RLIMIT_MEMLOCK") != NULL);
    CHECK_RESULT(pm_mem_host_alloc(&p, huge, PM_MEMHOSTALLOC_PORTABLE), PM_ERROR_OUT_OF_MEMORY);
    void *buf = mmap(NULL, huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(buf != MAP_FAILED);
    CHECK_RESULT(pm_mem_host_register(buf, huge, 0), PM_ERROR_OUT_OF_MEMORY);
    CHECK(strstr(pm_last_error_detail(), "RLIMIT_MEMLOCK") != NULL);
    munmap(buf, huge);
    const double took = seconds_now() - t0;
    const unsigned long long grew = peak_rss_kib() - peak_before;
    printf("three doomed 512 MiB requests: %.1f ms, peak resident size +%llu KiB\n", took * 1e3,
           grew);
    CHECK(grew < 32 << 10);
    CHECK(locked_kib() == 0);
}

static int limited_child(void)
{
    if (!set_small_limit())
        return 1;
    if (getuid() == 0 && !become_nobody(false)) {
        perror("dropping root");
        return 1;
    }
    if (ipc_lock(false) && !set_ipc_lock(false)) {
        perror("dropping CAP_IPC_LOCK");
        return 1;
    }
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("without CAP_IPC_LOCK (uid %d): backend %s, pinning bound by RLIMIT_MEMLOCK: %d\n",
           (int)getuid(), pm_backend_name(), limit_binds());
    const size_t big = 1 << 20;
    void *p = NULL;
    if (on_backend("cuda")) {
        CHECK(!limit_binds());
        CHECK_RESULT(pm_mem_alloc_host(&p, big), PM_SUCCESS);
        CHECK_RESULT(pm_mem_free_host(p), PM_SUCCESS);
        return check_finish("memlock (limit not enforced by this backend)");
    }
    CHECK(limit_binds());
    doomed_requests_are_cheap();
    CHECK_RESULT(pm_mem_alloc_host(&p, big), PM_ERROR_OUT_OF_MEMORY);
    CHECK(strstr(pm_last_error_detail(), "RLIMIT_MEMLOCK") != NULL);
    CHECK(strstr(pm_last_error_detail(), "ulimit -l") != NULL);
    printf("detail: %s\n", pm_last_error_detail());
    CHECK(locked_kib() == 0);

    void *buf = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE_OR(buf != MAP_FAILED, check_finish("memlock"));
    CHECK_RESULT(pm_mem_host_register(buf, big, 0), PM_ERROR_OUT_OF_MEMORY);
    CHECK(locked_kib() == 0);
    /* The failed registration left no claim behind: a small one works. */
    CHECK_RESULT(pm_mem_host_register(buf, 4096, 0), PM_SUCCESS);
    CHECK(locked_kib() == 4);
    CHECK_RESULT(pm_mem_host_unregister(buf), PM_SUCCESS);
    CHECK(locked_kib() == 0);

    CHECK_RESULT(pm_mem_alloc_host(&p, 16 << 10), PM_SUCCESS);
    CHECK(locked_kib() == 16);
    CHECK_RESULT(pm_mem_free_host(p), PM_SUCCESS);
    CHECK(locked_kib() == 0);
    munmap(buf, big);
    return check_finish("memlock (without CAP_IPC_LOCK)");
}

/* With the capability: 1 MiB pins under the 64 KiB limit, registered and
 * allocated; without it again, the limit binds at once. */
static void pins_past_the_limit(void)
{
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("with CAP_IPC_LOCK (uid %d): backend %s, pinning bound by RLIMIT_MEMLOCK: %d\n",
           (int)getuid(), pm_backend_name(), limit_binds());
    CHECK(!limit_binds());
    const size_t big = 1 << 20;
    void *p = NULL;
    REQUIRE_RESULT(pm_mem_alloc_host(&p, big), PM_SUCCESS);
    uint8_t *buf = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(buf != MAP_FAILED);
    CHECK_RESULT(pm_mem_host_register(buf, big, 0), PM_SUCCESS);
    if (on_backend("posix"))
        CHECK(locked_kib() == 2 * (big >> 10));
    CHECK_RESULT(pm_mem_host_unregister(buf), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_host(p), PM_SUCCESS);
    if (on_backend("posix")) {
        REQUIRE(set_ipc_lock(false));
        CHECK(limit_binds());
        CHECK_RESULT(pm_mem_alloc_host(&p, big), PM_ERROR_OUT_OF_MEMORY);
        CHECK(strstr(pm_last_error_detail(), "RLIMIT_MEMLOCK") != NULL);
        CHECK_RESULT(pm_mem_host_register(buf, big, 0), PM_ERROR_OUT_OF_MEMORY);
        CHECK(locked_kib() == 0);
    }
    munmap(buf, big);
}

/* As the process is, when it has the capability (root, or a user given it). */
static int capable_child(void)
{
    if (!set_small_limit())
        return 1;
    if (!ipc_lock(false)) {
        printf("skipped: with CAP_IPC_LOCK: this process does not have it\n");
        return 0;
    }
    pins_past_the_limit();
    return check_finish("memlock (with CAP_IPC_LOCK)");
}

/* Root turned into a user that is not root but holds CAP_IPC_LOCK. */
static int capable_user_child(void)
{
    if (!set_small_limit())
        return 1;
    if (getuid() != 0 || !ipc_lock(true)) {
        printf("skipped: a non-root user with CAP_IPC_LOCK: only root can make one here\n");
        return 0;
    }
    if (!become_nobody(true) || !set_ipc_lock(true)) {
        perror("becoming nobody with CAP_IPC_LOCK");
        return 1;
    }
    CHECK(getuid() != 0 && ipc_lock(false));
    pins_past_the_limit();
    return check_finish("memlock (non-root user with CAP_IPC_LOCK)");
}

/* In a user namespace of its own (a rootless container) the process holds
 * every capability, CAP_IPC_LOCK included, but mlock asks for it in the
 * initial namespace: the limit still binds, and pinmem must say so. */
static int namespaced_child(void)
{
    if (!set_small_limit())
        return 1;
    if (unshare(CLONE_NEWUSER) != 0) {
        printf("skipped: in a user namespace: unshare refused (%s)\n", strerror(errno));
        return 0;
    }
    REQUIRE_OR(ipc_lock(false), check_finish("memlock (user namespace)"));
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("in a user namespace with CAP_IPC_LOCK: backend %s, pinning bound by "
           "RLIMIT_MEMLOCK: %d\n",
           pm_backend_name(), limit_binds());
    if (on_backend("cuda")) {
        CHECK(!limit_binds());
        return check_finish("memlock in a user namespace (limit not enforced by this backend)");
    }
    CHECK(limit_binds());
    doomed_requests_are_cheap();
    void *p = NULL;
    CHECK_RESULT(pm_mem_alloc_host(&p, 1 << 20), PM_ERROR_OUT_OF_MEMORY);
    CHECK(locked_kib() == 0);
    return check_finish("memlock (user namespace)");
}

/* The pinned budget refuses as cheaply, for any user. */
static int budget_child(void)
{
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    pm_copy_config c = {.struct_size = sizeof c};
    CHECK_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    c.pinned_budget = 16 << 20;
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    const size_t huge = (size_t)512 << 20;
    const unsigned long long peak_before = peak_rss_kib();
    void *p = NULL;
    CHECK_RESULT(pm_mem_alloc_host(&p, huge), PM_ERROR_OUT_OF_MEMORY);
    CHECK(strstr(pm_last_error_detail(), "pinned budget") != NULL);
    const unsigned long long grew = peak_rss_kib() - peak_before;
    printf("a 512 MiB allocation past a 16 MiB budget: peak resident size +%llu KiB\n", grew);
    CHECK(grew < 32 << 10);
    CHECK_RESULT(pm_mem_alloc_host(&p, 1 << 20), PM_SUCCESS); /* within it: fine */
    CHECK_RESULT(pm_mem_free_host(p), PM_SUCCESS);
    return check_finish("memlock (pinned budget)");
}

static int in_child(int (*body)(void))
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        check_failures = 0; /* the child counts its own */
        int rc = body();
        fflush(stdout);
        _exit(rc);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(void)
{
    int failed = in_child(limited_child);
    failed |= in_child(capable_child);
    failed |= in_child(capable_user_child);
    failed |= in_child(namespaced_child);
    failed |= in_child(budget_child);
    return failed ? 1 : 0;
}
