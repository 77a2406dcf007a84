/* Lanes: a private stream and two events per thread that copies on its
 * per-thread default stream, made with the runtime's own functions on first
 * use and destroyed when the thread exits. Both happen once per thread, in
 * relaxed capture mode (pm__capture_relax): whether the driver counts them
 * as unsafe beside another thread's capture is not documented call by
 * call, and a refusal would invalidate that capture. */
#include <pthread.h>
#include <stdlib.h>

#include "preload.h"

struct pm__lane {
    cudaStream_t stream;
    cudaEvent_t before, after;
};

static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static bool have_key;

static void destroy(void *p)
{
    pm__lane *lane = p;
    enum cudaStreamCaptureMode mode;
    const bool relaxed = pm__capture_relax(&mode);
    if (lane->after)
        PM__REAL_CALL(cudaEventDestroy, lane->after);
    if (lane->before)
        PM__REAL_CALL(cudaEventDestroy, lane->before);
    if (lane->stream)
        PM__REAL_CALL(cudaStreamDestroy, lane->stream);
    if (relaxed)
        pm__capture_restore(mode);
    free(lane);
}

static void make_key(void)
{
    have_key = pthread_key_create(&key, destroy) == 0;
}

static bool make(pm__lane *lane)
{
    return PM__REAL_CALL(cudaStreamCreateWithFlags, &lane->stream, cudaStreamNonBlocking) ==
               cudaSuccess &&
           PM__REAL_CALL(cudaEventCreateWithFlags, &lane->before, cudaEventDisableTiming) ==
               cudaSuccess &&
           PM__REAL_CALL(cudaEventCreateWithFlags, &lane->after, cudaEventDisableTiming) ==
               cudaSuccess;
}

static pm__lane *mine(void)
{
    pthread_once(&key_once, make_key);
    if (!have_key)
        return NULL;
    pm__lane *lane = pthread_getspecific(key);
    if (lane)
        return lane;
    if (!(lane = calloc(1, sizeof *lane)))
        return NULL;
    enum cudaStreamCaptureMode mode;
    const bool relaxed = pm__capture_relax(&mode);
    const bool made = make(lane);
    if (relaxed)
        pm__capture_restore(mode);
    if (!made || pthread_setspecific(key, lane) != 0) {
        destroy(lane);
        return NULL;
    }
    return lane;
}

pm__lane *pm__lane_enter(void)
{
    pm__lane *lane = mine();
    if (!lane || PM__REAL_CALL(cudaEventRecord, lane->before, cudaStreamPerThread) != cudaSuccess ||
        PM__REAL_CALL(cudaStreamWaitEvent, lane->stream, lane->before, 0) != cudaSuccess)
        return NULL;
    return lane;
}

cudaStream_t pm__lane_stream(const pm__lane *lane)
{
    return lane->stream;
}

bool pm__lane_leave(pm__lane *lane, bool sync)
{
    return PM__REAL_CALL(cudaEventRecord, lane->after, lane->stream) == cudaSuccess &&
           PM__REAL_CALL(cudaStreamWaitEvent, cudaStreamPerThread, lane->after, 0) ==
               cudaSuccess &&
           (!sync || PM__REAL_CALL(cudaEventSynchronize, lane->after) == cudaSuccess);
}
