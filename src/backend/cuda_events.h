/* Events for markers, kept for reuse: making one can wait for a host
 * function running on any stream (docs/driver-behavior.md), which a pool's
 * free or destroy must not. */
#ifndef PINMEM_CUDA_EVENTS_H
#define PINMEM_CUDA_EVENTS_H

#include "cuda_loader.h"

/* Called once, when the backend opens, before any other call here. */
void pm__cuda_events_open(const pm__cuda_api *api);
/* An event of context ctx (current on the calling thread) recorded on s:
 * one kept from before where there is one, else a new one. On failure
 * *failed names the driver call that failed. */
CUresult pm__cuda_event_record_new(CUcontext ctx, CUstream s, CUevent *ev, const char **failed);
/* ev, of context ctx, kept for the next one recorded there, or destroyed
 * (where enough are kept, or ctx may end before the process). It may still
 * be recorded on work not yet done. */
void pm__cuda_event_give(CUcontext ctx, CUevent ev);

#endif
