/* What this process may use, for sizing pinmem's threads and caches: CPUs
 * (the calling thread's affinity, as taskset or a container's cpuset sets
 * it, lowered to its cgroup's CPU quota, as a container's or Kubernetes'
 * CPU limit sets it) and memory (the machine's, lowered to its cgroup's
 * memory limit). Threads beyond a quota spend it within the period and then
 * the whole process waits for the next one; pinned memory beyond a memory
 * limit gets the container killed. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"

enum { PATH_CAP = 4096, LINE_CAP = 8192 };

/* One cgroup hierarchy as mounted here: where, from which of its
 * directories, and the file naming the process's cgroup in it. */
typedef struct hierarchy {
    char mount[PATH_CAP], root[PATH_CAP], cgroup[PATH_CAP];
    bool v2;
} hierarchy;

/* Whether list (comma-separated) holds word. */
static bool has_word(const char *list, const char *word)
{
    const size_t n = strlen(word);
    for (const char *p = list; p;) {
        if (!strncmp(p, word, n) && (p[n] == ',' || p[n] == '\0'))
            return true;
        p = strchr(p, ',');
        p = p ? p + 1 : NULL;
    }
    return false;
}

/* The mount of the v2 hierarchy (want_v2) or of v1's controller in
 * mountinfo; false where there is none. */
static bool find_mount(const char *mountinfo, bool want_v2, const char *controller, hierarchy *h)
{
    FILE *f = fopen(mountinfo, "re");
    if (!f)
        return false;
    char *line = malloc(LINE_CAP);
    bool found = false;
    while (line && !found && fgets(line, LINE_CAP, f)) {
        char root[PATH_CAP], mount[PATH_CAP], type[64], opts[1024];
        const char *dash = strstr(line, " - ");
        if (!dash || sscanf(line, "%*s %*s %*s %4095s %4095s", root, mount) != 2 ||
            sscanf(dash, " - %63s %*s %1023s", type, opts) != 2)
            continue;
        found = want_v2 ? !strcmp(type, "cgroup2")
                        : !strcmp(type, "cgroup") && has_word(opts, controller);
        if (found) {
            snprintf(h->root, sizeof h->root, "%s", root);
            snprintf(h->mount, sizeof h->mount, "%s", mount);
            h->v2 = want_v2;
        }
    }
    free(line);
    fclose(f);
    return found;
}

/* The process's cgroup in h's hierarchy, from proc_cgroup ("0::/path" for
 * v2, "N:cpu,cpuacct:/path" for v1); false where it is not named. */
static bool find_cgroup(const char *proc_cgroup, const char *controller, hierarchy *h)
{
    FILE *f = fopen(proc_cgroup, "re");
    if (!f)
        return false;
    char line[PATH_CAP + 64];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *controllers = strchr(line, ':');
        char *path = controllers ? strchr(controllers + 1, ':') : NULL;
        if (!path)
            continue;
        *path++ = '\0';
        *controllers++ = '\0';
        found = h->v2 ? !strcmp(line, "0") && controllers[0] == '\0'
                      : has_word(controllers, controller);
        if (found)
            snprintf(h->cgroup, sizeof h->cgroup, "%s", path);
    }
    fclose(f);
    return found;
}

static bool read_numbers(const char *dir, const char *file, char *out, size_t cap)
{
    char path[2 * PATH_CAP + 32];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return pm__read_first_line(path, out, cap);
}

/* The quota of the cgroup at dir in whole CPUs, rounded up; 0 for none. */
static unsigned long long quota_at(const char *dir, bool v2)
{
    char text[128], period_text[64];
    long long quota = 0, period = 0;
    if (v2) {
        if (!read_numbers(dir, "cpu.max", text, sizeof text) ||
            sscanf(text, "%lld %lld", &quota, &period) != 2) /* "max 100000": none */
            return 0;
    } else if (!read_numbers(dir, "cpu.cfs_quota_us", text, sizeof text) ||
               !read_numbers(dir, "cpu.cfs_period_us", period_text, sizeof period_text) ||
               sscanf(text, "%lld", &quota) != 1 || sscanf(period_text, "%lld", &period) != 1) {
        return 0;
    }
    if (quota <= 0 || period <= 0) /* -1: none */
        return 0;
    long long cpus = (quota + period - 1) / period;
    return cpus > 4096 ? 4096 : (unsigned long long)cpus;
}

/* The memory limit of the cgroup at dir in bytes; 0 for none. */
static unsigned long long memory_at(const char *dir, bool v2)
{
    char text[128];
    unsigned long long bytes = 0;
    if (!read_numbers(dir, v2 ? "memory.max" : "memory.limit_in_bytes", text, sizeof text) ||
        sscanf(text, "%llu", &bytes) != 1) /* "max": none */
        return 0;
    /* v1 writes "no limit" as the largest page-aligned value (2^63 less a page) */
    return bytes >= (1ull << 62) ? 0 : bytes;
}

/* The smallest limit at_level reads from the process's cgroup up to the
 * hierarchy's mounted root; 0 for none. */
static unsigned long long hierarchy_limit(const hierarchy *h,
                                          unsigned long long (*at_level)(const char *, bool))
{
    const size_t root_len = strcmp(h->root, "/") ? strlen(h->root) : 0;
    const char *below = h->cgroup; /* the cgroup's path under the mount */
    if (root_len && !strncmp(h->cgroup, h->root, root_len) &&
        (h->cgroup[root_len] == '/' || h->cgroup[root_len] == '\0'))
        below += root_len;
    else if (root_len)
        below = ""; /* outside the part mounted here: only the mount's own level */
    char dir[2 * PATH_CAP];
    snprintf(dir, sizeof dir, "%s%s", h->mount, below);
    const size_t mount_len = strlen(h->mount);
    unsigned long long least = 0;
    for (;;) {
        unsigned long long q = at_level(dir, h->v2);
        if (q && (!least || q < least))
            least = q;
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= mount_len || !slash || (size_t)(slash - dir) < mount_len)
            break;
        *slash = '\0';
    }
    return least;
}

/* The least of the limits at_level reads in either hierarchy; 0 for none. */
static unsigned long long cgroup_limit(const char *mountinfo, const char *proc_cgroup,
                                       const char *controller,
                                       unsigned long long (*at_level)(const char *, bool))
{
    unsigned long long least = 0;
    for (int v2 = 0; v2 <= 1; v2++) {
        hierarchy *h = malloc(sizeof *h);
        if (h && find_mount(mountinfo, v2, controller, h) &&
            find_cgroup(proc_cgroup, controller, h)) {
            unsigned long long q = hierarchy_limit(h, at_level);
            if (q && (!least || q < least))
                least = q;
        }
        free(h);
    }
    return least;
}

unsigned pm__cgroup_cpu_limit(const char *mountinfo, const char *proc_cgroup)
{
    return (unsigned)cgroup_limit(mountinfo, proc_cgroup, "cpu", quota_at);
}

unsigned long long pm__cgroup_memory_limit(const char *mountinfo, const char *proc_cgroup)
{
    return cgroup_limit(mountinfo, proc_cgroup, "memory", memory_at);
}

static unsigned quota_cpus;
static unsigned long long memory_limit;
static pthread_once_t limits_once = PTHREAD_ONCE_INIT;

/* Limits change rarely; affinity may, and per thread, so it is read each time. */
static void read_limits(void)
{
    quota_cpus = pm__cgroup_cpu_limit("/proc/self/mountinfo", "/proc/self/cgroup");
    memory_limit = pm__cgroup_memory_limit("/proc/self/mountinfo", "/proc/self/cgroup");
}

unsigned pm__usable_cpus(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned cpus = online > 0 ? (unsigned)online : 1;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        cpus = (unsigned)CPU_COUNT(&set);
    pthread_once(&limits_once, read_limits);
    return quota_cpus && quota_cpus < cpus ? quota_cpus : cpus;
}

unsigned long long pm__usable_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    unsigned long long bytes =
        pages > 0 && page > 0 ? (unsigned long long)pages * (unsigned long long)page : 0;
    pthread_once(&limits_once, read_limits);
    return memory_limit && (!bytes || memory_limit < bytes) ? memory_limit : bytes;
}
