/* What a context the user made answers once a kernel left it a sticky
 * error, and once it is destroyed after that: which calls can tell a thread
 * waiting for a flag that the stream will never write it. Also whether the
 * primary context still works beside it, and what pinmem's event recorded
 * behind the fault answers.
 * gcc -O2 -Ibench/probe -Iinclude -I/usr/local/cuda/include
 *     bench/probe/sticky_context.c -lpinmem -lcuda -lpthread
 * ./probe_sticky_context */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include "pinmem.h"
#include "probe.h"
#include "fault_ptx.h"

static void row(const char *call, CUresult r)
{
    const char *n = "?";
    cuGetErrorName(r, &n);
    printf("%-56s %s\n", call, n);
}

/* The calls that name a context, on ctx (current or not). */
static void context_rows(const char *when, CUcontext ctx, bool alive)
{
    char name[96];
    unsigned long long id = 0;
    unsigned version = 0;
    snprintf(name, sizeof name, "%s: cuCtxGetId", when);
    row(name, cuCtxGetId(ctx, &id));
    snprintf(name, sizeof name, "%s: cuCtxGetApiVersion", when);
    row(name, cuCtxGetApiVersion(ctx, &version));
    if (!alive) {
        /* Pushing a destroyed context answers SUCCESS, and the next call,
         * even the pop, crashes (H200, driver 580). */
        printf("%-56s %s\n", "destroyed: cuCtxPushCurrent", "SUCCESS; the next call crashes");
        return;
    }
    snprintf(name, sizeof name, "%s: cuCtxPushCurrent", when);
    row(name, cuCtxPushCurrent(ctx));
    CUcontext popped;
    CUdevice dev;
    snprintf(name, sizeof name, "%s: cuCtxGetDevice (current)", when);
    row(name, cuCtxGetDevice(&dev));
    snprintf(name, sizeof name, "%s: cuStreamQuery(CU_STREAM_LEGACY)", when);
    row(name, cuStreamQuery(CU_STREAM_LEGACY));
    cuCtxPopCurrent(&popped);
}

static atomic_int synchronized;

static void *watchdog(void *arg)
{
    (void)arg;
    for (int i = 0; i < 300 && !atomic_load(&synchronized); i++)
        usleep(10000);
    if (!atomic_load(&synchronized)) {
        printf("%-56s %s\n", "pm_event_synchronize (flag behind the fault)",
               "still waiting after 3 s");
        fflush(stdout);
        _exit(0);
    }
    return NULL;
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* rows before a crash still show */
    CUcontext primary = probe_context();
    CUdevice dev;
    TRY(cuCtxGetDevice(&dev));
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    CUcontext theirs;
    CUctxCreateParams params = {0};
    TRY(cuCtxCreate(&theirs, &params, 0, dev));
    CUstream stream;
    TRY(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUmodule module;
    CUfunction fn;
    TRY(cuModuleLoadData(&module, fault_ptx));
    TRY(cuModuleGetFunction(&fn, module, "store_one"));
    pm_event_t event;
    if (pm_event_create(&event) != PM_SUCCESS) {
        printf("pm_event_create: %s\n", pm_last_error_detail());
        return 1;
    }
    CUdeviceptr where = 8;
    void *args[] = {&where};
    TRY(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, args, NULL));
    printf("%-56s %s\n", "pm_event_record behind the faulting kernel",
           pm_result_name(pm_event_record(event, stream)));
    row("cuStreamSynchronize (the fault)", cuStreamSynchronize(stream));
    CUcontext popped;
    TRY(cuCtxPopCurrent(&popped));
    context_rows("faulted", theirs, true);
    TRY(cuCtxPushCurrent(primary));
    void *host = NULL;
    row("primary, beside it: cuMemHostAlloc", cuMemHostAlloc(&host, 1 << 20, 0));
    row("primary, beside it: cuStreamQuery(CU_STREAM_LEGACY)", cuStreamQuery(CU_STREAM_LEGACY));
    if (host)
        cuMemFreeHost(host);
    printf("%-56s %s\n", "pm_event_query", pm_result_name(pm_event_query(event)));
    row("cuCtxDestroy", cuCtxDestroy(theirs));
    context_rows("destroyed", theirs, false);
    pthread_t dog;
    if (pthread_create(&dog, NULL, watchdog, NULL) != 0)
        return 1;
    pm_result r = pm_event_synchronize(event);
    atomic_store(&synchronized, 1);
    printf("%-56s %s (%s)\n", "pm_event_synchronize (flag behind the fault)", pm_result_name(r),
           r == PM_SUCCESS ? "" : pm_last_error_detail());
    pthread_join(dog, NULL);
    return 0;
}
