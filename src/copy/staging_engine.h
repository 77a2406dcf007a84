/* The staging engine's shared parts, for its files alone (staging*.c): the
 * buffers of the ring, a job and the slices claimed from it, the engines (one
 * a device), the small helpers the hot paths inline, and what each file
 * offers the others. staging.c says how an engine works. */
#ifndef PINMEM_STAGING_ENGINE_H
#define PINMEM_STAGING_ENGINE_H

#include <pthread.h>
#include <sys/types.h>

#include "../clock.h"
#include "copy.h"
#include "store_choice.h"
#include "trace.h"

typedef enum { DMA_NOT_QUEUED, DMA_QUEUING, DMA_QUEUED, DMA_FAILED } dma_state;

/* Each buffer's flag lies on a line of 64 bytes of its own, so that threads
 * reading one do not share its line with the writes of another. */
enum { FLAG_STRIDE = 64 / sizeof(uint32_t) };

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
    /* Where the ring has its device twin: the marker behind the last launch
     * from or into p's twin (on the engine's launch stream), whether it may
     * not be done yet, and how many blocks the list of p's piece holds. */
    pm__marker twin_mark;
    bool twin_pending;
    size_t list_count;
} buffer;

struct engine;

typedef struct job {
    struct engine *eng; /* the engine that runs it */
    pm__direction dir;
    const pm__segment *segs; /* in order, none empty */
    size_t n_segs;
    size_t bytes, slice;
    pm__piece_plan plan;
    bool one_call; /* a piece's DMAs in one driver call where it takes them */
    bool kernel;   /* pieces whose segments all may move by the batch kernel do */
    /* Some piece was scattered on the launch stream, which the job's stream
     * waits for at the job's end (atomic: set by the pieces' threads). */
    _Atomic bool launched;
    pm_stream_t stream;
    pm__place place; /* the caller's, which every thread queuing the job's work enters */
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

/* A stream of the engine's own for copies on their caller's own stream
 * (staging_lanes.c), in place context, used by one copy at a time; a
 * one-off lane is made for one copy and released at its end. */
typedef struct pm__lane {
    pm_stream_t stream;
    void *context;
    pm__marker end; /* kept lanes: the end of the last copy's work (handle NULL: none) */
    pid_t last_thread; /* and the thread (its id, slow to recur) and stream that copy followed */
    pm_stream_t last_own;
    bool busy, one_off;
} pm__lane;

/* The most lanes: one for each thread copying on its own stream at once. */
enum { PM__LANES_MAX = 16 };

/* A slice handed to a thread. */
typedef struct claim {
    job *j;
    buffer *b;
    unsigned index; /* of the slice in its piece */
} claim;

typedef enum { CLAIMED, NEED_BUFFER, NOTHING } claim_result;

/* One a device, process-wide (part of the instance), guarded by lock; the
 * ring and thread list change only with the copy gate held for writing. */
typedef struct engine {
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
     * the latest job of several slices asked (pm__staging_spinners_for), so
     * that no more burn their time than the next such copy needs. */
    unsigned spin_want;
    job *jobs;       /* active jobs with slices left to take */
    /* Jobs running in each direction, buffers each holds, and whether each
     * may then hold at most its share of the ring. */
    unsigned running[2], held[2];
    bool ring_split;
    job *turn;       /* the job whose turn it is */
    pthread_t *threads;
    struct worker_start *starts; /* each worker's engine and index */
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
    /* The stream of the launches between the twins and the blocks, made with
     * the twin (staging_twin.c says why it is not the copy's). */
    pm_stream_t launches;
    /* The lanes, and how many are being made (lock). */
    pm__lane lanes[PM__LANES_MAX];
    unsigned n_lanes, lanes_making;
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
} engine;

/* The engines (staging_engine.c), one a device: a copy runs on the engine of
 * the device whose memory it moves, so that copies to several devices at once
 * each have a ring and workers of their own (devices past PM__ENGINES_MAX
 * share, by their ordinal's remainder). Its files call an engine eng. */
enum { PM__ENGINES_MAX = 16 };
extern engine pm__staging_engines[PM__ENGINES_MAX];
/* The engine of a copy whose device memory is at dev. */
engine *pm__staging_engine_for(const pm__backend *be, pm_deviceptr dev);

/* Adds the time since `since` to the engine's counter and the job's (if any). */
static inline void count_ns(_Atomic unsigned long long *counter,
                            _Atomic unsigned long long *job_counter, unsigned long long since)
{
    unsigned long long ns = pm__now_ns() - since;
    atomic_fetch_add_explicit(counter, ns, memory_order_relaxed);
    if (job_counter)
        atomic_fetch_add_explicit(job_counter, ns, memory_order_relaxed);
}

static inline size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* lock held: something a worker may claim may have changed. */
static inline void note_event(engine *eng) { atomic_fetch_add(&eng->events, 1); }

/* The bytes a kernel job leaves free in each buffer for the list of a
 * piece's blocks, which lies right after the piece's bytes: a sixteenth, so
 * that the list of a buffer of blocks of 400 bytes or more fits. */
static inline size_t list_reserve(const engine *eng) { return eng->chunk / 16; }

/* staging_lanes.c: copies on a lane instead of their caller's stream. */
/* Work queued on waiter from now on follows the work queued on s so far. */
pm_result pm__staging_follow(const pm__backend *be, pm_stream_t waiter, pm_stream_t s);
/* Where a job runs on a lane: its caller's stream own, named in the caller's
 * place (where the legacy and per-thread handles are the caller's), and the
 * lane's place, the same or the context of the job's device memory. */
typedef struct pm__lane_places {
    pm__place own, lane;
} pm__lane_places;
/* Lock not held: a lane of at->lane that follows own, for a job whose
 * workers queue its work there (a kept one, or one made for this job in
 * spare, which must outlive the job); NULL where none could be had. */
pm__lane *pm__staging_lane_enter(engine *eng, const pm__lane_places *at, pm_stream_t own,
                                  pm__lane *spare);
/* Lock not held, at the job's end: own follows the lane (or, where that
 * cannot be queued, the lane's work is done), and the lane is free again. */
pm_result pm__staging_lane_leave(engine *eng, const pm__lane_places *at, pm_stream_t own,
                                 pm__lane *lane);
/* As the ring is freed (no job running): every lane's work waited for and
 * its stream destroyed. */
void pm__staging_release_lanes(engine *eng);

/* staging_twin.c: kernel jobs' pieces through the ring's device twin. */
/* lock held, as a kernel job starts: the ring's device twin and the launch
 * stream, made once (a failure leaves kernel jobs a DMA a segment). */
void pm__staging_ensure_twin_locked(engine *eng);
/* As the ring is freed (no job running): the launch stream waited for and
 * destroyed, the twin and its markers released. */
void pm__staging_release_twin(engine *eng);
/* A piece of kernel job j in b, which spans segments from the i-th on: where
 * every one of them may move by the kernel, their list fits and the ring has
 * its twin, it is queued through the twin (true, the result in *r), else
 * nothing is done (false). Host to device: the DMA of the piece and its list
 * into the twin, whose launch pm__staging_twin_scatter queues once b's
 * marker is behind that DMA; device to host: the gather and the DMA back. */
bool pm__staging_twin_queue(const pm__backend *be, job *j, buffer *b, size_t i, pm_result *r);
/* Device to host, as kernel job j starts: the launch stream waits for the
 * work before j on j's stream, once, so that its gathers need not wait for
 * j's own DMAs there (each would then wait for the DMA before it). False
 * where that could not be queued: j's pieces then take a DMA a segment. */
bool pm__staging_twin_start(const pm__backend *be, job *j);
/* Host to device: the launch scattering b's twin into the blocks, after b's
 * marker. */
pm_result pm__staging_twin_scatter(const pm__backend *be, job *j, buffer *b);
/* At j's end: its stream waits for the launches it queued, so that later
 * work on it finds the blocks written. */
pm_result pm__staging_twin_join(const pm__backend *be, const job *j);

/* staging_slices.c: claiming and running slices, the DMAs and the waits. */
/* lock held: whether a piece of direction dir may take a free buffer now:
 * one is free and, while the ring is split, dir holds less than its half. */
bool pm__staging_may_take_buffer(const engine *eng, pm__direction dir);
/* lock held: takes j off the list of active jobs. */
void pm__staging_unlist(job *j);
/* lock held: a slice of only, or (only NULL) of the first claimable job from
 * the one whose turn it is, skipping host-to-device jobs unless may_htod. */
claim_result pm__staging_claim_slice(engine *eng, job *only, claim *c, bool may_htod);
/* lock held: b goes back to the free queue. */
void pm__staging_give_buffer(engine *eng, buffer *b);
/* lock held, after a wait for a free buffer and the claim that followed it:
 * a thread woken for a buffer it did not take passes the wake on, so that no
 * other thread waiting for one sleeps beside a free buffer. (A split ring
 * wakes every waiter instead: one that may not take the buffer would only
 * pass the wake to another like it.) */
void pm__staging_pass_on_buffer_wake(engine *eng);
/* Before b is written again for j: its last DMA must be done. A failed wait
 * (a driver that refuses it on this thread while another captures a graph,
 * say) leaves that DMA possibly still running: b is then not written, stays
 * pending for its next user, and j fails. */
pm_result pm__staging_wait_previous_dma(engine *eng, job *j, buffer *b);
/* After work from or into b was queued on s (r: how that went): b's flag
 * written behind it, and b's marker re-recorded behind that, so that a done
 * marker means a done flag write (the page may then be freed). Where the
 * work failed, part of it may have been queued all the same: the marker is
 * re-recorded behind it for b's next user to wait for, else the stream
 * waited for, else the marker before stands, as nothing better can be
 * known; the flag is then not read. */
pm_result pm__staging_mark_behind(engine *eng, const pm__backend *be, pm_stream_t s, buffer *b,
                                  pm_result r, bool flag);
/* Device to host: queues the DMAs of j's next pieces into free buffers, up
 * to most of them, so that the DMA engine never waits for threads to come
 * back from copying out: a piece's threads wait for its DMA, and without
 * this the next DMAs would be queued only by threads that are free. One
 * thread per job at a time, so that the pieces it queues reach the stream in
 * order. Called by j's caller or a thread that holds a slice of j, so j
 * lives. */
void pm__staging_queue_ahead_up_to(job *j, unsigned most);
/* The same, as far ahead as the ring lets a job run. */
static inline void queue_ahead(job *j) { pm__staging_queue_ahead_up_to(j, j->eng->dtoh_ahead); }
/* Runs a claimed slice and records its end (lock not held on entry). */
void pm__staging_finish_slice(const claim *c);

/* staging_steer.c: the fillers' count, the stores, the spinners. */
/* lock held, after a host-to-device job: one filler more when its threads
 * hardly waited for DMAs (the CPU side could not keep up), one fewer when
 * they waited for more than a third of the time they copied (the DMA engine
 * needed fewer, and fewer threads copying let it read faster). Narrower
 * bands gained nothing (docs/design.md). Each kind of stores keeps its own
 * count. */
void pm__staging_steer_fillers(job *j);
/* lock held, as a job that steers the fillers starts: the count last steered
 * for its kind of stores. Demoting stores start from twice the count of the
 * other kind, as each thread copies about half as fast with them. */
void pm__staging_take_fillers_of(const job *j);
/* A job that may demote chooses its stores (lock held). Only synchronous
 * copies are timed: the caller waits for the stream next anyway. */
void pm__staging_choose_stores(const pm__copy_settings *set, job *j, bool sync,
                               unsigned *size_class, bool *timed);
/* Times a finished job until its last DMA is done (lock not held). */
void pm__staging_time_job(const job *j, unsigned size_class, unsigned long long t0);
/* lock held: how many workers should spin after j for the next copy like
 * it: its helpers where it is at most a buffer, for which a wake-up (15-25
 * µs on a virtual machine) is a large share of the copy, but at most half
 * the engine's threads, so that a thread preempted while it holds a slice
 * finds a CPU free (with every worker spinning, 4 MiB copies from the device
 * fell to 5-7% of pinned in some runs); none after larger copies, whose
 * workers join late at a small cost and would only burn the CPUs meanwhile. */
unsigned pm__staging_spinners_for(const job *j);
/* lock held: a job of direction dir starts (1) or ends (-1). As the last of
 * one direction ends beside the other's, the ring is whole again for the
 * other: its waiters may now take what they could not. */
void pm__staging_count_running(engine *eng, pm__direction dir, int change);

/* staging_workers.c: the worker threads. */
/* lock held: starts the workers that are missing (all of them as the engine
 * starts; later, those whose start failed), up to the first failure, which
 * the next staged copy tries again. Meanwhile copies work with fewer, or
 * none: callers run their own slices. */
void pm__staging_start_workers_locked(engine *eng);

/* staging_ring.c: the ring, and the engine's start and stop. */
/* lock held: the engine started, or the reason it cannot be (no ring). */
pm_result pm__staging_ensure_started_locked(engine *eng, const pm__copy_settings *set);

#endif
