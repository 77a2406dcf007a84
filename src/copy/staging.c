/* The staging engine: copies from and to pageable memory through a ring of
 * pinned buffers. A copy becomes a job of pieces of up to a buffer, each
 * moved by one DMA; the CPU side of a piece is cut into slices that several
 * threads copy at once. Large DMAs keep the copy engine near its peak (its
 * rate by piece size is in docs/performance.md), while small slices keep
 * every core busy and small first pieces let the first DMA start early
 * (plan.c). A job may be many segments (a batch's pageable blocks), laid end
 * to end: a piece then gathers several, and its DMAs, one a segment, go to
 * the driver in one call where it can take them so; or, where the batch kernel
 * may move a batch's pageable blocks (batch.c), through the ring's device
 * twin (staging_twin.c).
 *
 * Worker threads (started on first use, never per call) take slices from all
 * jobs in turn, so several callers are served at once and fairly, and each
 * caller works on its own job too. While jobs run both ways at once, each
 * direction may hold at most half the buffers (unless the ring is shared),
 * so that neither waits for buffers the other keeps busy. A worker that ran
 * out of slices may look for new ones a while before it sleeps (spin_ns), so
 * that back-to-back copies find it awake; a new copy wakes the sleepers only
 * when too few workers spin.
 *
 * Only some of the workers (the fillers) take slices of host-to-device
 * copies: the DMA engine reads the buffers from the memory the threads copy
 * through, and too many threads copying at once slow it down, while too few
 * leave it waiting. How many is right differs from machine to machine, so
 * the engine steers it after each large copy by how long its threads waited for DMAs
 * against how long they copied: threads that hardly wait are too few, and
 * threads that wait much are more than the DMA engine needs.
 *
 * Host to device: the threads copy a piece's slices into its buffer; the one
 * that finishes the last slice queues the DMA and a marker behind it.
 * Device to host: the DMAs of a job's next pieces are queued into free
 * buffers ahead of the threads, up to half the ring; where none was, the
 * thread that takes a piece's first slice queues its DMA. Each slice's thread
 * waits for its piece's DMA and copies its slice out.
 *
 * Buffers are reused oldest first: a buffer whose DMA may still be reading it
 * carries the marker recorded behind that DMA, and the next user waits for
 * that marker before writing into it.
 *
 * Large host-to-device copies may fill the buffers with demoting stores, which
 * leave the ring in the CPU's cache for the DMA engine at twice the CPU cost
 * (memcopy.c); whether they do is learnt from timed copies (store_choice.h).
 *
 * Each device has an engine of its own (its ring, its workers), made on the
 * first copy that moves that device's memory, so that copies to several
 * devices at once do not share one engine's threads and buffers.
 *
 * Its files, lowest first: staging_engine.c (the engines, and which one a
 * copy takes; the types are in staging_engine.h); staging_lanes.c (streams
 * for copies on their caller's own stream); staging_twin.c (pieces through
 * the device twin); staging_slices.c (claiming and running slices, the DMAs
 * and the waits for them); staging_steer.c (fillers, stores, spinners);
 * staging_workers.c;
 * staging_ring.c (the ring, the engine's start and stop); and this one, a
 * copy's job from its start to its end, and lists of blocks. */
#include <pthread.h>
#include <string.h>

#include "../errors.h"
#include "../instance.h"
#include "staging_engine.h"

/* Where a copy in place (a context pinmem does not hold) moves device memory
 * of a context pinmem holds, that context's place: DMAs queued from another
 * context into its memory cost 8-9 µs more each (docs/performance.md), so
 * the copy runs on a lane there. Else place. */
static pm__place lane_place_for(const pm__backend *be, const pm__place *place,
                                const pm__segment *segs)
{
    pm__place memory = {0};
    be->memory_place(segs[0].dev, &memory);
    return memory.context && memory.context != place->context ? memory : *place;
}

/* lock held: the rest of j's plan (its pieces, slices and stores), its
 * fillers and its id; *size_class and *timed say whether the copy's time
 * teaches the store choice (store_choice.h). */
static void plan_job_locked(const pm__copy_settings *set, const pm__backend *be, job *j,
                            bool sync, unsigned *size_class, bool *timed)
{
    engine *eng = j->eng;
    eng->ring_split = set->ring_split;
    atomic_store_explicit(&eng->spin_ns, set->spin_ns, memory_order_relaxed);
    if (j->kernel)
        pm__staging_ensure_twin_locked(eng);
    if (j->kernel && j->dir == PM__DTOH)
        j->kernel = pm__staging_twin_start(be, j);
    j->plan = pm__plan_pieces(set, j->dir, j->kernel ? eng->chunk - list_reserve(eng) : eng->chunk,
                              j->bytes, j->n_segs == 1);
    j->slice = j->plan.slice;
    pm__staging_choose_stores(set, j, sync, size_class, timed);
    pm__staging_take_fillers_of(j);
    j->slices = pm__plan_slices(&j->plan);
    j->id = (unsigned)(eng - pm__staging_engines) << 24 | (++eng->jobs_started & 0xffffff);
    pm__trace_note(eng->trace, PM__TRACE_JOB_START, j->id,
                   (unsigned)(j->bytes >> 10 & 0x7fffffff) | (unsigned)(j->dir == PM__DTOH) << 31);
    pm__staging_count_running(eng, j->dir, 1);
}

/* lock held, let go meanwhile: a copy of several slices on the caller's own
 * stream runs on a lane, where the workers' DMAs keep its order; so does one
 * of several pieces whose DMAs would queue slower from its stream's context
 * (one DMA costs the same from either, and the lane's two markers would not
 * pay). The lane j now runs on, or NULL. */
static pm__lane *enter_lane_locked(const pm__backend *be, job *j, bool may_run_elsewhere,
                                   pm__lane_places *lane_at, pm__lane *spare)
{
    engine *eng = j->eng;
    const pm_stream_t stream = j->stream;
    const bool own_stream = pm__stream_is_threads_own(stream);
    const bool several_dmas = may_run_elsewhere && pm__plan_piece(&j->plan, 0, 0) < j->bytes;
    if (j->slices <= 1 || (!own_stream && !several_dmas))
        return NULL;
    pm__lane *lane = NULL;
    pthread_mutex_unlock(&eng->lock);
    if (several_dmas)
        lane_at->lane = lane_place_for(be, &lane_at->own, j->segs);
    if (own_stream || lane_at->lane.context != lane_at->own.context)
        lane = pm__staging_lane_enter(eng, lane_at, stream, spare);
    pthread_mutex_lock(&eng->lock);
    if (lane) {
        j->stream = lane->stream;
        j->place = lane_at->lane;
    }
    return lane;
}

/* lock held: lists j for the workers and wakes every sleeper unless enough
 * workers spin (the first of many to wake joins sooner than any one woken
 * alone). */
static void announce_locked(job *j)
{
    engine *eng = j->eng;
    eng->spin_want = pm__staging_spinners_for(j);
    j->listed = true;
    atomic_fetch_add(&eng->listed, 1); /* before the event that announces it */
    j->following = eng->jobs;
    if (eng->jobs)
        eng->jobs->prev = j;
    eng->jobs = j;
    note_event(eng);
    unsigned awake = j->dir == PM__HTOD ? eng->spinning_fillers : eng->spinning;
    if (awake + 1 < j->slices) {
        pthread_cond_broadcast(&eng->has_work);
        if (j->dir == PM__DTOH)
            pthread_cond_broadcast(&eng->dtoh_work);
    }
    /* Workers waiting for a buffer for another job may take this one's. */
    pthread_cond_broadcast(&eng->buffer_freed);
}

/* lock held: the caller runs slices of j until none is left to claim, then
 * waits for those the workers took, and takes j off the engine. */
static void run_job_locked(job *j)
{
    engine *eng = j->eng;
    claim c;
    claim_result got;
    bool woke_for_buffer = false;
    while ((got = pm__staging_claim_slice(eng, j, &c, true)) != NOTHING) {
        if (woke_for_buffer)
            pm__staging_pass_on_buffer_wake(eng);
        woke_for_buffer = got == NEED_BUFFER;
        if (woke_for_buffer) {
            pthread_cond_wait(&eng->buffer_freed, &eng->lock);
            continue;
        }
        pthread_mutex_unlock(&eng->lock);
        pm__staging_finish_slice(&c);
        pthread_mutex_lock(&eng->lock);
    }
    if (woke_for_buffer)
        pm__staging_pass_on_buffer_wake(eng);
    while (j->slices_done < j->slices)
        pthread_cond_wait(&eng->progressed, &eng->lock);
    if (j->listed)
        pm__staging_unlist(j);
    pm__staging_count_running(eng, j->dir, -1);
    pm__trace_note(eng->trace, PM__TRACE_JOB_END, j->id, 0);
    if (j->error == PM_SUCCESS)
        pm__staging_steer_fillers(j);
}

static pm_result staged(const pm__copy_settings *set, pm__direction dir, const pm__segment *segs,
                        size_t n_segs, size_t bytes, pm_stream_t stream, bool sync, bool kernel,
                        bool *no_ring)
{
    *no_ring = false;
    const pm__backend *be = pm__instance_backend();
    pm__place place;
    pm_result placed = be->copy_place(stream, segs[0].dev, 0, &place);
    if (placed != PM_SUCCESS)
        return placed;
    /* Only a copy of one range in a context pinmem does not hold may run
     * elsewhere (lane_place_for); asked before the engine's lock. */
    const bool may_run_elsewhere = be->memory_place && n_segs == 1 && !be->place_lasts(&place);
    engine *eng = pm__staging_engine_for(be, segs[0].dev);
    pthread_mutex_lock(&eng->lock);
    pm_result started = pm__staging_ensure_started_locked(eng, set);
    if (started != PM_SUCCESS) {
        pthread_mutex_unlock(&eng->lock);
        *no_ring = true;
        return started;
    }
    /* After the engine's start, which would weigh on the first copy's time. */
    const unsigned long long t0 = pm__now_ns();
    job j = {.eng = eng, .dir = dir, .segs = segs, .n_segs = n_segs, .bytes = bytes,
             .stream = stream, .place = place, .one_call = set->batch != PM_COPY_BATCH_EACH,
             .kernel = kernel};
    unsigned size_class = 0;
    bool timed;
    plan_job_locked(set, be, &j, sync, &size_class, &timed);
    pm__lane spare_lane;
    pm__lane_places lane_at = {.own = place, .lane = place};
    pm__lane *lane = enter_lane_locked(be, &j, may_run_elsewhere, &lane_at, &spare_lane);
    /* From the device, the first piece's DMA is queued before the workers
     * are woken, which costs the caller 15-25 µs: the DMA runs meanwhile. */
    const bool dma_first = dir == PM__DTOH && j.slices > 1;
    if (dma_first) {
        pthread_mutex_unlock(&eng->lock);
        pm__staging_queue_ahead_up_to(&j, 1);
        pthread_mutex_lock(&eng->lock);
    }
    /* A single slice is the caller's alone: no hand-off. So is every slice of
     * a copy on the caller's own stream that found no lane: a worker's DMA
     * would land on the worker's own stream, out of the copy's order. */
    if (j.slices > 1 && !pm__stream_is_threads_own(j.stream))
        announce_locked(&j);
    if (dma_first) { /* and the next pieces' behind it */
        pthread_mutex_unlock(&eng->lock);
        queue_ahead(&j);
        pthread_mutex_lock(&eng->lock);
    }
    run_job_locked(&j);
    pthread_mutex_unlock(&eng->lock);
    /* Failed or not, nothing the job queued may run past it on its stream. */
    pm_result joined = pm__staging_twin_join(be, &j);
    if (lane) {
        const pm_result left = pm__staging_lane_leave(eng, &lane_at, stream, lane);
        if (joined == PM_SUCCESS)
            joined = left;
        /* The lane may now serve another copy, or be released: the timing
         * below waits on the caller's stream, which follows the lane. */
        j.stream = stream;
    }
    if (j.error != PM_SUCCESS)
        return pm__fail(j.error, "%s", j.detail);
    if (joined != PM_SUCCESS)
        return joined;
    if (timed)
        pm__staging_time_job(&j, size_class, t0);
    atomic_fetch_add_explicit(&pm__copy_count.staged_bytes, bytes, memory_order_relaxed);
    if (dir == PM__HTOD && j.stores == PM_COPY_STORES_DEMOTING)
        atomic_fetch_add_explicit(&pm__copy_count.demoted_bytes, bytes, memory_order_relaxed);
    return PM_SUCCESS;
}

pm_result pm__staged_copy(const pm__copy_settings *set, pm__direction dir, uint8_t *host,
                          pm_deviceptr dev, size_t bytes, pm_stream_t stream, bool sync,
                          bool *no_ring)
{
    const pm__segment one = {.host = host, .dev = dev, .bytes = bytes, .at = 0};
    return staged(set, dir, &one, 1, bytes, stream, sync, false, no_ring);
}

pm_result pm__staged_segments(const pm__copy_settings *set, pm__direction dir,
                              const pm__segment *segs, size_t n, size_t bytes, pm_stream_t stream,
                              bool kernel, bool *no_ring)
{
    return staged(set, dir, segs, n, bytes, stream, false, kernel, no_ring);
}

/* lock held: the oldest free buffer, for a list of blocks (one it may take).
 * It counts as a host-to-device buffer while held (pm__staging_give_buffer). */
static buffer *take_buffer(engine *eng)
{
    buffer *b = &eng->ring[eng->queue[eng->queue_head]];
    eng->queue_head = (eng->queue_head + 1) % eng->n_buffers;
    eng->queue_count--;
    b->dir = PM__HTOD;
    eng->held[PM__HTOD]++;
    return b;
}

/* Each list goes into a buffer of its own, free and done with its last
 * work, as a piece's bytes would; the buffer is free again at once, reused
 * only after the marker behind the launch. */
pm_result pm__staged_blocks(const pm__copy_settings *set, const pm__block_copy *blocks, size_t n,
                            pm_stream_t stream, bool *no_ring)
{
    *no_ring = false;
    const pm__backend *be = pm__instance_backend();
    /* The lists feed launches in pinmem's own context, its device's. */
    engine *eng = &pm__staging_engines[(unsigned)be->device_in_use % PM__ENGINES_MAX];
    pthread_mutex_lock(&eng->lock);
    pm_result r = pm__staging_ensure_started_locked(eng, set);
    if (r != PM_SUCCESS) {
        pthread_mutex_unlock(&eng->lock);
        *no_ring = true;
        return r;
    }
    const size_t per = eng->chunk / sizeof *blocks;
    unsigned long long bytes = 0;
    for (size_t done = 0; done < n && r == PM_SUCCESS;) {
        bool woke = false;
        /* As a host-to-device piece: within that direction's half while the
         * ring is split, so that copies from the device keep theirs. */
        while (!pm__staging_may_take_buffer(eng, PM__HTOD)) {
            pthread_cond_wait(&eng->buffer_freed, &eng->lock);
            woke = true;
        }
        buffer *b = take_buffer(eng);
        if (woke)
            pm__staging_pass_on_buffer_wake(eng);
        pthread_mutex_unlock(&eng->lock);
        const size_t k = min_size(per, n - done);
        unsigned long long t0 = pm__now_ns();
        r = pm__staging_wait_previous_dma(eng, NULL, b); /* failed: b is left as it is, pending */
        if (r == PM_SUCCESS) {
            memcpy(b->p, blocks + done, k * sizeof *blocks);
            r = pm__staging_mark_behind(eng, be, stream, b,
                                        pm__copy_backend_blocks(be, b->p, k, NULL, stream), true);
        }
        count_ns(&pm__copy_count.staging_queue_ns, NULL, t0);
        for (size_t i = done; i < done + k; i++)
            bytes += blocks[i].bytes;
        done += k;
        pthread_mutex_lock(&eng->lock);
        pm__staging_give_buffer(eng, b);
    }
    pthread_mutex_unlock(&eng->lock);
    if (r == PM_SUCCESS)
        atomic_fetch_add_explicit(&pm__copy_count.kernel_bytes, bytes, memory_order_relaxed);
    return r;
}
