/* What this process may use, for placing and sizing pinmem's threads and
 * caches: CPUs (the calling thread's affinity, as taskset or a container's
 * cpuset sets it, or the cpuset itself where PINMEM_THREAD_CPUS asks, as
 * OpenMP may have bound that thread to one CPU; lowered to its cgroup's CPU
 * quota, as a container's or Kubernetes' CPU limit sets it) and memory (the
 * machine's, lowered to its cgroup's memory limit). Threads beyond a quota
 * spend it within the period and then the whole process waits for the next
 * one; pinned memory beyond a memory limit gets the container killed. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../options.h"
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
    if (quota > LLONG_MAX - period) /* past any kernel's bound: as good as none */
        return 4096;
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

/* Calls visit on the process's cgroup directory in h, then on each level
 * above it up to the hierarchy's mounted root, until visit answers true;
 * whether one did. */
static bool visit_levels(const hierarchy *h, bool (*visit)(const char *dir, bool v2, void *ctx),
                         void *ctx)
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
    for (;;) {
        if (visit(dir, h->v2, ctx))
            return true;
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= mount_len || !slash || (size_t)(slash - dir) < mount_len)
            return false;
        *slash = '\0';
    }
}

/* Calls visit_levels in the v2 hierarchy, then in v1's controller, until a
 * visit answers true; whether one did. *short_of_memory is set where a
 * hierarchy could not be read for want of memory or file descriptors, which
 * a later read may have. */
static bool visit_hierarchies(const char *mountinfo, const char *proc_cgroup,
                              const char *controller,
                              bool (*visit)(const char *dir, bool v2, void *ctx), void *ctx,
                              bool *short_of_memory)
{
    bool done = false;
    for (int v2 = 1; v2 >= 0 && !done; v2--) {
        hierarchy *h = malloc(sizeof *h);
        errno = 0;
        done = h && find_mount(mountinfo, v2, controller, h) &&
               find_cgroup(proc_cgroup, controller, h) && visit_levels(h, visit, ctx);
        if (!h || errno == ENOMEM || errno == EMFILE || errno == ENFILE)
            *short_of_memory = true;
        free(h);
    }
    return done;
}

/* The least of the limits a level gives, over every level. */
typedef struct least_limit {
    unsigned long long (*at_level)(const char *dir, bool v2);
    unsigned long long least; /* 0: none yet */
} least_limit;

static bool take_least(const char *dir, bool v2, void *ctx)
{
    least_limit *l = ctx;
    unsigned long long q = l->at_level(dir, v2);
    if (q && (!l->least || q < l->least))
        l->least = q;
    return false; /* every level binds */
}

static unsigned long long cgroup_limit(const char *mountinfo, const char *proc_cgroup,
                                       const char *controller,
                                       unsigned long long (*at_level)(const char *, bool),
                                       bool *short_of_memory)
{
    least_limit l = {at_level, 0};
    visit_hierarchies(mountinfo, proc_cgroup, controller, take_least, &l, short_of_memory);
    return l.least;
}

unsigned pm__cgroup_cpu_limit(const char *mountinfo, const char *proc_cgroup)
{
    bool short_of_memory = false;
    return (unsigned)cgroup_limit(mountinfo, proc_cgroup, "cpu", quota_at, &short_of_memory);
}

unsigned long long pm__cgroup_memory_limit(const char *mountinfo, const char *proc_cgroup)
{
    bool short_of_memory = false;
    return cgroup_limit(mountinfo, proc_cgroup, "memory", memory_at, &short_of_memory);
}

/* The cpuset's effective CPUs at dir, where the file is there; the lowest
 * level that has it answers, as the kernel folds its ancestors in. */
static bool cpuset_at(const char *dir, bool v2, void *set)
{
    char path[2 * PATH_CAP + 32];
    snprintf(path, sizeof path, "%s/%s", dir,
             v2 ? "cpuset.cpus.effective" : "cpuset.effective_cpus");
    return pm__read_cpu_list(path, set);
}

static bool cgroup_cpuset(const char *mountinfo, const char *proc_cgroup, cpu_set_t *set,
                          bool *short_of_memory)
{
    return visit_hierarchies(mountinfo, proc_cgroup, "cpuset", cpuset_at, set, short_of_memory);
}

bool pm__cgroup_cpuset(const char *mountinfo, const char *proc_cgroup, cpu_set_t *set)
{
    bool short_of_memory = false;
    return cgroup_cpuset(mountinfo, proc_cgroup, set, &short_of_memory);
}

/* What the cgroup files said; read whole or not kept. */
typedef struct process_limits {
    unsigned quota_cpus;
    unsigned long long memory;
    cpu_set_t cpus;
    bool cpus_known;
} process_limits;

static process_limits read_once;
static atomic_bool read_once_done;
static pthread_mutex_t read_once_lock = PTHREAD_MUTEX_INITIALIZER;

/* Limits and cpusets change rarely, so they are read once; a read cut short
 * by want of memory is read again by the next call, not kept for good.
 * Affinity may change, and per thread, so it is read each time. */
static process_limits limits(void)
{
    if (atomic_load_explicit(&read_once_done, memory_order_acquire))
        return read_once;
    pthread_mutex_lock(&read_once_lock);
    if (!atomic_load_explicit(&read_once_done, memory_order_relaxed)) {
        const char *mounts = "/proc/self/mountinfo", *own = "/proc/self/cgroup";
        bool short_of_memory = false;
        process_limits l = {0};
        l.quota_cpus = (unsigned)cgroup_limit(mounts, own, "cpu", quota_at, &short_of_memory);
        l.memory = cgroup_limit(mounts, own, "memory", memory_at, &short_of_memory);
        l.cpus_known = cgroup_cpuset(mounts, own, &l.cpus, &short_of_memory) ||
                       pm__read_cpu_list("/sys/devices/system/cpu/online", &l.cpus);
        read_once = l;
        if (!short_of_memory)
            atomic_store_explicit(&read_once_done, true, memory_order_release);
    }
    process_limits l = read_once;
    pthread_mutex_unlock(&read_once_lock);
    return l;
}

/* With PINMEM_THREAD_CPUS=process, the process's cpuset into *set. */
static bool process_set(cpu_set_t *set)
{
    if (pm__option_value(PM__OPT_THREAD_CPUS) != PM__THREAD_CPUS_PROCESS)
        return false;
    const process_limits l = limits();
    if (l.cpus_known)
        *set = l.cpus;
    return l.cpus_known;
}

bool pm__thread_cpus(cpu_set_t *set)
{
    if (!process_set(set))
        return false;
    /* A thread bound to some of them works on its own copy there: the
     * others are left to pinmem's threads, one for each. */
    cpu_set_t own, shared, rest;
    if (sched_getaffinity(0, sizeof own, &own) == 0) {
        CPU_AND(&shared, &own, set);
        CPU_XOR(&rest, set, &shared);
        if (CPU_COUNT(&rest) > 0)
            *set = rest;
    }
    return true;
}

unsigned pm__usable_cpus(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned cpus = online > 0 ? (unsigned)online : 1;
    cpu_set_t set;
    if ((process_set(&set) || sched_getaffinity(0, sizeof set, &set) == 0) && CPU_COUNT(&set) > 0)
        cpus = (unsigned)CPU_COUNT(&set);
    const unsigned quota = limits().quota_cpus;
    return quota && quota < cpus ? quota : cpus;
}

unsigned long long pm__usable_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    unsigned long long bytes =
        pages > 0 && page > 0 ? (unsigned long long)pages * (unsigned long long)page : 0;
    const unsigned long long limit = limits().memory;
    return limit && (!bytes || limit < bytes) ? limit : bytes;
}
