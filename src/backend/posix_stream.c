/* POSIX streams: an ordered queue of work run by one thread, so that
 * stream-ordered behaviour (pools' reuse rules, asynchronous copies) runs for
 * real without a GPU. A marker is the stream plus a sequence number; it holds
 * a reference, so a marker outliving pm_stream_destroy stays valid. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../errors.h"
#include "../handle_set.h"
#include "../thread_start.h"
#include "backend.h"
#include "posix_stream.h"

typedef struct task {
    void (*fn)(void *);
    void *arg;
} task;

typedef struct posix_stream {
    pthread_mutex_t lock; /* guards everything below but completed's reads */
    pthread_cond_t has_work, progressed;
    task *ring;
    size_t cap, head, count;
    unsigned long long enqueued;
    _Atomic unsigned long long completed;
    unsigned long long id; /* never reused */
    int refs; /* the creator's, plus one per live marker or pending wait */
    bool stopping;
    bool released; /* the thread drops the creator's reference as it ends */
    pthread_t thread;
    pid_t pid; /* the process whose thread runs it (a forked child has none) */
    struct posix_stream *next_own, *prev_own; /* threads' own streams, under own_lock */
} posix_stream;

static void drop_ref(posix_stream *s);

static void *stream_main(void *arg)
{
    posix_stream *s = arg;
    pm__thread_begin("pinmem-stream");
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (s->count == 0 && !s->stopping)
            pthread_cond_wait(&s->has_work, &s->lock);
        if (s->count == 0)
            break;
        task t = s->ring[s->head];
        s->head = (s->head + 1) % s->cap;
        s->count--;
        pthread_mutex_unlock(&s->lock);
        t.fn(t.arg);
        pthread_mutex_lock(&s->lock);
        atomic_store_explicit(&s->completed, atomic_load(&s->completed) + 1,
                              memory_order_release);
        pthread_cond_broadcast(&s->progressed);
    }
    const bool released = s->released;
    pthread_mutex_unlock(&s->lock);
    if (released)
        drop_ref(s);
    return NULL;
}

static void destroy_stream(posix_stream *s);
static void synchronize_stream(posix_stream *s);

static void drop_ref(posix_stream *s)
{
    pthread_mutex_lock(&s->lock);
    bool last = --s->refs == 0;
    pthread_mutex_unlock(&s->lock);
    if (!last)
        return;
    pthread_cond_destroy(&s->has_work);
    pthread_cond_destroy(&s->progressed);
    pthread_mutex_destroy(&s->lock);
    free(s->ring);
    free(s);
}

/* A marker at the end of s's work so far, holding a reference to s until
 * released. */
static pm__marker hold_end(posix_stream *s)
{
    pthread_mutex_lock(&s->lock);
    const pm__marker m = {.handle = s, .seq = s->enqueued};
    s->refs++;
    pthread_mutex_unlock(&s->lock);
    return m;
}

static _Atomic unsigned long long last_id;

static pm_result create(posix_stream **out)
{
    posix_stream *s = calloc(1, sizeof *s);
    if (!s)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "pm_stream_create: out of memory");
    s->id = atomic_fetch_add(&last_id, 1) + 1;
    s->cap = 64;
    s->ring = malloc(s->cap * sizeof *s->ring);
    s->refs = 1;
    s->pid = getpid();
    atomic_init(&s->completed, 0);
    const bool made = s->ring && pthread_mutex_init(&s->lock, NULL) == 0;
    const bool has_work = made && pthread_cond_init(&s->has_work, NULL) == 0;
    const bool progressed = has_work && pthread_cond_init(&s->progressed, NULL) == 0;
    if (!progressed) {
        if (has_work)
            pthread_cond_destroy(&s->has_work);
        if (made)
            pthread_mutex_destroy(&s->lock);
        free(s->ring);
        free(s);
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "pm_stream_create: out of memory");
    }
    if (pm__thread_start(&s->thread, NULL, stream_main, s) != 0) {
        s->refs = 1;
        drop_ref(s);
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "pm_stream_create: cannot start its thread");
    }
    *out = s;
    return PM_SUCCESS;
}

/* Every live stream, so a handle that is not one is refused, not followed.
 * Each thread remembers the last handle it checked, while the set's
 * generation (moved on by every destroy) stays the same. */
static pm__handle_set live_streams = PM__HANDLE_SET_INIT;
static _Thread_local posix_stream *checked_stream __attribute__((tls_model("initial-exec")));
static _Thread_local unsigned long long checked_generation
    __attribute__((tls_model("initial-exec")));

static bool is_live(posix_stream *s)
{
    unsigned long long gen = pm__handle_set_generation(&live_streams);
    if (s == checked_stream && gen == checked_generation)
        return true;
    if (!pm__handle_set_contains(&live_streams, s))
        return false;
    checked_stream = s;
    checked_generation = gen;
    return true;
}

/* NULL names the default stream, made on first use and never destroyed. A
 * start that fails (no memory for its thread, say) is tried again by the
 * next call that needs it. */
static pthread_mutex_t default_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(posix_stream *) default_stream;

static posix_stream *default_or_start(void)
{
    posix_stream *s = atomic_load_explicit(&default_stream, memory_order_acquire);
    if (s)
        return s;
    pthread_mutex_lock(&default_lock);
    s = atomic_load_explicit(&default_stream, memory_order_relaxed);
    if (!s && create(&s) == PM_SUCCESS)
        atomic_store_explicit(&default_stream, s, memory_order_release);
    pthread_mutex_unlock(&default_lock);
    return s;
}

/* The handles that name no stream of their own (pinmem.h): the legacy one,
 * here the default stream, and the per-thread one, the calling thread's own
 * stream, made on the thread's first use and ended (after its work) when the
 * thread exits. */
static pthread_key_t own_key;
static pthread_once_t own_key_once = PTHREAD_ONCE_INIT;
static bool have_own_key;
static _Thread_local posix_stream *own_stream __attribute__((tls_model("initial-exec")));
/* Every thread's own stream, which legacy-stream work waits for. */
static pthread_mutex_t own_lock = PTHREAD_MUTEX_INITIALIZER;
static posix_stream *own_streams;

static void list_own(posix_stream *s)
{
    pthread_mutex_lock(&own_lock);
    s->next_own = own_streams;
    if (own_streams)
        own_streams->prev_own = s;
    own_streams = s;
    pthread_mutex_unlock(&own_lock);
}

static void unlist_own(posix_stream *s)
{
    pthread_mutex_lock(&own_lock);
    if (s->prev_own)
        s->prev_own->next_own = s->next_own;
    else
        own_streams = s->next_own;
    if (s->next_own)
        s->next_own->prev_own = s->prev_own;
    pthread_mutex_unlock(&own_lock);
}

/* At the thread's exit. Another exit handler that runs later and uses the
 * handle gets a new stream, ended in the next round of handlers. */
static void end_own(void *arg)
{
    posix_stream *s = arg;
    own_stream = NULL;
    /* A forked child has no thread to run the stream: nothing waits there (pinmem.h). */
    if (s->pid != getpid())
        return;
    synchronize_stream(s); /* legacy-stream work queued meanwhile still waits for it */
    unlist_own(s);
    destroy_stream(s);
}

static void make_own_key(void) { have_own_key = pthread_key_create(&own_key, end_own) == 0; }

static posix_stream *own_or_start(void)
{
    if (own_stream)
        return own_stream;
    pthread_once(&own_key_once, make_own_key);
    posix_stream *s = NULL;
    if (!have_own_key || create(&s) != PM_SUCCESS)
        return NULL;
    if (pthread_setspecific(own_key, s) != 0) {
        destroy_stream(s);
        return NULL;
    }
    list_own(s);
    own_stream = s;
    return s;
}

static bool names_a_stream(pm_stream_t s)
{
    return s && s != PM_STREAM_LEGACY && s != PM_STREAM_PER_THREAD;
}

static posix_stream *resolve(pm_stream_t s)
{
    if (names_a_stream(s))
        return is_live(s) ? s : NULL;
    return s == PM_STREAM_PER_THREAD ? own_or_start() : default_or_start();
}

#define RESOLVE_OR_FAIL(var, handle)                                                         \
    posix_stream *var = resolve(handle);                                                     \
    if (!var)                                                                                \
    return names_a_stream(handle)                                                            \
               ? pm__fail(PM_ERROR_INVALID_HANDLE, "%p is not a live stream", handle)        \
               : pm__fail(PM_ERROR_OUT_OF_MEMORY, "the %s stream could not be started",      \
                          handle == PM_STREAM_PER_THREAD ? "thread's own" : "default")

pm_result pm__posix_stream_check(pm_stream_t handle)
{
    RESOLVE_OR_FAIL(s, handle);
    (void)s;
    return PM_SUCCESS;
}

pm_result pm__posix_stream_create(pm_stream_t *out)
{
    posix_stream *s = NULL;
    pm_result r = create(&s);
    if (r != PM_SUCCESS)
        return r;
    if (!pm__handle_set_add(&live_streams, s)) {
        destroy_stream(s);
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "pm_stream_create: out of memory");
    }
    *out = s;
    return PM_SUCCESS;
}

static pm_result enqueue(posix_stream *s, void (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&s->lock);
    if (s->count == s->cap) {
        task *bigger = malloc(2 * s->cap * sizeof *bigger);
        if (!bigger) {
            pthread_mutex_unlock(&s->lock);
            return pm__fail(PM_ERROR_OUT_OF_MEMORY, "stream queue: out of memory");
        }
        for (size_t i = 0; i < s->count; i++)
            bigger[i] = s->ring[(s->head + i) % s->cap];
        free(s->ring);
        s->ring = bigger;
        s->head = 0;
        s->cap *= 2;
    }
    s->ring[(s->head + s->count) % s->cap] = (task){fn, arg};
    s->count++;
    s->enqueued++;
    pthread_cond_signal(&s->has_work);
    pthread_mutex_unlock(&s->lock);
    return PM_SUCCESS;
}

static void wait_for(posix_stream *s, unsigned long long seq)
{
    pthread_mutex_lock(&s->lock);
    while (atomic_load_explicit(&s->completed, memory_order_acquire) < seq)
        pthread_cond_wait(&s->progressed, &s->lock);
    pthread_mutex_unlock(&s->lock);
}

static void synchronize_stream(posix_stream *s)
{
    pthread_mutex_lock(&s->lock);
    unsigned long long target = s->enqueued;
    pthread_mutex_unlock(&s->lock);
    wait_for(s, target);
}

pm_result pm__posix_stream_synchronize(pm_stream_t handle)
{
    RESOLVE_OR_FAIL(s, handle);
    synchronize_stream(s);
    return PM_SUCCESS;
}

/* Streams to wait for, each held by a reference, and how far. */
typedef struct drain_list {
    pm__marker *marks;
    size_t n, cap;
} drain_list;

static void hold_for_drain(void *handle, void *arg)
{
    posix_stream *s = handle;
    drain_list *d = arg;
    if (s->pid != getpid())
        return; /* a forked child's copy: nothing runs its work */
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 16;
        pm__marker *bigger = realloc(d->marks, cap * sizeof *bigger);
        if (!bigger)
            return;
        d->marks = bigger;
        d->cap = cap;
    }
    d->marks[d->n++] = hold_end(s);
}

void pm__posix_streams_drain(void)
{
    drain_list d = {0};
    /* References are taken under the lists' locks and the waits made after,
     * so that no stream's work waits behind those locks. */
    pm__handle_set_for_each(&live_streams, hold_for_drain, &d);
    pthread_mutex_lock(&own_lock);
    for (posix_stream *own = own_streams; own; own = own->next_own)
        hold_for_drain(own, &d);
    pthread_mutex_unlock(&own_lock);
    posix_stream *legacy = atomic_load_explicit(&default_stream, memory_order_acquire);
    if (legacy)
        hold_for_drain(legacy, &d);
    for (size_t i = 0; i < d.n; i++) {
        wait_for(d.marks[i].handle, d.marks[i].seq);
        pm__posix_marker_release(&d.marks[i]);
    }
    free(d.marks); /* short of memory, some streams were not waited for */
}

pm_result pm__posix_stream_destroy(pm_stream_t handle)
{
    posix_stream *s = handle;
    if (!s || !pm__handle_set_remove(&live_streams, s))
        return pm__fail(PM_ERROR_INVALID_HANDLE, "pm_stream_destroy: %p is not a live stream",
                        handle);
    destroy_stream(s);
    return PM_SUCCESS;
}

pm_result pm__posix_stream_release(pm_stream_t handle)
{
    posix_stream *s = handle;
    if (!s || !pm__handle_set_remove(&live_streams, s))
        return pm__fail(PM_ERROR_INVALID_HANDLE, "%p is not a live stream", handle);
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    s->released = true;
    const pthread_t thread = s->thread; /* s may be gone once the lock is let go */
    pthread_cond_signal(&s->has_work);
    pthread_mutex_unlock(&s->lock);
    pthread_detach(thread);
    return PM_SUCCESS;
}

static void destroy_stream(posix_stream *s)
{
    synchronize_stream(s);
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_signal(&s->has_work);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    drop_ref(s);
}

pm_result pm__posix_stream_id(pm_stream_t handle, unsigned long long *id)
{
    RESOLVE_OR_FAIL(s, handle);
    *id = s->id;
    return PM_SUCCESS;
}

typedef struct wait_task {
    pm__marker marker;
} wait_task;

static void run_wait(void *arg)
{
    wait_task *w = arg;
    wait_for(w->marker.handle, w->marker.seq);
    pm__posix_marker_release(&w->marker);
    free(w);
}

/* Queues on s a wait for held, whose reference the wait takes over. */
static pm_result queue_wait(posix_stream *s, pm__marker held)
{
    wait_task *w = malloc(sizeof *w);
    if (!w) {
        pm__posix_marker_release(&held);
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "stream wait: out of memory");
    }
    w->marker = held;
    pm_result r = enqueue(s, run_wait, w);
    if (r != PM_SUCCESS) {
        pm__posix_marker_release(&w->marker);
        free(w);
    }
    return r;
}

/* Queues on s a wait for the work queued on other so far, if any. A forked
 * child skips its parent's streams, whose work nothing runs there. */
static pm_result queue_wait_for_all(posix_stream *s, posix_stream *other)
{
    if (other == s || other->pid != getpid())
        return PM_SUCCESS;
    pm__marker held = hold_end(other);
    if (pm__posix_marker_done(&held)) {
        pm__posix_marker_release(&held);
        return PM_SUCCESS;
    }
    return queue_wait(s, held);
}

/* The driver orders the legacy stream with every blocking stream, threads'
 * own streams among them: work queued on one waits for the other's work
 * queued before it. Streams pinmem creates are non-blocking. */
static pm_result order_with_blocking(pm_stream_t handle, posix_stream *s)
{
    if (handle == PM_STREAM_PER_THREAD) {
        posix_stream *legacy = atomic_load_explicit(&default_stream, memory_order_acquire);
        return legacy ? queue_wait_for_all(s, legacy) : PM_SUCCESS;
    }
    if (names_a_stream(handle))
        return PM_SUCCESS;
    pm_result r = PM_SUCCESS;
    pthread_mutex_lock(&own_lock);
    for (posix_stream *own = own_streams; own && r == PM_SUCCESS; own = own->next_own)
        r = queue_wait_for_all(s, own);
    pthread_mutex_unlock(&own_lock);
    return r;
}

pm_result pm__posix_stream_launch_host_func(pm_stream_t handle, void (*fn)(void *), void *arg)
{
    RESOLVE_OR_FAIL(s, handle);
    pm_result r = order_with_blocking(handle, s);
    return r == PM_SUCCESS ? enqueue(s, fn, arg) : r;
}

typedef struct flag_task {
    _Atomic uint32_t *flag;
    uint32_t value;
} flag_task;

static void write_flag(void *arg)
{
    flag_task *t = arg;
    atomic_store_explicit(t->flag, t->value, memory_order_release);
    free(t);
}

pm_result pm__posix_stream_write_flag(pm_stream_t handle, pm_deviceptr flag, uint32_t value)
{
    flag_task *t = malloc(sizeof *t);
    if (!t)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "writing a flag in stream order: out of memory");
    *t = (flag_task){.flag = (_Atomic uint32_t *)(uintptr_t)flag, .value = value};
    pm_result r = pm__posix_stream_launch_host_func(handle, write_flag, t);
    if (r != PM_SUCCESS)
        free(t);
    return r;
}

pm_result pm__posix_marker_record(pm_stream_t handle, pm__marker *out)
{
    RESOLVE_OR_FAIL(s, handle);
    pm_result r = order_with_blocking(handle, s);
    if (r != PM_SUCCESS)
        return r;
    *out = hold_end(s);
    return PM_SUCCESS;
}

bool pm__posix_marker_done(const pm__marker *m)
{
    const posix_stream *s = m->handle;
    return atomic_load_explicit(&s->completed, memory_order_acquire) >= m->seq;
}

pm_result pm__posix_marker_rerecord(pm_stream_t s, pm__marker *m)
{
    pm__marker fresh;
    pm_result r = pm__posix_marker_record(s, &fresh);
    if (r == PM_SUCCESS) {
        pm__posix_marker_release(m);
        *m = fresh;
    }
    return r;
}

pm_result pm__posix_marker_synchronize(const pm__marker *m)
{
    wait_for(m->handle, m->seq);
    return PM_SUCCESS;
}

void pm__posix_marker_release(pm__marker *m)
{
    if (m->handle)
        drop_ref(m->handle);
    m->handle = NULL;
}

pm_result pm__posix_marker_wait(pm_stream_t handle, const pm__marker *m)
{
    RESOLVE_OR_FAIL(s, handle);
    if (pm__posix_marker_done(m) || m->handle == s)
        return PM_SUCCESS; /* already done, or ordered by the stream itself */
    pm__marker held = hold_end(m->handle);
    held.seq = m->seq; /* the reference is the stream's, whatever the point */
    return queue_wait(s, held);
}
