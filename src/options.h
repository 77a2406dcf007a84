/* Every PINMEM_* environment variable the library reads, in one table
 * (options.c): name, type, default, the values allowed, one line on what it
 * does. No other file reads them; code asks here.
 *
 * One parser reads them all, once, as the instance is made. The rule for a
 * bad value (text that is not of the option's type, a number that overflows
 * or lies outside the range allowed, a word not among the choices): pm_init,
 * and every call after it, fails with PM_ERROR_INVALID_VALUE and a detail
 * naming the variable, its value and what is allowed. Nothing is printed,
 * and no bad value is quietly replaced by a default.
 *
 * The values, wherever they come from:
 *  - counts are decimal integers; sizes may end in K, M, G or T (KiB, MB and
 *    the like read the same: powers of 1024); flags are 0 or 1;
 *  - 0 means the default, for every count and size that the copy engine
 *    takes (a device ordinal 0 is device 0);
 *  - sizes of memory (staging buffers and slices, the registration cache's
 *    bounds) are rounded up to whole pages;
 *  - PINMEM_COPY_DIRECT_MAX=-1, like pm_copy_config.direct_max = (size_t)-1,
 *    means that no pageable copy takes the backend's own path (and
 *    PINMEM_COPY_DTOH_DIRECT_MAX=-1 none from the device);
 *    PINMEM_COPY_SPIN_US=-1, like pm_copy_config.spin_us = (unsigned)-1, that
 *    workers never spin.
 * The settings pm_copy_set_config (and pm_set_pinned_budget) also take pass
 * the same check, pm__option_check, so code and environment are held to the
 * same limits.
 *
 * Each option also keeps the value in effect and where it came from
 * (default, environment, code), which pm_get_setting reports. */
#ifndef PINMEM_OPTIONS_H
#define PINMEM_OPTIONS_H

#include <stdbool.h>

#include "pinmem.h"

typedef enum pm__option {
    PM__OPT_BACKEND,
    PM__OPT_DEVICE,
    PM__OPT_STATS,
    PM__OPT_POOL_VMM,
    PM__OPT_PINNED_BUDGET,
    PM__OPT_THREAD_CPUS,
    PM__OPT_REGISTRATION_CACHE,
    PM__OPT_REGISTRATION_CACHE_MIN,
    PM__OPT_REGISTRATION_CACHE_MAX,
    PM__OPT_COPY_WORKERS,
    PM__OPT_COPY_HTOD_WORKERS,
    PM__OPT_COPY_CHUNK,
    PM__OPT_COPY_SLICE,
    PM__OPT_COPY_BUFFERS,
    PM__OPT_COPY_DIRECT_MAX,
    PM__OPT_COPY_DTOH_DIRECT_MAX,
    PM__OPT_COPY_DTOH_SLICE,
    PM__OPT_COPY_STORES,
    PM__OPT_COPY_FIRST_PIECE,
    PM__OPT_COPY_DTOH_FIRST_PIECE,
    PM__OPT_COPY_PIECES,
    PM__OPT_COPY_SPIN_US,
    PM__OPT_COPY_RING,
    PM__OPT_COPY_BATCH,
    PM__OPT_COPY_KERNEL_MAX,
    PM__OPT_COPY_KERNEL_STAGED,
    PM__OPT_COPY_KERNEL_PER_SM,
    PM__OPT_COPY_TRACE,
    PM__OPT_COUNT
} pm__option;

/* The choices' values: the index of the word in the table. */
enum { PM__BACKEND_AUTO, PM__BACKEND_CUDA, PM__BACKEND_POSIX };
enum { PM__POOL_VMM_AUTO, PM__POOL_VMM_NEVER, PM__POOL_VMM_ALWAYS };
enum { PM__THREAD_CPUS_CALLER, PM__THREAD_CPUS_PROCESS };

/* A value that means "none" (PINMEM_COPY_DIRECT_MAX=-1). */
#define PM__OPT_NONE (~0ull)

/* Parses every variable (once; later calls give the same answer). */
pm_result pm__options_load(void);

/* The value the environment gave (checked and rounded), or false when the
 * variable is unset (or 0, the default). */
bool pm__option_env(pm__option id, unsigned long long *value);
/* The environment's value, or the table's default where it has one number
 * (choices: the index of the word). */
unsigned long long pm__option_value(pm__option id);

/* The one check for a value of id from code or the environment: *out gets
 * it rounded (0: the default; PM__OPT_NONE: none), or a failure with a
 * detail that starts with who ("PINMEM_COPY_CHUNK=1" or
 * "pm_copy_set_config: chunk_bytes = 1"). */
pm_result pm__option_check(pm__option id, unsigned long long value, const char *who,
                           unsigned long long *out);
/* The name pm_copy_config gives the setting ("chunk_bytes"), or NULL. */
const char *pm__option_field(pm__option id);

/* Records the value now in effect for pm_get_setting: by_code, set by a
 * call, unless it equals default_value (what the environment, or else the
 * default, gives); otherwise from the environment where it named one. */
void pm__option_publish(pm__option id, unsigned long long value, unsigned long long default_value,
                        bool by_code);
/* Fills *s for the index-th option (false past the last). */
bool pm__option_describe(unsigned index, pm_setting *s);

#endif
