/* The runtime's own functions, looked up on first use. RTLD_NEXT finds the
 * runtime a program linked or loaded globally; a runtime loaded with
 * RTLD_LOCAL (a plugin's dependency) is in no scope RTLD_NEXT searches, so
 * the runtime's libraries already in the process are asked by name next.
 * Nothing is loaded here: a runtime that is not in the process is not
 * brought in. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>

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

static void *find(const char *name)
{
    static const char *const runtimes[] = {"libcudart.so.13", "libcudart.so.12",
                                           "libcudart.so.11.0", "libcudart.so"};
    void *f = not_ours(dlsym(RTLD_NEXT, name));
    for (size_t i = 0; !f && i < sizeof runtimes / sizeof runtimes[0]; i++) {
        void *h = dlopen(runtimes[i], RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            continue;
        f = not_ours(dlsym(h, name));
        dlclose(h);
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
