/* Host functions that hold up and observe stream work, shared by the
 * stream-order tests: a gate stream A's work waits at, a mark A's work sets
 * once past it, and a look from stream B at whether A had got there. */
#ifndef PINMEM_TEST_STREAM_UTIL_H
#define PINMEM_TEST_STREAM_UTIL_H

#include <stdatomic.h>
#include <unistd.h>

static atomic_int gate_open, a_done, b_saw_a;

static inline void wait_gate(void *arg)
{
    (void)arg;
    while (!atomic_load(&gate_open))
        usleep(100);
}

static inline void mark_a_done(void *arg)
{
    (void)arg;
    atomic_store(&a_done, 1);
}

/* 1: a was done when b's work looked; -1: it was not; 0: b has not looked. */
static inline void look_for_a(void *arg)
{
    (void)arg;
    atomic_store(&b_saw_a, atomic_load(&a_done) ? 1 : -1);
}

/* Closes the gate and forgets earlier marks and looks. */
static inline void reset_gate(void)
{
    atomic_store(&gate_open, 0);
    atomic_store(&a_done, 0);
    atomic_store(&b_saw_a, 0);
}

#endif
