/* After a kernel leaves the device a sticky error, a wait for work behind
 * it in a context the user made (a flag its stream will never write) ends
 * with that error instead of waiting for ever. A sticky error stops every
 * context of the device for the rest of the process, so this test has a
 * process of its own. CUDA backend only. */
#include <pthread.h>
#include <unistd.h>

#include "context_util.h"
#include "stream_util.h"

#ifdef PINMEM_HAVE_CUDA_HEADERS
#include "../bench/probe/fault_ptx.h"

typedef struct kernel_api {
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*module_load_data)(CUmodule *, const void *);
    CUresult (*module_get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **);
} kernel_api;

static bool kernel_api_load(kernel_api *k)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    static const char *const names[] = {"cuStreamCreate", "cuModuleLoadData",
                                        "cuModuleGetFunction", "cuLaunchKernel"};
    void **slots = (void **)k;
    for (size_t i = 0; lib && i < sizeof names / sizeof names[0]; i++)
        if (!(slots[i] = dlsym(lib, names[i])))
            return false;
    return lib != NULL;
}

/* The kernel waits behind a gate, so that the event is recorded (its flag
 * queued) before the fault. */
static void flag_wait_ends_at_the_fault(void)
{
    kernel_api k;
    CUstream stream;
    CUmodule module;
    CUfunction fn;
    pm_event_t first = NULL, behind = NULL;
    REQUIRE(kernel_api_load(&k));
    REQUIRE(api.push(theirs) == CUDA_SUCCESS);
    REQUIRE(k.stream_create(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    REQUIRE(k.module_load_data(&module, fault_ptx) == CUDA_SUCCESS);
    REQUIRE(k.module_get_function(&fn, module, "store_one") == CUDA_SUCCESS);
    REQUIRE_RESULT(pm_event_create(&first), PM_SUCCESS);
    REQUIRE_RESULT(pm_event_create(&behind), PM_SUCCESS);
    CHECK_RESULT(pm_event_record(first, stream), PM_SUCCESS);
    CHECK_RESULT(pm_event_synchronize(first), PM_SUCCESS);
    reset_gate();
    pthread_t opener;
    REQUIRE(pthread_create(&opener, NULL, open_gate_if_stuck, NULL) == 0);
    CHECK_RESULT(pm_stream_launch_host_func(stream, wait_gate, NULL), PM_SUCCESS);
    CUdeviceptr where = 8;
    void *args[] = {&where};
    CHECK(k.launch(fn, 1, 1, 1, 1, 1, 1, 0, stream, args, NULL) == CUDA_SUCCESS);
    CHECK_RESULT(pm_event_record(behind, stream), PM_SUCCESS);
    CHECK(atomic_load(&gate_open) == 0);
    atomic_store(&gate_open, 1);
    pthread_join(opener, NULL);
    alarm(60); /* a wait that never ends fails the test by its signal */
    CHECK_RESULT(pm_event_synchronize(behind), PM_ERROR_ILLEGAL_ADDRESS);
    alarm(0);
    /* as cuEventQuery answers, even for work done before the fault */
    CHECK_RESULT(pm_event_query(behind), PM_ERROR_ILLEGAL_ADDRESS);
    CHECK_RESULT(pm_event_query(first), PM_ERROR_ILLEGAL_ADDRESS);
    CUcontext popped;
    api.pop(&popped);
}
#endif

int main(void)
{
#ifdef PINMEM_HAVE_CUDA_HEADERS
    static const context_case cases[] = {flag_wait_ends_at_the_fault};
#else
    static const context_case cases[] = {NULL};
#endif
    return their_context_main("sticky_error", cases, sizeof cases / sizeof cases[0]);
}
