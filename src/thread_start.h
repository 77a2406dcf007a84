/* Starting the library's own threads (the POSIX streams, the staging
 * workers, the registration cache's monitor), with the test fault point in
 * front: a failed start is an ordinary failure each caller retries later. */
#ifndef PINMEM_THREAD_START_H
#define PINMEM_THREAD_START_H

#include <errno.h>
#include <pthread.h>

#include "test_hooks.h"

static inline int pm__thread_start(pthread_t *thread, const pthread_attr_t *attr,
                                   void *(*fn)(void *), void *arg)
{
    if (PM__TEST_FAULT(pm__fault_thread_start))
        return EAGAIN;
    return pthread_create(thread, attr, fn, arg);
}

#endif
