/* The staging engine: copies from and to pageable memory through a ring of
 * pinned buffers. A copy becomes a job of pieces of up to a buffer, each
 * moved by one DMA; the CPU side of a piece is cut into slices that several
 * threads copy at once. Large DMAs keep the copy engine near its peak (its
 * rate by piece size is in docs/performance.md), while small slices keep
 * every core busy and small first pieces let the first DMA start early
 * (plan.c). A job may be many segments (a batch's pageable blocks), laid end
 * to end: a piece then gathers several, and its DMAs, one a segment, go to
 * the driver in one call where it can take them so; or, for a batch with the
 * kernel (batch.c), by one launch of the batch kernel, whose list of blocks
 * lies at the end of the buffer, so that the buffer's marker guards it too.
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
 * (memcopy.c); whether they do is learnt from timed copies (store_choice.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "../budget.h"
#include "../clock.h"
#include "../errors.h"
#include "../instance.h"
#include "../test_hooks.h"
#include "../thread_start.h"
#include "copy.h"
#include "store_choice.h"
#include "trace.h"

typedef enum { DMA_NOT_QUEUED, DMA_QUEUING, DMA_QUEUED, DMA_FAILED } dma_state;

/* Each buffer's flag lies on a line of 64 bytes of its own, so that threads
 * reading one do not share its line with the writes of another. */
enum { FLAG_STRIDE = 64 / sizeof(uint32_t) };
/* How long a thread reads a flag before it asks the driver instead: longer
 * than a buffer's DMA queued behind the rest of the ring's. */
#define FLAG_READ_NS 2000000ull
/* The largest job whose DMAs get flags: the flag's write fences the stream,
 * which holds the next DMA back a little (1 GiB copies lost 2 points of
 * pinned), while the waits of larger jobs are long beside the driver's
 * answer. */
#define FLAGGED_JOB_MAX ((size_t)64 << 20)

/* The most device-to-host pieces of one job whose DMAs run ahead of the
 * threads that copy them out. */
enum { AHEAD_MAX = 16 };

typedef struct buffer {
    void *p;
    pm__marker mark; /* behind the last DMA from or into p; reused */
    bool pending;    /* mark may not be done yet */
    /* The piece it carries, guarded by the engine lock: */
    pm__direction dir;
    size_t offset, bytes; /* in the job */
    unsigned slices, slices_left;
    dma_state dma; /* device to host */
    /* Where the ring has flags: the value that the flag write behind the
     * last work from or into p stores, and whether that write was queued. */
    uint32_t flag_value;
    bool flagged;
} buffer;

typedef struct job {
    pm__direction dir;
    const pm__segment *segs; /* in order, none empty */
    size_t n_segs;
    size_t bytes, slice;
    pm__piece_plan plan;
    bool one_call; /* a piece's DMAs in one driver call where it takes them */
    bool kernel;   /* pieces whose segments all may move by the batch kernel do */
    pm_stream_t stream;
    pm_copy_stores stores; /* of the CPU copies */
    unsigned store_kind;   /* PM__STORE_PLAIN or PM__STORE_DEMOTING */
    /* Time the job's threads spent copying and waiting for DMAs, for the
     * fillers' count (atomics: threads add without the lock). */
    _Atomic unsigned long long copy_ns, wait_ns;
    /* Guarded by the engine lock: */
    size_t next_offset;          /* where the next piece starts */
    unsigned pieces_started;
    buffer *current;             /* the piece whose slices are being handed out */
    /* Device to host: pieces whose DMAs were queued before any thread took
     * their slices, oldest first, and whether a thread is queuing more. */
    buffer *ahead[AHEAD_MAX];
    unsigned ahead_head, ahead_count;
    bool queuing_ahead;
    unsigned next_slice;         /* of current */
    size_t slices, slices_done;  /* in the whole job */
    pm_result error;             /* the first failure */
    char detail[256];            /* its detail, recorded on the thread it happened on */
    bool listed;                 /* on the active list, where workers see it */
    unsigned id;                 /* for the trace */
    struct job *prev, *following;
} job;

/* A slice handed to a thread. */
typedef struct claim {
    job *j;
    buffer *b;
    unsigned index; /* of the slice in its piece */
} claim;

typedef enum { CLAIMED, NEED_BUFFER, NOTHING } claim_result;

/* Process-wide (part of the instance), guarded by lock; the ring and thread
 * list change only with the copy gate held for writing. */
static struct {
    pthread_mutex_t lock;
    /* has_work: for the workers that take every kind of slice; dtoh_work:
     * for those that take only device-to-host ones */
    pthread_cond_t has_work, dtoh_work, progressed, buffer_freed, dma_ready;
    /* Moved on whenever a slice may have become claimable (a job listed, a
     * buffer freed, a DMA queued ahead), for the workers that spin. */
    _Atomic unsigned long long events;
    _Atomic unsigned long long spin_ns;
    /* Workers spinning now, and how many of them are fillers: a new job
     * wakes sleepers only where these are too few for its slices, as a
     * wake-up costs its caller microseconds and a sleeper joins late. */
    unsigned spinning, spinning_fillers;
    /* Jobs on the list, and whether the engine stops, for spinning workers
     * to read without the lock: an event while neither is so has nothing
     * for them, and they keep spinning rather than queue for the lock. */
    _Atomic unsigned listed;
    _Atomic bool stop_spinning;
    /* How many workers spin after work (the first ones, fillers first), as
     * the latest job of several slices asked (spinners_for), so that no more
     * burn their time than the next such copy needs. */
    unsigned spin_want;
    job *jobs;       /* active jobs with slices left to take */
    /* Jobs running in each direction, buffers each holds, and whether each
     * may then hold at most its share of the ring. */
    unsigned running[2], held[2];
    bool ring_split;
    job *turn;       /* the job whose turn it is */
    pthread_t *threads;
    unsigned n_threads, want_threads; /* running; asked for (a start that failed is retried) */
    unsigned htod_workers; /* the most fillers */
    unsigned fillers;      /* workers 0 .. fillers - 1 take host-to-device slices */
    unsigned dtoh_ahead;   /* the most pieces a device-to-host job queues ahead */
    bool stopping, started;
    pm__trace *trace;  /* NULL unless PINMEM_COPY_TRACE asks */
    unsigned jobs_started;
    buffer *ring;
    unsigned n_buffers;
    unsigned *queue; /* free buffers, oldest first */
    unsigned queue_head, queue_count;
    size_t chunk;
    /* The ring's memory: one pinned range of n_buffers * chunk bytes. */
    void *ring_base;
    /* Device memory as large as the ring, a buffer's twin for each, where
     * kernel jobs' pieces land whole (host to device) or are gathered
     * (device to host) so that one DMA moves each piece: made on the first
     * kernel job; scratch_failed once that failed (kernel jobs then take a
     * DMA a segment). */
    pm_deviceptr scratch;
    bool scratch_failed;
    size_t ring_pin_len;
    unsigned ring_tag;
    /* A flag a buffer in a page pinned at the ring's end, written in stream
     * order behind each buffer's work: a thread that waits for that work
     * reads its flag rather than asking the driver about the marker, which
     * costs 3-13 µs when several threads ask at once. NULL where the
     * backend cannot write flags. */
    _Atomic uint32_t *flags;
    pm_deviceptr flags_dev;
    /* The last ring planned (pm__staging_ring), and when a ring that could
     * not be pinned may be tried again. */
    pm__ring_plan plan;
    unsigned long long retry_after_ns, pinned_at_refusal;
    /* Demoting stores or not, learnt from timed copies, and the filler count
     * steered for each kind (0: none yet), as each needs its own. */
    pm__store_choice store_choice;
    unsigned fillers_of[PM__STORE_CHOICES];
} eng = {.lock = PTHREAD_MUTEX_INITIALIZER,
         .has_work = PTHREAD_COND_INITIALIZER,
         .dtoh_work = PTHREAD_COND_INITIALIZER,
         .progressed = PTHREAD_COND_INITIALIZER,
         .buffer_freed = PTHREAD_COND_INITIALIZER,
         .dma_ready = PTHREAD_COND_INITIALIZER};

/* Adds the time since `since` to the engine's counter and the job's (if any). */
static void count_ns(_Atomic unsigned long long *counter, _Atomic unsigned long long *job_counter,
                     unsigned long long since)
{
    unsigned long long ns = pm__now_ns() - since;
    atomic_fetch_add_explicit(counter, ns, memory_order_relaxed);
    if (job_counter)
        atomic_fetch_add_explicit(job_counter, ns, memory_order_relaxed);
}

static unsigned slices_of(size_t bytes, size_t slice) { return (unsigned)((bytes + slice - 1) / slice); }

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* lock held: something a worker may claim may have changed. */
static void note_event(void) { atomic_fetch_add(&eng.events, 1); }

/* lock held: the most buffers direction dir may hold now. */
static unsigned share_of(pm__direction dir)
{
    if (!eng.ring_split || !eng.running[PM__HTOD] || !eng.running[PM__DTOH] || eng.n_buffers < 2)
        return eng.n_buffers;
    unsigned dtoh = eng.n_buffers / 2;
    return dir == PM__DTOH ? dtoh : eng.n_buffers - dtoh;
}

/* lock held: whether a piece of direction dir may take a free buffer now. */
static bool may_take_buffer(pm__direction dir)
{
    return eng.queue_count > 0 && eng.held[dir] < share_of(dir);
}

static void record_error(job *j, pm_result r)
{
    if (r != PM_SUCCESS && j->error == PM_SUCCESS) {
        j->error = r;
        snprintf(j->detail, sizeof j->detail, "%s", pm_last_error_detail());
    }
}

/* lock held */
static void unlist(job *j)
{
    j->listed = false;
    atomic_fetch_sub(&eng.listed, 1);
    if (eng.turn == j)
        eng.turn = j->following;
    if (j->prev)
        j->prev->following = j->following;
    else
        eng.jobs = j->following;
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
    return j->next_offset < j->bytes && may_take_buffer(j->dir);
}

/* lock held: j's next piece in the oldest free buffer (there is one). */
static buffer *start_piece(job *j)
{
    buffer *b = &eng.ring[eng.queue[eng.queue_head]];
    eng.queue_head = (eng.queue_head + 1) % eng.n_buffers;
    eng.queue_count--;
    b->dir = j->dir;
    eng.held[j->dir]++;
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
            unlist(j); /* nothing left to take */
    }
}

/* lock held: a slice of only, or (only NULL) of the first claimable job from
 * the one whose turn it is, skipping host-to-device jobs unless may_htod. */
static claim_result claim_slice(job *only, claim *c, bool may_htod)
{
    if (only) {
        if (all_claimed(only))
            return NOTHING;
        if (!claimable(only))
            return NEED_BUFFER;
        claim_from(only, c);
        return CLAIMED;
    }
    if (!eng.jobs)
        return NOTHING;
    job *start = eng.turn ? eng.turn : eng.jobs, *j = start;
    bool any = false;
    do {
        bool mine = may_htod || j->dir != PM__HTOD;
        any |= mine;
        if (mine && claimable(j)) {
            eng.turn = j->following; /* the next claim serves the next job */
            claim_from(j, c);
            return CLAIMED;
        }
        j = j->following ? j->following : eng.jobs;
    } while (j != start);
    return any ? NEED_BUFFER : NOTHING;
}

/* lock held: whether the ring is split between the directions now (a freed
 * buffer may then be one that only some of its waiters may take). */
static bool split_now(void) { return share_of(PM__HTOD) < eng.n_buffers; }

/* lock held: b goes back to the free queue. */
static void give_buffer(buffer *b)
{
    eng.queue[(eng.queue_head + eng.queue_count) % eng.n_buffers] = (unsigned)(b - eng.ring);
    eng.queue_count++;
    eng.held[b->dir]--;
    note_event();
    if (split_now())
        pthread_cond_broadcast(&eng.buffer_freed);
    else
        pthread_cond_signal(&eng.buffer_freed);
}

/* lock held, after a wait for a free buffer and the claim that followed it:
 * a thread woken for a buffer it did not take passes the wake on, so that no
 * other thread waiting for one sleeps beside a free buffer. (A split ring
 * wakes every waiter instead: one that may not take the buffer would only
 * pass the wake to another like it.) */
static void pass_on_buffer_wake(void)
{
    if (eng.queue_count > 0 && !split_now())
        pthread_cond_signal(&eng.buffer_freed);
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
static bool flag_seen(const buffer *b)
{
    if (!b->flagged)
        return false;
    const _Atomic uint32_t *f = eng.flags + (size_t)(b - eng.ring) * FLAG_STRIDE;
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
static pm_result wait_marker(job *j, buffer *b)
{
    unsigned long long t0 = pm__now_ns();
    pm__trace_note(eng.trace, PM__TRACE_WAIT_BEGIN, j ? j->id : 0, (unsigned)(b - eng.ring));
    const pm__backend *be = pm__instance_backend();
    pm_result r = PM__TEST_FAULT(pm__fault_marker_wait)
                      ? pm__fail(PM_ERROR_UNKNOWN, "waiting for a staging DMA (injected fault)")
                  : flag_seen(b) ? PM_SUCCESS
                                 : be->marker_synchronize(&b->mark);
    count_ns(&pm__copy_count.staging_wait_ns, j ? &j->wait_ns : NULL, t0);
    pm__trace_note(eng.trace, PM__TRACE_WAIT_END, j ? j->id : 0, (unsigned)(b - eng.ring));
    return r;
}

/* Before b is written again for j: its last DMA must be done. A failed wait
 * (a driver that refuses it on this thread while another captures a graph,
 * say) leaves that DMA possibly still running: b is then not written, stays
 * pending for its next user, and j fails. */
static pm_result wait_previous_dma(job *j, buffer *b)
{
    return b->pending ? wait_marker(j, b) : PM_SUCCESS;
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

/* The bytes at the end of each buffer that a kernel job keeps for the list
 * of a piece's blocks: a sixteenth, so that the list of a buffer of blocks
 * of 400 bytes or more fits. Pieces of kernel jobs end before it. */
static size_t list_reserve(void) { return eng.chunk / 16; }

/* A piece of a kernel job, which spans segments from the i-th on: where
 * every one of them may move by the kernel, their list fits and the ring
 * has its device twin, the piece moves by one DMA between b and b's twin
 * and one launch of the kernel between the twin and the segments' device
 * memory, whose list is written at the end of b (true, the result in *r);
 * otherwise nothing is done (false). Host to device: the DMA, then the
 * kernel scattering; device to host: the kernel gathering, then the DMA. */
static bool queue_launch(const pm__backend *be, const job *j, const buffer *b, size_t i,
                         pm_result *r)
{
    const size_t end = b->offset + b->bytes, cap = list_reserve() / sizeof(pm__block_copy);
    size_t n = 0;
    if (!eng.scratch)
        return false;
    for (size_t k = i, off = b->offset; off < end; k++, n++) {
        if (!j->segs[k].kernel || n == cap)
            return false;
        off = j->segs[k].at + j->segs[k].bytes;
    }
    const pm_deviceptr twin = eng.scratch + (pm_deviceptr)((size_t)(b - eng.ring) * eng.chunk);
    pm__block_copy *list = (pm__block_copy *)((uint8_t *)b->p + eng.chunk - list_reserve());
    n = 0;
    for (size_t off = b->offset; off < end; i++) {
        const pm__segment *s = &j->segs[i];
        size_t in = off - s->at, take = min_size(s->bytes - in, end - off);
        pm_deviceptr near = twin + (off - b->offset);
        list[n++] = (pm__block_copy){.dst = j->dir == PM__HTOD ? s->dev + in : near,
                                     .src = j->dir == PM__HTOD ? near : s->dev + in,
                                     .bytes = take};
        off += take;
    }
    /* The list goes to the twin too: the kernel reads it there, near, rather
     * than across the bus once a part. */
    const pm_deviceptr twin_list = twin + (eng.chunk - list_reserve());
    const pm__block_copy *list_near = (const pm__block_copy *)(uintptr_t)twin_list;
    *r = pm__copy_backend(be, PM__HTOD, list, twin_list, n * sizeof *list, j->stream,
                          PM__VIA_PINNED);
    if (*r == PM_SUCCESS && j->dir == PM__HTOD) {
        *r = pm__copy_backend(be, PM__HTOD, b->p, twin, b->bytes, j->stream, PM__VIA_PINNED);
        if (*r == PM_SUCCESS)
            *r = pm__copy_backend_blocks(be, list, n, list_near, j->stream);
    } else if (*r == PM_SUCCESS) {
        *r = pm__copy_backend_blocks(be, list, n, list_near, j->stream);
        if (*r == PM_SUCCESS)
            *r = pm__copy_backend(be, PM__DTOH, b->p, twin, b->bytes, j->stream, PM__VIA_PINNED);
    }
    if (*r == PM_SUCCESS)
        atomic_fetch_add_explicit(&pm__copy_count.kernel_bytes, b->bytes, memory_order_relaxed);
    return true;
}

/* lock held, as a kernel job starts: the ring's device twin, made once (a
 * failure leaves kernel jobs a DMA a segment). */
static void ensure_scratch_locked(void)
{
    if (eng.scratch || eng.scratch_failed)
        return;
    const pm__backend *be = pm__instance_backend();
    pm_deviceptr d = 0;
    if (be->device_alloc(&d, (size_t)eng.n_buffers * eng.chunk) == PM_SUCCESS)
        eng.scratch = d;
    else
        eng.scratch_failed = true;
}

/* After work from or into b was queued on s (r: how that went): b's flag
 * written behind it, and b's marker re-recorded behind that, so that a done
 * marker means a done flag write (the page may then be freed). Where the
 * work failed, part of it may have been queued all the same: the marker is
 * re-recorded behind it for b's next user to wait for, else the stream
 * waited for, else the marker before stands, as nothing better can be
 * known; the flag is then not read. */
static pm_result mark_behind(const pm__backend *be, pm_stream_t s, buffer *b, pm_result r,
                             bool flag)
{
    b->flagged = false;
    if (r == PM_SUCCESS && flag && eng.flags) {
        pm__detail_saved before; /* a flag write that fails leaves the marker: no failure */
        pm__detail_save(&before);
        const size_t at = (size_t)(b - eng.ring) * FLAG_STRIDE * sizeof *eng.flags;
        const uint32_t value = ++b->flag_value;
        b->flagged = !PM__TEST_FAULT(pm__fault_flag_write) &&
                     be->stream_write_flag(s, eng.flags_dev + at, value) == PM_SUCCESS;
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

/* Queues the DMA of b's piece (or its DMAs, one a segment, or one launch of
 * the batch kernel for them) and re-records b's marker behind it. */
static pm_result queue_dma(const job *j, buffer *b)
{
    const pm__backend *be = pm__instance_backend();
    unsigned long long t0 = pm__now_ns();
    size_t i = pm__segment_at(j->segs, j->n_segs, b->offset);
    const pm__segment *s = &j->segs[i];
    pm_result r;
    if (b->offset + b->bytes <= s->at + s->bytes)
        r = pm__copy_backend(be, j->dir, b->p, s->dev + (b->offset - s->at), b->bytes, j->stream,
                             PM__VIA_PINNED);
    else if (!j->kernel || !queue_launch(be, j, b, i, &r))
        r = queue_segment_dmas(be, j, b, i);
    r = mark_behind(be, j->stream, b, r, j->bytes <= FLAGGED_JOB_MAX);
    pm__trace_note(eng.trace, PM__TRACE_DMA_QUEUED, j->id, (unsigned)(b - eng.ring));
    count_ns(&pm__copy_count.staging_queue_ns, NULL, t0);
    atomic_fetch_add_explicit(&pm__copy_count.staged_pieces, 1, memory_order_relaxed);
    return r;
}

/* Host to device: copy the slice in; the last slice of a piece queues its DMA. */
static void run_htod_slice(const claim *c, bool skip)
{
    job *j = c->j;
    buffer *b = c->b;
    size_t n, off = slice_span(c, &n);
    pm_result r = PM_SUCCESS;
    /* pending is written only by the last slice, after every slice of the
     * piece has passed here (ordered by the lock around slices_left). */
    if (!skip)
        r = wait_previous_dma(j, b);
    skip |= r != PM_SUCCESS;
    /* Pieces smaller than a buffer (the ramp at a copy's start, and its last)
     * wait for their slices alone: streaming stores, which cost a thread half
     * the time of demoting ones, start their DMAs sooner. */
    pm_copy_stores stores = j->stores == PM_COPY_STORES_DEMOTING && b->bytes < j->plan.chunk
                                ? PM_COPY_STORES_STREAMING
                                : j->stores;
    if (!skip)
        cpu_copy(j, stores, (uint8_t *)b->p + off, b->offset + off, n);
    pthread_mutex_lock(&eng.lock);
    record_error(j, r);
    bool last = --b->slices_left == 0;
    skip |= j->error != PM_SUCCESS;
    pthread_mutex_unlock(&eng.lock);
    if (!last)
        return;
    if (!skip)
        r = queue_dma(j, b);
    pthread_mutex_lock(&eng.lock);
    record_error(j, r);
    give_buffer(b);
    pthread_mutex_unlock(&eng.lock);
}

/* Device to host: queues the DMAs of j's next pieces into free buffers, up
 * to most of them, so that the DMA engine never waits for threads to come
 * back from copying out: a piece's threads wait for its DMA, and without
 * this the next DMAs would be queued only by threads that are free. One
 * thread per job at a time, so that the pieces it queues reach the stream in
 * order. Called by j's caller or a thread that holds a slice of j, so j
 * lives. */
static void queue_ahead_up_to(job *j, unsigned most)
{
    pthread_mutex_lock(&eng.lock);
    if (j->queuing_ahead) {
        pthread_mutex_unlock(&eng.lock);
        return;
    }
    j->queuing_ahead = true;
    while (j->error == PM_SUCCESS && j->next_offset < j->bytes && may_take_buffer(j->dir) &&
           j->ahead_count < most) {
        buffer *b = start_piece(j);
        b->dma = DMA_QUEUING;
        j->ahead[(j->ahead_head + j->ahead_count++) % AHEAD_MAX] = b;
        note_event();
        pthread_cond_broadcast(&eng.buffer_freed); /* its slices may be taken */
        pthread_mutex_unlock(&eng.lock);
        pm_result r = wait_previous_dma(j, b);
        if (r == PM_SUCCESS)
            r = queue_dma(j, b);
        pthread_mutex_lock(&eng.lock);
        b->dma = r == PM_SUCCESS ? DMA_QUEUED : DMA_FAILED;
        record_error(j, r);
        pthread_cond_broadcast(&eng.dma_ready);
    }
    j->queuing_ahead = false;
    pthread_mutex_unlock(&eng.lock);
}

static void queue_ahead(job *j) { queue_ahead_up_to(j, eng.dtoh_ahead); }

/* Device to host: the first slice queues the piece's DMA (unless it was
 * queued ahead); every slice waits for it and copies its part out. */
static void run_dtoh_slice(const claim *c, bool skip)
{
    job *j = c->j;
    buffer *b = c->b;
    size_t n, off = slice_span(c, &n);
    pm_result r = PM_SUCCESS;
    pthread_mutex_lock(&eng.lock);
    bool first = b->dma == DMA_NOT_QUEUED;
    if (first)
        b->dma = DMA_QUEUING;
    pthread_mutex_unlock(&eng.lock);
    if (first) {
        r = skip ? PM_ERROR_UNKNOWN : wait_previous_dma(j, b);
        if (!skip && r == PM_SUCCESS)
            r = queue_dma(j, b);
        pthread_mutex_lock(&eng.lock);
        b->dma = r == PM_SUCCESS ? DMA_QUEUED : DMA_FAILED;
        if (!skip)
            record_error(j, r);
        pthread_cond_broadcast(&eng.dma_ready);
        pthread_mutex_unlock(&eng.lock);
        if (!skip)
            queue_ahead(j);
    }
    pthread_mutex_lock(&eng.lock);
    while (b->dma == DMA_QUEUING)
        pthread_cond_wait(&eng.dma_ready, &eng.lock);
    bool queued = b->dma == DMA_QUEUED;
    pthread_mutex_unlock(&eng.lock);
    r = PM_SUCCESS;
    if (queued)
        r = wait_marker(j, b);
    if (queued && r == PM_SUCCESS)
        cpu_copy(j, j->stores, (uint8_t *)b->p + off, b->offset + off, n);
    pthread_mutex_lock(&eng.lock);
    record_error(j, r);
    bool last = --b->slices_left == 0;
    if (last) {
        /* Its DMA is done where a wait said so; where none was queued, the
         * marker still stands for the DMA before (queue_dma settled it if it
         * failed). */
        if (queued)
            b->pending = r != PM_SUCCESS;
        give_buffer(b);
    }
    pthread_mutex_unlock(&eng.lock);
    if (last && !skip)
        queue_ahead(j); /* the buffer just freed may take the next piece */
}

/* Runs a claimed slice and records its end (lock not held on entry). */
static void finish_slice(const claim *c)
{
    job *j = c->j;
    const unsigned where = (unsigned)(c->b - eng.ring) << 16 | c->index;
    pm__trace_note(eng.trace, PM__TRACE_CLAIM, j->id, where);
    pthread_mutex_lock(&eng.lock);
    bool skip = j->error != PM_SUCCESS; /* the job failed already: end it quickly */
    pthread_mutex_unlock(&eng.lock);
    if (j->dir == PM__HTOD)
        run_htod_slice(c, skip);
    else
        run_dtoh_slice(c, skip);
    pm__trace_note(eng.trace, PM__TRACE_SLICE_DONE, j->id, where);
    pthread_mutex_lock(&eng.lock);
    if (++j->slices_done == j->slices)
        pthread_cond_broadcast(&eng.progressed);
    pthread_mutex_unlock(&eng.lock);
}

/* How long a spinning worker naps between looks: sched_yield does not hand
 * the CPU to a thread woken onto it on every kernel, a sleep does. */
enum { SPIN_NAP_NS = 2000 };

/* Lock not held: waits until eng.events moves past seen while a job is
 * listed or the engine stops (true), or the clock passes until (false),
 * looking every few microseconds, so that work queued within the time finds
 * this thread awake. */
static bool spin_for_event(unsigned long long seen, unsigned long long until)
{
    for (unsigned k = 1;; k++) {
        unsigned long long now_seen = atomic_load(&eng.events);
        if (now_seen != seen) {
            /* Read after the event: a job listed before it is seen here. */
            if (atomic_load(&eng.listed) || atomic_load(&eng.stop_spinning))
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
static void lock_awake(void)
{
    for (unsigned k = 0; pthread_mutex_trylock(&eng.lock) != 0; k++) {
        if (k == 1024) {
            pthread_mutex_lock(&eng.lock);
            return;
        }
        cpu_relax();
    }
}

/* lock held: until when worker index, having just worked or woken, spins
 * (0: it sleeps). */
static unsigned long long spin_deadline(unsigned index)
{
    unsigned long long spin = atomic_load_explicit(&eng.spin_ns, memory_order_relaxed);
    return spin && index < eng.spin_want ? pm__now_ns() + spin : 0;
}

static void *worker_main(void *arg)
{
    const unsigned index = (unsigned)(uintptr_t)arg;
    pm__instance_backend()->own_thread_start();
    pm__trace_thread = index + 1;
#ifdef PR_SET_TIMERSLACK
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL); /* naps of microseconds, not of 50 */
#endif
    pthread_mutex_lock(&eng.lock);
    /* Until when the worker spins rather than sleeps: only just after a
     * slice, never while idle for longer. 0: it sleeps. */
    unsigned long long spin_until = 0;
    for (;;) {
        claim c;
        claim_result got = NOTHING;
        bool woke_for_buffer = false;
        while (!eng.stopping &&
               (got = claim_slice(NULL, &c, index < eng.fillers)) != CLAIMED) {
            if (woke_for_buffer)
                pass_on_buffer_wake();
            woke_for_buffer = false;
            if (spin_until) {
                unsigned long long seen = atomic_load_explicit(&eng.events, memory_order_relaxed);
                const bool filler = index < eng.fillers;
                eng.spinning++;
                eng.spinning_fillers += filler;
                pthread_mutex_unlock(&eng.lock);
                bool moved = spin_for_event(seen, spin_until);
                lock_awake();
                eng.spinning--;
                eng.spinning_fillers -= filler;
                if (!moved)
                    spin_until = 0;
                continue;
            }
            woke_for_buffer = got == NEED_BUFFER;
            pthread_cond_t *idle = index < eng.fillers ? &eng.has_work : &eng.dtoh_work;
            pthread_cond_wait(woke_for_buffer ? &eng.buffer_freed : idle, &eng.lock);
            pm__trace_note(eng.trace, PM__TRACE_WAKE, 0, woke_for_buffer);
            /* Woken for work that others took, it sleeps again rather than
             * spin: woken late, it would hold a CPU from a thread that holds a
             * slice (docs/design.md). */
        }
        if (woke_for_buffer)
            pass_on_buffer_wake();
        if (eng.stopping)
            break;
        const bool htod = c.j->dir == PM__HTOD;
        pthread_mutex_unlock(&eng.lock);
        finish_slice(&c);
        pthread_mutex_lock(&eng.lock);
        spin_until = spin_deadline(index);
        /* A filler that stopped being one while it ran a slice (the count was
         * steered down) leaves the rest of the piece to the fillers and the
         * copy's caller, who may all be asleep waiting for a buffer that this
         * very piece holds: wake them. */
        if (htod && index >= eng.fillers) {
            pthread_cond_broadcast(&eng.buffer_freed);
            pthread_cond_broadcast(&eng.has_work);
        }
    }
    pthread_mutex_unlock(&eng.lock);
    return NULL;
}

/* The page of flags pinned at the end of a ring of n buffers: none where
 * the backend cannot write flags (the engine then waits on markers alone).
 * One pinned range with the ring, as a page of its own would lie beside the
 * program's mappings, where the driver would answer for it. */
static size_t flags_bytes(unsigned n)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return pm__instance_backend()->stream_write_flag && n * FLAG_STRIDE * sizeof *eng.flags <= page
               ? page
               : 0;
}

/* lock held, the ring just pinned: its flags, where it has them. */
static void start_flags(void)
{
    const pm__backend *be = pm__instance_backend();
    const size_t bytes = flags_bytes(eng.n_buffers);
    uint8_t *p = (uint8_t *)eng.ring_base + (size_t)eng.n_buffers * eng.chunk;
    pm_deviceptr dev = 0;
    pm__detail_saved before; /* no flags is no failure */
    pm__detail_save(&before);
    if (bytes && be->device_pointer(&dev, p, NULL) == PM_SUCCESS) {
        memset(p, 0, bytes);
        eng.flags = (_Atomic uint32_t *)(void *)p;
        eng.flags_dev = dev;
    }
    pm__detail_restore(&before);
}

/* Frees whatever the ring holds (gate held for writing, or during start). */
static void free_ring(void)
{
    const pm__backend *be = pm__instance_backend();
    for (unsigned i = 0; i < eng.n_buffers; i++) {
        if (eng.ring[i].pending)
            be->marker_synchronize(&eng.ring[i].mark);
        if (eng.ring[i].mark.handle)
            be->marker_release(&eng.ring[i].mark);
    }
    if (eng.ring_base) {
        be->host_free(eng.ring_base, eng.ring_pin_len, eng.ring_tag);
        pm__budget_give(eng.ring_pin_len);
    }
    /* Freed with the ring: its last writes lie behind the markers waited for above. */
    eng.flags = NULL;
    if (eng.scratch)
        be->device_release(eng.scratch); /* its last users were the markers waited for above */
    eng.scratch = 0;
    eng.scratch_failed = false;
    free(eng.ring);
    free(eng.queue);
    eng.ring = NULL;
    eng.queue = NULL;
    eng.ring_base = NULL;
    eng.ring_pin_len = 0;
    eng.n_buffers = eng.queue_count = eng.queue_head = 0;
}

/* The largest ring, whatever the settings ask (buffers of up to 256 MiB, up
 * to 1024 of them): more than this pins memory for no copy's gain. */
#define RING_MAX ((size_t)2 << 30)
/* The smallest: two buffers (one filled while the other's DMA runs) of 64
 * KiB. */
#define RING_MIN_CHUNK ((size_t)64 << 10)
enum { RING_MIN_BUFFERS = 2 };
/* A ring takes at most this share of what the system's limit or the pinned
 * budget lets the process still pin, so that the program's own pinned
 * memory fits beside it. */
enum { RING_SHARE = 4 };
/* After a refusal, how long before a staged copy looks again (unless pinned
 * memory was given back meanwhile): looking reads /proc. */
#define RING_RETRY_NS 100000000ull

static size_t page_floor(size_t n, size_t page) { return n / page * page; }

static void size_text(size_t n, char *buf, size_t cap)
{
    static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    unsigned u = 0;
    while (n >= 1024 && n % 1024 == 0 && u < 4) {
        n /= 1024;
        u++;
    }
    snprintf(buf, cap, "%zu %s", n, units[u]);
}

/* The ring to pin for set now: as configured where it fits, else smaller
 * (buffers halved down to the slice size, then fewer of them, then smaller
 * again down to 64 KiB), else none, with the reason in note. Reads how
 * much may still be pinned; pins nothing. */
static pm__ring_plan plan_ring(const pm__copy_settings *set)
{
    pm__ring_plan p = {.buffers = set->buffers, .chunk = set->chunk_bytes, .fits = true};
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t room = pm__instance_backend()->pinnable_bytes();
    const char *bound = "RLIMIT_MEMLOCK";
    unsigned long long cap = pm__budget_cap(), pinned = pm__budget_pinned();
    if (cap && cap - (pinned < cap ? pinned : cap) < room) {
        room = (size_t)(cap - (pinned < cap ? pinned : cap));
        bound = "the pinned budget";
    }
    size_t allow = room == SIZE_MAX ? SIZE_MAX : room / RING_SHARE;
    if (allow > RING_MAX) {
        allow = RING_MAX;
        bound = NULL; /* the ring's own limit binds */
    }
    if ((size_t)p.buffers * p.chunk <= allow)
        return p;
    size_t floor = set->slice_bytes < p.chunk ? set->slice_bytes : p.chunk;
    floor = floor > RING_MIN_CHUNK ? floor : RING_MIN_CHUNK;
    while ((size_t)p.buffers * p.chunk > allow && page_floor(p.chunk / 2, page) >= floor)
        p.chunk = page_floor(p.chunk / 2, page);
    unsigned fewest = set->buffers < RING_MIN_BUFFERS ? set->buffers : RING_MIN_BUFFERS;
    if ((size_t)p.buffers * p.chunk > allow)
        p.buffers = allow / p.chunk > fewest ? (unsigned)(allow / p.chunk) : fewest;
    while ((size_t)p.buffers * p.chunk > allow && page_floor(p.chunk / 2, page) >= RING_MIN_CHUNK)
        p.chunk = page_floor(p.chunk / 2, page);
    char want[32], left[32];
    size_text(set->chunk_bytes, want, sizeof want);
    size_text(room, left, sizeof left);
    if ((size_t)p.buffers * p.chunk > allow) {
        p.fits = false;
        snprintf(p.note, sizeof p.note,
                 "no staging ring: %s leaves %s to pin, and a ring takes at most a quarter; "
                 "pageable copies take the backend's own path",
                 bound, left);
    } else if (!bound) {
        snprintf(p.note, sizeof p.note,
                 "smaller than the %u x %s configured: a ring pins at most 2 GiB", set->buffers,
                 want);
    } else {
        snprintf(p.note, sizeof p.note,
                 "smaller than the %u x %s configured: %s leaves %s to pin, and a ring takes "
                 "at most a quarter",
                 set->buffers, want, bound, left);
    }
    return p;
}

pm__ring_plan pm__staging_ring(const pm__copy_settings *set)
{
    pthread_mutex_lock(&eng.lock);
    /* The ring pinned, or the last refusal until a copy tries again, or
     * what a copy would pin now. */
    pm__ring_plan p = eng.started || eng.retry_after_ns ? eng.plan : plan_ring(set);
    p.pinned = eng.started;
    pthread_mutex_unlock(&eng.lock);
    return p;
}

/* lock held: pins the ring planned, or fails (nothing pinned, nothing
 * touched where the plan says it cannot fit). */
static pm_result pin_ring(const pm__copy_settings *set)
{
    unsigned long long now = pm__now_ns();
    if (now < eng.retry_after_ns && pm__budget_pinned() >= eng.pinned_at_refusal)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "%s", eng.plan.note);
    eng.plan = plan_ring(set);
    pm_result r = PM_SUCCESS;
    size_t bytes = (size_t)eng.plan.buffers * eng.plan.chunk + flags_bytes(eng.plan.buffers);
    if (!eng.plan.fits)
        r = pm__fail(PM_ERROR_OUT_OF_MEMORY, "%s", eng.plan.note);
    else if (PM__TEST_FAULT(pm__fault_stage_pin))
        r = pm__fail(PM_ERROR_OUT_OF_MEMORY, "pinning the staging ring failed (injected fault)");
    else
        r = pm__budget_take(bytes, "copy engine's staging ring");
    if (r == PM_SUCCESS) {
        const pm__backend *be = pm__instance_backend();
        r = be->host_alloc(bytes, 0, &eng.ring_base, &eng.ring_pin_len, &eng.ring_tag);
        if (r == PM_SUCCESS && eng.ring_pin_len != bytes) { /* the backend pinned more: count it */
            pm_result more =
                pm__budget_take(eng.ring_pin_len - bytes, "copy engine's staging ring");
            if (more != PM_SUCCESS) {
                be->host_free(eng.ring_base, eng.ring_pin_len, eng.ring_tag);
                eng.ring_base = NULL;
                r = more;
            }
        }
        if (r != PM_SUCCESS)
            pm__budget_give(bytes);
    }
    if (r != PM_SUCCESS) {
        eng.ring_base = NULL;
        eng.ring_pin_len = 0;
        if (eng.plan.fits) /* the reason is the failure's */
            snprintf(eng.plan.note, sizeof eng.plan.note,
                     "no staging ring: %s; pageable copies take the backend's own path",
                     pm_last_error_detail());
        eng.plan.fits = false;
        eng.retry_after_ns = now + RING_RETRY_NS;
        eng.pinned_at_refusal = pm__budget_pinned();
        return pm__fail(r, "%s", eng.plan.note);
    }
    eng.retry_after_ns = 0;
    return PM_SUCCESS;
}

/* lock held: starts the workers that are missing (all of them as the engine
 * starts; later, those whose start failed), up to the first failure, which
 * the next staged copy tries again. Meanwhile copies work with fewer, or
 * none: callers run their own slices. */
static void start_workers_locked(void)
{
    if (!eng.threads)
        eng.threads = calloc(eng.want_threads, sizeof *eng.threads);
    while (eng.threads && eng.n_threads < eng.want_threads) {
        unsigned i = eng.n_threads;
        if (pm__thread_start(&eng.threads[i], NULL, worker_main, (void *)(uintptr_t)i) != 0)
            break;
        eng.n_threads++;
    }
}

unsigned pm__staging_threads(void)
{
    pthread_mutex_lock(&eng.lock);
    unsigned n = eng.n_threads;
    pthread_mutex_unlock(&eng.lock);
    return n;
}

unsigned pm__staging_fillers(void)
{
    pthread_mutex_lock(&eng.lock);
    unsigned n = eng.started ? eng.fillers : 0;
    pthread_mutex_unlock(&eng.lock);
    return n;
}

void pm__staging_stop(void)
{
    pthread_mutex_lock(&eng.lock);
    eng.stopping = true;
    atomic_store(&eng.stop_spinning, true);
    note_event(); /* for the workers that spin */
    pthread_cond_broadcast(&eng.has_work);
    pthread_cond_broadcast(&eng.dtoh_work);
    pthread_cond_broadcast(&eng.buffer_freed);
    pthread_mutex_unlock(&eng.lock);
    for (unsigned i = 0; i < eng.n_threads; i++)
        pthread_join(eng.threads[i], NULL);
    free(eng.threads);
    eng.threads = NULL;
    eng.n_threads = eng.want_threads = 0;
    free_ring();
    pthread_mutex_lock(&eng.lock);
    eng.stopping = false;
    atomic_store(&eng.stop_spinning, false);
    eng.started = false;
    eng.retry_after_ns = 0; /* a new shape of ring may fit where the old did not */
    pthread_mutex_unlock(&eng.lock);
}

/* The ring and the workers, made on the first staged copy. The ring is
 * pinned in one piece, as large as configured where the system's limit and
 * the pinned budget leave room for it, else smaller (plan_ring); where none
 * fits, the staged copy fails and the caller falls back to the backend's
 * own path. lock held. */
static pm_result start_locked(const pm__copy_settings *set)
{
    pm_result r = pin_ring(set);
    if (r != PM_SUCCESS)
        return r;
    unsigned n = eng.plan.buffers;
    eng.ring = calloc(n, sizeof *eng.ring);
    eng.queue = calloc(n, sizeof *eng.queue);
    if (!eng.ring || !eng.queue) {
        free_ring();
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "copy engine: out of memory");
    }
    for (unsigned i = 0; i < n; i++) {
        eng.ring[i].p = (uint8_t *)eng.ring_base + (size_t)i * eng.plan.chunk;
        eng.queue[i] = i;
    }
    eng.n_buffers = eng.queue_count = n;
    eng.chunk = eng.plan.chunk;
    start_flags();
    /* Half the ring: enough that the DMA engine never waits for a thread to
     * come back from copying out; the other half is left for other callers'
     * copies. */
    eng.dtoh_ahead = eng.n_buffers / 2 < AHEAD_MAX ? eng.n_buffers / 2 : AHEAD_MAX;
    eng.htod_workers = pm__copy_htod_workers(set);
    eng.fillers = eng.htod_workers / 2 + 1; /* steered from the middle */
    if (eng.fillers > eng.htod_workers)
        eng.fillers = eng.htod_workers;
    /* A new shape of engine learns afresh. */
    memset(&eng.store_choice, 0, sizeof eng.store_choice);
    memset(eng.fillers_of, 0, sizeof eng.fillers_of);
    eng.want_threads = set->workers;
    start_workers_locked();
    eng.trace = pm__trace_get();
    eng.started = true;
    return PM_SUCCESS;
}

/* Whether j counts for the filler count: host-to-device jobs of several whole
 * buffers (the ramp at a copy's start waits little whatever the count). */
static bool steers_fillers(const job *j)
{
    return j->dir == PM__HTOD && j->bytes >= 8 * j->plan.chunk;
}

/* lock held, after a host-to-device job: one filler more when its threads
 * hardly waited for DMAs (the CPU side could not keep up), one fewer when
 * they waited for more than a third of the time they copied (the DMA engine
 * needed fewer, and fewer threads copying let it read faster). Narrower
 * bands gained nothing (docs/design.md). Each kind of stores keeps its own
 * count. */
static void steer_fillers(job *j)
{
    if (!steers_fillers(j))
        return;
    unsigned long long copy = atomic_load(&j->copy_ns), wait = atomic_load(&j->wait_ns);
    if (wait * 10 < copy && eng.fillers < eng.htod_workers) {
        eng.fillers++;
        pthread_cond_broadcast(&eng.dtoh_work); /* a new filler may sleep there */
    } else if (wait * 3 > copy && eng.fillers > 1) { /* more than a third */
        eng.fillers--;
    }
    eng.fillers_of[j->store_kind] = eng.fillers;
}

/* lock held, as a job that steers the fillers starts: the count last steered
 * for its kind of stores. Demoting stores start from twice the count of the
 * other kind, as each thread copies about half as fast with them. */
static void take_fillers_of(const job *j)
{
    unsigned n = eng.fillers_of[j->store_kind];
    if (n == 0 && j->store_kind == PM__STORE_DEMOTING)
        n = 2 * eng.fillers < eng.htod_workers ? 2 * eng.fillers : eng.htod_workers;
    if (!steers_fillers(j) || n == 0 || n == eng.fillers)
        return;
    if (n > eng.fillers)
        pthread_cond_broadcast(&eng.dtoh_work); /* new fillers may sleep there */
    eng.fillers = n;
}

/* A job that may demote chooses its stores (lock held). Only synchronous
 * copies are timed: the caller waits for the stream next anyway. */
static void choose_stores(const pm__copy_settings *set, job *j, bool sync, unsigned *size_class,
                          bool *timed)
{
    j->stores = pm__copy_stores_for(set, j->dir, j->bytes);
    *timed = false;
    if (pm__copy_may_demote(set, j->dir, j->bytes)) {
        *size_class = pm__store_class_of(j->bytes);
        *timed = sync;
        if (pm__store_choose(&eng.store_choice, *size_class, *timed) == PM__STORE_DEMOTING)
            j->stores = PM_COPY_STORES_DEMOTING;
    }
    /* Demoting stores by configuration steer their own filler count too. */
    j->store_kind = j->stores == PM_COPY_STORES_DEMOTING ? PM__STORE_DEMOTING : PM__STORE_PLAIN;
}

/* Times a finished job until its last DMA is done (lock not held). */
static void time_job(const job *j, unsigned size_class, unsigned long long t0)
{
    if (pm__instance_backend()->stream_synchronize(j->stream) != PM_SUCCESS)
        return; /* the caller's own wait reports it */
    double gbps = (double)j->bytes / (double)(pm__now_ns() - t0 + 1);
    pthread_mutex_lock(&eng.lock);
    pm__store_report(&eng.store_choice, size_class, j->store_kind, gbps);
    pthread_mutex_unlock(&eng.lock);
}

/* lock held: how many workers should spin after j for the next copy like
 * it: its helpers where it is at most a buffer, for which a wake-up (15-25
 * µs on a virtual machine) is a large share of the copy, but at most half
 * the engine's threads, so that a thread preempted while it holds a slice
 * finds a CPU free (with every worker spinning, 4 MiB copies from the device
 * fell to 5-7% of pinned in some runs); none after larger copies, whose
 * workers join late at a small cost and would only burn the CPUs meanwhile. */
static unsigned spinners_for(const job *j)
{
    if (j->bytes > eng.chunk)
        return 0;
    const unsigned most = (eng.n_threads + 1) / 2;
    return j->slices - 1 < most ? (unsigned)(j->slices - 1) : most;
}

/* lock held: a job of direction dir starts (1) or ends (-1). As the last of
 * one direction ends beside the other's, the ring is whole again for the
 * other: its waiters may now take what they could not. */
static void count_running(pm__direction dir, int change)
{
    eng.running[dir] = (unsigned)((int)eng.running[dir] + change);
    if (change < 0 && eng.running[dir] == 0 && eng.running[dir ^ 1]) {
        note_event();
        pthread_cond_broadcast(&eng.buffer_freed);
    }
}

/* lock held: the engine started, or the reason it cannot be (no ring). */
static pm_result ensure_started_locked(const pm__copy_settings *set)
{
    if (!eng.started)
        return start_locked(set);
    if (eng.n_threads < eng.want_threads)
        start_workers_locked();
    return PM_SUCCESS;
}

static pm_result staged(const pm__copy_settings *set, pm__direction dir, const pm__segment *segs,
                        size_t n_segs, size_t bytes, pm_stream_t stream, bool sync, bool kernel,
                        bool *no_ring)
{
    *no_ring = false;
    pthread_mutex_lock(&eng.lock);
    pm_result started = ensure_started_locked(set);
    if (started != PM_SUCCESS) {
        pthread_mutex_unlock(&eng.lock);
        *no_ring = true;
        return started;
    }
    /* After the engine's start, which would weigh on the first copy's time. */
    const unsigned long long t0 = pm__now_ns();
    eng.ring_split = set->ring_split;
    atomic_store_explicit(&eng.spin_ns, set->spin_ns, memory_order_relaxed);
    job j = {.dir = dir, .segs = segs, .n_segs = n_segs, .bytes = bytes, .stream = stream,
             .one_call = set->batch != PM_COPY_BATCH_EACH, .kernel = kernel};
    if (kernel)
        ensure_scratch_locked();
    j.plan = pm__plan_pieces(set, dir, kernel ? eng.chunk - list_reserve() : eng.chunk, bytes);
    j.slice = j.plan.slice;
    unsigned size_class = 0;
    bool timed;
    choose_stores(set, &j, sync, &size_class, &timed);
    take_fillers_of(&j);
    j.slices = pm__plan_slices(&j.plan);
    j.id = ++eng.jobs_started;
    pm__trace_note(eng.trace, PM__TRACE_JOB_START, j.id,
                   (unsigned)(bytes >> 10 & 0x7fffffff) | (unsigned)(dir == PM__DTOH) << 31);
    count_running(dir, 1);
    /* From the device, the first piece's DMA is queued before the workers
     * are woken, which costs the caller 15-25 µs: the DMA runs meanwhile. */
    const bool dma_first = dir == PM__DTOH && j.slices > 1;
    if (dma_first) {
        pthread_mutex_unlock(&eng.lock);
        queue_ahead_up_to(&j, 1);
        pthread_mutex_lock(&eng.lock);
    }
    if (j.slices > 1) { /* a single slice is the caller's alone: no hand-off */
        eng.spin_want = spinners_for(&j);
        j.listed = true;
        atomic_fetch_add(&eng.listed, 1); /* before the event that announces it */
        j.following = eng.jobs;
        if (eng.jobs)
            eng.jobs->prev = &j;
        eng.jobs = &j;
        note_event();
        /* Every sleeper is woken unless enough workers spin: the first of
         * many to wake joins sooner than any one woken alone. */
        unsigned awake = dir == PM__HTOD ? eng.spinning_fillers : eng.spinning;
        if (awake + 1 < j.slices) {
            pthread_cond_broadcast(&eng.has_work);
            if (dir == PM__DTOH)
                pthread_cond_broadcast(&eng.dtoh_work);
        }
        /* Workers waiting for a buffer for another job may take this one's. */
        pthread_cond_broadcast(&eng.buffer_freed);
    }
    if (dma_first) { /* and the next pieces' behind it */
        pthread_mutex_unlock(&eng.lock);
        queue_ahead(&j);
        pthread_mutex_lock(&eng.lock);
    }
    claim c;
    claim_result got;
    bool woke_for_buffer = false;
    while ((got = claim_slice(&j, &c, true)) != NOTHING) {
        if (woke_for_buffer)
            pass_on_buffer_wake();
        woke_for_buffer = got == NEED_BUFFER;
        if (woke_for_buffer) {
            pthread_cond_wait(&eng.buffer_freed, &eng.lock);
            continue;
        }
        pthread_mutex_unlock(&eng.lock);
        finish_slice(&c);
        pthread_mutex_lock(&eng.lock);
    }
    if (woke_for_buffer)
        pass_on_buffer_wake();
    while (j.slices_done < j.slices)
        pthread_cond_wait(&eng.progressed, &eng.lock);
    if (j.listed)
        unlist(&j);
    count_running(dir, -1);
    pm__trace_note(eng.trace, PM__TRACE_JOB_END, j.id, 0);
    if (j.error == PM_SUCCESS)
        steer_fillers(&j);
    pthread_mutex_unlock(&eng.lock);
    if (j.error != PM_SUCCESS)
        return pm__fail(j.error, "%s", j.detail);
    if (timed)
        time_job(&j, size_class, t0);
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

/* lock held: the oldest free buffer, for a list of blocks (there is one).
 * It counts as a host-to-device buffer while held (give_buffer). */
static buffer *take_buffer(void)
{
    buffer *b = &eng.ring[eng.queue[eng.queue_head]];
    eng.queue_head = (eng.queue_head + 1) % eng.n_buffers;
    eng.queue_count--;
    b->dir = PM__HTOD;
    eng.held[PM__HTOD]++;
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
    pthread_mutex_lock(&eng.lock);
    pm_result r = ensure_started_locked(set);
    if (r != PM_SUCCESS) {
        pthread_mutex_unlock(&eng.lock);
        *no_ring = true;
        return r;
    }
    const size_t per = eng.chunk / sizeof *blocks;
    unsigned long long bytes = 0;
    for (size_t done = 0; done < n && r == PM_SUCCESS;) {
        bool woke = false;
        while (eng.queue_count == 0) {
            pthread_cond_wait(&eng.buffer_freed, &eng.lock);
            woke = true;
        }
        buffer *b = take_buffer();
        if (woke)
            pass_on_buffer_wake();
        pthread_mutex_unlock(&eng.lock);
        const size_t k = min_size(per, n - done);
        unsigned long long t0 = pm__now_ns();
        r = wait_previous_dma(NULL, b); /* failed: b is left as it is, pending */
        if (r == PM_SUCCESS) {
            memcpy(b->p, blocks + done, k * sizeof *blocks);
            r = mark_behind(be, stream, b, pm__copy_backend_blocks(be, b->p, k, NULL, stream),
                            true);
        }
        count_ns(&pm__copy_count.staging_queue_ns, NULL, t0);
        for (size_t i = done; i < done + k; i++)
            bytes += blocks[i].bytes;
        done += k;
        pthread_mutex_lock(&eng.lock);
        give_buffer(b);
    }
    pthread_mutex_unlock(&eng.lock);
    if (r == PM_SUCCESS)
        atomic_fetch_add_explicit(&pm__copy_count.kernel_bytes, bytes, memory_order_relaxed);
    return r;
}
