/* fork() (pinmem.h, pm_init): a child of a process that has used pinmem
 * refuses every call at once, with PM_ERROR_NOT_INITIALIZED and a detail
 * naming the parent: no hang in staged copies, on streams with work queued,
 * in synchronization; no pool fast path that still hands out or takes back
 * blocks; nothing reported pinned. A child forked before the parent's first
 * call initialises as usual; one forked while another thread initialises
 * refuses. The parent goes on unharmed, a child it forks while pinmem reads
 * a file inherits none of its descriptors, and one it forks while the pools'
 * reaper holds its lock exits. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "child.h"
#include "copy_util.h"
#include "test_hooks.h"

/* Each case's watchdog. */
enum { WATCHDOG_S = 20 };

static int fresh_child(void *arg)
{
    (void)arg;
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    void *p = NULL;
    CHECK_RESULT(pm_mem_alloc_host(&p, 4096), PM_SUCCESS);
    unsigned f = 0;
    CHECK_RESULT(pm_mem_host_get_flags(&f, p), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_host(p), PM_SUCCESS);
    CHECK(strcmp(pm_last_error_detail(), "") == 0);
    return check_finish("fork: child of a parent that never used pinmem");
}

/* A parent whose initialisation failed started nothing: its child gives the
 * same answer, not a refusal that says pinmem was initialised. */
static int grandchild_of_failure(void *arg)
{
    CHECK_RESULT(pm_init(0), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "PINMEM_BACKEND") != NULL);
    (void)arg;
    return check_finish("fork: child of a parent whose initialisation failed");
}

static int failed_parent(void *arg)
{
    setenv("PINMEM_BACKEND", "bogus", 1);
    CHECK_RESULT(pm_init(0), PM_ERROR_INVALID_VALUE);
    CHECK(in_child(grandchild_of_failure, arg, WATCHDOG_S) == 0);
    return check_finish("fork: a parent whose initialisation failed");
}

/* A fork that another thread's first call races: the fork begins (its
 * prepare step) before that thread starts initialising, and the child is
 * made while the initialisation is midway. The child must refuse, as the
 * child of any fork after initialisation began: the parent's half-made
 * state and the locks its thread held are not the child's. */
static atomic_int race_stage; /* 1: the fork began, 2: init is midway, 3: the child is made */
static pid_t racing_parent;

static void wait_for_stage(int stage)
{
    for (int waited_ms = 0; atomic_load(&race_stage) < stage && waited_ms < 5000; waited_ms++)
        usleep(1000);
}

static void fork_begins(void)
{
    if (getpid() != racing_parent || atomic_load(&race_stage) != 0)
        return;
    atomic_store(&race_stage, 1);
    wait_for_stage(2);
}

static void init_midway(void)
{
    if (getpid() != racing_parent)
        return;
    atomic_store(&race_stage, 2);
    wait_for_stage(3);
}

static void *initialise_when_fork_begins(void *arg)
{
    wait_for_stage(1);
    *(pm_result *)arg = pm_init(0);
    return NULL;
}

static int refuses_after_racing_fork(void *arg)
{
    (void)arg;
    CHECK_RESULT(pm_init(0), PM_ERROR_NOT_INITIALIZED);
    CHECK(strstr(pm_last_error_detail(), "forked") != NULL);
    return check_finish("fork: child of a fork that raced initialisation");
}

static int fork_racing_initialisation(void *arg)
{
    (void)arg;
    racing_parent = getpid();
    pthread_atfork(fork_begins, NULL, NULL);
    atomic_store(&pm__test_init_midway, init_midway);
    pm_result initialised = PM_ERROR_UNKNOWN;
    pthread_t t;
    if (pthread_create(&t, NULL, initialise_when_fork_begins, &initialised) != 0) {
        CHECK(!"a thread to initialise");
        return check_finish("fork: a fork racing initialisation");
    }
    int child = in_child(refuses_after_racing_fork, NULL, WATCHDOG_S);
    atomic_store(&race_stage, 3);
    pthread_join(t, NULL);
    CHECK(child == 0);
    CHECK_RESULT(initialised, PM_SUCCESS);
    return check_finish("fork: a fork racing initialisation");
}

/* What the parent holds when it forks. */
typedef struct parent_state {
    void *host;             /* pm_mem_alloc_host */
    uint8_t *registered;    /* pm_mem_host_register'ed, 2 pages */
    pm_mem_pool_t pool;
    void *pool_block;       /* live; its run has blocks in this thread's cache */
    pm_stream_t stream;     /* with work queued that waits for the parent */
    uint8_t *pageable;      /* for a staged copy */
    size_t pageable_bytes;
    pm_deviceptr dev;
    int release[2];         /* the queued work reads a byte from here */
} parent_state;

static void wait_for_parent(void *arg)
{
    parent_state *st = arg;
    char c;
    while (read(st->release[0], &c, 1) < 0)
        ;
}

static pid_t initialiser; /* the test's own process */

static void expect_refusal(pm_result got, const char *call)
{
    char parent[32];
    snprintf(parent, sizeof parent, "process %d", (int)initialiser);
    if (got != PM_ERROR_NOT_INITIALIZED && check_failed_())
        fprintf(stderr, "in the child, %s gave %s, expected PM_ERROR_NOT_INITIALIZED\n", call,
                pm_result_name(got));
    else if (!strstr(pm_last_error_detail(), parent) || !strstr(pm_last_error_detail(), "fork"))
        CHECK(!"the detail names the parent and fork");
}

static int used_child(void *arg)
{
    parent_state *st = arg;
    unsigned f = 0;
    pm_deviceptr d = 0, base = 0;
    size_t size = 0;
    void *p = NULL;
    expect_refusal(pm_init(0), "pm_init");
    printf("child's detail: %s\n", pm_last_error_detail());
    CHECK(pm_backend_name() == NULL);
    /* Nothing inherited is reported pinned. */
    expect_refusal(pm_mem_host_get_flags(&f, st->host), "pm_mem_host_get_flags");
    expect_refusal(pm_mem_host_get_flags(&f, st->registered), "pm_mem_host_get_flags");
    expect_refusal(pm_mem_host_get_device_pointer(&d, st->pool_block, 0),
                   "pm_mem_host_get_device_pointer");
    expect_refusal(pm_mem_get_address_range(&base, &size, (pm_deviceptr)(uintptr_t)st->host),
                   "pm_mem_get_address_range");
    expect_refusal(pm_mem_check_access((pm_deviceptr)(uintptr_t)st->host, 64, PM_ACCESS_READ, NULL,
                                       NULL), "pm_mem_check_access");
    /* The pool fast paths: this thread's cache and memos came from the parent. */
    expect_refusal(pm_mem_alloc_from_pool(&p, 64, st->pool), "pm_mem_alloc_from_pool");
    expect_refusal(pm_mem_free(st->pool_block), "pm_mem_free");
    expect_refusal(pm_mem_alloc_from_pool_async(&p, 64, st->pool, NULL),
                   "pm_mem_alloc_from_pool_async");
    expect_refusal(pm_mem_free_async(st->pool_block, NULL), "pm_mem_free_async");
    /* What would wait for the parent's threads. */
    expect_refusal(pm_memcpy_htod(st->dev, st->pageable, st->pageable_bytes), "pm_memcpy_htod");
    expect_refusal(pm_memcpy_dtoh(st->pageable, st->dev, st->pageable_bytes), "pm_memcpy_dtoh");
    expect_refusal(pm_memcpy_htod_async(st->dev, st->host, 4096, st->stream),
                   "pm_memcpy_htod_async");
    expect_refusal(pm_stream_synchronize(st->stream), "pm_stream_synchronize");
    expect_refusal(pm_stream_synchronize(NULL), "pm_stream_synchronize(NULL)");
    expect_refusal(pm_stream_destroy(st->stream), "pm_stream_destroy");
    /* Nothing of the parent's can be given back from here. */
    expect_refusal(pm_mem_free_host(st->host), "pm_mem_free_host");
    expect_refusal(pm_mem_host_unregister(st->registered), "pm_mem_host_unregister");
    expect_refusal(pm_mem_pool_destroy(st->pool), "pm_mem_pool_destroy");
    expect_refusal(pm_mem_pool_trim_to(st->pool, 0), "pm_mem_pool_trim_to");
    expect_refusal(pm_mem_alloc_host(&p, 4096), "pm_mem_alloc_host");
    pm_copy_stats cs = {.struct_size = sizeof cs};
    expect_refusal(pm_copy_get_stats(&cs), "pm_copy_get_stats");
    pm_pool_stats ps = {.struct_size = sizeof ps};
    expect_refusal(pm_mem_pool_get_stats(NULL, &ps), "pm_mem_pool_get_stats");
    /* The inherited memory is still there to read. */
    CHECK(((volatile uint8_t *)st->host)[0] == 0x5a);
    return check_finish("fork: child of a parent that used pinmem");
}

static int grandchild(void *arg)
{
    (void)arg;
    expect_refusal(pm_init(0), "pm_init");
    void *p = NULL;
    expect_refusal(pm_mem_alloc_host(&p, 4096), "pm_mem_alloc_host");
    return check_finish("fork: grandchild");
}

static int child_then_grandchild(void *arg)
{
    (void)arg;
    expect_refusal(pm_init(0), "pm_init");
    CHECK(in_child(grandchild, NULL, WATCHDOG_S) == 0);
    return check_finish("fork: child forking again");
}

/* Used from a thread other than the one that forks. */
static void *use_pinmem(void *arg)
{
    parent_state *st = arg;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    CHECK_RESULT(pm_mem_alloc_host(&st->host, 3 * page), PM_SUCCESS);
    return NULL;
}

static void used_parent(void)
{
    parent_state st = {0};
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    REQUIRE(pipe(st.release) == 0);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, use_pinmem, &st) == 0);
    pthread_join(t, NULL);
    REQUIRE(st.host != NULL);
    memset(st.host, 0x5a, 3 * page);
    st.registered = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(st.registered != MAP_FAILED);
    REQUIRE_RESULT(pm_mem_host_register(st.registered, 2 * page, 0), PM_SUCCESS);
    /* A small staging engine, so that a 1 MiB pageable copy is staged. */
    small_copy_config(0);
    st.pageable_bytes = 1 << 20;
    st.pageable = malloc(st.pageable_bytes);
    st.dev = device_alloc(st.pageable_bytes);
    REQUIRE(st.pageable && st.dev);
    fill(st.pageable, st.pageable_bytes, 3);
    CHECK_RESULT(pm_memcpy_htod(st.dev, st.pageable, st.pageable_bytes), PM_SUCCESS);
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    REQUIRE_RESULT(pm_mem_pool_create(&st.pool, &props), PM_SUCCESS);
    void *warm = NULL;
    bool pools = pm_mem_alloc_from_pool(&warm, 64, st.pool) == PM_SUCCESS;
    if (!pools)
        printf("skipped: pool fast paths after fork: no pool memory here (%s)\n",
               pm_last_error_detail());
    if (pools) {
        CHECK_RESULT(pm_mem_alloc_from_pool(&st.pool_block, 64, st.pool), PM_SUCCESS);
        CHECK_RESULT(pm_mem_free(warm), PM_SUCCESS); /* into this thread's cache */
    }
    REQUIRE_RESULT(pm_stream_create(&st.stream), PM_SUCCESS);
    CHECK_RESULT(pm_stream_launch_host_func(st.stream, wait_for_parent, &st), PM_SUCCESS);

    CHECK(in_child(used_child, &st, WATCHDOG_S) == 0);
    CHECK(in_child(child_then_grandchild, NULL, WATCHDOG_S) == 0);

    /* The parent is unharmed: its stream runs on, its pools and memory work. */
    CHECK(write(st.release[1], "x", 1) == 1);
    CHECK_RESULT(pm_stream_synchronize(st.stream), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(st.stream), PM_SUCCESS);
    memset(st.pageable, 0, st.pageable_bytes);
    CHECK_RESULT(pm_memcpy_dtoh(st.pageable, st.dev, st.pageable_bytes), PM_SUCCESS);
    CHECK(first_mismatch(st.pageable, st.pageable_bytes, 3) == st.pageable_bytes);
    unsigned f = 0;
    CHECK_RESULT(pm_mem_host_get_flags(&f, st.host), PM_SUCCESS);
    if (pools) {
        void *again = NULL;
        CHECK_RESULT(pm_mem_alloc_from_pool(&again, 64, st.pool), PM_SUCCESS);
        CHECK_RESULT(pm_mem_free(again), PM_SUCCESS);
        CHECK_RESULT(pm_mem_free(st.pool_block), PM_SUCCESS);
    }
    CHECK_RESULT(pm_mem_pool_destroy(st.pool), PM_SUCCESS);
    CHECK_RESULT(pm_mem_host_unregister(st.registered), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_host(st.host), PM_SUCCESS);
    munmap(st.registered, 2 * page);
    device_free(st.dev);
    free(st.pageable);
    close(st.release[0]);
    close(st.release[1]);
}

/* A thread with work queued on its own stream forks, and the child's only
 * thread (a copy of that one) ends: its thread-exit handlers run in the
 * child, where the stream's thread is not, and must not wait for that work. */
static void end_quietly(void) { _exit(0); }

static void *fork_with_own_work(void *arg)
{
    parent_state *st = arg;
    CHECK_RESULT(pm_stream_launch_host_func(PM_STREAM_PER_THREAD, wait_for_parent, st),
                 PM_SUCCESS);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(10);
        /* The last thread's end runs its thread-exit handlers, then exit(0);
         * this ends the child there, before a leak checker reports the
         * parent's memory the child inherited. */
        atexit(end_quietly);
        return NULL;
    }
    int status = 0;
    if (pid > 0)
        waitpid(pid, &status, 0);
    CHECK(pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (pid > 0 && WIFSIGNALED(status))
        fprintf(stderr, "child ended by signal %d%s\n", WTERMSIG(status),
                WTERMSIG(status) == SIGALRM ? " (it hung at its thread's exit)" : "");
    CHECK(write(st->release[1], "x", 1) == 1);
    CHECK_RESULT(pm_stream_synchronize(PM_STREAM_PER_THREAD), PM_SUCCESS);
    return NULL;
}

static void own_stream_at_fork(void)
{
    parent_state st = {0};
    REQUIRE(pipe(st.release) == 0);
    pthread_t t;
    if (pthread_create(&t, NULL, fork_with_own_work, &st) == 0)
        pthread_join(t, NULL);
    else
        CHECK(!"a thread to fork from");
    close(st.release[0]);
    close(st.release[1]);
}

/* Descriptors the process holds without close-on-exec, as a bitmap of the first 1,024. */
enum { FD_SCAN = 1024 };
static void open_without_cloexec(uint64_t *set)
{
    for (int fd = 0; fd < FD_SCAN; fd++) {
        const int flags = fcntl(fd, F_GETFD);
        if (flags >= 0 && !(flags & FD_CLOEXEC))
            set[fd / 64] |= (uint64_t)1 << (fd % 64);
    }
}

static _Atomic bool stop_reading;

/* Calls that read system files (the memory-lock status, NUMA nodes), over and over. */
static void *read_system_files(void *arg)
{
    (void)arg;
    while (!stop_reading) {
        pm_capabilities c = {.struct_size = sizeof c};
        CHECK_RESULT(pm_get_capabilities(&c), PM_SUCCESS);
    }
    return NULL;
}

/* A program that forks and execs while pinmem reads a file on another thread
 * passes the child none of pinmem's descriptors. The forked children look
 * before they would exec, with calls safe after fork. */
static void descriptors_stay_private(void)
{
    uint64_t before[FD_SCAN / 64] = {0};
    open_without_cloexec(before);
    pthread_t reader;
    REQUIRE(pthread_create(&reader, NULL, read_system_files, NULL) == 0);
    int leaked = 0;
    for (int i = 0; i < 200; i++) {
        const pid_t pid = fork();
        if (pid == 0) {
            uint64_t now[FD_SCAN / 64] = {0};
            open_without_cloexec(now);
            for (int w = 0; w < FD_SCAN / 64; w++)
                if (now[w] & ~before[w])
                    _exit(1);
            _exit(0);
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) {
            CHECK(!"fork and wait for a child");
            break;
        }
        leaked += WEXITSTATUS(status) != 0;
    }
    stop_reading = true;
    pthread_join(reader, NULL);
    printf("children that would inherit a descriptor of pinmem's: %d of 200\n", leaked);
    CHECK(leaked == 0);
}

/* A fork while the pools' reaper holds its lock (hook pm__test_reap_midway),
 * waiting for a destroyed pool's last block to come back on a stream: the
 * child's exit() must not wait for that lock, which no thread of the child
 * will ever let go. */
static atomic_int reap_stage; /* 1: the reaper holds its lock, 2: the child is made */

static void reaper_holds_lock(void)
{
    if (getpid() != initialiser || atomic_load(&reap_stage) != 0)
        return;
    atomic_store(&reap_stage, 1);
    for (int waited_ms = 0; atomic_load(&reap_stage) < 2 && waited_ms < 5000; waited_ms++)
        usleep(1000);
}

static int exits_with_handlers(void *arg)
{
    (void)arg;
    fflush(stdout);
    exit(0); /* runs the handlers the parent registered with atexit */
}

static void fork_while_reaping(void)
{
    parent_state st = {0};
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    pm_mem_pool_t pool;
    REQUIRE_RESULT(pm_mem_pool_create(&pool, &props), PM_SUCCESS);
    void *block = NULL;
    if (pm_mem_alloc_from_pool(&block, 64, pool) != PM_SUCCESS) {
        CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
        SKIP_CASE("no pool memory here");
    }
    REQUIRE(pipe(st.release) == 0);
    pm_stream_t s = NULL;
    CHECK_RESULT(pm_stream_create(&s), PM_SUCCESS);
    CHECK_RESULT(pm_stream_launch_host_func(s, wait_for_parent, &st), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_async(block, s), PM_SUCCESS);
    atomic_store(&pm__test_reap_midway, reaper_holds_lock);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS); /* the reaper waits for the block */
    for (int waited_ms = 0; atomic_load(&reap_stage) < 1 && waited_ms < 5000; waited_ms++)
        usleep(1000);
    CHECK(atomic_load(&reap_stage) == 1);
    int child = in_child(exits_with_handlers, NULL, WATCHDOG_S);
    atomic_store(&reap_stage, 2);
    atomic_store(&pm__test_reap_midway, NULL);
    CHECK(child == 0);
    CHECK(write(st.release[1], "x", 1) == 1);
    CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(s), PM_SUCCESS);
    close(st.release[0]);
    close(st.release[1]);
}

int main(void)
{
    /* Before the parent's first call: the child initialises on its own. */
    CHECK(in_child(fresh_child, NULL, WATCHDOG_S) == 0);
    CHECK(in_child(failed_parent, NULL, WATCHDOG_S) == 0);
    CHECK(in_child(fork_racing_initialisation, NULL, WATCHDOG_S) == 0);
    initialiser = getpid();
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    if (!on_backend("posix"))
        SKIP("forks a process that has used pinmem: only on the POSIX backend (the driver "
             "forbids use after fork)");
    used_parent();
    own_stream_at_fork();
    descriptors_stay_private();
    fork_while_reaping();
    return check_finish("fork");
}
