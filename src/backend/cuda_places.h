/* Where the CUDA backend's driver calls for a stream run: the stream's
 * context, and for copies by a thread without one, the primary context of
 * the device whose memory is copied (docs/design.md, "Several devices"). */
#ifndef PINMEM_CUDA_PLACES_H
#define PINMEM_CUDA_PLACES_H

#include "backend.h"
#include "cuda_loader.h"

/* Called once, when the backend opens, before any other call here: primary
 * is the context of device in_use, which threads without a context use. */
pm_result pm__cuda_places_open(const pm__cuda_api *api, CUcontext primary, int device_count);
/* The context s's work runs in: s's own for a stream handle; for the legacy
 * and per-thread handles (and NULL), the calling thread's current context,
 * or pinmem's primary one where the thread has none. */
CUcontext pm__cuda_stream_context(pm_stream_t s);
/* Whether ctx is a context pinmem holds until the process ends: its own
 * primary context, or another device's that it retained. */
bool pm__cuda_context_held(CUcontext ctx);
/* backend.h's legacy_is_home: the calling thread has no context or pinmem's
 * primary one (a failed query answers false). */
bool pm__cuda_legacy_is_home(void);
/* The backend's thread_runs_host_funcs. */
bool pm__cuda_thread_runs_host_funcs(void);
/* backend.h's place_lasts: a context pinmem holds. */
bool pm__cuda_place_lasts(const pm__place *p);
/* backend.h's memory_place: the owning context where pinmem holds it. */
void pm__cuda_memory_place(pm_deviceptr a, pm__place *out);
/* backend.h's copy_place, place_enter and place_leave. */
pm_result pm__cuda_copy_place(pm_stream_t s, pm_deviceptr a, pm_deviceptr b, pm__place *out);
pm_result pm__cuda_place_enter(const pm__place *p, pm__place_scope *scope);
void pm__cuda_place_leave(pm__place_scope *scope);
/* A scope in which driver calls run in the calling thread's current
 * context, or in pinmem's primary one where the thread has none; left with
 * pm__cuda_place_leave. */
pm_result pm__cuda_home_enter(pm__place_scope *scope);
/* A scope in pinmem's primary context, whatever the thread's current one:
 * for memory pinmem keeps (host allocations, pool chunks, the staging ring,
 * cache registrations), which must not die with a context the user made
 * (cuCtxDestroy frees what was allocated in it); left with
 * pm__cuda_place_leave. */
pm_result pm__cuda_own_enter(pm__place_scope *scope);
/* Runs one driver call (expr, named name in a failure's detail) in the
 * scope enter makes and returns its result, translated. */
#define PM__CUDA_CALL_IN(enter, name, expr)                                 \
    do {                                                                   \
        pm__place_scope scope_;                                            \
        pm_result entered_ = enter(&scope_);                               \
        if (entered_ != PM_SUCCESS)                                        \
            return entered_;                                               \
        CUresult rc_ = (expr);                                             \
        pm__cuda_place_leave(&scope_);                                     \
        return rc_ == CUDA_SUCCESS ? PM_SUCCESS : pm__cuda_fail(rc_, name); \
    } while (0)
#define PM__CUDA_CALL(name, expr) PM__CUDA_CALL_IN(pm__cuda_home_enter, name, expr)
/* backend.h's device_alloc_on: cuMemAlloc in device ordinal's primary
 * context (below the device count). */
pm_result pm__cuda_device_alloc_on(pm_deviceptr *d, size_t bytesize, int ordinal);
/* backend.h's device_release: cuMemFree in the context that made d (with one
 * device, the current or pinmem's). */
pm_result pm__cuda_device_free(pm_deviceptr d);

#endif
