#include "budget.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "errors.h"
#include "instance.h"
#include "no_cancel.h"
#include "options.h"

static _Atomic unsigned long long pinned;
static _Atomic unsigned long long cap; /* 0: none */
/* Orders setters, so that the value pm_get_setting reports is the cap in effect. */
static pthread_mutex_t set_lock = PTHREAD_MUTEX_INITIALIZER;

void pm__budget_init_from_env(void)
{
    unsigned long long v = 0;
    pm__option_env(PM__OPT_PINNED_BUDGET, &v);
    atomic_store(&cap, v);
}

pm_result pm__budget_take(size_t bytes, const char *what)
{
    unsigned long long now = atomic_load_explicit(&pinned, memory_order_relaxed);
    for (;;) {
        unsigned long long limit = atomic_load_explicit(&cap, memory_order_relaxed);
        if (limit && (bytes > limit || now > limit - bytes))
            return pm__fail(PM_ERROR_OUT_OF_MEMORY,
                            "%s: %zu more pinned bytes would pass the pinned budget of %llu "
                            "(%llu pinned now)",
                            what, bytes, limit, now);
        if (atomic_compare_exchange_weak_explicit(&pinned, &now, now + bytes,
                                                  memory_order_relaxed, memory_order_relaxed))
            return PM_SUCCESS;
    }
}

void pm__budget_give(size_t bytes)
{
    atomic_fetch_sub_explicit(&pinned, bytes, memory_order_relaxed);
}

unsigned long long pm__budget_pinned(void) { return atomic_load(&pinned); }
unsigned long long pm__budget_cap(void) { return atomic_load(&cap); }

void pm__budget_set_cap(unsigned long long c, bool by_code)
{
    unsigned long long from_env = 0;
    pm__option_env(PM__OPT_PINNED_BUDGET, &from_env);
    pthread_mutex_lock(&set_lock);
    atomic_store(&cap, c);
    pm__option_publish(PM__OPT_PINNED_BUDGET, c, from_env, by_code);
    pthread_mutex_unlock(&set_lock);
}

pm_result pm_set_pinned_budget(unsigned long long bytes)
{
    PM__NO_CANCEL;
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    pm__budget_set_cap(bytes, true);
    return PM_SUCCESS;
}

pm_result pm_get_pinned_budget(unsigned long long *bytes)
{
    PM__NO_CANCEL;
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    if (!bytes)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_get_pinned_budget: bytes is NULL");
    *bytes = pm__budget_cap();
    return PM_SUCCESS;
}
