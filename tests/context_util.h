/* A context the user made (cuCtxCreate), on pinmem's device, for the tests
 * of what pinmem does on threads in it (CUDA backend only): the driver's
 * context calls, which pinmem does not wrap, loaded from the driver pinmem
 * loaded. */
#ifndef PINMEM_TEST_CONTEXT_UTIL_H
#define PINMEM_TEST_CONTEXT_UTIL_H

#include <stddef.h>

#include "check.h"

#ifdef PINMEM_HAVE_CUDA_HEADERS
#include <cuda.h>
#include <dlfcn.h>
#include <stdbool.h>

typedef struct context_api {
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*create)(CUcontext *, unsigned, CUdevice);
    CUresult (*destroy)(CUcontext);
    CUresult (*push)(CUcontext);
    CUresult (*pop)(CUcontext *);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*mem_host_get_flags)(unsigned *, void *);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*primary_release)(CUdevice);
} context_api;

static context_api api;
static CUcontext theirs; /* the user's context, on pinmem's device */

static inline bool context_api_load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
        return false;
    static const char *const names[] = {"cuDeviceGet",         "cuCtxCreate_v2",
                                        "cuCtxDestroy_v2",     "cuCtxPushCurrent_v2",
                                        "cuCtxPopCurrent_v2",  "cuMemAlloc_v2",
                                        "cuMemFree_v2",        "cuMemHostGetFlags",
                                        "cuDevicePrimaryCtxRetain",
                                        "cuDevicePrimaryCtxRelease_v2"};
    void **slots = (void **)&api;
    _Static_assert(sizeof api == sizeof names / sizeof names[0] * sizeof(void *),
                   "one name a slot");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(slots[i] = dlsym(lib, names[i])))
            return false;
    return true;
}

/* Makes theirs, not left current: each case picks its own. NULL: why not. */
static inline const char *their_context_make(void)
{
    pm_capabilities caps = {.struct_size = sizeof caps};
    CUdevice dev;
    if (pm_get_capabilities(&caps) != PM_SUCCESS || !context_api_load() ||
        api.device_get(&dev, caps.device_ordinal) != CUDA_SUCCESS)
        return "the driver's context calls are not there";
    if (api.create(&theirs, 0, dev) != CUDA_SUCCESS)
        return "no context could be made";
    CUcontext popped;
    api.pop(&popped);
    return NULL;
}
#endif

typedef void (*context_case)(void);

/* A test's main: each case with the user's context made (skipped without a
 * CUDA driver, its headers or such a context); the test's exit status. */
static inline int their_context_main(const char *name, const context_case *cases, size_t count)
{
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    SKIP_UNLESS_CUDA();
#ifdef PINMEM_HAVE_CUDA_HEADERS
    const char *why_not = their_context_make();
    if (why_not)
        SKIP(why_not);
    for (size_t i = 0; i < count; i++)
        cases[i]();
    api.destroy(theirs);
#else
    (void)cases;
    (void)count;
    SKIP("built without the CUDA headers");
#endif
    return check_finish(name);
}

#endif
