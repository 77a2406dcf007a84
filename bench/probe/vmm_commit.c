/* What committing pool memory in driver VMM host granules costs, to choose
 * how the pools grow: granules one by one against one large handle, access
 * granted per granule against once for a whole range, creates from several
 * threads at once, unmapping an idle granule, and the CPU's first touch.
 * gcc -O2 -pthread -I/usr/local/cuda/include vmm_commit.c -lcuda */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "probe.h"

static CUcontext ctx;
static CUmemAllocationProp prop;
static CUmemAccessDesc access[2];
static size_t gran;

/* Commits [va, va + n * piece) in handles of piece bytes; access granted per
 * handle or once for the range. */
static void commit(CUdeviceptr va, size_t n, size_t piece, int access_once)
{
    for (size_t i = 0; i < n; i++) {
        CUmemGenericAllocationHandle h;
        TRY(cuMemCreate(&h, piece, &prop, 0));
        TRY(cuMemMap(va + i * piece, piece, 0, h, 0));
        TRY(cuMemRelease(h)); /* the mapping keeps it */
        if (!access_once)
            TRY(cuMemSetAccess(va + i * piece, piece, access, 2));
    }
    if (access_once)
        TRY(cuMemSetAccess(va, n * piece, access, 2));
}

static void decommit(CUdeviceptr va, size_t n, size_t piece)
{
    for (size_t i = 0; i < n; i++)
        TRY(cuMemUnmap(va + i * piece, piece));
}

typedef struct {
    CUdeviceptr va;
    size_t n;
} job;

static void *commit_job(void *arg)
{
    job *j = arg;
    TRY(cuCtxSetCurrent(ctx));
    commit(j->va, j->n, gran, 1);
    return NULL;
}

int main(void)
{
    ctx = probe_context();
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    TRY(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    access[0] = (CUmemAccessDesc){.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                                  .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    access[1] = (CUmemAccessDesc){.location = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0},
                                  .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    const size_t chunk = (size_t)32 << 20, per = chunk / gran;
    CUdeviceptr va;
    TRY(cuMemAddressReserve(&va, (size_t)64 << 30, chunk, 0, 0));

    /* warm the driver's paths */
    commit(va, per, gran, 1);
    decommit(va, per, gran);

    for (int round = 0; round < 3; round++) {
        double t0 = now_ms();
        commit(va, per, gran, 0);
        double t1 = now_ms();
        decommit(va, per, gran);
        double t2 = now_ms();
        commit(va, per, gran, 1);
        double t3 = now_ms();
        decommit(va, per, gran);
        double t4 = now_ms();
        commit(va, 1, chunk, 1);
        double t5 = now_ms();
        decommit(va, 1, chunk);
        double t6 = now_ms();
        printf("32 MiB: %zu granules, access each %.2f ms; access once %.2f ms; one handle %.2f ms; "
               "unmap %zu granules %.2f ms (%.3f ms each); unmap one handle %.2f ms\n",
               per, t1 - t0, t3 - t2, t5 - t4, per, t2 - t1, (t2 - t1) / per, t6 - t5);
    }

    /* one granule given back and another committed: a move */
    commit(va, per, gran, 1);
    double t0 = now_ms();
    for (int i = 0; i < 16; i++) {
        TRY(cuMemUnmap(va + (i % per) * gran, gran));
        commit(va + (i % per) * gran, 1, gran, 1);
    }
    printf("move one granule (unmap, create, map, access): %.3f ms each\n", (now_ms() - t0) / 16);

    /* CPU first touch, against mmap + mlock memory */
    t0 = now_ms();
    memset((void *)va, 1, chunk);
    double t1 = now_ms();
    memset((void *)va, 2, chunk);
    double t2 = now_ms();
    printf("memset of 32 MiB VMM host memory: first %.2f ms, again %.2f ms\n", t1 - t0, t2 - t1);
    void *m = mmap(NULL, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(m, chunk, MADV_HUGEPAGE);
    mlock(m, chunk);
    t0 = now_ms();
    memset(m, 1, chunk);
    printf("memset of 32 MiB mlocked mmap memory: %.2f ms\n", now_ms() - t0);
    decommit(va, per, gran);

    /* creates from several threads at once: 32 MiB each */
    for (int threads = 1; threads <= 16; threads *= 2) {
        pthread_t tid[16];
        job jobs[16];
        t0 = now_ms();
        for (int i = 0; i < threads; i++) {
            jobs[i] = (job){va + (CUdeviceptr)i * chunk, per};
            pthread_create(&tid[i], NULL, commit_job, &jobs[i]);
        }
        for (int i = 0; i < threads; i++)
            pthread_join(tid[i], NULL);
        double t = now_ms() - t0;
        printf("%2d threads committing 32 MiB each: %.2f ms, %.2f GB/s in total\n", threads, t,
               threads * (double)chunk / t / 1e6);
        for (int i = 0; i < threads; i++)
            decommit(va + (CUdeviceptr)i * chunk, per, gran);
    }
    return 0;
}
