/* The runtime's own functions, looked up on first use, for each runtime
 * version a caller came from (pm__runtime). RTLD_NEXT finds the runtime a
 * program linked or loaded globally; a runtime loaded with RTLD_LOCAL (a
 * plugin's dependency) is in no scope RTLD_NEXT searches, so the runtime's
 * libraries already in the process are asked by name next, then any other
 * runtime of CUDA 11 or later loaded under another name. A caller's own
 * version is asked for by its name (dlvsym); a function no runtime of that
 * version has is looked up as for a caller without one. Nothing is loaded
 * here: a runtime that is not in the process is not brought in. */
#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "preload.h"

static void *own_base(void)
{
    Dl_info self;
    return dladdr((void *)own_base, &self) ? self.dli_fbase : NULL;
}

/* f, unless it is this library's own definition. */
static void *not_ours(void *f)
{
    Dl_info where;
    if (!f)
        return NULL;
    if (dladdr(f, &where) && where.dli_fbase == own_base())
        return NULL;
    return f;
}

/* The paths of the runtimes loaded under other names (a wheel's renamed
 * copy, "libcudart-1a2b3c4d.so.12"), of CUDA 11 and later, whose ABI the
 * preload speaks. Collected first: nothing is opened while the list of
 * loaded objects is walked. */
enum { MOST_RUNTIMES = 8, RUNTIME_PATH_MAX = 512 };
typedef struct runtime_paths {
    char path[MOST_RUNTIMES][RUNTIME_PATH_MAX];
    int n;
} runtime_paths;

static int note_runtime(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    runtime_paths *found = arg;
    const char *path = info->dlpi_name, *base = path ? strrchr(path, '/') : NULL;
    base = base ? base + 1 : path;
    const char *so = base ? strstr(base, ".so.") : NULL;
    if (!so || strncmp(base, "libcudart", 9) != 0 || atoi(so + 4) < 11 ||
        strlen(path) >= RUNTIME_PATH_MAX)
        return 0;
    snprintf(found->path[found->n++], RUNTIME_PATH_MAX, "%s", path);
    return found->n == MOST_RUNTIMES;
}

/* The name each runtime gives its library and its functions' version. */
static const char *const version_names[PM__RUNTIME_COUNT] = {
    [PM__RUNTIME_11] = "libcudart.so.11.0",
    [PM__RUNTIME_12] = "libcudart.so.12",
    [PM__RUNTIME_13] = "libcudart.so.13",
};

/* name in handle, of that version (any when version is NULL). */
static void *symbol(void *handle, const char *name, const char *version)
{
    return not_ours(version ? dlvsym(handle, name, version) : dlsym(handle, name));
}

static void *find_in(const char *library, const char *name, const char *version)
{
    void *h = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return NULL;
    void *f = symbol(h, name, version);
    dlclose(h);
    return f;
}

static void *find_version(const char *name, const char *version)
{
    static const char *const runtimes[] = {"libcudart.so.13", "libcudart.so.12",
                                           "libcudart.so.11.0", "libcudart.so"};
    void *f = symbol(RTLD_NEXT, name, version);
    for (size_t i = 0; !f && i < sizeof runtimes / sizeof runtimes[0]; i++)
        f = find_in(runtimes[i], name, version);
    if (!f) {
        runtime_paths found = {.n = 0};
        dl_iterate_phdr(note_runtime, &found);
        for (int i = 0; !f && i < found.n; i++)
            f = find_in(found.path[i], name, version);
    }
    return f;
}

static void *find(const char *name, pm__runtime runtime)
{
    void *f = version_names[runtime] ? find_version(name, version_names[runtime]) : NULL;
    return f ? f : find_version(name, NULL);
}

static void missing(const char *name)
{
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&said))
        pm__preload_say("no CUDA runtime in this process has %s; calls that need the runtime "
                        "return cudaErrorInitializationError",
                        name);
}

#define PM__REAL_DEFINE_(name, params)                                                   \
    pm__real_##name##_t pm__real_##name(pm__runtime runtime)                             \
    {                                                                                    \
        static _Atomic(pm__real_##name##_t) slots[PM__RUNTIME_COUNT];                    \
        pm__real_##name##_t f = atomic_load_explicit(&slots[runtime], memory_order_acquire); \
        if (f)                                                                           \
            return f;                                                                    \
        void *found = find(#name, runtime);                                              \
        if (!found) {                                                                    \
            missing(#name);                                                              \
            return NULL;                                                                 \
        }                                                                                \
        f = (pm__real_##name##_t)(uintptr_t)found;                                       \
        atomic_store_explicit(&slots[runtime], f, memory_order_release);                 \
        return f;                                                                        \
    }
PM__REAL_LIST(PM__REAL_DEFINE_)

/* An optional function's absence is kept too (as 1), so that the calls
 * that would use it do not look it up again each time. */
#define PM__REAL_DEFINE_OPTIONAL_(name, params)                                    \
    pm__real_##name##_t pm__real_##name(pm__runtime runtime)                       \
    {                                                                              \
        static atomic_uintptr_t slots[PM__RUNTIME_COUNT];                          \
        uintptr_t f = atomic_load_explicit(&slots[runtime], memory_order_acquire); \
        if (!f) {                                                                  \
            void *found = find(#name, runtime);                                    \
            f = found ? (uintptr_t)found : 1;                                      \
            atomic_store_explicit(&slots[runtime], f, memory_order_release);       \
        }                                                                          \
        return f == 1 ? NULL : (pm__real_##name##_t)f;                             \
    }
PM__REAL_OPTIONAL_LIST(PM__REAL_DEFINE_OPTIONAL_)

bool pm__capture_relax(pm__runtime runtime, enum cudaStreamCaptureMode *was)
{
    pm__real_cudaThreadExchangeStreamCaptureMode_t exchange =
        pm__real_cudaThreadExchangeStreamCaptureMode(runtime);
    *was = cudaStreamCaptureModeRelaxed;
    return exchange && exchange(was) == cudaSuccess;
}

void pm__capture_restore(pm__runtime runtime, enum cudaStreamCaptureMode was)
{
    pm__real_cudaThreadExchangeStreamCaptureMode(runtime)(&was);
}
