/* Facts about the host and the page-level helpers both backends share. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../errors.h"
#include "../thread_start.h"
#include "backend.h"

static size_t read_huge_page_size(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "re");
    unsigned long long v = 0;
    if (f) {
        if (fscanf(f, "%llu", &v) != 1)
            v = 0;
        fclose(f);
    }
    return (size_t)v;
}

bool pm__read_first_line(const char *path, char *line, size_t cap)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    bool ok = fgets(line, (int)cap, f) != NULL;
    fclose(f);
    if (ok)
        line[strcspn(line, "\n")] = '\0';
    return ok;
}

bool pm__read_cpu_list(const char *path, cpu_set_t *set)
{
    char list[4096] = "";
    if (!pm__read_first_line(path, list, sizeof list))
        return false;
    CPU_ZERO(set);
    for (char *at = list; *at;) {
        char *end;
        unsigned long first = strtoul(at, &end, 10), last = first;
        if (end == at)
            return false;
        if (*end == '-')
            last = strtoul(end + 1, &end, 10);
        for (unsigned long cpu = first; cpu <= last && cpu < CPU_SETSIZE; cpu++)
            CPU_SET((int)cpu, set);
        at = *end == ',' ? end + 1 : end;
    }
    return CPU_COUNT(set) > 0;
}

/* The bracketed word of the THP "enabled" file, e.g. "always [madvise] never". */
static void read_huge_page_mode(char *out, size_t cap)
{
    snprintf(out, cap, "unavailable");
    char line[128];
    if (pm__read_first_line("/sys/kernel/mm/transparent_hugepage/enabled", line, sizeof line)) {
        char *open = strchr(line, '['), *close = open ? strchr(open, ']') : NULL;
        if (open && close && (size_t)(close - open - 1) < cap) {
            memcpy(out, open + 1, (size_t)(close - open - 1));
            out[close - open - 1] = '\0';
        }
    }
}

static int current_numa_node(void)
{
    unsigned cpu = 0, node = 0;
    if (syscall(SYS_getcpu, &cpu, &node, NULL) != 0)
        return -1;
    return (int)node;
}

void pm__system_fill_caps(pm_capabilities *caps)
{
    caps->page_size = (size_t)sysconf(_SC_PAGESIZE);
    read_huge_page_mode(caps->huge_page_mode, sizeof caps->huge_page_mode);
    caps->huge_page_size =
        strcmp(caps->huge_page_mode, "unavailable") == 0 ? 0 : read_huge_page_size();
    caps->host_numa_node = current_numa_node();
}

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

void *pm__map_anonymous_aligned(size_t bytesize, size_t align, size_t *map_len)
{
    const size_t page = page_size();
    const size_t huge = 2u << 20; /* the x86-64 and arm64 PMD size; a hint only */
    if (bytesize == 0 || align > ((size_t)1 << 40) || bytesize > SIZE_MAX - 2 * huge - align) {
        errno = ENOMEM;
        return NULL;
    }
    size_t len = (bytesize + page - 1) & ~(page - 1);
    if (len >= huge && align < huge)
        align = huge; /* so the kernel can back the range with huge pages */
    if (align <= page) {
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
        *map_len = len;
        return p;
    }
    /* Over-map, then trim both ends to the boundary. */
    uint8_t *raw = mmap(NULL, len + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    uint8_t *aligned = (uint8_t *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
    if (aligned > raw)
        munmap(raw, (size_t)(aligned - raw));
    size_t tail = (size_t)(raw + len + align - (aligned + len));
    if (tail)
        munmap(aligned + len, tail);
    if (len >= huge)
        madvise(aligned, len, MADV_HUGEPAGE);
    *map_len = len;
    return aligned;
}

void *pm__map_anonymous(size_t bytesize, size_t *map_len)
{
    return pm__map_anonymous_aligned(bytesize, 0, map_len);
}

/* Workers take 2 MiB chunks from one counter, so a slow thread never leaves a
 * large slice for the others to wait on. (Starting to pin behind the faulted
 * front gained nothing: docs/design.md, "Tried and not adopted".) */
typedef struct prefault_job {
    uint8_t *base;
    size_t len, chunk, n_chunks, step;
    int node; /* the threads run on its CPUs, or -1 */
    atomic_size_t next_chunk;
} prefault_job;

static void *prefault_worker(void *arg)
{
    prefault_job *j = arg;
    if (j->node >= 0)
        pm__run_on_node(j->node); /* where it cannot, the pages go where it runs */
    for (;;) {
        size_t i = atomic_fetch_add_explicit(&j->next_chunk, 1, memory_order_relaxed);
        if (i >= j->n_chunks)
            return NULL;
        volatile uint8_t *q = j->base + i * j->chunk;
        volatile uint8_t *end = i + 1 == j->n_chunks ? j->base + j->len : q + j->chunk;
        for (; q < end; q += j->step)
            *q = 0;
    }
}

static void *prefault_thread(void *arg)
{
    pm__thread_begin("pinmem-prefault");
    return prefault_worker(arg);
}

static size_t worker_count(size_t len)
{
    enum { max_threads = 16 };
    const size_t per_thread_min = pm__prefault_parallel_min / 2; /* less is not worth a thread */
    const size_t cpus = pm__usable_cpus();
    size_t threads = len / per_thread_min;
    if (threads > (size_t)max_threads)
        threads = max_threads;
    if (threads > cpus)
        threads = cpus;
    return threads;
}

void pm__prefault(void *p, size_t len, int node)
{
    enum { max_threads = 16 };
    const bool on_node = pm__placed_by_touch(node);
    prefault_job job = {.base = p, .len = len, .chunk = 2u << 20, .step = page_size(),
                        .node = on_node ? node : -1};
    job.n_chunks = (len + job.chunk - 1) / job.chunk;
    atomic_init(&job.next_chunk, 0);
    size_t threads = worker_count(len);
    if (on_node && threads == 0)
        threads = 1; /* the caller may run on another node */
    pthread_t tids[max_threads];
    size_t started = 0;
    while ((threads > 1 || on_node) && started < threads &&
           pm__thread_create(&tids[started], NULL, prefault_thread, &job) == 0)
        started++;
    /* This thread works too, but for pages meant for a node, unless no
     * thread started: then it works alone, where it runs. */
    if (started == 0)
        job.node = -1;
    if (!on_node || started == 0)
        prefault_worker(&job);
    for (size_t i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
}

pm_result pm__reserve_chunk_range(size_t len, size_t align, int numa_node, void **base)
{
    size_t map_len = 0;
    void *p = pm__map_anonymous_aligned(len, align, &map_len);
    if (!p)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "mmap of a %zu-byte pool chunk failed: %s", len,
                        strerror(errno));
    /* The policy stays with the range, so pages faulted in by later commits follow it. */
    pm_result r = numa_node >= 0 ? pm__bind_to_node(p, map_len, numa_node) : PM_SUCCESS;
    if (r != PM_SUCCESS) {
        munmap(p, map_len);
        return r;
    }
    *base = p;
    return PM_SUCCESS;
}

/* The kernel's fixed inode number of the initial user namespace. */
enum { INITIAL_USER_NAMESPACE_INODE = 0xEFFFFFFDu };

/* mlock asks whether the capability is held in the initial user namespace,
 * so CAP_IPC_LOCK held in another (a rootless container's) lifts nothing. */
static bool in_initial_user_namespace(void)
{
    struct stat ns;
    return stat("/proc/self/ns/user", &ns) != 0 || ns.st_ino == INITIAL_USER_NAMESPACE_INODE;
}

/* Reads VmLck (bytes) and whether CAP_IPC_LOCK (bit 14) lifts the limit. */
static void read_lock_status(unsigned long long *locked, bool *can_lock_freely)
{
    FILE *f = fopen("/proc/self/status", "re");
    char line[256];
    unsigned long long kib = 0, caps = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmLck: %llu kB", &kib) == 1)
            continue;
        if (sscanf(line, "CapEff: %llx", &caps) == 1)
            continue;
    }
    if (f)
        fclose(f);
    *locked = kib * 1024;
    *can_lock_freely = ((caps >> 14) & 1) && in_initial_user_namespace();
}

size_t pm__memlock_headroom(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return SIZE_MAX;
    unsigned long long locked = 0;
    bool free_pass = false;
    read_lock_status(&locked, &free_pass);
    if (free_pass)
        return SIZE_MAX;
    return rl.rlim_cur > locked ? (size_t)(rl.rlim_cur - locked) : 0;
}
