/* pm_event_* and pm_stream_wait_event: the backend's markers, plus the stream
 * order pools learn from them (stream_order.h). Handles are checked against
 * the live events, so a stale or made-up one is refused, not followed; a call
 * that found its event live holds it, so that a destroy from another thread
 * meanwhile leaves the freeing to the last holder. A synchronization holds
 * the marker it waits on, not the event's lock, so that a record meanwhile
 * (from a host function the wait is behind, say) goes ahead. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "errors.h"
#include "handle_set.h"
#include "host_func.h"
#include "instance.h"
#include "no_cancel.h"
#include "pool/pool.h"
#include "stream_order.h"
#include "test_hooks.h"

/* A recorded point, shared by its event and the synchronizations waiting on it. */
typedef struct held_marker {
    pm__marker marker;
    _Atomic unsigned refs; /* the event's (while it is the event's point) and each waiter's */
} held_marker;

struct pm_event_s {
    /* The point and the order change together, under the write lock (a
     * record); queries, waits and synchronizations read them under the read lock. */
    pthread_rwlock_t lock;
    held_marker *point;   /* NULL until first recorded */
    pm__order_set order;  /* what the recorded point's stream had waited for, and the point */
    _Atomic unsigned holds; /* calls in progress, and one for being live */
};

/* Part of the process-wide instance: the live events. */
static pm__handle_set live_events = PM__HANDLE_SET_INIT;

static void add_hold(const void *e)
{
    atomic_fetch_add_explicit(&((pm_event_t)e)->holds, 1, memory_order_relaxed);
}

/* PM_SUCCESS and a hold on e (let go by let_go) where e is live. */
static pm_result hold_event(const char *name, pm_event_t e)
{
    if (!e || !pm__handle_set_contains_then(&live_events, e, add_hold))
        return pm__fail(PM_ERROR_INVALID_HANDLE, "%s: %p is not a live event", name, (void *)e);
    return PM_SUCCESS;
}

/* e's point where it holds a recorded marker (a failed record may leave it empty). */
static held_marker *recorded_point(pm_event_t e)
{
    return e->point && e->point->marker.handle ? e->point : NULL;
}

static void drop_point(const pm__backend *b, held_marker *p)
{
    if (!p || atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1)
        return;
    b->marker_release(&p->marker);
    free(p);
}

/* Lets go of a hold; the last one, once e is destroyed, frees it. */
static void let_go(const pm__backend *b, pm_event_t e)
{
    if (atomic_fetch_sub_explicit(&e->holds, 1, memory_order_acq_rel) != 1)
        return;
    drop_point(b, e->point);
    pm__order_set_free(&e->order);
    pthread_rwlock_destroy(&e->lock);
    free(e);
}

pm_result pm_event_create(pm_event_t *event)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_event_create");
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    if (!event)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_event_create: event is NULL");
    pm_event_t e = calloc(1, sizeof *e);
    if (!e || pthread_rwlock_init(&e->lock, NULL) != 0) {
        free(e);
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "pm_event_create: out of memory");
    }
    atomic_init(&e->holds, 1);
    if (!pm__handle_set_add(&live_events, e)) {
        pthread_rwlock_destroy(&e->lock);
        free(e);
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "pm_event_create: out of memory");
    }
    *event = e;
    return PM_SUCCESS;
}

pm_result pm_event_destroy(pm_event_t event)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_event_destroy");
    PM__INSTANCE_OR_RETURN(inst);
    if (!event || !pm__handle_set_remove(&live_events, event))
        return pm__fail(PM_ERROR_INVALID_HANDLE, "pm_event_destroy: %p is not a live event",
                        (void *)event);
    let_go(&inst->backend, event);
    return PM_SUCCESS;
}

/* The checks of a call on an event and a stream, holding the event where
 * they pass; *id: the stream's. */
static pm_result hold_pair(const char *name, const pm__backend *b, pm_event_t event,
                           pm_stream_t stream, unsigned long long *id)
{
    pm_result r = hold_event(name, event);
    if (r != PM_SUCCESS)
        return r;
    r = b->stream_check(stream);
    if (r == PM_SUCCESS)
        r = b->stream_id(stream, id);
    if (r != PM_SUCCESS)
        let_go(b, event);
    return r;
}

static void forget_at_thread_exit(unsigned long long id);

/* Records e's point on stream, under e's write lock: in place where no
 * synchronization waits on it (or the backend keeps its handle), else as a
 * new point, the old one in *replaced for its last waiter to free. */
static pm_result record_point(const pm__backend *b, pm_event_t e, pm_stream_t stream,
                              held_marker **replaced)
{
    held_marker *p = e->point;
    bool waited = p && atomic_load_explicit(&p->refs, memory_order_acquire) > 1;
    bool in_place = p && (!waited || (b->marker_rerecord_in_place &&
                                      b->marker_rerecord_in_place(stream, &p->marker)));
    if (in_place)
        return b->marker_rerecord(stream, &p->marker);
    held_marker *fresh = calloc(1, sizeof *fresh);
    if (!fresh)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "pm_event_record: out of memory");
    atomic_init(&fresh->refs, 1);
    pm_result r = b->marker_record(stream, &fresh->marker);
    if (r != PM_SUCCESS) {
        free(fresh);
        return r;
    }
    *replaced = p;
    e->point = fresh;
    return PM_SUCCESS;
}

pm_result pm_event_record(pm_event_t event, pm_stream_t stream)
{
    PM__NO_CANCEL;
    if (pm__stream_is_legacy(stream) || pm__stream_is_threads_own(stream))
        PM__REFUSED_IN_HOST_FUNC("pm_event_record on a default stream");
    PM__INSTANCE_OR_RETURN(inst);
    const pm__backend *b = &inst->backend;
    unsigned long long id = 0;
    pm_result r = hold_pair("pm_event_record", b, event, stream, &id);
    if (r != PM_SUCCESS)
        return r;
    /* Blocks freed on the stream until now join their pools' batches before
     * the event's tick, so that the event is known to follow them. */
    pm__pools_flush_stream(stream);
    /* Taken before the marker, so that a free or a wait another thread
     * queues on the stream meanwhile is never claimed as before the event. */
    pm__order_set order = {0};
    held_marker *replaced = NULL;
    pthread_rwlock_wrlock(&event->lock);
    if (!pm__order_snapshot(id, pm__order_next(), &order))
        order.n = 0; /* out of memory: waits on it teach nothing, which is safe */
    PM__TEST_RECORD_MIDWAY();
    r = record_point(b, event, stream, &replaced);
    if (r == PM_SUCCESS || !recorded_point(event)) {
        /* A failure that emptied the point (cuda: released, then not made
         * anew) leaves no point whose order a wait could learn. */
        pm__order_set old = event->order;
        event->order = r == PM_SUCCESS ? order : (pm__order_set){0};
        if (r != PM_SUCCESS)
            pm__order_set_free(&order);
        order = old;
    }
    pthread_rwlock_unlock(&event->lock);
    drop_point(b, replaced);
    let_go(b, event);
    pm__order_set_free(&order);
    if (r == PM_SUCCESS && pm__stream_is_threads_own(stream))
        forget_at_thread_exit(id); /* streams that wait for the event learn of it */
    return r;
}

pm_result pm_event_query(pm_event_t event)
{
    PM__NO_CANCEL;
    PM__INSTANCE_OR_RETURN(inst);
    pm_result r = hold_event("pm_event_query", event);
    if (r != PM_SUCCESS)
        return r;
    pthread_rwlock_rdlock(&event->lock);
    held_marker *p = recorded_point(event);
    if (p)
        r = inst->backend.marker_query(&p->marker);
    pthread_rwlock_unlock(&event->lock);
    let_go(&inst->backend, event);
    return r;
}

pm_result pm_event_synchronize(pm_event_t event)
{
    PM__NO_CANCEL;
    PM__INSTANCE_OR_RETURN(inst);
    pm_result r = hold_event("pm_event_synchronize", event);
    if (r != PM_SUCCESS)
        return r;
    /* The point is held, not the lock: a record meanwhile replaces the
     * event's point (or records it in place, as the driver's event) and
     * frees the old one only after this wait. */
    pthread_rwlock_rdlock(&event->lock);
    held_marker *p = recorded_point(event);
    pm__marker waited_on = {0};
    if (p) {
        atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
        waited_on = p->marker;
    }
    pthread_rwlock_unlock(&event->lock);
    if (p)
        r = inst->backend.marker_synchronize(&waited_on);
    drop_point(&inst->backend, p);
    let_go(&inst->backend, event);
    return r;
}

/* What a thread's own stream (PM_STREAM_PER_THREAD) learned, and what other
 * streams learned of it, is forgotten when the thread exits, with its
 * stream, as pm_stream_destroy forgets a stream the user made: else every
 * thread that ever waited or recorded there would stay in stream_order.c's
 * lists. The key holds the id seen last; forgetting an id early only misses
 * reuse. */
static pthread_key_t own_order_key;
static pthread_once_t own_order_once = PTHREAD_ONCE_INIT;
static bool have_own_order_key;

static void forget_own_order(void *id)
{
    pm_result ignored;
    if (pm__instance_get(&ignored)) /* not in a forked child: its locks may be held */
        pm__order_forget((unsigned long long)(uintptr_t)id);
}

static void make_own_order_key(void)
{
    have_own_order_key = pthread_key_create(&own_order_key, forget_own_order) == 0;
}

static void forget_at_thread_exit(unsigned long long id)
{
    pthread_once(&own_order_once, make_own_order_key);
    if (!have_own_order_key)
        return;
    void *old = pthread_getspecific(own_order_key);
    if ((uintptr_t)old == id)
        return;
    if (pthread_setspecific(own_order_key, (void *)(uintptr_t)id) == 0 && old)
        pm__order_forget((unsigned long long)(uintptr_t)old);
}

pm_result pm_stream_wait_event(pm_stream_t stream, pm_event_t event)
{
    PM__NO_CANCEL;
    if (pm__stream_is_legacy(stream) || pm__stream_is_threads_own(stream))
        PM__REFUSED_IN_HOST_FUNC("pm_stream_wait_event on a default stream");
    PM__INSTANCE_OR_RETURN(inst);
    const pm__backend *b = &inst->backend;
    unsigned long long id = 0;
    pm_result r = hold_pair("pm_stream_wait_event", b, event, stream, &id);
    if (r != PM_SUCCESS)
        return r;
    /* Blocks freed on the stream before the wait are reusable without it. */
    pm__pools_flush_frees_on(stream);
    pthread_rwlock_rdlock(&event->lock);
    held_marker *p = recorded_point(event);
    if (p)
        r = b->marker_wait(stream, &p->marker);
    if (r == PM_SUCCESS)
        pm__order_learn(id, &event->order); /* out of memory: nothing learned, which is safe */
    pthread_rwlock_unlock(&event->lock);
    let_go(b, event);
    if (r == PM_SUCCESS && pm__stream_is_threads_own(stream))
        forget_at_thread_exit(id);
    return r;
}
