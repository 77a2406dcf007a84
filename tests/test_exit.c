/* Process exit (pinmem.h, pm_init): a program may end, by exit() on any
 * thread, while pinmem's threads are at work: copies queued on streams,
 * staging workers filling and emptying the ring, other threads copying, a
 * destroyed pool waiting for its streams, the registration cache unpinning
 * freed buffers. The process ends with the program's status, with no crash
 * and no hang, on the real driver as on POSIX. Each case runs several times,
 * each time in a fresh child. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

enum { EXIT_STATUS = 3, COPY_BYTES = 16 << 20, THREADS = 4 };

/* What one child's copies use: pageable memory and device memory. */
typedef struct job {
    uint8_t *pageable;
    pm_deviceptr device;
    pm_stream_t stream;
    atomic_int copies;
} job;

static bool job_make(job *j)
{
    j->pageable = malloc(COPY_BYTES);
    if (!j->pageable || pm_device_alloc(&j->device, COPY_BYTES) != PM_SUCCESS ||
        pm_stream_create(&j->stream) != PM_SUCCESS) {
        fprintf(stderr, "cannot make a copy job: %s\n", pm_last_error_detail());
        return false;
    }
    memset(j->pageable, 0x5a, COPY_BYTES);
    return true;
}

/* Copies back and forth, on the stream and synchronously, until the process ends. */
static void *copy_forever(void *arg)
{
    job *j = arg;
    for (;;) {
        pm_memcpy_htod_async(j->device, j->pageable, COPY_BYTES, j->stream);
        pm_memcpy_dtoh_async(j->pageable, j->device, COPY_BYTES, j->stream);
        pm_memcpy(j->device, (pm_deviceptr)(uintptr_t)j->pageable, COPY_BYTES / 2);
        atomic_fetch_add(&j->copies, 1);
    }
    return NULL;
}

/* The main thread queues copies and exits while they run. */
static void exit_behind_queued_copies(unsigned round)
{
    job j = {0};
    if (!job_make(&j))
        _exit(1);
    for (int i = 0; i < 4; i++) {
        pm_memcpy_htod_async(j.device, j.pageable, COPY_BYTES, j.stream);
        pm_memcpy_dtoh_async(j.pageable, j.device, COPY_BYTES, j.stream);
    }
    usleep(round * 500);
    exit(EXIT_STATUS);
}

/* Threads copy while one more calls exit(). */
static void exit_while_threads_copy(unsigned round)
{
    static job jobs[THREADS];
    for (int i = 0; i < THREADS; i++) {
        if (!job_make(&jobs[i]))
            _exit(1);
        pthread_t t;
        if (pthread_create(&t, NULL, copy_forever, &jobs[i]) != 0)
            _exit(1);
    }
    while (atomic_load(&jobs[0].copies) == 0)
        usleep(100);
    usleep(round * 1000);
    exit(EXIT_STATUS);
}

/* A pool destroyed with frees still queued behind copies on its stream is
 * reaped by pinmem's thread, which the exit meets midway. */
static void exit_while_pool_reaped(unsigned round)
{
    job j = {0};
    if (!job_make(&j))
        _exit(1);
    pm_mem_pool_t pool = NULL;
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    if (pm_mem_pool_create(&pool, &props) != PM_SUCCESS)
        _exit(1);
    for (int i = 0; i < 8; i++) {
        void *p = NULL;
        pm_memcpy_htod_async(j.device, j.pageable, COPY_BYTES, j.stream);
        if (pm_mem_alloc_from_pool_async(&p, 64 << 10, pool, j.stream) == PM_SUCCESS)
            pm_mem_free_async(p, j.stream);
    }
    pm_mem_pool_destroy(pool);
    usleep(round * 300);
    exit(EXIT_STATUS);
}

/* With the registration cache on, buffers that were cached are freed while
 * copies of others go on: the cache's threads unpin as the process ends. */
static void exit_while_cache_unpins(unsigned round)
{
    pm_copy_config c = {.struct_size = sizeof c};
    if (pm_copy_get_config(&c) != PM_SUCCESS)
        _exit(1);
    c.registration_cache = 1;
    c.cache_min_bytes = 1 << 20;
    if (pm_copy_set_config(&c) != PM_SUCCESS)
        _exit(1);
    job j = {0};
    if (!job_make(&j))
        _exit(1);
    pthread_t t;
    pm_deviceptr own = 0; /* the thread's copies write j.device */
    if (pthread_create(&t, NULL, copy_forever, &j) != 0 ||
        pm_device_alloc(&own, 4 << 20) != PM_SUCCESS)
        _exit(1);
    for (int i = 0; i < 6; i++) {
        size_t bytes = 4 << 20;
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            _exit(1);
        memset(p, i, bytes);
        pm_memcpy_htod(own, p, bytes);
        pm_memcpy_htod(own, p, bytes); /* the second registers it */
        munmap(p, bytes);
    }
    usleep(round * 300);
    exit(EXIT_STATUS);
}

/* The host function that ends the program. */
static void exit_from_host_func(void *unused)
{
    (void)unused;
    exit(EXIT_STATUS);
}

/* A host function on a stream calls exit() behind queued copies, while the
 * main thread waits for that stream. */
static void exit_inside_host_func(unsigned round)
{
    job j = {0};
    if (!job_make(&j))
        _exit(1);
    for (unsigned i = 0; i < round % 4; i++)
        pm_memcpy_htod_async(j.device, j.pageable, COPY_BYTES, j.stream);
    if (pm_stream_launch_host_func(j.stream, exit_from_host_func, NULL) != PM_SUCCESS)
        _exit(1);
    pm_memcpy_dtoh_async(j.pageable, j.device, COPY_BYTES, j.stream);
    /* The driver's teardown in that exit() may end this wait early, with an
     * error (seen on an H200): the process must still end with the status
     * the function gave, so the thread waits on rather than ending it. */
    if (round % 2)
        pm_stream_synchronize(j.stream);
    for (;;)
        pause();
}

static const struct {
    const char *name;
    void (*body)(unsigned round);
} cases[] = {
    {"behind_queued_copies", exit_behind_queued_copies},
    {"while_threads_copy", exit_while_threads_copy},
    {"while_pool_reaped", exit_while_pool_reaped},
    {"while_cache_unpins", exit_while_cache_unpins},
    {"inside_host_func", exit_inside_host_func},
};

/* Each round a fresh child, which must end by its exit() with its status. */
static void run_case(unsigned c, unsigned rounds)
{
    for (unsigned round = 0; round < rounds; round++) {
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            alarm(60);
            cases[c].body(round);
            _exit(1);
        }
        REQUIRE(pid > 0);
        int status = 0;
        REQUIRE(waitpid(pid, &status, 0) == pid);
        if (WIFSIGNALED(status)) {
            fprintf(stderr, "%s, round %u: ended by signal %d%s\n", cases[c].name, round,
                    WTERMSIG(status), WTERMSIG(status) == SIGALRM ? " (it hung)" : "");
            CHECK(!WIFSIGNALED(status));
            return;
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != EXIT_STATUS) {
            fprintf(stderr, "%s, round %u: exited with %d, not %d\n", cases[c].name, round,
                    WEXITSTATUS(status), EXIT_STATUS);
            CHECK(WEXITSTATUS(status) == EXIT_STATUS);
            return;
        }
    }
    printf("%s: %u exits, each with the program's status\n", cases[c].name, rounds);
}

/* Every case, or the one named. */
int main(int argc, char **argv)
{
    const unsigned rounds = UNDER_TSAN ? 3 : 10;
    for (unsigned c = 0; c < sizeof cases / sizeof cases[0]; c++)
        if (argc < 2 || strcmp(argv[1], cases[c].name) == 0)
            run_case(c, rounds);
    return check_finish("exit");
}
