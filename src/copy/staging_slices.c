/* The staging engine's hot path: claiming slices of the jobs in turn, the
 * buffers they take and give back, the CPU copies, the DMAs queued behind
 * them (ahead of the threads, from the device), and the waits for those
 * DMAs, by a buffer's flag or its marker. */
#include <stdio.h>

#include "../errors.h"
#include "../instance.h"
#include "../test_hooks.h"
#include "staging_engine.h"

/* How long a thread reads a flag before it asks the driver instead: longer
 * than a buffer's DMA queued behind the rest of the ring's. */
#define FLAG_READ_NS 2000000ull
/* The largest job whose DMAs get flags: the flag's write fences the stream,
 * which holds the next DMA back a little (1 GiB copies lost 2 points of
 * pinned), while the waits of larger jobs are long beside the driver's
 * answer. */
#define FLAGGED_JOB_MAX ((size_t)64 << 20)

static unsigned slices_of(size_t bytes, size_t slice) { return (unsigned)((bytes + slice - 1) / slice); }

/* lock held: the most buffers direction dir may hold now. */
static unsigned share_of(const engine *eng, pm__direction dir)
{
    if (!eng->ring_split || !eng->running[PM__HTOD] || !eng->running[PM__DTOH] ||
        eng->n_buffers < 2)
        return eng->n_buffers;
    unsigned dtoh = eng->n_buffers / 2;
    return dir == PM__DTOH ? dtoh : eng->n_buffers - dtoh;
}

bool pm__staging_may_take_buffer(const engine *eng, pm__direction dir)
{
    return eng->queue_count > 0 && eng->held[dir] < share_of(eng, dir);
}

static void record_error(job *j, pm_result r)
{
    if (r != PM_SUCCESS && j->error == PM_SUCCESS) {
        j->error = r;
        snprintf(j->detail, sizeof j->detail, "%s", pm_last_error_detail());
    }
}

void pm__staging_unlist(job *j)
{
    engine *eng = j->eng;
    j->listed = false;
    atomic_fetch_sub(&eng->listed, 1);
    if (eng->turn == j)
        eng->turn = j->following;
    if (j->prev)
        j->prev->following = j->following;
    else
        eng->jobs = j->following;
    if (j->following)
        j->following->prev = j->prev;
    j->prev = j->following = NULL;
}

/* lock held: whether j has handed out every slice. */
static bool all_claimed(const job *j)
{
    return !j->current && j->ahead_count == 0 && j->next_offset == j->bytes;
}

/* lock held: whether j has a slice to hand out now. */
static bool claimable(const job *j)
{
    if (j->current || j->ahead_count > 0)
        return true;
    return j->next_offset < j->bytes && pm__staging_may_take_buffer(j->eng, j->dir);
}

/* lock held: j's next piece in the oldest free buffer (there is one). */
static buffer *start_piece(job *j)
{
    engine *eng = j->eng;
    buffer *b = &eng->ring[eng->queue[eng->queue_head]];
    eng->queue_head = (eng->queue_head + 1) % eng->n_buffers;
    eng->queue_count--;
    b->dir = j->dir;
    eng->held[j->dir]++;
    b->offset = j->next_offset;
    b->bytes = pm__plan_piece(&j->plan, j->pieces_started++, b->offset);
    b->slices = b->slices_left = slices_of(b->bytes, j->slice);
    b->dma = DMA_NOT_QUEUED;
    j->next_offset += b->bytes;
    return b;
}

/* lock held: the next slice of j, which is claimable. A piece whose DMA was
 * queued ahead goes first; otherwise a new piece takes the oldest free buffer. */
static void claim_from(job *j, claim *c)
{
    if (!j->current) {
        if (j->ahead_count > 0) {
            j->current = j->ahead[j->ahead_head];
            j->ahead_head = (j->ahead_head + 1) % AHEAD_MAX;
            j->ahead_count--;
        } else {
            j->current = start_piece(j);
        }
        j->next_slice = 0;
    }
    c->j = j;
    c->b = j->current;
    c->index = j->next_slice++;
    if (j->next_slice == j->current->slices) {
        j->current = NULL;
        if (all_claimed(j) && j->listed)
            pm__staging_unlist(j); /* nothing left to take */
    }
}

claim_result pm__staging_claim_slice(engine *eng, job *only, claim *c, bool may_htod)
{
    if (only) {
        if (all_claimed(only))
            return NOTHING;
        if (!claimable(only))
            return NEED_BUFFER;
        claim_from(only, c);
        return CLAIMED;
    }
    if (!eng->jobs)
        return NOTHING;
    job *start = eng->turn ? eng->turn : eng->jobs, *j = start;
    bool any = false;
    do {
        bool mine = may_htod || j->dir != PM__HTOD;
        any |= mine;
        if (mine && claimable(j)) {
            eng->turn = j->following; /* the next claim serves the next job */
            claim_from(j, c);
            return CLAIMED;
        }
        j = j->following ? j->following : eng->jobs;
    } while (j != start);
    return any ? NEED_BUFFER : NOTHING;
}

/* lock held: whether the ring is split between the directions now (a freed
 * buffer may then be one that only some of its waiters may take). */
static bool split_now(const engine *eng) { return share_of(eng, PM__HTOD) < eng->n_buffers; }

void pm__staging_give_buffer(engine *eng, buffer *b)
{
    eng->queue[(eng->queue_head + eng->queue_count) % eng->n_buffers] = (unsigned)(b - eng->ring);
    eng->queue_count++;
    eng->held[b->dir]--;
    note_event(eng);
    if (split_now(eng))
        pthread_cond_broadcast(&eng->buffer_freed);
    else
        pthread_cond_signal(&eng->buffer_freed);
}

void pm__staging_pass_on_buffer_wake(engine *eng)
{
    if (eng->queue_count > 0 && !split_now(eng))
        pthread_cond_signal(&eng->buffer_freed);
}

/* The CPU half of a slice: bytes [off, off + n) of j between the segments
 * that hold them and ring (into the ring for host to device), timed for the
 * statistics. */
static void cpu_copy(job *j, pm_copy_stores stores, uint8_t *ring, size_t off, size_t n)
{
    unsigned long long t0 = pm__now_ns();
    for (size_t i = pm__segment_at(j->segs, j->n_segs, off); n > 0; i++) {
        const pm__segment *s = &j->segs[i];
        size_t in = off - s->at, take = min_size(s->bytes - in, n);
        if (j->dir == PM__HTOD)
            pm__copy_bytes(ring, s->host + in, take, stores);
        else
            pm__copy_bytes(s->host + in, ring, take, stores);
        ring += take;
        off += take;
        n -= take;
    }
    count_ns(&pm__copy_count.staging_copy_ns, &j->copy_ns, t0);
}

/* Whether b's flag shows its last work done within FLAG_READ_NS. Longer
 * waits, work whose flag write failed, and a stream that failed (whose flag
 * never comes) are left to the marker to answer. */
static bool flag_seen(const engine *eng, const buffer *b)
{
    if (!b->flagged)
        return false;
    const _Atomic uint32_t *f = eng->flags + (size_t)(b - eng->ring) * FLAG_STRIDE;
    const unsigned long long until = pm__now_ns() + FLAG_READ_NS;
    for (unsigned k = 1;; k++) {
        if (atomic_load_explicit(f, memory_order_acquire) == b->flag_value)
            return true;
        if (k % 256 == 0 && pm__now_ns() > until)
            return false;
        cpu_relax();
    }
}

/* Waits until the DMA behind b's marker is done. */
static pm_result wait_marker(engine *eng, job *j, buffer *b)
{
    unsigned long long t0 = pm__now_ns();
    pm__trace_note(eng->trace, PM__TRACE_WAIT_BEGIN, j ? j->id : 0, (unsigned)(b - eng->ring));
    const pm__backend *be = pm__instance_backend();
    pm_result r = PM__TEST_FAULT(pm__fault_marker_wait)
                      ? pm__fail(PM_ERROR_UNKNOWN, "waiting for a staging DMA (injected fault)")
                  : flag_seen(eng, b) ? PM_SUCCESS
                                 : be->marker_synchronize(&b->mark);
    count_ns(&pm__copy_count.staging_wait_ns, j ? &j->wait_ns : NULL, t0);
    pm__trace_note(eng->trace, PM__TRACE_WAIT_END, j ? j->id : 0, (unsigned)(b - eng->ring));
    return r;
}

pm_result pm__staging_wait_previous_dma(engine *eng, job *j, buffer *b)
{
    return b->pending ? wait_marker(eng, j, b) : PM_SUCCESS;
}

/* Where slice c lies in its buffer (the offset), and its length in *n. */
static size_t slice_span(const claim *c, size_t *n)
{
    size_t off = (size_t)c->index * c->j->slice;
    *n = c->b->bytes - off < c->j->slice ? c->b->bytes - off : c->j->slice;
    return off;
}

/* The DMAs of a piece that spans segments from the i-th on: one a segment,
 * in driver calls of up to DMA_GROUP (a 4 MiB buffer of 8 KiB blocks in
 * one). */
enum { DMA_GROUP = 512 };
static pm_result queue_segment_dmas(const pm__backend *be, const job *j, const buffer *b, size_t i)
{
    pm_deviceptr dsts[DMA_GROUP], srcs[DMA_GROUP];
    size_t sizes[DMA_GROUP], n = 0;
    const size_t end = b->offset + b->bytes;
    pm_result r = PM_SUCCESS;
    for (size_t off = b->offset; off < end && r == PM_SUCCESS; i++) {
        const pm__segment *s = &j->segs[i];
        size_t in = off - s->at, take = min_size(s->bytes - in, end - off);
        pm_deviceptr ring = (pm_deviceptr)(uintptr_t)((uint8_t *)b->p + (off - b->offset));
        dsts[n] = j->dir == PM__HTOD ? s->dev + in : ring;
        srcs[n] = j->dir == PM__HTOD ? ring : s->dev + in;
        sizes[n++] = take;
        off += take;
        if (n == DMA_GROUP || off == end) {
            r = pm__copy_backend_batch(be, dsts, srcs, sizes, n, 0, j->stream, j->one_call);
            n = 0;
        }
    }
    return r;
}

pm_result pm__staging_mark_behind(engine *eng, const pm__backend *be, pm_stream_t s, buffer *b,
                                  pm_result r, bool flag)
{
    b->flagged = false;
    if (r == PM_SUCCESS && flag && eng->flags) {
        pm__detail_saved before; /* a flag write that fails leaves the marker: no failure */
        pm__detail_save(&before);
        const size_t at = (size_t)(b - eng->ring) * FLAG_STRIDE * sizeof *eng->flags;
        const uint32_t value = ++b->flag_value;
        b->flagged = !PM__TEST_FAULT(pm__fault_flag_write) &&
                     be->stream_write_flag(s, eng->flags_dev + at, value) == PM_SUCCESS;
        if (!b->flagged)
            pm__detail_restore(&before);
    }
    if (r == PM_SUCCESS)
        r = be->marker_rerecord(s, &b->mark);
    if (r == PM_SUCCESS || be->marker_rerecord(s, &b->mark) == PM_SUCCESS)
        b->pending = true;
    else if (be->stream_synchronize(s) == PM_SUCCESS)
        b->pending = false;
    return r;
}

/* Queues the DMA of b's piece (or its DMAs, one a segment, or its way
 * through the ring's device twin) and re-records b's marker behind it, in
 * the job's place. */
static pm_result queue_dma(job *j, buffer *b)
{
    engine *eng = j->eng;
    const pm__backend *be = pm__instance_backend();
    unsigned long long t0 = pm__now_ns();
    pm__place_scope scope;
    pm_result entered = be->place_enter(&j->place, &scope);
    if (entered != PM_SUCCESS)
        return entered;
    size_t i = pm__segment_at(j->segs, j->n_segs, b->offset);
    const pm__segment *s = &j->segs[i];
    pm_result r;
    bool twin = false;
    if (b->offset + b->bytes <= s->at + s->bytes)
        r = pm__copy_backend(be, j->dir, b->p, s->dev + (b->offset - s->at), b->bytes, j->stream,
                             PM__VIA_PINNED);
    else if (!j->kernel || !(twin = pm__staging_twin_queue(be, j, b, i, &r)))
        r = queue_segment_dmas(be, j, b, i);
    r = pm__staging_mark_behind(eng, be, j->stream, b, r, j->bytes <= FLAGGED_JOB_MAX);
    if (twin && j->dir == PM__HTOD && r == PM_SUCCESS)
        r = pm__staging_twin_scatter(be, j, b);
    be->place_leave(&scope);
    pm__trace_note(eng->trace, PM__TRACE_DMA_QUEUED, j->id, (unsigned)(b - eng->ring));
    count_ns(&pm__copy_count.staging_queue_ns, NULL, t0);
    atomic_fetch_add_explicit(&pm__copy_count.staged_pieces, 1, memory_order_relaxed);
    return r;
}

/* Host to device: copy the slice in; the last slice of a piece queues its DMA. */
static void run_htod_slice(const claim *c, bool skip)
{
    job *j = c->j;
    engine *eng = j->eng;
    buffer *b = c->b;
    size_t n, off = slice_span(c, &n);
    pm_result r = PM_SUCCESS;
    /* pending is written only by the last slice, after every slice of the
     * piece has passed here (ordered by the lock around slices_left). */
    if (!skip)
        r = pm__staging_wait_previous_dma(eng, j, b);
    skip |= r != PM_SUCCESS;
    /* Pieces smaller than a buffer (the ramp at a copy's start, and its last)
     * wait for their slices alone: streaming stores, which cost a thread half
     * the time of demoting ones, start their DMAs sooner. */
    pm_copy_stores stores = j->stores == PM_COPY_STORES_DEMOTING && b->bytes < j->plan.chunk
                                ? PM_COPY_STORES_STREAMING
                                : j->stores;
    if (!skip)
        cpu_copy(j, stores, (uint8_t *)b->p + off, b->offset + off, n);
    pthread_mutex_lock(&eng->lock);
    record_error(j, r);
    bool last = --b->slices_left == 0;
    skip |= j->error != PM_SUCCESS;
    pthread_mutex_unlock(&eng->lock);
    if (!last)
        return;
    if (!skip)
        r = queue_dma(j, b);
    pthread_mutex_lock(&eng->lock);
    record_error(j, r);
    pm__staging_give_buffer(eng, b);
    pthread_mutex_unlock(&eng->lock);
}

void pm__staging_queue_ahead_up_to(job *j, unsigned most)
{
    engine *eng = j->eng;
    pthread_mutex_lock(&eng->lock);
    if (j->queuing_ahead) {
        pthread_mutex_unlock(&eng->lock);
        return;
    }
    j->queuing_ahead = true;
    while (j->error == PM_SUCCESS && j->next_offset < j->bytes &&
           pm__staging_may_take_buffer(eng, j->dir) && j->ahead_count < most) {
        buffer *b = start_piece(j);
        b->dma = DMA_QUEUING;
        j->ahead[(j->ahead_head + j->ahead_count++) % AHEAD_MAX] = b;
        note_event(eng);
        pthread_cond_broadcast(&eng->buffer_freed); /* its slices may be taken */
        pthread_mutex_unlock(&eng->lock);
        pm_result r = pm__staging_wait_previous_dma(eng, j, b);
        if (r == PM_SUCCESS)
            r = queue_dma(j, b);
        pthread_mutex_lock(&eng->lock);
        b->dma = r == PM_SUCCESS ? DMA_QUEUED : DMA_FAILED;
        record_error(j, r);
        pthread_cond_broadcast(&eng->dma_ready);
    }
    j->queuing_ahead = false;
    pthread_mutex_unlock(&eng->lock);
}

/* Device to host: the first slice queues the piece's DMA (unless it was
 * queued ahead); every slice waits for it and copies its part out. */
static void run_dtoh_slice(const claim *c, bool skip)
{
    job *j = c->j;
    engine *eng = j->eng;
    buffer *b = c->b;
    size_t n, off = slice_span(c, &n);
    pm_result r = PM_SUCCESS;
    pthread_mutex_lock(&eng->lock);
    bool first = b->dma == DMA_NOT_QUEUED;
    if (first)
        b->dma = DMA_QUEUING;
    pthread_mutex_unlock(&eng->lock);
    if (first) {
        r = skip ? PM_ERROR_UNKNOWN : pm__staging_wait_previous_dma(eng, j, b);
        if (!skip && r == PM_SUCCESS)
            r = queue_dma(j, b);
        pthread_mutex_lock(&eng->lock);
        b->dma = r == PM_SUCCESS ? DMA_QUEUED : DMA_FAILED;
        if (!skip)
            record_error(j, r);
        pthread_cond_broadcast(&eng->dma_ready);
        pthread_mutex_unlock(&eng->lock);
        if (!skip)
            queue_ahead(j);
    }
    pthread_mutex_lock(&eng->lock);
    while (b->dma == DMA_QUEUING)
        pthread_cond_wait(&eng->dma_ready, &eng->lock);
    bool queued = b->dma == DMA_QUEUED;
    pthread_mutex_unlock(&eng->lock);
    r = PM_SUCCESS;
    if (queued)
        r = wait_marker(eng, j, b);
    if (queued && r == PM_SUCCESS)
        cpu_copy(j, j->stores, (uint8_t *)b->p + off, b->offset + off, n);
    pthread_mutex_lock(&eng->lock);
    record_error(j, r);
    bool last = --b->slices_left == 0;
    if (last) {
        /* Its DMA is done where a wait said so; where none was queued, the
         * marker still stands for the DMA before (queue_dma settled it if it
         * failed). */
        if (queued)
            b->pending = r != PM_SUCCESS;
        pm__staging_give_buffer(eng, b);
    }
    pthread_mutex_unlock(&eng->lock);
    if (last && !skip)
        queue_ahead(j); /* the buffer just freed may take the next piece */
}

void pm__staging_finish_slice(const claim *c)
{
    job *j = c->j;
    engine *eng = j->eng;
    const unsigned where = (unsigned)(c->b - eng->ring) << 16 | c->index;
    pm__trace_note(eng->trace, PM__TRACE_CLAIM, j->id, where);
    pthread_mutex_lock(&eng->lock);
    bool skip = j->error != PM_SUCCESS; /* the job failed already: end it quickly */
    pthread_mutex_unlock(&eng->lock);
    if (j->dir == PM__HTOD)
        run_htod_slice(c, skip);
    else
        run_dtoh_slice(c, skip);
    pm__trace_note(eng->trace, PM__TRACE_SLICE_DONE, j->id, where);
    pthread_mutex_lock(&eng->lock);
    if (++j->slices_done == j->slices)
        pthread_cond_broadcast(&eng->progressed);
    pthread_mutex_unlock(&eng->lock);
}
