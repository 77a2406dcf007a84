/* Events for markers, kept for reuse (cuda_events.h says why). */
#include "cuda_events.h"

#include "cuda_places.h"

#include <pthread.h>
#include <stdbool.h>

enum { KEPT_MAX = 64 };

/* Process-wide (part of the lazily created instance). */
static const pm__cuda_api *cu;
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    CUcontext ctx;
    CUevent ev;
} kept[KEPT_MAX]; /* kept_lock */
static int n_kept; /* kept_lock */

void pm__cuda_events_open(const pm__cuda_api *api) { cu = api; }

static bool take_kept(CUcontext ctx, CUevent *ev)
{
    pthread_mutex_lock(&kept_lock);
    int i = n_kept - 1;
    while (i >= 0 && kept[i].ctx != ctx)
        i--;
    if (i >= 0) {
        *ev = kept[i].ev;
        kept[i] = kept[--n_kept];
    }
    pthread_mutex_unlock(&kept_lock);
    return i >= 0;
}

CUresult pm__cuda_event_record_new(CUcontext ctx, CUstream s, CUevent *ev, const char **failed)
{
    CUresult rc = CUDA_SUCCESS;
    if (!take_kept(ctx, ev))
        rc = cu->event_create(ev, CU_EVENT_DISABLE_TIMING);
    if (rc != CUDA_SUCCESS) {
        *failed = "cuEventCreate";
        return rc;
    }
    rc = cu->event_record(*ev, s);
    if (rc != CUDA_SUCCESS) {
        *failed = "cuEventRecord";
        cu->event_destroy(*ev);
    }
    return rc;
}

void pm__cuda_event_give(CUcontext ctx, CUevent ev)
{
    /* Only events of contexts that live as long as the process: an event
     * outlives no context, and a user's may be destroyed meanwhile. */
    bool keep = pm__cuda_context_held(ctx);
    pthread_mutex_lock(&kept_lock);
    keep = keep && n_kept < KEPT_MAX;
    if (keep) {
        kept[n_kept].ctx = ctx;
        kept[n_kept++].ev = ev;
    }
    pthread_mutex_unlock(&kept_lock);
    if (!keep)
        cu->event_destroy(ev);
}
