/* The process-wide instance: the chosen backend and the range registry,
 * created once on first use and never torn down (other libraries' atexit
 * handlers may still free pinned memory). */
#ifndef PINMEM_INSTANCE_H
#define PINMEM_INSTANCE_H

#include <stdatomic.h>

#include "backend/backend.h"
#include "ranges.h"

typedef struct pm__instance {
    pm__backend backend;
    pm__ranges *ranges;
    _Atomic int maps_fd; /* see pm__instance_maps_file */
} pm__instance;

/* The instance, or NULL with *r set (and the thread's detail recorded) when
 * no backend could be initialised, or in a child forked after the library
 * was initialised (pinmem.h, pm_init). The same answer on every call. */
pm__instance *pm__instance_get(pm_result *r);

/* /proc/self/maps, which says what each mapping permits (proc_maps.h):
 * opened on first use and kept; -1 where the kernel cannot say, or where
 * the file cannot be opened now (tried again on the next call). A forked
 * child never reads its parent's: every call of such a child refuses. */
int pm__instance_maps_file(pm__instance *inst);

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

/* What modules above the instance ask it to run at moments only it sees,
 * so that it never names them: a module adds its hooks once, as it first
 * initialises (the pools, when the first pool is made). Either function
 * may be NULL. */
typedef struct pm__instance_hooks {
    /* In a child forked after the instance was initialised, on the child's
     * one thread, once every call refuses: only lock-free work, as the
     * parent's other threads may have held any lock. */
    void (*after_fork_in_child)(void);
    /* At exit, when PINMEM_STATS=1: prints the module's statistics. */
    void (*print_stats)(void);
    struct pm__instance_hooks *next; /* the instance's */
} pm__instance_hooks;

/* Adds a module's hooks, which must live as long as the process. */
void pm__instance_add_hooks(pm__instance_hooks *hooks);

/* Runs the preamble every public call starts with. */
#define PM__INSTANCE_OR_RETURN(inst)          \
    pm_result init_result_ = PM_SUCCESS;      \
    pm__instance *inst = pm__instance_get(&init_result_); \
    if (!inst)                                \
        return init_result_

#endif
