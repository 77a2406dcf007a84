/* The staging engine: copies from and to pageable memory through a ring of
 * pinned buffers. Each copy becomes a job of chunk-sized pieces; worker
 * threads (started on first use, never per call) take pieces from all jobs in
 * turn, so several callers are served at once and fairly, and the caller
 * works on its own job too. A piece is a CPU copy into a buffer and a DMA out
 * of it (host to device), or a DMA into a buffer and a CPU copy out of it
 * (device to host); while one piece's DMA runs, other pieces are being copied
 * by the CPU.
 *
 * Buffers are reused oldest first: a buffer whose DMA may still be reading it
 * carries the marker recorded behind that DMA, and the next user waits for
 * that marker before writing into it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../clock.h"
#include "../errors.h"
#include "../instance.h"
#include "copy.h"

typedef struct buffer {
    void *p;
    pm__marker mark; /* behind the last DMA from or into p; reused */
    bool pending;    /* mark may not be done yet */
} buffer;

typedef struct job {
    pm__direction dir;
    uint8_t *host;
    pm_deviceptr dev;
    size_t bytes, chunk;
    pm_stream_t stream;
    bool streaming; /* streaming stores for the CPU copies */
    size_t pieces, next, done; /* guarded by the engine lock */
    pm_result error;           /* the first failure */
    char detail[256];          /* its detail, recorded on the thread it happened on */
    bool listed;               /* on the active list, where workers see it */
    struct job *prev, *following;
} job;

/* Process-wide (part of the instance), guarded by lock; the ring and thread
 * list change only with the copy gate held for writing. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t has_work, progressed, buffer_freed;
    job *jobs;       /* active jobs with pieces left to take */
    job *turn;       /* the job whose turn it is */
    pthread_t *threads;
    unsigned n_threads;
    bool stopping, started;
    buffer *ring;
    unsigned n_buffers;
    unsigned *queue; /* free buffers, oldest first */
    unsigned queue_head, queue_count;
    size_t chunk;
    pm_mem_pool_t pool;
} eng = {.lock = PTHREAD_MUTEX_INITIALIZER,
         .has_work = PTHREAD_COND_INITIALIZER,
         .progressed = PTHREAD_COND_INITIALIZER,
         .buffer_freed = PTHREAD_COND_INITIALIZER};

static void count_ns(_Atomic unsigned long long *counter, unsigned long long since)
{
    atomic_fetch_add_explicit(counter, pm__now_ns() - since, memory_order_relaxed);
}

static buffer *take_buffer(void)
{
    unsigned long long t0 = pm__now_ns();
    pthread_mutex_lock(&eng.lock);
    while (eng.queue_count == 0)
        pthread_cond_wait(&eng.buffer_freed, &eng.lock);
    buffer *b = &eng.ring[eng.queue[eng.queue_head]];
    eng.queue_head = (eng.queue_head + 1) % eng.n_buffers;
    eng.queue_count--;
    pthread_mutex_unlock(&eng.lock);
    if (b->pending) {
        const pm__backend *be = pm__instance_backend();
        if (be->marker_synchronize(&b->mark) != PM_SUCCESS)
            be->stream_synchronize(NULL); /* cannot tell: wait for everything */
        b->pending = false;
    }
    count_ns(&pm__copy_count.staging_wait_ns, t0);
    return b;
}

static void give_buffer(buffer *b)
{
    pthread_mutex_lock(&eng.lock);
    eng.queue[(eng.queue_head + eng.queue_count) % eng.n_buffers] = (unsigned)(b - eng.ring);
    eng.queue_count++;
    pthread_cond_signal(&eng.buffer_freed);
    pthread_mutex_unlock(&eng.lock);
}

/* The CPU half of a piece, timed for the statistics. */
static void cpu_copy(const job *j, void *dst, const void *src, size_t n)
{
    unsigned long long t0 = pm__now_ns();
    pm__copy_bytes(dst, src, n, j->streaming);
    count_ns(&pm__copy_count.staging_copy_ns, t0);
}

/* One piece of a job, through one buffer. */
static pm_result run_piece(const job *j, size_t index)
{
    const pm__backend *be = pm__instance_backend();
    size_t off = index * j->chunk;
    size_t n = j->bytes - off < j->chunk ? j->bytes - off : j->chunk;
    buffer *b = take_buffer();
    pm_result r;
    unsigned long long t0;
    if (j->dir == PM__HTOD) {
        cpu_copy(j, b->p, j->host + off, n);
        t0 = pm__now_ns();
        r = pm__copy_backend(be, PM__HTOD, b->p, j->dev + off, n, j->stream, PM__VIA_PINNED);
        if (r == PM_SUCCESS && be->marker_rerecord(j->stream, &b->mark) == PM_SUCCESS)
            b->pending = true;
        else if (r == PM_SUCCESS)
            r = be->stream_synchronize(j->stream); /* no marker: the buffer must be free now */
        count_ns(&pm__copy_count.staging_queue_ns, t0);
    } else {
        t0 = pm__now_ns();
        r = pm__copy_backend(be, PM__DTOH, b->p, j->dev + off, n, j->stream, PM__VIA_PINNED);
        if (r == PM_SUCCESS)
            r = be->marker_rerecord(j->stream, &b->mark);
        count_ns(&pm__copy_count.staging_queue_ns, t0);
        t0 = pm__now_ns();
        if (r == PM_SUCCESS)
            r = be->marker_synchronize(&b->mark);
        else
            be->stream_synchronize(j->stream); /* the DMA may have been queued */
        count_ns(&pm__copy_count.staging_wait_ns, t0);
        if (r == PM_SUCCESS)
            cpu_copy(j, j->host + off, b->p, n);
    }
    give_buffer(b);
    atomic_fetch_add_explicit(&pm__copy_count.staged_pieces, 1, memory_order_relaxed);
    return r;
}

/* lock held: the next piece to run, from the job whose turn it is (or from
 * only, when only is not NULL), and that job. */
static bool claim_piece(job *only, job **out, size_t *index)
{
    job *j = only;
    if (!j) {
        j = eng.turn ? eng.turn : eng.jobs;
        if (!j)
            return false;
        eng.turn = j->following; /* the next claim serves the next job */
    } else if (j->next == j->pieces) {
        return false;
    }
    *out = j;
    *index = j->next++;
    if (j->next == j->pieces && j->listed) { /* nothing left to take: off the active list */
        j->listed = false;
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
    return true;
}

/* Runs a claimed piece and records its end (lock not held on entry). */
static void finish_piece(job *j, size_t index)
{
    pm_result r = PM_SUCCESS;
    pthread_mutex_lock(&eng.lock);
    bool skip = j->error != PM_SUCCESS; /* the job failed already: end it quickly */
    pthread_mutex_unlock(&eng.lock);
    if (!skip)
        r = run_piece(j, index);
    pthread_mutex_lock(&eng.lock);
    if (r != PM_SUCCESS && j->error == PM_SUCCESS) {
        j->error = r;
        snprintf(j->detail, sizeof j->detail, "%s", pm_last_error_detail());
    }
    if (++j->done == j->pieces)
        pthread_cond_broadcast(&eng.progressed);
    pthread_mutex_unlock(&eng.lock);
}

static void *worker_main(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&eng.lock);
    for (;;) {
        job *j;
        size_t index;
        while (!eng.stopping && !claim_piece(NULL, &j, &index))
            pthread_cond_wait(&eng.has_work, &eng.lock);
        if (eng.stopping)
            break;
        pthread_mutex_unlock(&eng.lock);
        finish_piece(j, index);
        pthread_mutex_lock(&eng.lock);
    }
    pthread_mutex_unlock(&eng.lock);
    return NULL;
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
        pm_mem_free(eng.ring[i].p);
    }
    free(eng.ring);
    free(eng.queue);
    eng.ring = NULL;
    eng.queue = NULL;
    eng.n_buffers = eng.queue_count = eng.queue_head = 0;
}

void pm__staging_stop(void)
{
    pthread_mutex_lock(&eng.lock);
    eng.stopping = true;
    pthread_cond_broadcast(&eng.has_work);
    pthread_mutex_unlock(&eng.lock);
    for (unsigned i = 0; i < eng.n_threads; i++)
        pthread_join(eng.threads[i], NULL);
    free(eng.threads);
    eng.threads = NULL;
    eng.n_threads = 0;
    free_ring();
    pthread_mutex_lock(&eng.lock);
    eng.stopping = false;
    eng.started = false;
    pthread_mutex_unlock(&eng.lock);
}

/* The ring and the workers, made on the first staged copy. Pinning fewer
 * buffers than asked is fine (the budget may allow only some); none is a
 * failure the caller falls back from. lock held. */
static pm_result start_locked(const pm__copy_settings *set)
{
    if (!eng.pool) {
        pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
        pm_result r = pm_mem_pool_create(&eng.pool, &props);
        if (r != PM_SUCCESS)
            return r;
    }
    eng.ring = calloc(set->buffers, sizeof *eng.ring);
    eng.queue = calloc(set->buffers, sizeof *eng.queue);
    if (!eng.ring || !eng.queue) {
        free_ring();
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "copy engine: out of memory");
    }
    pm_result r = PM_SUCCESS;
    for (unsigned i = 0; i < set->buffers; i++) {
        if (pm__copy_injected(&pm__copy_fail_stage_countdown))
            r = pm__fail(PM_ERROR_OUT_OF_MEMORY, "pinning a staging buffer failed (injected fault)");
        else
            r = pm_mem_alloc_from_pool(&eng.ring[i].p, set->chunk_bytes, eng.pool);
        if (r != PM_SUCCESS)
            break;
        eng.queue[i] = i;
        eng.n_buffers = eng.queue_count = i + 1;
    }
    if (eng.n_buffers == 0) {
        free_ring();
        return r;
    }
    eng.chunk = set->chunk_bytes;
    eng.threads = calloc(set->workers, sizeof *eng.threads);
    for (unsigned i = 0; eng.threads && i < set->workers; i++) {
        if (pthread_create(&eng.threads[i], NULL, worker_main, NULL) != 0)
            break;
        eng.n_threads++;
    }
    /* No worker at all still works: callers run their own pieces. */
    eng.started = true;
    return PM_SUCCESS;
}

pm_result pm__staged_copy(const pm__copy_settings *set, pm__direction dir, uint8_t *host,
                          pm_deviceptr dev, size_t bytes, pm_stream_t stream, bool *no_ring)
{
    *no_ring = false;
    pthread_mutex_lock(&eng.lock);
    if (!eng.started) {
        pm_result r = start_locked(set);
        if (r != PM_SUCCESS) {
            pthread_mutex_unlock(&eng.lock);
            *no_ring = true;
            return r;
        }
    }
    job j = {.dir = dir, .host = host, .dev = dev, .bytes = bytes, .chunk = eng.chunk,
             .stream = stream, .streaming = set->streaming_stores,
             .pieces = (bytes + eng.chunk - 1) / eng.chunk};
    if (j.pieces > 1) { /* a single piece is the caller's alone: no hand-off */
        j.listed = true;
        j.following = eng.jobs;
        if (eng.jobs)
            eng.jobs->prev = &j;
        eng.jobs = &j;
        pthread_cond_broadcast(&eng.has_work);
    }
    job *claimed;
    size_t index;
    while (claim_piece(&j, &claimed, &index)) {
        pthread_mutex_unlock(&eng.lock);
        finish_piece(&j, index);
        pthread_mutex_lock(&eng.lock);
    }
    while (j.done < j.pieces)
        pthread_cond_wait(&eng.progressed, &eng.lock);
    pthread_mutex_unlock(&eng.lock);
    if (j.error != PM_SUCCESS)
        return pm__fail(j.error, "%s", j.detail);
    atomic_fetch_add_explicit(&pm__copy_count.staged_bytes, bytes, memory_order_relaxed);
    return PM_SUCCESS;
}
