/* The runtime's own functions, looked up on first use. RTLD_NEXT finds the
 * runtime a program linked or loaded globally; a runtime loaded with
 * RTLD_LOCAL (a plugin's dependency) is in no scope RTLD_NEXT searches, so
 * the runtime's libraries already in the process are asked by name next,
 * then any other runtime of CUDA 11 or later loaded under another name.
 * Nothing is loaded here: a runtime that is not in the process is not
 * brought in. */
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

static void *find_in(const char *library, const char *name)
{
    void *h = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return NULL;
    void *f = not_ours(dlsym(h, name));
    dlclose(h);
    return f;
}

static void *find(const char *name)
{
    static const char *const runtimes[] = {"libcudart.so.13", "libcudart.so.12",
                                           "libcudart.so.11.0", "libcudart.so"};
    void *f = not_ours(dlsym(RTLD_NEXT, name));
    for (size_t i = 0; !f && i < sizeof runtimes / sizeof runtimes[0]; i++)
        f = find_in(runtimes[i], name);
    if (!f) {
        runtime_paths found = {.n = 0};
        dl_iterate_phdr(note_runtime, &found);
        for (int i = 0; !f && i < found.n; i++)
            f = find_in(found.path[i], name);
    }
    return f;
}

static void missing(const char *name)
{
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&said))
        pm__preload_say("no CUDA runtime in this process has %s; calls that need the runtime "
                        "return cudaErrorInitializationError",
                        name);
}

#define PM__REAL_DEFINE_(name, params)                                          \
    pm__real_##name##_t pm__real_##name(void)                                   \
    {                                                                           \
        static _Atomic(pm__real_##name##_t) slot;                               \
        pm__real_##name##_t f = atomic_load_explicit(&slot, memory_order_acquire); \
        if (f)                                                                  \
            return f;                                                           \
        void *found = find(#name);                                              \
        if (!found) {                                                           \
            missing(#name);                                                     \
            return NULL;                                                        \
        }                                                                       \
        f = (pm__real_##name##_t)(uintptr_t)found;                              \
        atomic_store_explicit(&slot, f, memory_order_release);                  \
        return f;                                                               \
    }
PM__REAL_LIST(PM__REAL_DEFINE_)

/* An optional function's absence is kept too (as 1), so that the calls
 * that would use it do not look it up again each time. */
#define PM__REAL_DEFINE_OPTIONAL_(name, params)                                    \
    pm__real_##name##_t pm__real_##name(void)                                      \
    {                                                                              \
        static atomic_uintptr_t slot;                                              \
        uintptr_t f = atomic_load_explicit(&slot, memory_order_acquire);           \
        if (!f) {                                                                  \
            void *found = find(#name);                                             \
            f = found ? (uintptr_t)found : 1;                                      \
            atomic_store_explicit(&slot, f, memory_order_release);                 \
        }                                                                          \
        return f == 1 ? NULL : (pm__real_##name##_t)f;                             \
    }
PM__REAL_OPTIONAL_LIST(PM__REAL_DEFINE_OPTIONAL_)

bool pm__capture_relax(enum cudaStreamCaptureMode *was)
{
    pm__real_cudaThreadExchangeStreamCaptureMode_t exchange =
        pm__real_cudaThreadExchangeStreamCaptureMode();
    *was = cudaStreamCaptureModeRelaxed;
    return exchange && exchange(was) == cudaSuccess;
}

void pm__capture_restore(enum cudaStreamCaptureMode was)
{
    pm__real_cudaThreadExchangeStreamCaptureMode()(&was);
}
