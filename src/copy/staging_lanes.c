/* Lanes: streams of the engine's own on which a copy on its caller's own
 * stream (cuda's per-thread default stream) runs, so that the workers may
 * queue its DMAs too. A worker that queued work on that handle would queue
 * it on the worker's own stream, out of the copy's order; on a lane, the
 * lane first waits for the caller's stream, and the caller's stream waits
 * for the lane at the end, so the copy keeps its place in the caller's
 * order (docs/design.md, "The staging engine"). A copy in a context the
 * user made, of device memory of a context pinmem holds, runs on a lane in
 * the memory's context the same way, as DMAs into it cost more from another
 * context. Lanes are kept only in places that last as long as the process;
 * a copy elsewhere, or one that finds every lane busy, makes a one-off lane
 * and releases it at its end, and one that cannot is staged by its caller
 * alone. */
#include <unistd.h>

#include "../errors.h"
#include "../instance.h"
#include "../test_hooks.h"
#include "staging_engine.h"

/* Work queued on waiter (named in waiter_at) from now on follows the work
 * queued on s (named in s_at) so far; each side's handle is read in its own
 * place, where the legacy and per-thread handles mean that place's. keep,
 * where not NULL, gets the marker of s's work (the caller releases it). */
static pm_result follow_across(const pm__backend *be, const pm__place *waiter_at,
                               pm_stream_t waiter, const pm__place *s_at, pm_stream_t s,
                               pm__marker *keep)
{
    pm__marker m = {0};
    pm__place_scope scope;
    pm_result r = be->place_enter(s_at, &scope);
    if (r == PM_SUCCESS) {
        r = be->marker_record(s, &m);
        be->place_leave(&scope);
    }
    if (r == PM_SUCCESS && (r = be->place_enter(waiter_at, &scope)) == PM_SUCCESS) {
        r = be->marker_wait(waiter, &m);
        be->place_leave(&scope);
    }
    if (r == PM_SUCCESS && keep)
        *keep = m;
    else if (m.handle)
        be->marker_release(&m);
    return r;
}

pm_result pm__staging_follow(const pm__backend *be, pm_stream_t waiter, pm_stream_t s)
{
    static const pm__place current = {0}; /* entering it changes nothing */
    return follow_across(be, &current, waiter, &current, s, NULL);
}

/* lock held: a lane of place that no copy uses, now marked used, whose
 * last copy followed the same stream of the same thread, or whose last
 * copy's work is done; NULL where there is none. Another stream's lane
 * still at work would tie own to that stream: the lane's first wait follows
 * it, and it may wait for anything (a host function waiting for own, say). */
static pm__lane *take_idle_locked(engine *eng, const pm__backend *be, const pm__place *place,
                                  pm_stream_t own)
{
    for (unsigned i = 0; i < eng->n_lanes; i++) {
        pm__lane *lane = &eng->lanes[i];
        if (lane->busy || lane->context != place->context)
            continue;
        const bool same_stream = lane->last_own == own && lane->last_thread == gettid();
        if (same_stream || !lane->end.handle || be->marker_done(&lane->end)) {
            lane->busy = true;
            return lane;
        }
    }
    return NULL;
}

/* A stream made in place (entered), or NULL; a failure only costs the copy
 * its helpers, so the detail of the caller's last failure stays as it was. */
static pm_stream_t make_stream(const pm__backend *be)
{
    pm_stream_t stream = NULL;
    pm__detail_saved saved;
    pm__detail_save(&saved);
    if (be->stream_create(&stream) != PM_SUCCESS)
        stream = NULL;
    pm__detail_restore(&saved);
    return stream;
}

/* A new lane of place, made and marked used, or NULL where there may be no
 * more or the stream could not be made (place entered). */
static pm__lane *make_kept(engine *eng, const pm__backend *be, const pm__place *place)
{
    pthread_mutex_lock(&eng->lock);
    const bool room = eng->n_lanes + eng->lanes_making < PM__LANES_MAX;
    if (room)
        eng->lanes_making++;
    pthread_mutex_unlock(&eng->lock);
    if (!room)
        return NULL;
    pm_stream_t stream = make_stream(be);
    pthread_mutex_lock(&eng->lock);
    eng->lanes_making--;
    pm__lane *lane = NULL;
    if (stream) {
        lane = &eng->lanes[eng->n_lanes++];
        *lane = (pm__lane){.stream = stream, .context = place->context, .busy = true};
    }
    pthread_mutex_unlock(&eng->lock);
    return lane;
}

/* A lane for this copy alone, in spare, or NULL (place entered). */
static pm__lane *make_one_off(const pm__backend *be, const pm__place *place, pm__lane *spare)
{
    *spare = (pm__lane){.stream = make_stream(be), .context = place->context, .busy = true,
                        .one_off = true};
    return spare->stream ? spare : NULL;
}

/* A one-off lane is released (place entered), its work left to finish; a
 * kept one is free again, end (where not NULL) the end of its work, which
 * own of the calling thread follows. */
static void give_back(engine *eng, const pm__backend *be, pm__lane *lane, pm__marker *end,
                      pm_stream_t own)
{
    if (lane->one_off) {
        pm__detail_saved saved;
        pm__detail_save(&saved);
        be->stream_release(lane->stream);
        pm__detail_restore(&saved);
        if (end && end->handle)
            be->marker_release(end);
        return;
    }
    pm__marker old = {0};
    pthread_mutex_lock(&eng->lock);
    if (end) {
        old = lane->end;
        lane->end = *end;
        lane->last_thread = gettid();
        lane->last_own = own;
    }
    lane->busy = false;
    pthread_mutex_unlock(&eng->lock);
    if (old.handle)
        be->marker_release(&old);
}

pm__lane *pm__staging_lane_enter(engine *eng, const pm__lane_places *at, pm_stream_t own,
                                  pm__lane *spare)
{
    const pm__backend *be = pm__instance_backend();
    if (PM__TEST_FAULT(pm__fault_lane))
        return NULL;
    const pm__place *place = &at->lane;
    const bool kept = be->place_lasts(place) && !PM__TEST_LANES_TAKEN();
    pm__lane *lane = NULL;
    if (kept) {
        pthread_mutex_lock(&eng->lock);
        lane = take_idle_locked(eng, be, place, own);
        pthread_mutex_unlock(&eng->lock);
    }
    pm__place_scope scope;
    if (be->place_enter(place, &scope) != PM_SUCCESS) {
        if (lane)
            give_back(eng, be, lane, NULL, own);
        return NULL;
    }
    if (!lane && kept)
        lane = make_kept(eng, be, place);
    if (!lane)
        lane = make_one_off(be, place, spare);
    pm__detail_saved saved;
    pm__detail_save(&saved);
    const bool following =
        lane && follow_across(be, place, lane->stream, &at->own, own, NULL) == PM_SUCCESS;
    pm__detail_restore(&saved);
    if (lane && !following)
        give_back(eng, be, lane, NULL, own);
    be->place_leave(&scope);
    return following ? lane : NULL;
}

pm_result pm__staging_lane_leave(engine *eng, const pm__lane_places *at, pm_stream_t own,
                                 pm__lane *lane)
{
    const pm__backend *be = pm__instance_backend();
    pm__detail_saved saved;
    pm__detail_save(&saved);
    pm__place_scope scope;
    pm_result r = be->place_enter(&at->lane, &scope);
    const bool entered = r == PM_SUCCESS;
    pm__marker end = {0};
    if (entered)
        r = PM__TEST_FAULT(pm__fault_lane)
                ? pm__fail(PM_ERROR_UNKNOWN, "a lane's exit failed (injected fault)")
                : follow_across(be, &at->own, own, &at->lane, lane->stream, &end);
    /* Unordered, the caller's stream could run ahead of the copy: it is
     * done before the copy returns instead. */
    if (r != PM_SUCCESS && be->stream_synchronize(lane->stream) == PM_SUCCESS) {
        pm__detail_restore(&saved);
        r = PM_SUCCESS;
    }
    give_back(eng, be, lane, &end, own);
    if (entered)
        be->place_leave(&scope);
    return r;
}

void pm__staging_release_lanes(engine *eng)
{
    const pm__backend *be = pm__instance_backend();
    for (unsigned i = 0; i < eng->n_lanes; i++) {
        pm__place place = {.context = eng->lanes[i].context};
        pm__place_scope scope;
        const bool entered = be->place_enter(&place, &scope) == PM_SUCCESS;
        if (eng->lanes[i].end.handle)
            be->marker_release(&eng->lanes[i].end);
        be->stream_destroy(eng->lanes[i].stream); /* waits for its last work */
        if (entered)
            be->place_leave(&scope);
    }
    eng->n_lanes = 0;
}
