/* pinmem for the stand-in runtime and the test programs, reached the way the
 * preload reaches it: the libpinmem.so already in the process (by soname),
 * else this build's (PM_DYN_LIBRARY), loaded on first use. Neither links
 * libpinmem, so a test can see that nothing loads it before the first
 * runtime call. */
#ifndef PINMEM_TEST_PM_DYN_H
#define PINMEM_TEST_PM_DYN_H

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "pinmem.h"

#define PM_DYN_FUNCS(X)                                                                   \
    X(pm_backend_name) X(pm_result_name) X(pm_last_error_detail) X(pm_device_alloc)       \
    X(pm_device_free) X(pm_stream_create) X(pm_stream_destroy) X(pm_stream_synchronize)   \
    X(pm_stream_launch_host_func) X(pm_event_create) X(pm_event_destroy) X(pm_event_record) \
    X(pm_event_synchronize) X(pm_event_query) X(pm_stream_wait_event) X(pm_mem_host_get_flags) \
    X(pm_mem_get_address_range) X(pm_mem_host_alloc) X(pm_mem_free_host) X(pm_copy_get_stats)

typedef struct pm_dyn {
#define PM_DYN_FIELD_(name) __typeof__(&name) name;
    PM_DYN_FUNCS(PM_DYN_FIELD_)
#undef PM_DYN_FIELD_
} pm_dyn;

#define PM_DYN_STR2_(x) #x
#define PM_DYN_STR_(x) PM_DYN_STR2_(x)

static pm_dyn pm_dyn_table;
static pthread_once_t pm_dyn_once = PTHREAD_ONCE_INIT;

static void pm_dyn_load(void)
{
    const char *soname =
        "libpinmem.so." PM_DYN_STR_(PM_VERSION_MAJOR) "." PM_DYN_STR_(PM_VERSION_MINOR);
    void *h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        h = dlopen(PM_DYN_LIBRARY, RTLD_NOW);
    if (!h) {
        fprintf(stderr, "pm_dyn: %s\n", dlerror());
        abort();
    }
#define PM_DYN_BIND_(name)                                                   \
    if (!(pm_dyn_table.name = (__typeof__(&name))(uintptr_t)dlsym(h, #name))) { \
        fprintf(stderr, "pm_dyn: %s is missing\n", #name);                  \
        abort();                                                             \
    }
    PM_DYN_FUNCS(PM_DYN_BIND_)
#undef PM_DYN_BIND_
}

/* The table, loading pinmem on first use. */
static inline const pm_dyn *pmd(void)
{
    pthread_once(&pm_dyn_once, pm_dyn_load);
    return &pm_dyn_table;
}

#endif
