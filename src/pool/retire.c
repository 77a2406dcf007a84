/* The end of a destroyed pool.
 *
 * A pool destroyed with allocations live stays until their last free. Then
 * its memory goes back, which must not make the caller wait, just as
 * cuMemPoolDestroy returns at once: not for work still queued on the
 * streams its last frees were made on, and not for the device where giving
 * memory back waits for all of its work (pm__chunk_ops.give_back_waits:
 * cuMemHostUnregister). A pool whose teardown waits for nothing is torn down
 * by the call that ended it; any other goes to the reaper, a thread started
 * when there is such a pool and gone when there is none. It may call the
 * driver, which a stream's host function may not.
 *
 * A reaper that cannot be started is started again at the next pool call
 * that looks (pm__retire_poll); meanwhile those calls tear down, in the
 * caller's thread, the pools whose teardown no longer waits, and a stream's
 * synchronization, which waits anyway, also those whose giving back waits
 * for the device, rather than leave them pinned for good. At exit the
 * reaper stops before its next teardown, and pools still waiting stay as
 * they are: the process gives their memory back as it ends.
 *
 * Destroyed pools are listed from their destroy until they are finished,
 * so that statistics of all pools (and PINMEM_STATS) count what their live
 * allocations hold.
 *
 * Lock order: listed_lock before pool locks (walks visit pools under it);
 * reap_lock only with no pool lock held, and while holding it only markers
 * are asked about (pools waiting for the reaper belong to nobody else). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "../instance.h"
#include "../thread_start.h"
#include "pool_internal.h"

/* Process-wide (part of the lazily created instance). */
static pthread_mutex_t listed_lock = PTHREAD_MUTEX_INITIALIZER;
static pm__pool *listed; /* destroyed pools not yet finished; listed_lock */

static pthread_mutex_t reap_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t reap_wake;
static pthread_once_t reap_once = PTHREAD_ONCE_INIT;
static pm__pool *reap_list;  /* linked through reap_next; reap_lock */
static bool reaper_running;  /* reap_lock */
static pid_t reaper_pid;     /* the process the reaper runs in (a fork's child has none) */
static bool exiting;         /* reap_lock */
static _Atomic int waiting;  /* pools in reap_list, read without the lock */
int pm__retire_fail_starts;  /* reap_lock */

/* Every stream free of the pool's is done. */
static bool markers_done(pm__pool *pool)
{
    const pm__backend *b = pool->backend;
    for (pm__pending *p = pool->pending; p; p = p->next)
        if (!b->marker_done(&p->marker))
            return false;
    return true;
}

/* Giving the pool's memory back would wait for the device. */
static bool release_waits(pm__pool *pool)
{
    for (size_t i = 0; i < pool->n_chunks; i++)
        if (pool->chunks[i]->ops->give_back_waits && pool->chunks[i]->committed_granules > 0)
            return true;
    return false;
}

/* Gives everything of a claimed pool back and frees it; its stream frees
 * must be done. */
static void teardown(pm__pool *pool)
{
    /* Threads' memos of this pool's runs (run_of) go stale before its chunks
     * and spans go, so that none can match an address a new chunk takes. */
    atomic_fetch_add(&pm__pools_epoch, 1);
    pthread_mutex_lock(&pool->lock);
    pm__pending_release_all(pool);
    pm__central_release_empty_runs(pool);
    pm__pages_release_all(pool);
    pthread_mutex_unlock(&pool->lock);
    for (pm__span *s = pool->spare_spans, *next; s; s = next) {
        next = s->bin_next;
        free((void *)s->requested);
        free(s->free_idx);
        free(s);
    }
    for (size_t i = 0; i < pool->n_graveyard; i++)
        free(pool->graveyard[i]);
    free(pool->graveyard);
    free(pool->chunks);
    pthread_mutex_destroy(&pool->lock);
    free(pool);
}

/* Not in a forked child, which has no reaper: a thread of its parent may have
 * held the lock at the fork, and the child's exit would wait for it forever. */
static void stop_at_exit(void)
{
    pm_result ignored;
    if (!pm__instance_get(&ignored))
        return;
    pthread_mutex_lock(&reap_lock);
    exiting = true;
    pthread_cond_broadcast(&reap_wake);
    pthread_mutex_unlock(&reap_lock);
}

static void init_once(void)
{
    /* Naps are timed on the monotonic clock: a clock change must not stretch one. */
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&reap_wake, &attr);
    pthread_condattr_destroy(&attr);
    atexit(stop_at_exit);
}

/* reap_lock held: the first listed pool whose streams are done (and, when
 * here_and_now, whose teardown does not wait for the device), unlisted. */
static pm__pool *take_ready_locked(bool here_and_now)
{
    for (pm__pool **link = &reap_list; *link; link = &(*link)->reap_next) {
        pm__pool *pool = *link;
        if (markers_done(pool) && !(here_and_now && release_waits(pool))) {
            *link = pool->reap_next;
            atomic_fetch_sub_explicit(&waiting, 1, memory_order_relaxed);
            return pool;
        }
    }
    return NULL;
}

/* Streams' work takes from microseconds to forever: look again soon, then
 * less and less often. */
static void *reaper_main(void *backend)
{
    /* It queries events and gives memory back to the driver: in pinmem's
     * context, and without disturbing another thread's graph capture. */
    pm__thread_begin("pinmem-reaper");
    ((const pm__backend *)backend)->own_thread_start();
    long nap_us = 1000;
    pthread_mutex_lock(&reap_lock);
    while (reap_list && !exiting) {
        PM__TEST_REAP_MIDWAY();
        pm__pool *pool = take_ready_locked(false);
        if (pool) {
            pthread_mutex_unlock(&reap_lock);
            teardown(pool);
            pthread_mutex_lock(&reap_lock);
            nap_us = 1000;
            continue;
        }
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += nap_us * 1000;
        until.tv_sec += until.tv_nsec / 1000000000;
        until.tv_nsec %= 1000000000;
        pthread_cond_timedwait(&reap_wake, &reap_lock, &until);
        nap_us = nap_us < 100000 ? 2 * nap_us : 100000;
    }
    reaper_running = false;
    pthread_mutex_unlock(&reap_lock);
    return NULL;
}

/* reap_lock held: a reaper runs in this process, started now if need be
 * with b, the backend of the pools it reaps; false when it could not be
 * started. */
static bool reaper_alive_locked(const pm__backend *b)
{
    if (reaper_running && reaper_pid == getpid())
        return true;
    if (exiting)
        return false;
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0)
        return false;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    reaper_running = false;
    if (pm__retire_fail_starts > 0)
        pm__retire_fail_starts--;
    else
        reaper_running = pm__thread_create(&thread, &attr, reaper_main, (void *)b) == 0;
    pthread_attr_destroy(&attr);
    if (reaper_running)
        reaper_pid = getpid();
    return reaper_running;
}

static void reap_later(pm__pool *pool)
{
    pthread_once(&reap_once, init_once);
    pthread_mutex_lock(&reap_lock);
    pool->reap_next = reap_list;
    reap_list = pool;
    atomic_fetch_add_explicit(&waiting, 1, memory_order_relaxed);
    if (reaper_running && reaper_pid == getpid())
        pthread_cond_signal(&reap_wake);
    else
        reaper_alive_locked(pool->backend); /* when this fails, pm__retire_poll tries again */
    pthread_mutex_unlock(&reap_lock);
}

bool pm__retire_claim(pm__pool *pool)
{
    if (!pool->destroyed || pool->destroying || pool->live != 0 || pool->finishing)
        return false;
    pool->finishing = true;
    return true;
}

void pm__retire_list(pm__pool *pool)
{
    pthread_mutex_lock(&listed_lock);
    pool->listed_prev = NULL;
    pool->listed_next = listed;
    if (listed)
        listed->listed_prev = pool;
    listed = pool;
    pool->listed = true;
    pthread_mutex_unlock(&listed_lock);
}

void pm__retire_for_each_listed(void (*visit)(void *pool, void *arg), void *arg)
{
    pthread_mutex_lock(&listed_lock);
    for (pm__pool *pool = listed; pool; pool = pool->listed_next)
        visit(pool, arg);
    pthread_mutex_unlock(&listed_lock);
}

static void unlist(pm__pool *pool)
{
    pthread_mutex_lock(&listed_lock);
    if (pool->listed) {
        if (pool->listed_prev)
            pool->listed_prev->listed_next = pool->listed_next;
        else
            listed = pool->listed_next;
        if (pool->listed_next)
            pool->listed_next->listed_prev = pool->listed_prev;
        pool->listed = false;
    }
    pthread_mutex_unlock(&listed_lock);
}

void pm__retire_finish(pm__pool *pool)
{
    /* Waits out any walk over the listed pools; the next ones will not see it. */
    unlist(pool);
    /* The pool is the caller's alone now; the lock orders what other
     * threads wrote into it before. */
    pthread_mutex_lock(&pool->lock);
    bool now = markers_done(pool) && !release_waits(pool);
    pthread_mutex_unlock(&pool->lock);
    if (now)
        teardown(pool);
    else
        reap_later(pool);
}

/* Tears down here the waiting pools whose streams are done, and of those
 * only the ones whose giving back does not wait unless may_wait. */
static bool reap_here(bool may_wait)
{
    if (!atomic_load_explicit(&waiting, memory_order_relaxed))
        return false;
    bool reaped = false;
    pthread_mutex_lock(&reap_lock);
    for (pm__pool *pool; !exiting && (pool = take_ready_locked(!may_wait));) {
        pthread_mutex_unlock(&reap_lock);
        teardown(pool);
        reaped = true;
        pthread_mutex_lock(&reap_lock);
    }
    pthread_mutex_unlock(&reap_lock);
    return reaped;
}

bool pm__retire_reap_here(void) { return reap_here(false); }

bool pm__retire_reaper_running(void)
{
    pthread_mutex_lock(&reap_lock);
    bool running = reaper_running && reaper_pid == getpid();
    pthread_mutex_unlock(&reap_lock);
    return running;
}

void pm__retire_poll(bool may_wait)
{
    if (!atomic_load_explicit(&waiting, memory_order_relaxed))
        return;
    pthread_mutex_lock(&reap_lock);
    bool alive = !reap_list || reaper_alive_locked(reap_list->backend); /* none left: none needed */
    pthread_mutex_unlock(&reap_lock);
    if (!alive)
        reap_here(may_wait);
}
