/* Reaching pinmem: one libpinmem.so per process, so that a Python program
 * that imports the pinmem package and runs under this library shares one
 * instance (one registry of pinned ranges, one copy engine) with it. The
 * library already in the process is taken first (found by its soname,
 * whatever path it was loaded from); else the one PINMEM_LIBRARY names, as
 * the Python package does; else the one beside this library (the build
 * tree, the install's lib directory, the Python package's _lib); else the
 * system's. The Python package looks for a loaded one first as well. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "preload.h"

#define PM__STR2_(x) #x
#define PM__STR_(x) PM__STR2_(x)
#define PINMEM_SONAME "libpinmem.so." PM__STR_(PM_VERSION_MAJOR) "." PM__STR_(PM_VERSION_MINOR)

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pm__pinmem_api api;
static const pm__pinmem_api *usable;
/* A load is under way in this process, on some thread. */
static atomic_bool loading;
/* This process was forked while its parent loaded pinmem: the loader's and
 * pinmem's state were half made there, so this child leaves both alone. */
static atomic_bool forked_while_loading;

static void note_fork_in_child(void)
{
    if (atomic_load_explicit(&loading, memory_order_relaxed))
        atomic_store_explicit(&forked_while_loading, true, memory_order_relaxed);
}

/* At load, before any thread can begin loading: glibc leaves out of a fork's
 * child step a handler registered while that fork was under way. */
__attribute__((constructor)) static void watch_forks(void)
{
    pthread_atfork(NULL, NULL, note_fork_in_child);
}

/* The directory this library was loaded from, with a trailing slash. */
static bool own_directory(char *dir, size_t cap)
{
    Dl_info self;
    char real[PATH_MAX];
    if (!dladdr((void *)own_directory, &self) || !self.dli_fname ||
        !realpath(self.dli_fname, real))
        return false;
    char *slash = strrchr(real, '/');
    if (!slash)
        return false;
    slash[1] = '\0';
    return snprintf(dir, cap, "%s", real) < (int)cap;
}

static void *open_library(void)
{
    void *h = dlopen(PINMEM_SONAME, RTLD_NOW | RTLD_NOLOAD);
    if (h)
        return h;
    const char *given = getenv("PINMEM_LIBRARY");
    if (given && *given)
        return dlopen(given, RTLD_NOW);
    char path[PATH_MAX + 32];
    if (own_directory(path, PATH_MAX)) {
        strcat(path, PINMEM_SONAME);
        if ((h = dlopen(path, RTLD_NOW)))
            return h;
    }
    return dlopen(PINMEM_SONAME, RTLD_NOW);
}

static bool bind_functions(void *h)
{
#define PM__PINMEM_BIND_(name, ret, params)                                 \
    if (!(api.name = (ret(*) params)(uintptr_t)dlsym(h, #name))) {         \
        pm__preload_say("the libpinmem.so found lacks %s (too old)", #name); \
        return false;                                                       \
    }
    PM__PINMEM_LIST(PM__PINMEM_BIND_)
#undef PM__PINMEM_BIND_
    int v = api.pm_version();
    if (v / 10000 != PM_VERSION_MAJOR || v < PM_VERSION_NUMBER) {
        pm__preload_say("the libpinmem.so found is version %d; this library needs %d.%d or a "
                        "later %d.x",
                        v, PM_VERSION_MAJOR, PM_VERSION_MINOR, PM_VERSION_MAJOR);
        return false;
    }
    return true;
}

/* pinmem's pinning and copies stand in for the runtime's only when they reach
 * the runtime's driver: on the CUDA backend. The POSIX backend serves only
 * when asked for by name (PINMEM_BACKEND=posix): its device memory is its
 * own simulation, which only a runtime built on pinmem (the tests' stand-in)
 * hands out. */
static bool backend_serves(void)
{
    const char *name = api.pm_backend_name();
    if (strcmp(name, "cuda") == 0)
        return true;
    const char *asked = getenv("PINMEM_BACKEND");
    if (strcmp(name, "posix") == 0 && asked && strcmp(asked, "posix") == 0)
        return true;
    pm__preload_say("pinmem found no CUDA driver it can use (backend %s); the CUDA runtime's "
                    "own calls serve this process",
                    name);
    return false;
}

static void load_pinmem(void)
{
    if (atomic_load_explicit(&forked_while_loading, memory_order_relaxed)) {
        pm__preload_say("this process was forked while its parent loaded pinmem; the CUDA "
                        "runtime's own calls serve this process");
        return;
    }
    void *h = open_library();
    if (!h) {
        pm__preload_say("libpinmem.so could not be loaded (%s); the CUDA runtime's own calls "
                        "serve this process",
                        dlerror());
        return;
    }
    if (!bind_functions(h))
        return;
    pm_result r = api.pm_init(0);
    if (r != PM_SUCCESS) {
        pm__preload_say("pinmem did not initialise (%s: %s); the CUDA runtime's own calls serve "
                        "this process",
                        api.pm_result_name(r), api.pm_last_error_detail());
        return;
    }
    if (!backend_serves())
        return;
    pm_capabilities caps = {.struct_size = sizeof caps};
    pm_copy_config config = {.struct_size = sizeof config};
    if (api.pm_get_capabilities(&caps) != PM_SUCCESS ||
        api.pm_copy_get_config(&config) != PM_SUCCESS)
        return;
    api.device_ordinal = caps.device_ordinal;
    api.direct_max = config.direct_max;
    api.dtoh_direct_max = config.dtoh_direct_max;
    usable = &api;
}

static void load(void)
{
    atomic_store_explicit(&loading, true, memory_order_relaxed);
    load_pinmem();
    atomic_store_explicit(&loading, false, memory_order_relaxed);
}

const pm__pinmem_api *pm__pinmem(void)
{
    pthread_once(&once, load);
    return usable;
}
