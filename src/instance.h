/* The process-wide instance: the chosen backend and the range registry,
 * created once on first use and never torn down (other libraries' atexit
 * handlers may still free pinned memory). */
#ifndef PINMEM_INSTANCE_H
#define PINMEM_INSTANCE_H

#include "backend/backend.h"
#include "ranges.h"

typedef struct pm__instance {
    pm__backend backend;
    pm__ranges *ranges;
} pm__instance;

/* The instance, or NULL with *r set (and the thread's detail recorded) when
 * no backend could be initialised, or in a child forked after the library
 * was initialised (pinmem.h, pm_init). The same answer on every call. */
pm__instance *pm__instance_get(pm_result *r);

/* The backend. There are two ways to it, one for each kind of code: a
 * public call takes the instance its preamble (PM__INSTANCE_OR_RETURN)
 * returned and uses inst->backend; internal code below the public calls,
 * which runs only after one of them initialised the instance, calls this. */
static inline const pm__backend *pm__instance_backend(void)
{
    pm_result ignored;
    pm__instance *inst = pm__instance_get(&ignored);
    return &inst->backend;
}

/* Runs the preamble every public call starts with. */
#define PM__INSTANCE_OR_RETURN(inst)          \
    pm_result init_result_ = PM_SUCCESS;      \
    pm__instance *inst = pm__instance_get(&init_result_); \
    if (!inst)                                \
        return init_result_

#endif
