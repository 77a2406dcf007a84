/* The process-wide cap on pinned bytes (pm_set_pinned_budget, also
 * pm_copy_config.pinned_budget and PINMEM_PINNED_BUDGET): every path that
 * pins memory takes its bytes here first and gives them back when it
 * unpins. Part of the lazily created instance. */
#ifndef PINMEM_BUDGET_H
#define PINMEM_BUDGET_H

#include <stdbool.h>
#include <stddef.h>

#include "pinmem.h"

/* Takes PINMEM_PINNED_BUDGET (instance initialisation). */
void pm__budget_init_from_env(void);
/* PM_SUCCESS, or PM_ERROR_OUT_OF_MEMORY with a detail naming what wanted
 * the bytes when the budget would be exceeded. */
pm_result pm__budget_take(size_t bytes, const char *what);
void pm__budget_give(size_t bytes);
unsigned long long pm__budget_pinned(void);
unsigned long long pm__budget_cap(void); /* 0: no cap */
/* by_code: set by a call (for pm_get_setting), rather than the environment. */
void pm__budget_set_cap(unsigned long long cap, bool by_code);

#endif
