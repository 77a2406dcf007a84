/* Starting the library's own threads (the staging workers, the POSIX
 * streams, the registration cache's monitor, the pools' reaper, the
 * threads that fault large allocations in). Each starts with every signal
 * blocked: a program's signals are for its own threads, and one that
 * blocks a signal everywhere to take it with sigwait or a signalfd must
 * never lose it to a pinmem thread. Each runs on the CPUs
 * PINMEM_THREAD_CPUS names (by default, where its starting thread may) and
 * names itself "pinmem-...", which is what top -H, debuggers and profilers
 * show. */
#ifndef PINMEM_THREAD_START_H
#define PINMEM_THREAD_START_H

#include <errno.h>
#include <pthread.h>
#include <signal.h>

#include "backend/backend.h"
#include "test_hooks.h"

static inline int pm__thread_create(pthread_t *thread, const pthread_attr_t *attr,
                                    void *(*fn)(void *), void *arg)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = pthread_create(thread, attr, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return r;
}

/* As pm__thread_create, with the test fault point in front: for threads
 * whose failed start is an ordinary failure each caller retries later. */
static inline int pm__thread_start(pthread_t *thread, const pthread_attr_t *attr,
                                   void *(*fn)(void *), void *arg)
{
    if (PM__TEST_FAULT(pm__fault_thread_start))
        return EAGAIN;
    return pm__thread_create(thread, attr, fn, arg);
}

/* Called first by each such thread, so that it is placed before it does
 * anything (a prefault thread then binds itself to a NUMA node's CPUs);
 * name has at most 15 characters. */
static inline void pm__thread_begin(const char *name)
{
    cpu_set_t cpus;
    if (pm__thread_cpus(&cpus)) /* a refusal leaves the inherited CPUs */
        sched_setaffinity(0, sizeof cpus, &cpus);
    pthread_setname_np(pthread_self(), name);
}

#endif
