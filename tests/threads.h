/* Starting and joining a test's threads, each given one element of an array. */
#ifndef PINMEM_TEST_THREADS_H
#define PINMEM_TEST_THREADS_H

#include <pthread.h>
#include <stddef.h>

/* Starts fn on args[0..n) (elements of elem_size bytes) and returns how many
 * threads started: a test checks that all did and joins only those. */
static inline unsigned start_threads(pthread_t *t, unsigned n, void *(*fn)(void *), void *args,
                                     size_t elem_size)
{
    unsigned started = 0;
    while (started < n &&
           pthread_create(&t[started], NULL, fn, (char *)args + started * elem_size) == 0)
        started++;
    return started;
}

static inline void join_threads(const pthread_t *t, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

#endif
