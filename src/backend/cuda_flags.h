/* Markers as flags, for contexts pinmem does not hold (cuda_flags.c). */
#ifndef PINMEM_CUDA_FLAGS_H
#define PINMEM_CUDA_FLAGS_H

#include "backend.h"
#include "cuda_loader.h"

/* Called once, when the backend opens, before any other call here: home is
 * the context the flags' pages are pinned in (pinmem's primary one). */
void pm__cuda_flags_open(const pm__cuda_api *api, CUcontext home);
/* Whether markers of s's context ctx are flags: ctx is not one pinmem
 * holds, and the driver writes and waits for flags. */
bool pm__cuda_flags_for(CUcontext ctx);
/* A flag written behind s's work so far, into *out (ctx: s's context,
 * current on the calling thread). */
pm_result pm__cuda_flag_record(CUstream s, CUcontext ctx, pm__marker *out);
bool pm__cuda_flag_done(const pm__marker *m);
/* Work enqueued on s after this waits for m's flag. */
pm_result pm__cuda_flag_wait(CUstream s, const pm__marker *m);
/* SUCCESS where m's flag has arrived, NOT_READY before, or, as the driver's
 * cuEventQuery, the sticky error that stopped the device's work. */
pm_result pm__cuda_flag_query(const pm__marker *m);
/* Waits for m's flag; fails with the error that stopped the device's work
 * where a sticky error means the flag never comes. */
pm_result pm__cuda_flag_synchronize(const pm__marker *m);
/* m's flag word back for reuse once its value has arrived. */
void pm__cuda_flag_release(pm__marker *m);

#endif
