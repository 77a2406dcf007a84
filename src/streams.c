/* pm_stream_*: the backend's streams, plus what pools do when one settles. */
#include <stdlib.h>

#include "errors.h"
#include "host_func.h"
#include "instance.h"
#include "no_cancel.h"
#include "pool/pool.h"
#include "stream_order.h"

pm_result pm_stream_create(pm_stream_t *stream)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_stream_create");
    PM__INSTANCE_OR_RETURN(inst);
    if (!stream)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_stream_create: stream is NULL");
    return inst->backend.stream_create(stream);
}

pm_result pm_stream_synchronize(pm_stream_t stream)
{
    PM__NO_CANCEL;
    if (pm__stream_is_legacy(stream) || pm__stream_is_threads_own(stream))
        PM__REFUSED_IN_HOST_FUNC("pm_stream_synchronize of a default stream");
    PM__INSTANCE_OR_RETURN(inst);
    pm_result r = inst->backend.stream_check(stream);
    if (r == PM_SUCCESS)
        r = inst->backend.stream_synchronize(stream);
    if (r == PM_SUCCESS)
        pm__pools_after_sync(stream);
    return r;
}

pm_result pm_stream_destroy(pm_stream_t stream)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_stream_destroy");
    PM__INSTANCE_OR_RETURN(inst);
    if (!stream || stream == PM_STREAM_LEGACY)
        return pm__fail(PM_ERROR_INVALID_HANDLE, "pm_stream_destroy: the default stream lives on");
    if (stream == PM_STREAM_PER_THREAD)
        return pm__fail(PM_ERROR_INVALID_HANDLE,
                        "pm_stream_destroy: a thread's own stream lives as long as the thread");
    pm_result r = inst->backend.stream_check(stream);
    if (r == PM_SUCCESS)
        r = inst->backend.stream_synchronize(stream);
    if (r != PM_SUCCESS)
        return r;
    /* Blocks freed on it must not wait on a stream that is gone. */
    pm__pools_after_sync(stream);
    unsigned long long id;
    if (inst->backend.stream_id(stream, &id) == PM_SUCCESS)
        pm__order_forget(id);
    return inst->backend.stream_destroy(stream);
}

pm_result pm_stream_launch_host_func(pm_stream_t stream, void (*fn)(void *arg), void *arg)
{
    PM__NO_CANCEL;
    if (pm__stream_is_legacy(stream) || pm__stream_is_threads_own(stream))
        PM__REFUSED_IN_HOST_FUNC("pm_stream_launch_host_func on a default stream");
    PM__INSTANCE_OR_RETURN(inst);
    if (!fn)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_stream_launch_host_func: fn is NULL");
    pm_result r = inst->backend.stream_check(stream);
    if (r != PM_SUCCESS)
        return r;
    /* fn may wait for another stream: blocks freed on this one before it
     * must be reusable without waiting for fn, as the driver's are. */
    pm__pools_flush_frees_on(stream);
    /* Run through a wrapper that marks the thread, so that the calls fn makes
     * answer as the driver's do inside a host function. */
    void *wrapped = pm__host_func_wrap(fn, arg);
    if (!wrapped)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "pm_stream_launch_host_func: out of memory");
    r = inst->backend.stream_launch_host_func(stream, pm__host_func_run, wrapped);
    if (r != PM_SUCCESS)
        free(wrapped);
    return r;
}
