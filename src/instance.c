#include "instance.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "errors.h"
#include "host_func.h"
#include "no_cancel.h"
#include "options.h"
#include "proc_maps.h"
#include "test_hooks.h"
#include "versioned.h"

/* maps_fd until /proc/self/maps is first asked for. */
#define MAPS_UNOPENED (-2)

static pthread_once_t once = PTHREAD_ONCE_INIT;
static atomic_bool ready; /* set once initialise succeeded: one load on the hot path */
static pm__instance instance;
static pm_result init_result = PM_ERROR_NOT_INITIALIZED;
static char init_detail[512];
/* A process forked from one that initialised the library (pinmem.h, pm_init):
 * every call refuses. The pid is the process that initialised. */
static atomic_bool forked_child;
static pid_t init_pid;
/* Initialisation ran and failed: nothing was started, and a forked child
 * gives the parent's answer rather than the forked child's. */
static atomic_bool init_failed;
/* Initialisation began: a child forked from here on, even midway, refuses
 * (the other thread's locks and half-made state are not the child's). */
static atomic_bool init_begun;
/* The modules' hooks, newest first: pushed with a compare-and-swap and read
 * without a lock, so that the child of a fork can walk them. */
static _Atomic(pm__instance_hooks *) hooks;

void pm__instance_add_hooks(pm__instance_hooks *h)
{
    h->next = atomic_load_explicit(&hooks, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&hooks, &h->next, h, memory_order_release,
                                                  memory_order_relaxed))
        ;
}

/* Runs in the child, on its one thread: only atomic stores, no locks (the
 * parent's other threads may have held any). A child of a parent that never
 * began initialising is a process like any other. */
static void after_fork_in_child(void)
{
    if (!atomic_load_explicit(&init_begun, memory_order_acquire))
        return;
    if (atomic_load_explicit(&init_failed, memory_order_acquire))
        return; /* every call keeps failing as in the parent */
    atomic_store_explicit(&ready, false, memory_order_relaxed);
    atomic_store_explicit(&forked_child, true, memory_order_relaxed);
    for (pm__instance_hooks *h = atomic_load_explicit(&hooks, memory_order_acquire); h; h = h->next)
        if (h->after_fork_in_child)
            h->after_fork_in_child();
}

/* At load, before any thread can begin initialising: registered later, the
 * hook could miss a fork that another thread's initialisation raced. */
__attribute__((constructor)) static void watch_forks(void)
{
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

/* PINMEM_STATS=1, at exit: every module's statistics. */
static void print_stats_at_exit(void)
{
    for (pm__instance_hooks *h = atomic_load_explicit(&hooks, memory_order_acquire); h; h = h->next)
        if (h->print_stats)
            h->print_stats();
}

/* PINMEM_BACKEND: auto (default) tries the driver, then POSIX. */
static pm_result open_backend(pm__backend *b)
{
    unsigned long long choice = pm__option_value(PM__OPT_BACKEND);
    if (choice == PM__BACKEND_AUTO) {
        if (pm__backend_cuda_open(b) == PM_SUCCESS)
            return PM_SUCCESS;
        return pm__backend_posix_open(b);
    }
    if (choice == PM__BACKEND_POSIX)
        return pm__backend_posix_open(b);
    pm_result r = pm__backend_cuda_open(b);
    if (r == PM_SUCCESS)
        return r;
    char why[400];
    snprintf(why, sizeof why, "%s", pm_last_error_detail());
    return pm__fail(PM_ERROR_NO_DEVICE, "PINMEM_BACKEND=cuda, but the CUDA backend failed: %s",
                    why);
}

static void initialise(void)
{
    PM__NO_CANCEL;
    /* Trying the driver first fails on machines without one; a selection
     * that then succeeds must not leave that failure as the thread's detail. */
    pm__detail_saved before;
    pm__detail_save(&before);
    /* First, so that a fork from here on leaves the child refusing: the
     * driver cannot be used after fork, and the parent's streams, workers and
     * locks are not in the child. */
    init_pid = getpid();
    atomic_store_explicit(&init_begun, true, memory_order_release);
    PM__TEST_INIT_MIDWAY();
    init_result = pm__options_load(); /* a bad PINMEM_* value fails here */
    if (init_result == PM_SUCCESS)
        init_result = open_backend(&instance.backend);
    atomic_init(&instance.maps_fd, MAPS_UNOPENED);
    if (init_result == PM_SUCCESS) {
        instance.ranges = pm__ranges_create();
        if (!instance.ranges)
            init_result = pm__fail(PM_ERROR_OUT_OF_MEMORY, "cannot allocate the range registry");
    }
    if (init_result != PM_SUCCESS) {
        snprintf(init_detail, sizeof init_detail, "%s", pm_last_error_detail());
        atomic_store_explicit(&init_failed, true, memory_order_release);
    }
    pm__budget_init_from_env();
    if (init_result == PM_SUCCESS)
        atomic_store_explicit(&ready, true, memory_order_release);
    if (init_result == PM_SUCCESS && pm__option_value(PM__OPT_STATS) == 1)
        atexit(print_stats_at_exit);
    if (init_result == PM_SUCCESS)
        pm__detail_restore(&before);
}

pm__instance *pm__instance_get(pm_result *r)
{
    if (atomic_load_explicit(&ready, memory_order_acquire))
        return &instance;
    if (atomic_load_explicit(&forked_child, memory_order_relaxed)) {
        *r = pm__fail(PM_ERROR_NOT_INITIALIZED,
                      "pinmem was initialised in process %d, and this process (%d) was forked "
                      "from it: a forked child cannot use pinmem (nor the CUDA driver); exec in "
                      "the child, or fork before the first pinmem call",
                      (int)init_pid, (int)getpid());
        return NULL;
    }
    if (!atomic_load_explicit(&init_begun, memory_order_acquire) &&
        pm__backend_cuda_in_host_func()) {
        /* The driver refuses what opening its backend takes; it is not
         * tried, so that a later call outside the function can succeed. */
        *r = pm__fail(PM_ERROR_NOT_PERMITTED,
                      "pinmem cannot start inside a host function (cuLaunchHostFunc), where the "
                      "driver refuses the calls that start it: make a first pinmem call outside "
                      "one");
        return NULL;
    }
    pthread_once(&once, initialise);
    if (init_result != PM_SUCCESS) {
        /* Every thread that asks learns why, not just the one that initialised. */
        *r = pm__fail(init_result, "%s", init_detail);
        return NULL;
    }
    return &instance;
}

bool pm__host_func_thread_check(void)
{
    if (pm__thread_calls == PM__THREAD_IN_HOST_FUNC)
        return true;
    pm_result ignored;
    pm__instance *inst = pm__instance_get(&ignored);
    if (!inst)
        return false; /* the call's preamble gives the reason */
    if (inst->backend.thread_runs_host_funcs && inst->backend.thread_runs_host_funcs())
        return true;
    pm__thread_calls = PM__THREAD_FREE;
    return false;
}

pm_result pm_init(unsigned flags)
{
    PM__NO_CANCEL;
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    if (flags != 0)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_init: flags must be 0, not 0x%x", flags);
    return PM_SUCCESS;
}

const char *pm_backend_name(void)
{
    PM__NO_CANCEL;
    pm_result r;
    pm__instance *inst = pm__instance_get(&r);
    return inst ? inst->backend.name : NULL;
}

int pm__instance_maps_file(pm__instance *inst)
{
    int fd = atomic_load_explicit(&inst->maps_fd, memory_order_acquire);
    if (fd != MAPS_UNOPENED)
        return fd;
    bool for_now = false;
    fd = pm__proc_maps_open(&for_now);
    if (fd < 0 && for_now)
        return -1; /* out of descriptors at this moment: the next call opens it */
    int expected = MAPS_UNOPENED;
    if (!atomic_compare_exchange_strong_explicit(&inst->maps_fd, &expected, fd,
                                                 memory_order_acq_rel, memory_order_acquire)) {
        if (fd >= 0)
            close(fd); /* another thread opened it first */
        fd = expected;
    }
    return fd;
}

pm_result pm_get_capabilities(pm_capabilities *caps)
{
    PM__NO_CANCEL;
    PM__INSTANCE_OR_RETURN(inst);
    pm_result r = PM__STRUCT_SIZE_CHECK("pm_get_capabilities", caps);
    if (r != PM_SUCCESS)
        return r;
    size_t n = caps->struct_size;
    pm_capabilities full = inst->backend.caps;
    full.struct_size = n;
    /* Whether the limit binds can change (setrlimit, capabilities dropped). */
    full.pinning_limited_by_memlock_rlimit = inst->backend.pinnable_bytes() != SIZE_MAX;
    full.access_checks_permissions =
        pm__instance_maps_file(inst) >= 0 || pm__maps_text_readable();
    memcpy(caps, &full, n);
    return PM_SUCCESS;
}
