/* pinmem's own threads (staging workers, POSIX streams, the registration
 * cache's monitor, the pools' reaper) say whose they are by their names,
 * and take none of the program's signals: each blocks every signal, so a
 * signal the program blocks in its own threads waits for them (sigwait,
 * signalfd) instead of going to a pinmem thread, which would run the
 * handler there or, with none, end the process. */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "copy_util.h"
#include "pool/pool_internal.h"
#include "pool_util.h"
#include "stream_util.h"

enum { copy_bytes = 4 << 20 }; /* within an ordinary user's RLIMIT_MEMLOCK */

/* Signals a program commonly handles or waits for; each must be blocked in
 * every pinmem thread. */
static const int program_signals[] = {SIGHUP,  SIGINT,  SIGQUIT, SIGUSR1,  SIGUSR2, SIGPIPE,
                                      SIGALRM, SIGTERM, SIGCHLD, SIGWINCH, SIGPROF};

typedef struct seen {
    unsigned copy, stream, cache, reaper, prefault, other;
} seen;

/* The mask of signals blocked in thread tid ("SigBlk" in its status), or 0
 * when it cannot be read (the thread ended meanwhile). */
static unsigned long long blocked_in(const char *tid)
{
    char path[320], line[256];
    snprintf(path, sizeof path, "/proc/self/task/%s/status", tid);
    FILE *f = fopen(path, "r");
    unsigned long long mask = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "SigBlk: %llx", &mask) == 1)
            break;
    fclose(f);
    return mask;
}

static bool thread_name(const char *tid, char *name, size_t cap)
{
    char path[320];
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool ok = fgets(name, (int)cap, f) != NULL;
    fclose(f);
    name[strcspn(name, "\n")] = '\0';
    return ok;
}

/* Counts this process's pinmem threads by kind; with check, checks that
 * each blocks every signal in program_signals. */
static seen look_at_threads(bool check)
{
    seen s = {0};
    DIR *d = opendir("/proc/self/task");
    CHECK(d != NULL);
    if (!d)
        return s;
    for (struct dirent *e; (e = readdir(d));) {
        char name[32];
        if (e->d_name[0] == '.' || !thread_name(e->d_name, name, sizeof name) ||
            strncmp(name, "pinmem-", 7) != 0)
            continue;
        unsigned long long mask = check ? blocked_in(e->d_name) : ~0ull;
        char takes[128] = "";
        for (size_t i = 0; i < sizeof program_signals / sizeof *program_signals; i++)
            if (!(mask >> (program_signals[i] - 1) & 1))
                snprintf(takes + strlen(takes), sizeof takes - strlen(takes), " %d",
                         program_signals[i]);
        if (takes[0])
            fprintf(stderr, "thread %s (%s) takes signals%s\n", e->d_name, name, takes);
        CHECK(takes[0] == '\0');
        if (!strcmp(name, "pinmem-copy"))
            s.copy++;
        else if (!strcmp(name, "pinmem-stream"))
            s.stream++;
        else if (!strcmp(name, "pinmem-cache"))
            s.cache++;
        else if (!strcmp(name, "pinmem-reaper"))
            s.reaper++;
        else if (!strcmp(name, "pinmem-prefault"))
            s.prefault++; /* joined before the call returns, yet listed a moment longer */
        else
            s.other++;
    }
    closedir(d);
    return s;
}

/* Pageable copies of n bytes both ways, twice: staged (the workers start),
 * or where the registration cache is on and n at least its smallest buffer,
 * through it (it registers the buffers and starts its monitor). */
static void round_trips(pm_deviceptr dev, uint8_t *src, uint8_t *back, size_t n)
{
    for (unsigned seed = 1; seed <= 2; seed++) {
        fill(src, n, seed);
        CHECK_RESULT(pm_memcpy_htod(dev, src, n), PM_SUCCESS);
        memset(back, 0, n);
        CHECK_RESULT(pm_memcpy_dtoh(back, dev, n), PM_SUCCESS);
        CHECK(first_mismatch(back, n, seed) == n);
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}


/* Every kind of pinmem thread at once, each named and blocking signals: the
 * reaper is alive while a destroyed pool's blocks wait for a stream held at
 * the gate. */
static void threads_are_named_and_take_no_signals(void)
{
    pm_copy_config c = {.struct_size = sizeof c};
    REQUIRE_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    SCOPED_MALLOC uint8_t *src = malloc(copy_bytes);
    SCOPED_MALLOC uint8_t *back = malloc(copy_bytes);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(copy_bytes);
    REQUIRE(src && back && dev);
    pm_copy_config with_cache = c;
    with_cache.registration_cache = 1;
    with_cache.cache_min_bytes = copy_bytes;
    REQUIRE_RESULT(pm_copy_set_config(&with_cache), PM_SUCCESS);
    round_trips(dev, src, back, copy_bytes);
    round_trips(dev, src, back, copy_bytes / 4); /* below the cache's smallest: staged */
    pm_copy_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_copy_get_stats(&st), PM_SUCCESS);

    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    pm_mem_pool_t pool = make_pool(4 << 20);
    REQUIRE(pool != NULL);
    void *block = NULL;
    REQUIRE_RESULT(pm_mem_alloc_from_pool_async(&block, 4096, pool, s), PM_SUCCESS);
    reset_gate();
    REQUIRE_RESULT(pm_stream_launch_host_func(s, wait_gate, NULL), PM_SUCCESS);
    pthread_t opener;
    REQUIRE(pthread_create(&opener, NULL, open_gate_if_stuck, NULL) == 0);
    CHECK_RESULT(pm_mem_free_async(block, s), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);

    /* A thread names itself once it runs: look until all are named. */
    const bool posix = !strcmp(pm_backend_name(), "posix");
    const bool cached = st.cache_registrations > 0;
    CHECK(pm__retire_reaper_running()); /* the pool waits for the gate */
    seen seen = {0};
    for (double until = now() + 2.0; now() < until; usleep(1000)) {
        seen = look_at_threads(false);
        if (seen.copy && (seen.stream || !posix) && (seen.cache == 2 || !cached) && seen.reaper)
            break;
    }
    seen = look_at_threads(true);
    printf("pinmem threads: %u copy, %u stream, %u cache, %u reaper, %u other\n", seen.copy,
           seen.stream, seen.cache, seen.reaper, seen.other);
    CHECK(seen.copy >= 1);
    CHECK(!posix || seen.stream >= 1); /* CUDA's streams are the driver's */
    if (cached)
        CHECK(seen.cache == 2); /* the monitor and the thread that undoes registrations */
    else
        printf("no cache monitor: the cache registered nothing (listening: %d)\n",
               st.cache_listening);
    CHECK(seen.reaper == 1);
    CHECK(seen.other == 0);

    atomic_store(&gate_open, 1);
    pthread_join(opener, NULL);
    CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
}

static _Atomic pid_t handled_in;
static char handled_by[16];

static void note_thread(int sig)
{
    (void)sig;
    prctl(PR_GET_NAME, handled_by, 0, 0, 0);
    atomic_store(&handled_in, gettid());
}

/* A program that blocks SIGUSR1 and waits for it gets it, with pinmem's
 * threads running: none of them takes it. */
static void a_blocked_signal_waits_for_the_program(void)
{
    SCOPED_MALLOC uint8_t *src = malloc(copy_bytes);
    SCOPED_MALLOC uint8_t *back = malloc(copy_bytes);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(copy_bytes);
    REQUIRE(src && back && dev);
    round_trips(dev, src, back, copy_bytes); /* the workers are there, asleep */

    struct sigaction sa = {.sa_handler = note_thread}, old_sa;
    sigemptyset(&sa.sa_mask);
    REQUIRE(sigaction(SIGUSR1, &sa, &old_sa) == 0);
    sigset_t usr1, old_mask;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, &old_mask);
    CHECK(kill(getpid(), SIGUSR1) == 0);
    round_trips(dev, src, back, copy_bytes); /* and awake */
    const struct timespec wait = {.tv_sec = 2};
    int got = sigtimedwait(&usr1, NULL, &wait);
    if (got != SIGUSR1) {
        /* On POSIX every thread but this one is pinmem's; under CUDA the
         * driver's threads are not, and their masks are the driver's. */
        const pid_t tid = atomic_load(&handled_in);
        const bool posix = !strcmp(pm_backend_name(), "posix");
        const bool ours =
            tid && tid != gettid() && (posix || !strncmp(handled_by, "pinmem-", 7));
        if (ours)
            fprintf(stderr, "thread %d (%s) took the program's SIGUSR1\n", (int)tid, handled_by);
        else
            printf("SIGUSR1 went to thread %d (%s), not pinmem's\n", (int)tid, handled_by);
        CHECK(ours == false);
    }
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    sigaction(SIGUSR1, &old_sa, NULL);
}

int main(void)
{
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    threads_are_named_and_take_no_signals();
    a_blocked_signal_waits_for_the_program();
    return check_finish("test_own_threads");
}
