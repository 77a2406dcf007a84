/* libpinmem_preload.so: the CUDA runtime's pinned-memory and copy calls,
 * served by pinmem for programs that never call it (LD_PRELOAD).
 *
 * What a program sees must not change, except speed. So pinmem serves only
 * calls it can complete the way the runtime would; everything else, and
 * every call pinmem fails, goes to the runtime's own function. An error the
 * program sees therefore always comes from the runtime itself, which also
 * keeps the runtime's last-error state (cudaGetLastError,
 * cudaPeekAtLastError) exactly as it would be: a call pinmem served
 * succeeded, and a successful runtime call leaves that state alone too.
 *
 * Nothing is loaded before the first interposed call: the runtime's
 * functions are looked up then, and libpinmem.so is loaded at the first call
 * pinmem may serve. The library declares no dependency on either, so any
 * program (a shell, a program without CUDA) starts under it unchanged. */
#ifndef PINMEM_PRELOAD_H
#define PINMEM_PRELOAD_H

#include <stdbool.h>
#include <stddef.h>

#include "cudart.h"
#include "pinmem.h"

#define PM__PRELOAD_EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------ settings */

/* What PINMEM_PRELOAD lets pinmem serve: off, alloc, copy or all. */
enum { PM__PRELOAD_ALLOC = 1u, PM__PRELOAD_COPY = 2u };

/* The PINMEM_PRELOAD bits, read once (a bad value: said once, then all). */
unsigned pm__preload_mode(void);
/* PINMEM_STATS=1: the counts are printed at exit. */
bool pm__preload_stats_wanted(void);
/* The feature is in the mode and has not been turned off (below). */
bool pm__preload_wants(unsigned feature);
/* Turns a feature off for the rest of the process. */
void pm__preload_turn_off(unsigned feature);

/* --------------------------------------------- the runtime's own functions */

/* The runtime a caller reached the preload from. The runtime names its
 * functions with a version (cudaMemcpy@libcudart.so.12), and so does every
 * caller linked against it; the preload defines each function once per
 * version (PM__PRELOAD_ENTRIES), so that in a process with two runtimes (a
 * program on one, a plugin on another) each caller's calls go on to its own
 * runtime, with its own last-error state. A reference without a version
 * (dlsym, a program linked against an unversioned runtime) reaches ANY: the
 * first runtime found. */
typedef enum {
    PM__RUNTIME_ANY,
    PM__RUNTIME_11,
    PM__RUNTIME_12,
    PM__RUNTIME_13,
    PM__RUNTIME_COUNT
} pm__runtime;

/* X(name, parameter list): the interposed functions, then those the
 * interposed ones call. */
#define PM__REAL_LIST(X)                                                                   \
    X(cudaHostAlloc, (void **, size_t, unsigned))                                          \
    X(cudaMallocHost, (void **, size_t))                                                   \
    X(cudaFreeHost, (void *))                                                              \
    X(cudaHostRegister, (void *, size_t, unsigned))                                        \
    X(cudaHostUnregister, (void *))                                                        \
    X(cudaHostGetDevicePointer, (void **, void *, unsigned))                               \
    X(cudaHostGetFlags, (unsigned *, void *))                                              \
    X(cudaMemcpy, (void *, const void *, size_t, enum cudaMemcpyKind))                     \
    X(cudaMemcpy_ptds, (void *, const void *, size_t, enum cudaMemcpyKind))                \
    X(cudaMemcpyAsync, (void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t))  \
    X(cudaMemcpyAsync_ptsz, (void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t)) \
    X(cudaPointerGetAttributes, (struct cudaPointerAttributes *, const void *))            \
    X(cudaStreamIsCapturing, (cudaStream_t, enum cudaStreamCaptureStatus *))               \
    X(cudaGetDevice, (int *))                                                              \
    X(cudaStreamSynchronize, (cudaStream_t))

/* Functions older runtimes lack (this one came with CUDA 10.1), which the
 * preload then does without, silently. */
#define PM__REAL_OPTIONAL_LIST(X) \
    X(cudaThreadExchangeStreamCaptureMode, (enum cudaStreamCaptureMode *))

/* pm__real_NAME(runtime): that runtime's NAME, or NULL when no runtime in
 * the process has it (said once for those of PM__REAL_LIST). */
#define PM__REAL_DECLARE_(name, params)            \
    typedef cudaError_t(*pm__real_##name##_t) params; \
    pm__real_##name##_t pm__real_##name(pm__runtime runtime);
PM__REAL_LIST(PM__REAL_DECLARE_)
PM__REAL_OPTIONAL_LIST(PM__REAL_DECLARE_)
#undef PM__REAL_DECLARE_

/* The error an interposed call returns when the runtime's function cannot
 * be found (a caller that reached it without the runtime loaded). */
#define PM__PRELOAD_NO_RUNTIME cudaErrorInitializationError

/* Calls the runtime's name(args...), or returns PM__PRELOAD_NO_RUNTIME. */
#define PM__REAL_CALL(runtime, name, ...)                                          \
    (pm__real_##name(runtime) ? pm__real_##name(runtime)(__VA_ARGS__) \
                              : PM__PRELOAD_NO_RUNTIME)

/* Defines the interposed function name, with parameters params, as
 * serve(runtime, args...), args being expressions of the parameters: name@libcudart.so.11.0, .12 and
 * .13 for callers of each runtime, and name@@PINMEM_PRELOAD (the default,
 * preload/versions.map) for references without a version. */
#define PM__PRELOAD_ENTRIES(name, serve, params, args)                                  \
    PM__PRELOAD_ENTRY_(name, serve, params, args, any, PM__RUNTIME_ANY, "@@PINMEM_PRELOAD") \
    PM__PRELOAD_ENTRY_(name, serve, params, args, 11, PM__RUNTIME_11, "@libcudart.so.11.0") \
    PM__PRELOAD_ENTRY_(name, serve, params, args, 12, PM__RUNTIME_12, "@libcudart.so.12")   \
    PM__PRELOAD_ENTRY_(name, serve, params, args, 13, PM__RUNTIME_13, "@libcudart.so.13")
#define PM__PRELOAD_ARGS_(...) __VA_ARGS__
#define PM__PRELOAD_ENTRY_(name, serve, params, args, tag, runtime, version)        \
    PM__PRELOAD_EXPORT cudaError_t pm__##name##_##tag params;                      \
    PM__PRELOAD_EXPORT cudaError_t pm__##name##_##tag params                       \
    {                                                                               \
        return serve(runtime, PM__PRELOAD_ARGS_ args);                              \
    }                                                                               \
    __asm__(".symver pm__" #name "_" #tag ", " #name version);

/* While another thread captures a graph in global mode, the driver refuses
 * a synchronization from a thread in global mode, and the refusal
 * invalidates that capture. The waits the preload adds on a caller's thread
 * (on streams and events that are not capturing) therefore run in relaxed
 * mode: pm__capture_relax sets it and keeps the caller's mode in *was, for
 * pm__capture_restore. false: the mode is unchanged (a runtime without the
 * exchange), and nothing is to be restored. */
bool pm__capture_relax(pm__runtime runtime, enum cudaStreamCaptureMode *was);
void pm__capture_restore(pm__runtime runtime, enum cudaStreamCaptureMode was);

/* ----------------------------------------------------------------- pinmem */

/* The pinmem functions the preload calls, from the one libpinmem.so of the
 * process: the one already loaded (by the Python package, say), else the
 * one of PINMEM_LIBRARY, else the one beside this library, else the
 * system's. */
#define PM__PINMEM_LIST(X)                                                                 \
    X(pm_version, int, (void))                                                             \
    X(pm_init, pm_result, (unsigned))                                                      \
    X(pm_backend_name, const char *, (void))                                               \
    X(pm_get_capabilities, pm_result, (pm_capabilities *))                                 \
    X(pm_result_name, const char *, (pm_result))                                           \
    X(pm_last_error_detail, const char *, (void))                                          \
    X(pm_mem_host_alloc, pm_result, (void **, size_t, unsigned))                           \
    X(pm_mem_free_host, pm_result, (void *))                                               \
    X(pm_mem_host_register, pm_result, (void *, size_t, unsigned))                         \
    X(pm_mem_host_unregister, pm_result, (void *))                                         \
    X(pm_mem_host_get_flags, pm_result, (unsigned *, void *))                              \
    X(pm_mem_host_get_device_pointer, pm_result, (pm_deviceptr *, void *, unsigned))       \
    X(pm_mem_get_address_range, pm_result, (pm_deviceptr *, size_t *, pm_deviceptr))       \
    X(pm_memcpy, pm_result, (pm_deviceptr, pm_deviceptr, size_t))                          \
    X(pm_memcpy_async, pm_result, (pm_deviceptr, pm_deviceptr, size_t, pm_stream_t))       \
    X(pm_copy_get_config, pm_result, (pm_copy_config *))

typedef struct pm__pinmem_api {
#define PM__PINMEM_FIELD_(name, ret, params) ret(*name) params;
    PM__PINMEM_LIST(PM__PINMEM_FIELD_)
#undef PM__PINMEM_FIELD_
    int device_ordinal;  /* pinmem's device; -1 where it has none (posix) */
    size_t direct_max;   /* pageable copies up to this size pinmem leaves to the driver */
    size_t dtoh_direct_max; /* the same from the device */
} pm__pinmem_api;

/* pinmem, loaded and initialised on first use; NULL when it cannot serve
 * this process (said once): not found, too old, or no backend that stands
 * for the runtime's driver. */
const pm__pinmem_api *pm__pinmem(void);

/* ------------------------------------------------ memory pinmem pinned here */

typedef enum { PM__OWNED_ALLOC = 1, PM__OWNED_REGISTERED = 2 } pm__owned_kind;

/* The allocations and registrations the preload made through pinmem, by the
 * pointer it returned or registered. */
bool pm__owned_add(void *p, size_t bytes, pm__owned_kind kind);
/* Removes p if it is an entry of that kind; *bytes receives its size. */
bool pm__owned_take(void *p, pm__owned_kind kind, size_t *bytes);
/* p lies in an entry's memory (interior pointers included): its kind, or 0. */
pm__owned_kind pm__owned_find(const pm__pinmem_api *pm, const void *p);
/* Whether [p, p + bytes) overlaps an entry of that kind (a scan: for the rare calls). */
bool pm__owned_overlaps(const void *p, size_t bytes, pm__owned_kind kind);
/* Whether there are any entries: a load, for the calls that check first. */
bool pm__owned_any(void);

/* ---------------------------------------------------- reporting, counting */

#define PM__PRELOAD_FUNCTIONS(X)                                                          \
    X(cudaHostAlloc) X(cudaMallocHost) X(cudaFreeHost) X(cudaHostRegister)                 \
    X(cudaHostUnregister) X(cudaHostGetDevicePointer) X(cudaHostGetFlags) X(cudaMemcpy)    \
    X(cudaMemcpy_ptds) X(cudaMemcpyAsync) X(cudaMemcpyAsync_ptsz)

typedef enum {
#define PM__PRELOAD_FN_ENUM_(name) PM__FN_##name,
    PM__PRELOAD_FUNCTIONS(PM__PRELOAD_FN_ENUM_)
#undef PM__PRELOAD_FN_ENUM_
    PM__FN_COUNT
} pm__preload_fn;

/* Counts a call pinmem served, with its bytes. */
void pm__preload_count_served(pm__preload_fn fn, size_t bytes);

/* A call pinmem did not serve: either it was not for pinmem (passed on), or
 * pinmem tried and failed (failed records why, before anything else can
 * overwrite pinmem's per-thread detail). */
typedef struct pm__attempt {
    pm__preload_fn fn;
    pm__runtime runtime; /* whose functions answer what pinmem does not serve */
    unsigned feature;
    bool tried;
    pm_result r;
    char detail[256];
} pm__attempt;
void pm__attempt_failed(pm__attempt *a, const pm__pinmem_api *pm, pm_result r);
/* The runtime's own call then answered real_rc, which the caller returns:
 * counts the call. When pinmem had failed and the runtime succeeded, pinmem
 * failed where the runtime would not: said once per feature, and for any
 * failure but running out of memory the feature is turned off for the rest
 * of the process. */
cudaError_t pm__attempt_settle(const pm__attempt *a, cudaError_t real_rc);
/* "pinmem preload: " and the message, on stderr. */
void pm__preload_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints the counts at exit when PINMEM_STATS=1 (set up on first use). */
void pm__preload_stats_arm(void);

#endif
