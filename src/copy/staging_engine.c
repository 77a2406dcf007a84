/* The staging engines, one a device, process-wide (part of the instance;
 * their type is in staging_engine.h), with their locks and conditions ready
 * before any thread uses them, and the choice of a copy's engine. */
#include "../errors.h"
#include "../test_hooks.h"
#include "staging_engine.h"

engine pm__staging_engines[PM__ENGINES_MAX] = {
    [0 ... PM__ENGINES_MAX - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER,
                                   .has_work = PTHREAD_COND_INITIALIZER,
                                   .dtoh_work = PTHREAD_COND_INITIALIZER,
                                   .progressed = PTHREAD_COND_INITIALIZER,
                                   .buffer_freed = PTHREAD_COND_INITIALIZER,
                                   .dma_ready = PTHREAD_COND_INITIALIZER}};

engine *pm__staging_engine_for(const pm__backend *be, pm_deviceptr dev)
{
    if (PM__TEST_ENGINES_SPLIT())
        return &pm__staging_engines[dev >> 21 & 1];
    if (be->device_count < 2)
        return &pm__staging_engines[0];
    int ordinal = 0;
    pm__detail_saved before; /* memory of no device takes the first engine: no failure */
    pm__detail_save(&before);
    if (be->pointer_device(dev, &ordinal) != PM_SUCCESS)
        ordinal = 0;
    pm__detail_restore(&before);
    return &pm__staging_engines[(unsigned)ordinal % PM__ENGINES_MAX];
}
