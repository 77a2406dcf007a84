/* Host functions that hold up and observe stream work, shared by the
 * stream-order tests: a gate stream A's work waits at, a mark A's work sets
 * once past it, a look from stream B at whether A had got there, and the
 * fill and check of each use of a block in the race tests, and a thread
 * that opens the gate should the call under test wait for the work behind it. */
#ifndef PINMEM_TEST_STREAM_UTIL_H
#define PINMEM_TEST_STREAM_UTIL_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "pinmem.h"

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

/* The race tests: each use of a block is filled with its tag by work on the
 * block's stream, and checked (after a pause) by later work on that stream,
 * which counts a violation if anyone else wrote the block meanwhile. */
static atomic_long violations;

typedef struct use {
    uint32_t *p;
    size_t words;
    uint32_t tag;
    unsigned pause_us;
    /* Words from one written and checked to the next (0: every word). Any
     * two uses of pool memory start a multiple of 64 KiB apart, so a stride
     * that divides that still sees every overlap, at a fraction of the cost
     * (under ThreadSanitizer, most of a race's time). */
    size_t stride;
} use;

static inline void fill_use(void *arg)
{
    use *u = arg;
    size_t step = u->stride ? u->stride : 1;
    for (size_t i = 0; i < u->words; i += step)
        u->p[i] = u->tag;
}

/* Plays the device reading the block: it must still hold this use's tag. */
static inline void verify_and_release(void *arg)
{
    use *u = arg;
    if (u->pause_us)
        usleep(u->pause_us);
    size_t step = u->stride ? u->stride : 1;
    for (size_t i = 0; i < u->words; i += step)
        if (u->p[i] != u->tag) {
            atomic_fetch_add(&violations, 1);
            break;
        }
    free(u);
}

/* One racing thread: its pool, its stream, its number. */
typedef struct racer {
    pm_mem_pool_t pool;
    pm_stream_t stream;
    uint32_t id;
} racer;

/* A thread's body: the stream's work waits for the gate, which the caller
 * opens only after the call under test returns; should that call wait for
 * the work, this opens the gate after 3 s, so that the test ends. */
static inline void *open_gate_if_stuck(void *arg)
{
    (void)arg;
    struct timespec start, t;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        usleep(1000);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (!atomic_load(&gate_open) && t.tv_sec - start.tv_sec < 3);
    atomic_store(&gate_open, 1);
    return NULL;
}

/* Closes the gate and forgets earlier marks and looks. */
static inline void reset_gate(void)
{
    atomic_store(&gate_open, 0);
    atomic_store(&a_done, 0);
    atomic_store(&b_saw_a, 0);
}

#endif
