/* The staging engine's one instance, process-wide (part of the instance; its
 * type is in staging_engine.h), with its lock and conditions ready before
 * any thread uses them. */
#include "staging_engine.h"

engine pm__staging_engine = {.lock = PTHREAD_MUTEX_INITIALIZER,
                             .has_work = PTHREAD_COND_INITIALIZER,
                             .dtoh_work = PTHREAD_COND_INITIALIZER,
                             .progressed = PTHREAD_COND_INITIALIZER,
                             .buffer_freed = PTHREAD_COND_INITIALIZER,
                             .dma_ready = PTHREAD_COND_INITIALIZER};
