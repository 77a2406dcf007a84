/* pm_mem_check_access: readable, writable, read-only, inaccessible and
 * unmapped pages, ranges across mappings, device and page-locked memory, a
 * mapped file of a long name, the span it answers, bad arguments, eight
 * threads at once; all of it again where the kernel has no query of the
 * mappings (before Linux 6.11) and the file's text answers (section
 * "no_query", a process of its own), a query refused midway, and a first
 * check made while the process had no file descriptor to spare (section
 * "out_of_files"). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "proc_maps.h"
#include "test_hooks.h"
#include "threads.h"

static size_t page;

/* Whether the library can learn what a mapping permits: it reads
 * /proc/self/maps, by the kernel's query or (before Linux 6.11) as text. */
static int permissions_told(void)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    close(fd);
    return 1;
}

static int detail_has(const char *words)
{
    return strstr(pm_last_error_detail(), words) != NULL;
}

static pm_deviceptr at(const uint8_t *p) { return (pm_deviceptr)(uintptr_t)p; }

/* Three fresh read-write pages, or NULL. */
static uint8_t *three_pages(void)
{
    void *p = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void capabilities(int tells)
{
    pm_capabilities caps = {.struct_size = sizeof caps};
    REQUIRE_RESULT(pm_get_capabilities(&caps), PM_SUCCESS);
    CHECK(caps.access_checks_permissions == tells);
}

static void bad_arguments(void)
{
    uint8_t byte = 0;
    pm_deviceptr base = 1;
    size_t size = 1;
    CHECK_RESULT(pm_mem_check_access(at(&byte), 1, 0, NULL, NULL), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_check_access(at(&byte), 1, 4, NULL, NULL), PM_ERROR_INVALID_VALUE);
    CHECK(detail_has("access must be"));
    CHECK_RESULT(pm_mem_check_access(0, 1, PM_ACCESS_READ, NULL, NULL), PM_ERROR_INVALID_VALUE);
    CHECK(detail_has("address 0x0 (+1 bytes) is not mapped"));
    CHECK_RESULT(pm_mem_check_access(UINT64_MAX - 7, 16, PM_ACCESS_READ, NULL, NULL),
                 PM_ERROR_INVALID_VALUE);
    CHECK(detail_has("runs past the end"));
    /* nothing to touch: fine anywhere, and the span is the empty range */
    CHECK_RESULT(pm_mem_check_access(0, 0, PM_ACCESS_WRITE, &base, &size), PM_SUCCESS);
    CHECK(base == 0 && size == 0);
}

static void plain_pages(void)
{
    uint8_t *p = three_pages();
    REQUIRE(p);
    pm_deviceptr base = 0;
    size_t size = 0;
    unsigned all[] = {PM_ACCESS_READ, PM_ACCESS_WRITE, PM_ACCESS_READ | PM_ACCESS_WRITE};
    for (int i = 0; i < 3; i++) {
        CHECK_RESULT(pm_mem_check_access(at(p + 100), 2 * page, all[i], &base, &size),
                     PM_SUCCESS);
        /* the mapping that holds it */
        CHECK(base <= at(p) && at(p + 3 * page) <= base + size);
    }
    CHECK_RESULT(pm_mem_check_access(at(p), 3 * page, PM_ACCESS_READ, NULL, &size), PM_SUCCESS);
    /* a stack variable and a heap block */
    int local = 0;
    CHECK_RESULT(pm_mem_check_access(at((uint8_t *)&local), sizeof local, PM_ACCESS_WRITE, NULL,
                                     NULL), PM_SUCCESS);
    uint8_t *heap = malloc(1 << 20);
    if (heap)
        CHECK_RESULT(pm_mem_check_access(at(heap), 1 << 20, PM_ACCESS_READ, NULL, NULL),
                     PM_SUCCESS);
    free(heap);
    munmap(p, 3 * page);
}

static void unmapped_pages(void)
{
    uint8_t *p = three_pages();
    REQUIRE(p);
    REQUIRE(munmap(p + page, page) == 0);
    CHECK_RESULT(pm_mem_check_access(at(p), page, PM_ACCESS_WRITE, NULL, NULL), PM_SUCCESS);
    CHECK_RESULT(pm_mem_check_access(at(p + page + 8), 8, PM_ACCESS_READ, NULL, NULL),
                 PM_ERROR_INVALID_VALUE);
    CHECK(detail_has("is not mapped in this process"));
    /* a range that passes through the hole */
    CHECK_RESULT(pm_mem_check_access(at(p), 3 * page, PM_ACCESS_READ, NULL, NULL),
                 PM_ERROR_INVALID_VALUE);
    CHECK(detail_has("is not mapped"));
    munmap(p, 3 * page);
}

static void pages_the_process_may_not_touch(void)
{
    if (!permissions_told())
        SKIP_CASE("/proc/self/maps cannot be read here");
    uint8_t *p = three_pages();
    REQUIRE(p);
    REQUIRE(mprotect(p + page, page, PROT_NONE) == 0);
    CHECK_RESULT(pm_mem_check_access(at(p + page), 64, PM_ACCESS_READ, NULL, NULL),
                 PM_ERROR_INVALID_VALUE);
    CHECK(detail_has("is neither readable host memory nor inside one device allocation"));
    CHECK_RESULT(pm_mem_check_access(at(p + page), 64, PM_ACCESS_WRITE, NULL, NULL),
                 PM_ERROR_INVALID_VALUE);
    CHECK(detail_has("neither writable"));
    CHECK_RESULT(pm_mem_check_access(at(p + page - 8), 16, PM_ACCESS_READ | PM_ACCESS_WRITE,
                                     NULL, NULL), PM_ERROR_INVALID_VALUE);
    CHECK(detail_has("neither readable and writable"));
    CHECK_RESULT(pm_mem_check_access(at(p), 3 * page, PM_ACCESS_READ, NULL, NULL),
                 PM_ERROR_INVALID_VALUE);
    /* the pages around it are fine */
    CHECK_RESULT(pm_mem_check_access(at(p + 2 * page), page, PM_ACCESS_WRITE, NULL, NULL),
                 PM_SUCCESS);

    /* read-only: read, not written */
    REQUIRE(mprotect(p + page, page, PROT_READ) == 0);
    CHECK_RESULT(pm_mem_check_access(at(p + page), page, PM_ACCESS_READ, NULL, NULL),
                 PM_SUCCESS);
    CHECK_RESULT(pm_mem_check_access(at(p + page), page, PM_ACCESS_WRITE, NULL, NULL),
                 PM_ERROR_INVALID_VALUE);
    CHECK(detail_has("is not writable in this process"));
    /* a range over three mappings, all readable: good, and the span is the range */
    pm_deviceptr base = 0;
    size_t size = 0;
    CHECK_RESULT(pm_mem_check_access(at(p + 10), 3 * page - 20, PM_ACCESS_READ, &base, &size),
                 PM_SUCCESS);
    CHECK(base == at(p + 10) && size == 3 * page - 20);
    CHECK_RESULT(pm_mem_check_access(at(p + 10), 3 * page - 20, PM_ACCESS_WRITE, NULL, NULL),
                 PM_ERROR_INVALID_VALUE);
    munmap(p, 3 * page);
}

static void device_memory(void)
{
    pm_deviceptr d = 0;
    size_t n = 1 << 20;
    REQUIRE_RESULT(pm_device_alloc(&d, n), PM_SUCCESS);
    pm_deviceptr base = 0;
    size_t size = 0;
    CHECK_RESULT(pm_mem_check_access(d + 4096, n - 4096, PM_ACCESS_READ | PM_ACCESS_WRITE, &base,
                                     &size), PM_SUCCESS);
    CHECK(base <= d && d + n <= base + size);
    if (on_backend("cuda") && permissions_told()) {
        /* past its end: the CPU may touch none of it, and no allocation holds it all */
        CHECK_RESULT(pm_mem_check_access(d + n - 8, 16, PM_ACCESS_READ, NULL, NULL),
                     PM_ERROR_INVALID_VALUE);
        CHECK(detail_has("neither readable host memory"));
    }
    /* on posix the CPU copies device memory too, so its mapping answers */
    uint8_t *inside = (uint8_t *)(uintptr_t)((d + 2 * page) & ~(pm_deviceptr)(page - 1));
    if (!on_backend("cuda") && permissions_told() && mprotect(inside, page, PROT_NONE) == 0) {
        CHECK_RESULT(pm_mem_check_access(at(inside), 16, PM_ACCESS_READ, NULL, NULL),
                     PM_ERROR_INVALID_VALUE);
        CHECK(detail_has("neither readable host memory"));
        CHECK(mprotect(inside, page, PROT_READ | PROT_WRITE) == 0);
    }
    CHECK_RESULT(pm_device_free(d), PM_SUCCESS);
}

/* Page-locked memory the program made inaccessible is refused on every
 * backend: its mapping answers, since the driver reads a small copy's
 * page-locked side with the CPU. */
static void page_locked_memory(void)
{
    void *h = NULL;
    pm_result r = pm_mem_host_alloc(&h, page, 0);
    if (r == PM_ERROR_OUT_OF_MEMORY)
        SKIP_CASE("no page-locked memory to be had here");
    REQUIRE_RESULT(r, PM_SUCCESS);
    CHECK_RESULT(pm_mem_check_access(at(h), page, PM_ACCESS_WRITE, NULL, NULL), PM_SUCCESS);
    if (permissions_told() && mprotect(h, page, PROT_NONE) == 0) {
        pm_deviceptr base = 0;
        size_t size = 0;
        /* on every backend: the CPU may read it (the driver does, for a
         * small copy to the device) */
        CHECK_RESULT(pm_mem_check_access(at(h), page, PM_ACCESS_READ, &base, &size),
                     PM_ERROR_INVALID_VALUE);
        CHECK(detail_has("neither readable host memory"));
        CHECK(base == at(h) && size == page); /* a refusal's span is the range itself */
        CHECK_RESULT(pm_mem_check_access(at(h) + 8, 16, PM_ACCESS_WRITE, NULL, NULL),
                     PM_ERROR_INVALID_VALUE);
        /* more than the allocation holds */
        CHECK_RESULT(pm_mem_check_access(at(h), 2 * page, PM_ACCESS_WRITE, NULL, NULL),
                     PM_ERROR_INVALID_VALUE);
        CHECK(detail_has("neither writable host memory"));
        CHECK_RESULT(pm_mem_check_access(at(h) + 8, page, PM_ACCESS_READ, NULL, NULL),
                     PM_ERROR_INVALID_VALUE);
        /* read-only: its mapping answers, not the allocation */
        CHECK(mprotect(h, page, PROT_READ) == 0);
        CHECK_RESULT(pm_mem_check_access(at(h), page, PM_ACCESS_READ, NULL, NULL), PM_SUCCESS);
        CHECK_RESULT(pm_mem_check_access(at(h), page, PM_ACCESS_WRITE, NULL, NULL),
                     PM_ERROR_INVALID_VALUE);
        CHECK(detail_has("is not writable"));
        CHECK(mprotect(h, page, PROT_READ | PROT_WRITE) == 0);
    }
    CHECK_RESULT(pm_mem_free_host(h), PM_SUCCESS);
}

/* A refused query (the kernel stops answering) leaves that call to the
 * file's text; where the text cannot be read either, to msync: mapped pages
 * pass whatever they permit, unmapped ones do not. */
static void query_refused_midway(void)
{
    uint8_t *p = three_pages();
    REQUIRE(p);
    REQUIRE(mprotect(p, page, PROT_NONE) == 0);
    REQUIRE(munmap(p + 2 * page, page) == 0);
    const pm_result told = permissions_told() ? PM_ERROR_INVALID_VALUE : PM_SUCCESS;
    CHECK_RESULT(pm_mem_check_access(at(p + page), page, PM_ACCESS_READ, NULL, NULL), PM_SUCCESS);
    atomic_store(&pm__fault_maps_query, 1);
    CHECK_RESULT(pm_mem_check_access(at(p), page, PM_ACCESS_READ, NULL, NULL), told);
    atomic_store(&pm__fault_maps_query, 1);
    atomic_store(&pm__fault_maps_text, 1);
    CHECK_RESULT(pm_mem_check_access(at(p), page, PM_ACCESS_READ, NULL, NULL), PM_SUCCESS);
    CHECK(atomic_load(&pm__fault_maps_text) == 0);
    atomic_store(&pm__fault_maps_query, 1);
    atomic_store(&pm__fault_maps_text, 1);
    CHECK_RESULT(pm_mem_check_access(at(p + page), 2 * page, PM_ACCESS_READ, NULL, NULL),
                 PM_ERROR_INVALID_VALUE);
    CHECK(detail_has("is not mapped"));
    atomic_store(&pm__fault_maps_query, 0); /* unspent where the kernel has no query */
    /* the next call asks the kernel again */
    CHECK_RESULT(pm_mem_check_access(at(p), page, PM_ACCESS_READ, NULL, NULL), told);
    munmap(p, 2 * page);
}

/* The library's reader of /proc/self/maps gives each mapping's bounds, what
 * it permits and the head of its name: the file's path at file, "[stack]"
 * at a local variable. */
static void names_in_the_text(const void *file, const char *path, const int *local)
{
    pm__maps_text t;
    pm__mapping m;
    REQUIRE(pm__maps_text_open(&t) == 0);
    int seen = 0, got;
    uintptr_t last_end = 0;
    while ((got = pm__maps_text_next(&t, &m)) == 1) {
        CHECK(m.start < m.end && m.start >= last_end);
        last_end = m.end;
        if (m.start <= (uintptr_t)file && (uintptr_t)file < m.end) {
            CHECK(m.readable && !m.writable);
            CHECK(strncmp(t.name, path, sizeof t.name - 1) == 0);
            seen++;
        }
        if (m.start <= (uintptr_t)local && (uintptr_t)local < m.end) {
            CHECK(m.readable && m.writable && strcmp(t.name, "[stack]") == 0);
            seen++;
        }
    }
    CHECK(got == 0 && seen == 2);
    pm__maps_text_close(&t);
}

/* A file whose name is near the longest a path may be, mapped read-only
 * between two inaccessible pages: its line in /proc/self/maps outgrows the
 * library's buffer for the text, which must read past it to the page above. */
static void a_long_file_name(void)
{
    char path[4090]; /* a line of more than 4 KiB in the file */
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    int n = snprintf(path, sizeof path, "%s/pinmem-access-XXXXXX", tmp);
    REQUIRE(n > 0 && (size_t)n < 200 && mkdtemp(path));
    size_t dirs = 0, len = strlen(path);
    while (len + 201 + sizeof "/pages" <= sizeof path) {
        path[len] = '/';
        memset(path + len + 1, 'd', 200);
        path[len + 201] = '\0';
        if (mkdir(path, 0700) != 0) {
            path[len] = '\0';
            break;
        }
        len += 201;
        dirs++;
    }
    strcpy(path + len, "/pages");
    /* the file between two inaccessible pages */
    uint8_t *r = mmap(NULL, 3 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    void *m = MAP_FAILED;
    if (r != MAP_FAILED && fd >= 0 && ftruncate(fd, (off_t)page) == 0)
        m = mmap(r + page, page, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
    CHECK(strlen(path) > 4000 && m != MAP_FAILED);
    if (m != MAP_FAILED) {
        const pm_result told = permissions_told() ? PM_ERROR_INVALID_VALUE : PM_SUCCESS;
        int local = 0;
        CHECK_RESULT(pm_mem_check_access(at(m), page, PM_ACCESS_READ, NULL, NULL), PM_SUCCESS);
        CHECK_RESULT(pm_mem_check_access(at(m), page, PM_ACCESS_WRITE, NULL, NULL), told);
        CHECK_RESULT(pm_mem_check_access(at(r + 2 * page), 1, PM_ACCESS_READ, NULL, NULL), told);
        CHECK_RESULT(pm_mem_check_access(at((uint8_t *)&local), sizeof local, PM_ACCESS_WRITE,
                                         NULL, NULL), PM_SUCCESS);
        names_in_the_text(m, path, &local);
    }
    if (r != MAP_FAILED)
        munmap(r, 3 * page);
    if (fd >= 0)
        close(fd);
    unlink(path);
    for (size_t i = 0; i <= dirs; i++) { /* the directories, deepest first, then the top */
        *strrchr(path, '/') = '\0';
        rmdir(path);
    }
}

/* Where the threads meet: no thread starts or ends while others check, as
 * starting and ending map and unmap pages (ASan's per-thread memory among
 * them), which may land in the hole for a while. */
typedef struct {
    atomic_int ready, finished;
    atomic_bool go;
    int threads; /* how many meet, set before go */
} threads_gate;

typedef struct {
    uint8_t *pages; /* page 0 read-write, page 1 inaccessible, page 2 unmapped */
    int tells;      /* the kernel says what a mapping permits */
    int rounds;
    threads_gate *gate;
} threads_arg;

static void *check_in_a_thread(void *v)
{
    const threads_arg *a = v;
    atomic_fetch_add(&a->gate->ready, 1);
    while (!atomic_load(&a->gate->go))
        sched_yield();
    for (int i = 0; i < a->rounds; i++) {
        CHECK_RESULT(pm_mem_check_access(at(a->pages + i % 64), 64, PM_ACCESS_WRITE, NULL, NULL),
                     PM_SUCCESS);
        CHECK_RESULT(pm_mem_check_access(at(a->pages + 2 * page), 1, PM_ACCESS_READ, NULL, NULL),
                     PM_ERROR_INVALID_VALUE);
        if (a->tells)
            CHECK_RESULT(pm_mem_check_access(at(a->pages + page), 1, PM_ACCESS_READ, NULL, NULL),
                         PM_ERROR_INVALID_VALUE);
    }
    atomic_fetch_add(&a->gate->finished, 1);
    while (atomic_load(&a->gate->finished) < a->gate->threads)
        sched_yield();
    return NULL;
}

static void eight_threads(void)
{
    uint8_t *p = three_pages();
    REQUIRE(p);
    threads_gate gate = {.threads = 0};
    threads_arg a = {p, permissions_told(), 2000, &gate};
    threads_arg args[8];
    for (int i = 0; i < 8; i++)
        args[i] = a;
    pthread_t t[8];
    unsigned started = start_threads(t, 8, check_in_a_thread, args, sizeof args[0]);
    CHECK(started == 8);
    while (atomic_load(&gate.ready) < (int)started)
        sched_yield();
    /* the hole made once every thread has started */
    CHECK(mprotect(p + page, page, PROT_NONE) == 0);
    CHECK(munmap(p + 2 * page, page) == 0);
    gate.threads = (int)started;
    atomic_store(&gate.go, true);
    join_threads(t, started);
    munmap(p, 2 * page);
}

static int open_files(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* Every case that asks about permissions, in the process's mode. */
static void told_cases(void)
{
    bad_arguments();
    plain_pages();
    unmapped_pages();
    pages_the_process_may_not_touch();
    device_memory();
    page_locked_memory();
    a_long_file_name();
    eight_threads();
}

/* A kernel before 6.11 refuses the first query: the file is closed and every
 * check reads the file's text instead, telling as much as the query, with no
 * file left open; where the text cannot be read either, msync says whether
 * pages are mapped (a process of its own, since the file is opened once). */
static void kernel_without_the_query(void)
{
    int files = open_files();
    uint8_t byte = 0;
    atomic_store(&pm__fault_maps_query, 1); /* the query that tries the file */
    CHECK_RESULT(pm_mem_check_access(at(&byte), 1, PM_ACCESS_READ, NULL, NULL), PM_SUCCESS);
    CHECK(atomic_load(&pm__fault_maps_query) == 0);
    CHECK(open_files() == files);
    capabilities(permissions_told());
    told_cases();
    CHECK(open_files() == files);

    uint8_t *p = three_pages();
    REQUIRE(p);
    REQUIRE(mprotect(p, page, PROT_NONE) == 0);
    REQUIRE(munmap(p + 2 * page, page) == 0);
    atomic_store(&pm__fault_maps_text, 1);
    CHECK_RESULT(pm_mem_check_access(at(p), page, PM_ACCESS_READ, NULL, NULL), PM_SUCCESS);
    atomic_store(&pm__fault_maps_text, 1);
    CHECK_RESULT(pm_mem_check_access(at(p + page), 2 * page, PM_ACCESS_WRITE, NULL, NULL),
                 PM_ERROR_INVALID_VALUE);
    CHECK(detail_has("is not mapped"));
    atomic_store(&pm__fault_maps_text, 1);
    capabilities(0);
    munmap(p, 2 * page);
}

/* Out of file descriptors at the first check, which then cannot read the
 * mappings (msync answers): a later check, with descriptors to spare, opens
 * the file for queries as a first check does, where the kernel answers them
 * (a process of its own, since the file is opened once). */
static void out_of_files_at_the_first_check(void)
{
    const int files = open_files();
    pm__maps_text t;
    REQUIRE(files > 0 && pm__maps_text_open(&t) == 0);
    pm__mapping m;
    const int queries = pm__proc_maps_query(t.fd, (uintptr_t)&m, &m) == 0;
    pm__maps_text_close(&t);
    uint8_t *p = three_pages();
    REQUIRE(p);
    struct rlimit was, few;
    REQUIRE(getrlimit(RLIMIT_NOFILE, &was) == 0);
    few = was;
    if (few.rlim_cur > (rlim_t)files + 8)
        few.rlim_cur = (rlim_t)files + 8;
    REQUIRE(setrlimit(RLIMIT_NOFILE, &few) == 0);
    int held[64], n = 0;
    while (n < 64 && (held[n] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0)
        n++;
    const int exhausted = n < 64 && errno == EMFILE;
    CHECK_RESULT(pm_mem_check_access(at(p), page, PM_ACCESS_READ, NULL, NULL), PM_SUCCESS);
    while (n > 0)
        close(held[--n]);
    CHECK(setrlimit(RLIMIT_NOFILE, &was) == 0);
    REQUIRE(exhausted);

    REQUIRE(mprotect(p, page, PROT_NONE) == 0);
    const pm_result told = permissions_told() ? PM_ERROR_INVALID_VALUE : PM_SUCCESS;
    CHECK_RESULT(pm_mem_check_access(at(p), page, PM_ACCESS_READ, NULL, NULL), told);
    CHECK(open_files() == files + queries); /* the file kept for the queries */
    munmap(p, 3 * page);
}

int main(int argc, char **argv)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    printf("backend: %s\n", pm_backend_name());
    if (argc > 1 && strcmp(argv[1], "no_query") == 0) {
        kernel_without_the_query();
    } else if (argc > 1 && strcmp(argv[1], "out_of_files") == 0) {
        out_of_files_at_the_first_check();
    } else {
        capabilities(permissions_told());
        told_cases();
        query_refused_midway();
    }
    return check_finish("access");
}
