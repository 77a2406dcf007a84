/* Stream order learned from events (stream_order.h): per stream, the latest
 * tick of each other stream its work waits for. Few streams wait on events in
 * a process, so a list searched in turn, under one lock, serves; it is only
 * read on allocation slow paths and written by event records and waits. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "stream_order.h"

typedef struct waiter {
    unsigned long long stream_id;
    pm__order_set waits_for;
} waiter;

static _Atomic unsigned long long ticks;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static waiter *waiters;
static size_t n_waiters, cap_waiters;

unsigned long long pm__order_now(void) { return atomic_load_explicit(&ticks, memory_order_relaxed); }

unsigned long long pm__order_next(void) { return atomic_fetch_add(&ticks, 1) + 1; }

void pm__order_set_free(pm__order_set *set)
{
    free(set->points);
    *set = (pm__order_set){0};
}

/* Raises set's point for p.stream_id to p.tick, adding it if new. */
static bool set_raise(pm__order_set *set, pm__order_point p)
{
    for (size_t i = 0; i < set->n; i++) {
        if (set->points[i].stream_id == p.stream_id) {
            if (set->points[i].tick < p.tick)
                set->points[i].tick = p.tick;
            return true;
        }
    }
    if (set->n == set->cap) {
        size_t cap = set->cap ? 2 * set->cap : 4;
        pm__order_point *bigger = realloc(set->points, cap * sizeof *bigger);
        if (!bigger)
            return false;
        set->points = bigger;
        set->cap = cap;
    }
    set->points[set->n++] = p;
    return true;
}

/* lock held */
static waiter *find(unsigned long long stream_id)
{
    for (size_t i = 0; i < n_waiters; i++)
        if (waiters[i].stream_id == stream_id)
            return &waiters[i];
    return NULL;
}

bool pm__order_snapshot(unsigned long long stream_id, unsigned long long tick, pm__order_set *out)
{
    out->n = 0;
    pthread_mutex_lock(&lock);
    const waiter *w = find(stream_id);
    bool ok = true;
    for (size_t i = 0; w && ok && i < w->waits_for.n; i++)
        ok = set_raise(out, w->waits_for.points[i]);
    pthread_mutex_unlock(&lock);
    ok = ok && set_raise(out, (pm__order_point){stream_id, tick});
    if (!ok)
        out->n = 0;
    return ok;
}

bool pm__order_learn(unsigned long long stream_id, const pm__order_set *set)
{
    if (set->n == 0)
        return true;
    pthread_mutex_lock(&lock);
    waiter *w = find(stream_id);
    if (!w && n_waiters == cap_waiters) {
        size_t cap = cap_waiters ? 2 * cap_waiters : 8;
        waiter *bigger = realloc(waiters, cap * sizeof *bigger);
        if (bigger) {
            waiters = bigger;
            cap_waiters = cap;
        }
    }
    if (!w && n_waiters < cap_waiters) {
        w = &waiters[n_waiters++];
        *w = (waiter){.stream_id = stream_id};
    }
    bool ok = w != NULL;
    for (size_t i = 0; ok && i < set->n; i++)
        if (set->points[i].stream_id != stream_id)
            ok = set_raise(&w->waits_for, set->points[i]);
    pthread_mutex_unlock(&lock);
    return ok;
}

bool pm__order_follows(unsigned long long stream_id, unsigned long long other_id,
                       unsigned long long tick)
{
    bool follows = false;
    pthread_mutex_lock(&lock);
    const waiter *w = find(stream_id);
    for (size_t i = 0; w && i < w->waits_for.n; i++)
        if (w->waits_for.points[i].stream_id == other_id)
            follows = w->waits_for.points[i].tick > tick;
    pthread_mutex_unlock(&lock);
    return follows;
}

/* Drops set's point for stream_id, if any. */
static void set_drop(pm__order_set *set, unsigned long long stream_id)
{
    for (size_t i = 0; i < set->n; i++)
        if (set->points[i].stream_id == stream_id) {
            set->points[i] = set->points[--set->n];
            return;
        }
}

void pm__order_forget(unsigned long long stream_id)
{
    pthread_mutex_lock(&lock);
    waiter *w = find(stream_id);
    if (w) {
        pm__order_set_free(&w->waits_for);
        *w = waiters[--n_waiters];
    }
    /* Ids are never reused: points of a stream that is gone would only pile
     * up in the streams that waited for it, each thread's own stream one more. */
    for (size_t i = 0; i < n_waiters; i++)
        set_drop(&waiters[i].waits_for, stream_id);
    pthread_mutex_unlock(&lock);
}

size_t pm__order_known_points(void)
{
    pthread_mutex_lock(&lock);
    size_t n = 0;
    for (size_t i = 0; i < n_waiters; i++)
        n += waiters[i].waits_for.n;
    pthread_mutex_unlock(&lock);
    return n;
}

size_t pm__order_known_streams(void)
{
    pthread_mutex_lock(&lock);
    size_t n = n_waiters;
    pthread_mutex_unlock(&lock);
    return n;
}
