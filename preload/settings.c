/* PINMEM_PRELOAD and PINMEM_STATS, read once per process on first use. Each
 * variable is read by one small function, so that the reading can move into
 * the library's table of settings as it is. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "preload.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static unsigned mode;
static bool stats;
static atomic_uint turned_off;

/* off|alloc|copy|all, default all; anything else is said once and read as
 * the default. */
static unsigned mode_from_env(void)
{
    static const struct {
        const char *name;
        unsigned bits;
    } modes[] = {{"off", 0},
                 {"alloc", PM__PRELOAD_ALLOC},
                 {"copy", PM__PRELOAD_COPY},
                 {"all", PM__PRELOAD_ALLOC | PM__PRELOAD_COPY}};
    const char *v = getenv("PINMEM_PRELOAD");
    if (!v || !*v)
        return PM__PRELOAD_ALLOC | PM__PRELOAD_COPY;
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (strcmp(v, modes[i].name) == 0)
            return modes[i].bits;
    pm__preload_say("PINMEM_PRELOAD=%s is not off, alloc, copy or all; using all", v);
    return PM__PRELOAD_ALLOC | PM__PRELOAD_COPY;
}

static bool stats_from_env(void)
{
    const char *v = getenv("PINMEM_STATS");
    return v && strcmp(v, "1") == 0;
}

static void read_settings(void)
{
    mode = mode_from_env();
    stats = stats_from_env();
}

unsigned pm__preload_mode(void)
{
    pthread_once(&once, read_settings);
    return mode;
}

bool pm__preload_stats_wanted(void)
{
    pthread_once(&once, read_settings);
    return stats;
}

bool pm__preload_wants(unsigned feature)
{
    return (pm__preload_mode() & feature) &&
           !(atomic_load_explicit(&turned_off, memory_order_relaxed) & feature);
}

void pm__preload_turn_off(unsigned feature)
{
    atomic_fetch_or(&turned_off, feature);
}
