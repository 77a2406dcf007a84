/* RLIMIT_MEMLOCK, in a child that has given up CAP_IPC_LOCK (root becomes
 * nobody) and has a 64 KiB limit: pinning past it fails cleanly, names the
 * limit, and leaves nothing locked. On the CUDA backend the driver ignores
 * the limit, as it does for cuMemHostAlloc. */
#include <grp.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

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

static int child(void)
{
    struct rlimit rl = {64 << 10, 64 << 10};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
        perror("setrlimit");
        return 1;
    }
    if (getuid() == 0 && (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)) {
        perror("dropping root");
        return 1;
    }
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    pm_capabilities c = {.struct_size = sizeof c};
    pm_get_capabilities(&c);
    printf("backend %s, pinning bound by RLIMIT_MEMLOCK: %d\n", c.backend,
           c.pinning_limited_by_memlock_rlimit);
    const size_t big = 1 << 20;
    void *p = NULL;
    if (!c.pinning_limited_by_memlock_rlimit) {
        CHECK_RESULT(pm_mem_alloc_host(&p, big), PM_SUCCESS);
        CHECK_RESULT(pm_mem_free_host(p), PM_SUCCESS);
        return check_finish("memlock (limit not enforced by this backend)");
    }
    doomed_requests_are_cheap();
    CHECK_RESULT(pm_mem_alloc_host(&p, big), PM_ERROR_OUT_OF_MEMORY);
    CHECK(strstr(pm_last_error_detail(), "RLIMIT_MEMLOCK") != NULL);
    CHECK(strstr(pm_last_error_detail(), "ulimit -l") != NULL);
    printf("detail: %s\n", pm_last_error_detail());
    CHECK(locked_kib() == 0);

    void *buf = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
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
    return check_finish("memlock");
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
    int rc = in_child(child);
    return in_child(budget_child) || rc;
}
