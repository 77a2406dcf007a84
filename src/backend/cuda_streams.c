/* The CUDA backend's streams, markers (the events or flags that pools and
 * the copy engine wait on) and graph-capture calls. */
#include "cuda_streams.h"

#include "../errors.h"
#include "cuda_events.h"
#include "cuda_flags.h"
#include "cuda_places.h"

static const pm__cuda_api *cu;
static CUcontext primary;

/* pm_stream_t is the CUstream itself on this backend. */
static pm_result cuda_stream_create(pm_stream_t *out)
{
    PM__CUDA_CALL("cuStreamCreate", cu->stream_create((CUstream *)out, CU_STREAM_NON_BLOCKING));
}

static pm_result cuda_stream_id(pm_stream_t s, unsigned long long *id)
{
    PM__CUDA_CALL("cuStreamGetId", cu->stream_get_id((CUstream)s, id));
}

static pm_result cuda_stream_check(pm_stream_t s)
{
    (void)s;
    return PM_SUCCESS;
}

static pm_result cuda_stream_synchronize(pm_stream_t s)
{
    PM__CUDA_CALL("cuStreamSynchronize", cu->stream_synchronize((CUstream)s));
}

static pm_result cuda_stream_destroy(pm_stream_t s)
{
    if (!s)
        return pm__fail(PM_ERROR_INVALID_HANDLE, "pm_stream_destroy: the default stream");
    pm_result r = cuda_stream_synchronize(s); /* pm_stream_destroy waits, as documented */
    if (r != PM_SUCCESS)
        return r;
    PM__CUDA_CALL("cuStreamDestroy", cu->stream_destroy((CUstream)s));
}

static pm_result cuda_stream_release(pm_stream_t s)
{
    PM__CUDA_CALL("cuStreamDestroy", cu->stream_destroy((CUstream)s));
}

static pm_result cuda_stream_launch_host_func(pm_stream_t s, void (*fn)(void *), void *arg)
{
    PM__CUDA_CALL("cuLaunchHostFunc", cu->launch_host_func((CUstream)s, fn, arg));
}

/* An event belongs to one context and is recorded only on that context's
 * streams: it is made in s's context (not the calling thread's, which may be
 * another device's), and made anew where a marker moves to another context.
 * In a context pinmem does not hold, the marker is a flag (cuda_flags.c). */
static pm_result cuda_marker_record(pm_stream_t s, pm__marker *out)
{
    CUevent ev = NULL;
    pm__place place = {.context = pm__cuda_stream_context(s)};
    pm__place_scope scope;
    pm_result r = pm__cuda_place_enter(&place, &scope);
    if (r != PM_SUCCESS)
        return r;
    if (pm__cuda_flags_for(place.context)) {
        r = pm__cuda_flag_record((CUstream)s, place.context, out);
        pm__cuda_place_leave(&scope);
        return r;
    }
    const char *call = NULL;
    CUresult rc = pm__cuda_event_record_new(place.context, (CUstream)s, &ev, &call);
    pm__cuda_place_leave(&scope);
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, call);
    *out = (pm__marker){.handle = ev, .context = place.context};
    return PM_SUCCESS;
}

static bool cuda_marker_done(const pm__marker *m)
{
    if (m->flag)
        return pm__cuda_flag_done(m);
    return cu->event_query((CUevent)m->handle) == CUDA_SUCCESS;
}

static pm_result cuda_marker_query(const pm__marker *m)
{
    if (m->flag)
        return pm__cuda_flag_query(m);
    const CUresult rc = cu->event_query((CUevent)m->handle);
    if (rc == CUDA_ERROR_NOT_READY)
        return PM_ERROR_NOT_READY;
    return rc == CUDA_SUCCESS ? PM_SUCCESS : pm__cuda_fail(rc, "cuEventQuery");
}

static pm_result cuda_marker_wait(pm_stream_t s, const pm__marker *m)
{
    if (m->flag)
        return pm__cuda_flag_wait((CUstream)s, m);
    PM__CUDA_CALL("cuStreamWaitEvent", cu->stream_wait_event((CUstream)s, (CUevent)m->handle, 0));
}

static void cuda_marker_release(pm__marker *m)
{
    if (m->flag)
        pm__cuda_flag_release(m);
    else if (m->handle)
        pm__cuda_event_give(m->context, (CUevent)m->handle);
    m->handle = NULL;
}

static pm_result cuda_marker_rerecord(pm_stream_t s, pm__marker *m)
{
    if (m->handle && (m->flag || m->context != pm__cuda_stream_context(s)))
        cuda_marker_release(m);
    if (!m->handle)
        return cuda_marker_record(s, m);
    PM__CUDA_CALL("cuEventRecord", cu->event_record((CUevent)m->handle, (CUstream)s));
}

static bool cuda_marker_rerecord_in_place(pm_stream_t s, const pm__marker *m)
{
    return m->handle && !m->flag && m->context == pm__cuda_stream_context(s);
}

static pm_result cuda_marker_synchronize(const pm__marker *m)
{
    if (m->flag)
        return pm__cuda_flag_synchronize(m);
    CUresult rc = cu->event_synchronize((CUevent)m->handle);
    return rc == CUDA_SUCCESS ? PM_SUCCESS : pm__cuda_fail(rc, "cuEventSynchronize");
}

static pm_result cuda_stream_write_flag(pm_stream_t s, pm_deviceptr flag, uint32_t value)
{
    /* The default flags fence the stream's earlier writes before this one. */
    PM__CUDA_CALL("cuStreamWriteValue32",
                  cu->stream_write_value32((CUstream)s, (CUdeviceptr)flag, value,
                                           CU_STREAM_WRITE_VALUE_DEFAULT));
}

static pm_result cuda_stream_capture_status(pm_stream_t s, bool *capturing)
{
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    pm__place_scope scope; /* the legacy stream is the current context's */
    pm_result r = pm__cuda_home_enter(&scope);
    if (r != PM_SUCCESS)
        return r;
    CUresult rc = cu->stream_is_capturing((CUstream)s, &status);
    pm__cuda_place_leave(&scope);
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, "cuStreamIsCapturing");
    *capturing = status != CU_STREAM_CAPTURE_STATUS_NONE;
    return PM_SUCCESS;
}

/* Relaxed: the driver then checks nothing this thread does against captures
 * other threads have in progress in global mode; its own streams never
 * capture. The primary context stays current on the thread, so that every
 * driver call it makes runs there, those outside a context scope (event
 * queries and releases) included, and the scopes need no push. */
static void cuda_own_thread_start(void)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    cu->thread_exchange_capture_mode(&mode);
    CUcontext current = NULL;
    if (cu->ctx_get_current(&current) == CUDA_SUCCESS && !current)
        cu->ctx_push(primary);
}

static int cuda_captures_relax(void)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    return cu->thread_exchange_capture_mode(&mode) == CUDA_SUCCESS ? (int)mode : -1;
}

static void cuda_captures_restore(int saved)
{
    CUstreamCaptureMode mode = (CUstreamCaptureMode)saved;
    if (saved >= 0)
        cu->thread_exchange_capture_mode(&mode);
}

void pm__cuda_streams_open(const pm__cuda_api *api, CUcontext in_use, pm__backend *out)
{
    cu = api;
    primary = in_use;
    out->stream_create = cuda_stream_create;
    out->stream_check = cuda_stream_check;
    out->stream_id = cuda_stream_id;
    out->stream_destroy = cuda_stream_destroy;
    out->stream_release = cuda_stream_release;
    out->stream_synchronize = cuda_stream_synchronize;
    out->stream_launch_host_func = cuda_stream_launch_host_func;
    out->marker_record = cuda_marker_record;
    out->marker_done = cuda_marker_done;
    out->marker_query = cuda_marker_query;
    out->marker_wait = cuda_marker_wait;
    out->marker_release = cuda_marker_release;
    out->marker_synchronize = cuda_marker_synchronize;
    out->stream_write_flag = cu->stream_write_value32 ? cuda_stream_write_flag : NULL;
    out->marker_rerecord = cuda_marker_rerecord;
    out->marker_rerecord_in_place = cuda_marker_rerecord_in_place;
    out->stream_capture_status = cuda_stream_capture_status;
    out->own_thread_start = cuda_own_thread_start;
    out->captures_relax = cuda_captures_relax;
    out->captures_restore = cuda_captures_restore;
}
