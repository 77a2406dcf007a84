/* Lanes: streams of the engine's own on which a copy on its caller's own
 * stream (cuda's per-thread default stream) runs, so that the workers may
 * queue its DMAs too. A worker that queued work on that handle would queue
 * it on the worker's own stream, out of the copy's order; on a lane, the
 * lane first waits for the caller's stream, and the caller's stream waits
 * for the lane at the end, so the copy keeps its place in the caller's
 * order (docs/design.md, "The staging engine"). Lanes are
 * kept only in places that last as long as the process; a copy elsewhere,
 * or one that finds every lane busy, is staged by its caller alone. */
#include "../errors.h"
#include "../instance.h"
#include "../test_hooks.h"
#include "staging_engine.h"

pm_result pm__staging_follow(const pm__backend *be, pm_stream_t waiter, pm_stream_t s)
{
    pm__marker m = {0};
    pm_result r = be->marker_record(s, &m);
    if (r == PM_SUCCESS)
        r = be->marker_wait(waiter, &m);
    if (m.handle)
        be->marker_release(&m);
    return r;
}

/* lock held: a lane of place that no copy uses, now marked used; NULL where
 * there is none. */
static pm__lane *take_idle_locked(const pm__place *place)
{
    for (unsigned i = 0; i < eng.n_lanes; i++)
        if (!eng.lanes[i].busy && eng.lanes[i].context == place->context) {
            eng.lanes[i].busy = true;
            return &eng.lanes[i];
        }
    return NULL;
}

/* A new lane of place, made and marked used, or NULL where there may be no
 * more or the stream could not be made (place entered). */
static pm__lane *make_lane(const pm__backend *be, const pm__place *place)
{
    pthread_mutex_lock(&eng.lock);
    const bool room = eng.n_lanes + eng.lanes_making < PM__LANES_MAX;
    if (room)
        eng.lanes_making++;
    pthread_mutex_unlock(&eng.lock);
    if (!room)
        return NULL;
    pm_stream_t stream = NULL;
    /* A failure here only costs the copy its helpers: the detail of the
     * caller's last failure stays as it was. */
    pm__detail_saved saved;
    pm__detail_save(&saved);
    const bool made = be->stream_create(&stream) == PM_SUCCESS;
    pm__detail_restore(&saved);
    pthread_mutex_lock(&eng.lock);
    eng.lanes_making--;
    pm__lane *lane = NULL;
    if (made) {
        lane = &eng.lanes[eng.n_lanes++];
        *lane = (pm__lane){.stream = stream, .context = place->context, .busy = true};
    }
    pthread_mutex_unlock(&eng.lock);
    return lane;
}

static void give_back(pm__lane *lane)
{
    pthread_mutex_lock(&eng.lock);
    lane->busy = false;
    pthread_mutex_unlock(&eng.lock);
}

pm__lane *pm__staging_lane_enter(const pm__place *place, pm_stream_t own)
{
    const pm__backend *be = pm__instance_backend();
    if (PM__TEST_FAULT(pm__fault_lane) || !be->place_lasts(place))
        return NULL;
    pthread_mutex_lock(&eng.lock);
    pm__lane *lane = take_idle_locked(place);
    pthread_mutex_unlock(&eng.lock);
    pm__place_scope scope;
    if (be->place_enter(place, &scope) != PM_SUCCESS)
        goto none;
    if (!lane)
        lane = make_lane(be, place);
    pm__detail_saved saved;
    pm__detail_save(&saved);
    const bool following = lane && pm__staging_follow(be, lane->stream, own) == PM_SUCCESS;
    pm__detail_restore(&saved);
    be->place_leave(&scope);
    if (following)
        return lane;
none:
    if (lane)
        give_back(lane);
    return NULL;
}

pm_result pm__staging_lane_leave(const pm__place *place, pm_stream_t own, pm__lane *lane)
{
    const pm__backend *be = pm__instance_backend();
    pm__detail_saved saved;
    pm__detail_save(&saved);
    pm__place_scope scope;
    pm_result r = be->place_enter(place, &scope);
    const bool entered = r == PM_SUCCESS;
    if (entered)
        r = PM__TEST_FAULT(pm__fault_lane)
                ? pm__fail(PM_ERROR_UNKNOWN, "a lane's exit failed (injected fault)")
                : pm__staging_follow(be, own, lane->stream);
    /* Unordered, the caller's stream could run ahead of the copy: it is
     * done before the copy returns instead. */
    if (r != PM_SUCCESS && be->stream_synchronize(lane->stream) == PM_SUCCESS) {
        pm__detail_restore(&saved);
        r = PM_SUCCESS;
    }
    if (entered)
        be->place_leave(&scope);
    give_back(lane);
    return r;
}

void pm__staging_release_lanes(void)
{
    const pm__backend *be = pm__instance_backend();
    for (unsigned i = 0; i < eng.n_lanes; i++) {
        pm__place place = {.context = eng.lanes[i].context};
        pm__place_scope scope;
        const bool entered = be->place_enter(&place, &scope) == PM_SUCCESS;
        be->stream_destroy(eng.lanes[i].stream); /* waits for its last work */
        if (entered)
            be->place_leave(&scope);
    }
    eng.n_lanes = 0;
}
