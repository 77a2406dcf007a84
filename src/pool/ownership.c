/* See ownership.h. */
#include "ownership.h"

#include <linux/membarrier.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

bool pm__owner_fence_free;
static pthread_once_t membarrier_once = PTHREAD_ONCE_INIT;

static void register_membarrier(void)
{
    long cmds = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    pm__owner_fence_free =
        cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
        syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}

void pm__ownership_prepare(void) { pthread_once(&membarrier_once, register_membarrier); }

void pm__ownership_init(pm__ownership *o)
{
    /* Before any owner's first entry, so that the choice never changes
     * under an owner. */
    pm__ownership_prepare();
    atomic_init(&o->busy, 0);
    atomic_init(&o->foreign, 0);
    pthread_mutex_init(&o->foreign_lock, NULL);
}

void pm__foreign_enter(pm__ownership *o)
{
    pthread_mutex_lock(&o->foreign_lock);
    atomic_store_explicit(&o->foreign, 1, memory_order_seq_cst);
    if (pm__owner_fence_free &&
        syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) {
        /* Registered, so this cannot fail; if it ever did, the owner's store
         * might still sit in its store buffer: nothing else is safe. */
        abort();
    }
    while (atomic_load_explicit(&o->busy, memory_order_seq_cst))
        sched_yield(); /* the owner is inside for a few nanoseconds, or a refill */
}

void pm__foreign_leave(pm__ownership *o)
{
    atomic_store_explicit(&o->foreign, 0, memory_order_release);
    pthread_mutex_unlock(&o->foreign_lock);
}
