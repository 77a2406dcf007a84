/* RLIMIT_MEMLOCK, in a child that has given up CAP_IPC_LOCK (root becomes
 * nobody) and has a 64 KiB limit: pinning past it fails cleanly, names the
 * limit, and leaves nothing locked. On the CUDA backend the driver ignores
 * the limit, as it does for cuMemHostAlloc. */
#include <grp.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

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

int main(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0)
    {
        int rc = child();
        fflush(stdout);
        _exit(rc);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
