/* What pinmem places and sizes its threads and caches by: the thread's
 * affinity or the process's cpuset, and the CPU quota and memory limit of
 * the process's cgroup, read from mountinfo and /proc/self/cgroup as the
 * kernel writes them (here, files of the test's own naming a tree it made),
 * v2 and v1, through every level up to the mounted root. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "copy_util.h"

static char top[64];

/* Writes text to top/name; false (a failed check) where it cannot. */
static bool put(const char *name, const char *fmt, ...)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", top, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return false;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    return fclose(f) == 0;
}

static void dirs(const char *path)
{
    char full[512];
    snprintf(full, sizeof full, "%s/%s", top, path);
    for (char *p = full + strlen(top) + 1;; p++) {
        const char c = *p;
        if (c == '/' || c == '\0') {
            *p = '\0';
            if (mkdir(full, 0755) != 0 && errno != EEXIST)
                CHECK(!"mkdir");
            *p = c;
        }
        if (c == '\0')
            return;
    }
}

/* The limits read through the test's own mountinfo and cgroup files. */
static char own_mountinfo[128], own_cgroup[128];

static unsigned limit(void) { return pm__cgroup_cpu_limit(own_mountinfo, own_cgroup); }

static unsigned long long memory_limit(void)
{
    return pm__cgroup_memory_limit(own_mountinfo, own_cgroup);
}

/* mountinfo's line for a hierarchy mounted at top/dir from its root. */
static void mount_line(FILE *f, const char *dir, const char *root, bool v2)
{
    fprintf(f, "41 31 0:38 %s %s/%s rw,relatime shared:9 - %s cgroup rw,%s\n", root, top, dir,
            v2 ? "cgroup2" : "cgroup", v2 ? "nsdelegate" : "cpu,cpuacct");
}

static void mounts(const char *v2_root, const char *v1_root)
{
    char path[128];
    snprintf(path, sizeof path, "%s/mountinfo", top);
    FILE *f = fopen(path, "w");
    REQUIRE(f != NULL);
    fprintf(f, "23 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n");
    fprintf(f, "31 23 0:28 / %s/fs rw - tmpfs tmpfs rw,mode=755\n", top);
    if (v1_root)
        mount_line(f, "fs/cpu", v1_root, false);
    fprintf(f, "33 31 0:30 / %s/fs/memory rw - cgroup cgroup rw,memory\n", top);
    fprintf(f, "34 31 0:31 / %s/fs/cpuset rw - cgroup cgroup rw,cpuset\n", top);
    if (v2_root)
        mount_line(f, "fs/unified", v2_root, true);
    fclose(f);
}

static void cgroup_v2(void)
{
    mounts("/", NULL);
    dirs("fs/unified/kubepods/pod/ctr");
    put("cgroup", "0::/kubepods/pod/ctr\n");
    CHECK(limit() == 0); /* no cpu.max anywhere */
    put("fs/unified/kubepods/pod/ctr/cpu.max", "max 100000\n");
    put("fs/unified/kubepods/cpu.max", "max 100000\n");
    CHECK(limit() == 0);
    put("fs/unified/kubepods/pod/cpu.max", "250000 100000\n"); /* a parent's: 2.5 CPUs */
    CHECK(limit() == 3);
    put("fs/unified/kubepods/pod/ctr/cpu.max", "50000 100000\n");
    CHECK(limit() == 1);
    put("fs/unified/kubepods/pod/ctr/cpu.max", "800000 100000\n"); /* the least binds */
    CHECK(limit() == 3);
    put("fs/unified/cpu.max", "200000 100000\n"); /* the mounted root counts too */
    CHECK(limit() == 2);
    put("fs/unified/cpu.max", "max 100000\n");

    /* A container's own namespace: the cgroup is "/", the mount its root. */
    put("cgroup", "0::/\n");
    CHECK(limit() == 0);
    put("fs/unified/cpu.max", "400000 100000\n");
    CHECK(limit() == 4);
    put("fs/unified/cpu.max", "max 100000\n");

    /* Mounted from a directory of the hierarchy: the path is read below it. */
    mounts("/kubepods", NULL);
    put("cgroup", "0::/kubepods/pod/ctr\n");
    dirs("fs/unified/pod/ctr");
    put("fs/unified/pod/cpu.max", "150000 100000\n");
    CHECK(limit() == 2);
    /* A cgroup outside the part mounted: only the mount's own level. */
    put("cgroup", "0::/elsewhere/x\n");
    CHECK(limit() == 0);
    put("fs/unified/cpu.max", "100000 100000\n");
    CHECK(limit() == 1);
    put("fs/unified/cpu.max", "max 100000\n");
}

static void cgroup_v1(void)
{
    mounts(NULL, "/");
    dirs("fs/cpu/docker/abc");
    put("cgroup", "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n");
    put("fs/cpu/docker/abc/cpu.cfs_quota_us", "-1\n");
    put("fs/cpu/docker/abc/cpu.cfs_period_us", "100000\n");
    CHECK(limit() == 0);
    put("fs/cpu/docker/abc/cpu.cfs_quota_us", "300000\n");
    CHECK(limit() == 3);
    put("fs/cpu/docker/abc/cpu.cfs_period_us", "garbage\n");
    CHECK(limit() == 0);
    put("fs/cpu/docker/abc/cpu.cfs_period_us", "100000\n");
    /* Both hierarchies name limits (a hybrid system): the least binds. */
    mounts("/", "/");
    dirs("fs/unified/docker/abc");
    put("cgroup", "4:cpu,cpuacct:/docker/abc\n0::/docker/abc\n");
    put("fs/unified/docker/abc/cpu.max", "200000 100000\n");
    CHECK(limit() == 2);
}

static void memory_limits(void)
{
    mounts("/", NULL);
    dirs("fs/unified/user.slice/app");
    put("cgroup", "0::/user.slice/app\n");
    put("fs/unified/user.slice/app/memory.max", "max\n");
    CHECK(memory_limit() == 0);
    CHECK(limit() == 0); /* memory files are not CPU quotas */
    put("fs/unified/user.slice/memory.max", "4294967296\n");
    CHECK(memory_limit() == 4294967296ull);
    put("fs/unified/user.slice/app/memory.max", "1073741824\n");
    CHECK(memory_limit() == 1073741824ull);
    put("fs/unified/user.slice/app/memory.max", "max\n");
    put("fs/unified/user.slice/memory.max", "max\n");

    /* v1: its own mount, and "no limit" written as 2^63 less a page. */
    mounts(NULL, NULL);
    dirs("fs/memory/docker/abc");
    put("cgroup", "4:cpu,cpuacct:/docker/abc\n12:memory:/docker/abc\n");
    put("fs/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");
    CHECK(memory_limit() == 0);
    put("fs/memory/docker/abc/memory.limit_in_bytes", "536870912\n");
    CHECK(memory_limit() == 536870912ull);
    CHECK(limit() == 0);

    const unsigned long long here = pm__usable_memory();
    const unsigned long long physical =
        (unsigned long long)sysconf(_SC_PHYS_PAGES) * (unsigned long long)sysconf(_SC_PAGESIZE);
    CHECK(here > 0 && here <= physical);
    printf("here: %llu MiB of memory usable, %llu MiB physical\n", here >> 20, physical >> 20);
}

static bool cpuset(cpu_set_t *set) { return pm__cgroup_cpuset(own_mountinfo, own_cgroup, set); }

/* The cpuset: the effective CPUs of the lowest level that has the file, v2
 * first, else v1's (a hybrid system whose cpuset controller is v1's). */
static void cpusets(void)
{
    cpu_set_t set;
    mounts("/", NULL);
    dirs("fs/unified/kubepods/pod/ctr");
    put("cgroup", "0::/kubepods/pod/ctr\n");
    CHECK(!cpuset(&set)); /* no file anywhere */
    put("fs/unified/cpuset.cpus.effective", "0-63\n");
    CHECK(cpuset(&set) && CPU_COUNT(&set) == 64);
    put("fs/unified/kubepods/pod/cpuset.cpus.effective", "2-3,8,10-11\n");
    CHECK(cpuset(&set) && CPU_COUNT(&set) == 5 && CPU_ISSET(8, &set) && !CPU_ISSET(9, &set));
    put("fs/unified/kubepods/pod/ctr/cpuset.cpus.effective", "4\n");
    CHECK(cpuset(&set) && CPU_COUNT(&set) == 1 && CPU_ISSET(4, &set));
    put("fs/unified/kubepods/pod/ctr/cpuset.cpus.effective", "4-x\n"); /* unreadable: above */
    CHECK(cpuset(&set) && CPU_COUNT(&set) == 5);
    put("fs/unified/kubepods/pod/ctr/cpuset.cpus.effective", "\n");
    CHECK(cpuset(&set) && CPU_COUNT(&set) == 5);

    dirs("fs/cpuset/docker/abc");
    put("cgroup", "5:cpuset:/docker/abc\n0::/docker/abc\n");
    put("fs/cpuset/docker/abc/cpuset.effective_cpus", "1,3,5-6\n");
    CHECK(cpuset(&set) && CPU_COUNT(&set) == 64); /* v2's root has the file */
    put("fs/unified/cpuset.cpus.effective", "\n");
    CHECK(cpuset(&set) && CPU_COUNT(&set) == 4 && CPU_ISSET(6, &set) && !CPU_ISSET(4, &set));
    mounts(NULL, NULL);
    CHECK(cpuset(&set) && CPU_COUNT(&set) == 4);
    put("cgroup", "0::/docker/abc\n"); /* v1's cpuset names no cgroup of the process */
    CHECK(!cpuset(&set));
}

/* Files the kernel would never write: no limit, and no crash. */
static void malformed(void)
{
    char missing[128];
    snprintf(missing, sizeof missing, "%s/none", top);
    CHECK(pm__cgroup_cpu_limit(missing, missing) == 0);
    put("mountinfo", "no fields\n - \n41 31 0:38 / %s/fs/unified rw - cgroup2\n\n", top);
    put("cgroup", "0::\n::::\n0\n");
    CHECK(limit() == 0);
    CHECK(pm__cgroup_memory_limit(missing, missing) == 0);
    cpu_set_t set;
    CHECK(!pm__cgroup_cpuset(missing, missing, &set));
    mounts("/", NULL);
    put("cgroup", "0::/../../../\n");
    CHECK(limit() == 0);
    char long_line[10000];
    memset(long_line, 'x', sizeof long_line - 1);
    long_line[sizeof long_line - 1] = '\0';
    put("cgroup", "0::/%s\n", long_line);
    CHECK(limit() == 0);
    put("mountinfo", "%s\n", long_line);
    CHECK(limit() == 0);
}

/* Affinity: a thread allowed one CPU may keep one busy. */
static void affinity(void)
{
    cpu_set_t all, one;
    REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
    const unsigned quota = pm__cgroup_cpu_limit("/proc/self/mountinfo", "/proc/self/cgroup");
    const unsigned n = (unsigned)CPU_COUNT(&all);
    CHECK(pm__usable_cpus() == (quota && quota < n ? quota : n));
    int first = 0;
    while (!CPU_ISSET(first, &all))
        first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
    CHECK(pm__usable_cpus() == 1);
    CHECK(sched_setaffinity(0, sizeof all, &all) == 0);
    printf("here: %u CPUs of affinity, cgroup quota %u\n", n, quota);
}

/* The copy engine's default workers follow the CPUs the process may use:
 * one each but the caller's, here with at most three allowed. */
static void workers_follow_affinity(void)
{
    cpu_set_t all, some;
    REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
    CPU_ZERO(&some);
    for (int cpu = 0, n = 0; cpu < CPU_SETSIZE && n < 3; cpu++)
        if (CPU_ISSET(cpu, &all)) {
            CPU_SET(cpu, &some);
            n++;
        }
    const unsigned allowed = (unsigned)CPU_COUNT(&some);
    fflush(NULL);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        unsetenv("PINMEM_COPY_WORKERS");
        pm_copy_config c = {.struct_size = sizeof c};
        if (sched_setaffinity(0, sizeof some, &some) != 0 || pm_init(0) != PM_SUCCESS ||
            pm_copy_get_config(&c) != PM_SUCCESS)
            _exit(2);
        const unsigned quota = pm__cgroup_cpu_limit("/proc/self/mountinfo", "/proc/self/cgroup");
        const unsigned cpus = quota && quota < allowed ? quota : allowed;
        const unsigned want = cpus > 2 ? cpus - 1 : 1;
        if (c.workers != want)
            fprintf(stderr, "%u CPUs allowed: %u workers, expected %u\n", cpus, c.workers, want);
        _exit(c.workers == want ? 0 : 1);
    }
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* The staging workers now running, and how many of them run on exactly the
 * CPUs of want (their affinity, as the kernel reports it). */
static unsigned copy_workers(const cpu_set_t *want, unsigned *on_want)
{
    unsigned workers = 0;
    *on_want = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));) {
        char path[320], name[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        cpu_set_t on;
        if (e->d_name[0] == '.' || !pm__read_first_line(path, name, sizeof name) ||
            strcmp(name, "pinmem-copy") != 0)
            continue;
        workers++;
        if (sched_getaffinity((pid_t)atoi(e->d_name), sizeof on, &on) == 0 && CPU_EQUAL(&on, want))
            (*on_want)++;
    }
    closedir(d);
    return workers;
}

/* A child's main thread bound to one CPU, as OpenMP binds it: the staging
 * workers count the CPUs of counted and run on want. Its exit status: 0
 * when they do. */
static int bound_child(const char *thread_cpus, const cpu_set_t *one, const cpu_set_t *counted,
                       const cpu_set_t *want)
{
    unsetenv("PINMEM_COPY_WORKERS");
    if (thread_cpus)
        setenv("PINMEM_THREAD_CPUS", thread_cpus, 1);
    else
        unsetenv("PINMEM_THREAD_CPUS");
    pm_copy_config c = {.struct_size = sizeof c};
    if (sched_setaffinity(0, sizeof *one, one) != 0 || pm_init(0) != PM_SUCCESS ||
        pm_copy_get_config(&c) != PM_SUCCESS)
        return 2;
    const unsigned quota = pm__cgroup_cpu_limit("/proc/self/mountinfo", "/proc/self/cgroup");
    const unsigned n = (unsigned)CPU_COUNT(counted), cpus = quota && quota < n ? quota : n;
    const unsigned expected = cpus > 16 ? 15 : cpus > 2 ? cpus - 1 : 1;
    enum { bytes = 4 << 20 }; /* above the backend's own path: staged, the workers start */
    uint8_t *src = calloc(1, bytes);
    pm_deviceptr dev = src ? device_alloc(bytes) : 0;
    if (!dev || pm_memcpy_htod(dev, src, bytes) != PM_SUCCESS)
        return 2;
    unsigned workers = 0, on_want = 0;
    for (int tries = 0; tries < 2000 && (workers < c.workers || on_want < workers); tries++) {
        usleep(1000); /* each worker names itself once it runs */
        workers = copy_workers(want, &on_want);
    }
    device_free(dev);
    free(src);
    const bool ok = c.workers == expected && workers == c.workers && on_want == workers;
    if (!ok)
        fprintf(stderr,
                "PINMEM_THREAD_CPUS=%s: %u workers configured (expected %u), %u running, "
                "%u of them on the expected %d CPUs\n",
                thread_cpus ? thread_cpus : "(unset)", c.workers, expected, workers, on_want,
                CPU_COUNT(want));
    return ok ? 0 : 1;
}

/* Where the workers run with the main thread bound to one CPU: on that CPU
 * by default; with PINMEM_THREAD_CPUS=process, one for each CPU of the
 * process's cpuset but that one, on those. */
static void workers_follow_thread_cpus(void)
{
    cpu_set_t all, one, spread;
    REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
    REQUIRE(pm__cgroup_cpuset("/proc/self/mountinfo", "/proc/self/cgroup", &spread) ||
            pm__read_cpu_list("/sys/devices/system/cpu/online", &spread));
    cpu_set_t both;
    CPU_AND(&both, &all, &spread);
    CHECK(CPU_EQUAL(&both, &all)); /* an affinity lies within its cpuset */
    int first = 0;
    while (!CPU_ISSET(first, &all))
        first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    cpu_set_t others = spread;
    CPU_CLR(first, &others);
    if (CPU_COUNT(&others) == 0) {
        printf("one CPU in the cpuset: the workers' spreading is not seen here\n");
        others = spread;
    }
    const char *settings[] = {NULL, "caller", "process"};
    for (int i = 0; i < 3; i++) {
        fflush(NULL);
        pid_t child = fork();
        REQUIRE(child >= 0);
        if (child == 0)
            _exit(i < 2 ? bound_child(settings[i], &one, &one, &one)
                        : bound_child(settings[i], &one, &spread, &others));
        int status = 0;
        CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    printf("here: %d CPUs in the process's cpuset\n", CPU_COUNT(&spread));
}

static void remove_tree(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", top);
}

int main(void)
{
    snprintf(top, sizeof top, "%s/pinmem-limits-XXXXXX", "/tmp");
    if (!mkdtemp(top)) {
        printf("mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    snprintf(own_mountinfo, sizeof own_mountinfo, "%s/mountinfo", top);
    snprintf(own_cgroup, sizeof own_cgroup, "%s/cgroup", top);
    cgroup_v2();
    cgroup_v1();
    memory_limits();
    cpusets();
    malformed();
    /* Children first: a process reads its PINMEM_* variables once, and the
     * CPU counts below read PINMEM_THREAD_CPUS. */
    workers_follow_affinity();
    workers_follow_thread_cpus();
    affinity();
    remove_tree();
    return check_finish("test_limits");
}
