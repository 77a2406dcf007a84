/* The staging engine's worker threads: started once, each takes slices of
 * every job in turn, and between jobs spins a while or sleeps. */
#include <stdlib.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "../instance.h"
#include "../thread_start.h"
#include "staging_engine.h"

/* How long a spinning worker naps between looks: sched_yield does not hand
 * the CPU to a thread woken onto it on every kernel, a sleep does. */
enum { SPIN_NAP_NS = 2000 };

/* Lock not held: waits until eng->events moves past seen while a job is
 * listed or the engine stops (true), or the clock passes until (false),
 * looking every few microseconds, so that work queued within the time finds
 * this thread awake. */
static bool spin_for_event(engine *eng, unsigned long long seen, unsigned long long until)
{
    for (unsigned k = 1;; k++) {
        unsigned long long now_seen = atomic_load(&eng->events);
        if (now_seen != seen) {
            /* Read after the event: a job listed before it is seen here. */
            if (atomic_load(&eng->listed) || atomic_load(&eng->stop_spinning))
                return true;
            seen = now_seen;
        }
        if (k % 64 == 0) {
            if (pm__now_ns() >= until)
                return false;
            const struct timespec nap = {.tv_nsec = SPIN_NAP_NS};
            nanosleep(&nap, NULL);
        }
        cpu_relax();
    }
}

/* Takes the engine's lock without sleeping in it for a while: a spinning
 * worker that slept there would cost the thread that lets the lock go a
 * wake-up. */
static void lock_awake(engine *eng)
{
    for (unsigned k = 0; pthread_mutex_trylock(&eng->lock) != 0; k++) {
        if (k == 1024) {
            pthread_mutex_lock(&eng->lock);
            return;
        }
        cpu_relax();
    }
}

/* lock held: until when worker index, having just worked or woken, spins
 * (0: it sleeps). */
static unsigned long long spin_deadline(const engine *eng, unsigned index)
{
    unsigned long long spin = atomic_load_explicit(&eng->spin_ns, memory_order_relaxed);
    return spin && index < eng->spin_want ? pm__now_ns() + spin : 0;
}

/* What a worker is started with. */
typedef struct worker_start {
    engine *eng;
    unsigned index;
} worker_start;

static void *worker_main(void *arg)
{
    const worker_start *start = arg;
    engine *eng = start->eng;
    const unsigned index = start->index;
    pm__thread_begin("pinmem-copy");
    pm__instance_backend()->own_thread_start();
    pm__trace_thread = (unsigned)(eng - pm__staging_engines) * 1000 + index + 1;
#ifdef PR_SET_TIMERSLACK
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL); /* naps of microseconds, not of 50 */
#endif
    pthread_mutex_lock(&eng->lock);
    /* Until when the worker spins rather than sleeps: only just after a
     * slice, never while idle for longer. 0: it sleeps. */
    unsigned long long spin_until = 0;
    for (;;) {
        claim c;
        claim_result got = NOTHING;
        bool woke_for_buffer = false;
        while (!eng->stopping &&
               (got = pm__staging_claim_slice(eng, NULL, &c, index < eng->fillers)) != CLAIMED) {
            if (woke_for_buffer)
                pm__staging_pass_on_buffer_wake(eng);
            woke_for_buffer = false;
            if (spin_until) {
                unsigned long long seen = atomic_load_explicit(&eng->events, memory_order_relaxed);
                const bool filler = index < eng->fillers;
                eng->spinning++;
                eng->spinning_fillers += filler;
                pthread_mutex_unlock(&eng->lock);
                bool moved = spin_for_event(eng, seen, spin_until);
                lock_awake(eng);
                eng->spinning--;
                eng->spinning_fillers -= filler;
                if (!moved)
                    spin_until = 0;
                continue;
            }
            woke_for_buffer = got == NEED_BUFFER;
            pthread_cond_t *idle = index < eng->fillers ? &eng->has_work : &eng->dtoh_work;
            pthread_cond_wait(woke_for_buffer ? &eng->buffer_freed : idle, &eng->lock);
            pm__trace_note(eng->trace, PM__TRACE_WAKE, 0, woke_for_buffer);
            /* Woken for work that others took, it sleeps again rather than
             * spin: woken late, it would hold a CPU from a thread that holds a
             * slice (docs/design.md). */
        }
        if (woke_for_buffer)
            pm__staging_pass_on_buffer_wake(eng);
        if (eng->stopping)
            break;
        const bool htod = c.j->dir == PM__HTOD;
        pthread_mutex_unlock(&eng->lock);
        pm__staging_finish_slice(&c);
        pthread_mutex_lock(&eng->lock);
        spin_until = spin_deadline(eng, index);
        /* A filler that stopped being one while it ran a slice (the count was
         * steered down) leaves the rest of the piece to the fillers and the
         * copy's caller, who may all be asleep waiting for a buffer that this
         * very piece holds: wake them. */
        if (htod && index >= eng->fillers) {
            pthread_cond_broadcast(&eng->buffer_freed);
            pthread_cond_broadcast(&eng->has_work);
        }
    }
    pthread_mutex_unlock(&eng->lock);
    return NULL;
}

void pm__staging_start_workers_locked(engine *eng)
{
    if (!eng->threads) {
        eng->threads = calloc(eng->want_threads, sizeof *eng->threads);
        eng->starts = calloc(eng->want_threads, sizeof *eng->starts);
        if (!eng->threads || !eng->starts) {
            free(eng->threads);
            free(eng->starts);
            eng->threads = NULL;
            eng->starts = NULL;
        }
    }
    while (eng->threads && eng->n_threads < eng->want_threads) {
        unsigned i = eng->n_threads;
        eng->starts[i] = (worker_start){.eng = eng, .index = i};
        if (pm__thread_start(&eng->threads[i], NULL, worker_main, &eng->starts[i]) != 0)
            break;
        eng->n_threads++;
    }
}

unsigned pm__staging_threads(void)
{
    unsigned n = 0;
    for (unsigned e = 0; e < PM__ENGINES_MAX; e++) {
        engine *eng = &pm__staging_engines[e];
        pthread_mutex_lock(&eng->lock);
        n += eng->n_threads;
        pthread_mutex_unlock(&eng->lock);
    }
    return n;
}

unsigned pm__staging_fillers(void)
{
    unsigned n = 0;
    for (unsigned e = 0; e < PM__ENGINES_MAX; e++) {
        engine *eng = &pm__staging_engines[e];
        pthread_mutex_lock(&eng->lock);
        n += eng->started ? eng->fillers : 0;
        pthread_mutex_unlock(&eng->lock);
    }
    return n;
}
