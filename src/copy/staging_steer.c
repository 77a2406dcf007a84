/* How the staging engine fits itself to the machine and the copies: the
 * count of workers that fill buffers for the device, steered after each
 * large copy; the stores a copy uses, learnt from timed copies; and how many
 * workers spin for the next copy. */
#include "../instance.h"
#include "staging_engine.h"

/* Whether j counts for the filler count: host-to-device jobs of several whole
 * buffers (the ramp at a copy's start waits little whatever the count). */
static bool steers_fillers(const job *j)
{
    return j->dir == PM__HTOD && j->bytes >= 8 * j->plan.chunk;
}

void pm__staging_steer_fillers(job *j)
{
    engine *eng = j->eng;
    if (!steers_fillers(j))
        return;
    unsigned long long copy = atomic_load(&j->copy_ns), wait = atomic_load(&j->wait_ns);
    if (wait * 10 < copy && eng->fillers < eng->htod_workers) {
        eng->fillers++;
        pthread_cond_broadcast(&eng->dtoh_work); /* a new filler may sleep there */
    } else if (wait * 3 > copy && eng->fillers > 1) { /* more than a third */
        eng->fillers--;
    }
    eng->fillers_of[j->store_kind] = eng->fillers;
}

void pm__staging_take_fillers_of(const job *j)
{
    engine *eng = j->eng;
    unsigned n = eng->fillers_of[j->store_kind];
    if (n == 0 && j->store_kind == PM__STORE_DEMOTING)
        n = 2 * eng->fillers < eng->htod_workers ? 2 * eng->fillers : eng->htod_workers;
    if (!steers_fillers(j) || n == 0 || n == eng->fillers)
        return;
    if (n > eng->fillers)
        pthread_cond_broadcast(&eng->dtoh_work); /* new fillers may sleep there */
    eng->fillers = n;
}

void pm__staging_choose_stores(const pm__copy_settings *set, job *j, bool sync,
                               unsigned *size_class, bool *timed)
{
    j->stores = pm__copy_stores_for(set, j->dir, j->bytes);
    *timed = false;
    if (pm__copy_may_demote(set, j->dir, j->bytes)) {
        *size_class = pm__store_class_of(j->bytes);
        *timed = sync;
        if (pm__store_choose(&j->eng->store_choice, *size_class, *timed) == PM__STORE_DEMOTING)
            j->stores = PM_COPY_STORES_DEMOTING;
    }
    /* Demoting stores by configuration steer their own filler count too. */
    j->store_kind = j->stores == PM_COPY_STORES_DEMOTING ? PM__STORE_DEMOTING : PM__STORE_PLAIN;
}

void pm__staging_time_job(const job *j, unsigned size_class, unsigned long long t0)
{
    if (pm__instance_backend()->stream_synchronize(j->stream) != PM_SUCCESS)
        return; /* the caller's own wait reports it */
    double gbps = (double)j->bytes / (double)(pm__now_ns() - t0 + 1);
    engine *eng = j->eng;
    pthread_mutex_lock(&eng->lock);
    pm__store_report(&eng->store_choice, size_class, j->store_kind, gbps);
    pthread_mutex_unlock(&eng->lock);
}

unsigned pm__staging_spinners_for(const job *j)
{
    const engine *eng = j->eng;
    if (j->bytes > eng->chunk)
        return 0;
    const unsigned most = (eng->n_threads + 1) / 2;
    return j->slices - 1 < most ? (unsigned)(j->slices - 1) : most;
}

void pm__staging_count_running(engine *eng, pm__direction dir, int change)
{
    eng->running[dir] = (unsigned)((int)eng->running[dir] + change);
    if (change < 0 && eng->running[dir] == 0 && eng->running[dir ^ 1]) {
        note_event(eng);
        pthread_cond_broadcast(&eng->buffer_freed);
    }
}
