/* How long pm_memcpy_batch_async takes to return for 1,000 scattered blocks
 * of page-locked memory (checking, planning and queuing them: the time
 * before the kernel can start), to the device and from it, and the rate of
 * the whole batch with its stream's synchronization: fastest tenth and
 * median of the calls. Like pool_cold.c it measures pinmem itself.
 * gcc -O2 -Iinclude bench/probe/batch_call.c -Lbuild -lpinmem -o probe_batch_call
 * LD_LIBRARY_PATH=build ./probe_batch_call [block bytes] [calls] */
#include <stdint.h>

#include "api_probe.h"

enum { BLOCKS = 1000, CALLS_MAX = 10001 };

int main(int argc, char **argv)
{
    const size_t block = argc > 1 ? strtoul(argv[1], NULL, 0) : 65536;
    const int calls = argc > 2 ? atoi(argv[2]) : 301;
    if (block == 0 || block > (64u << 20) / 2 || calls < 1 || calls > CALLS_MAX) {
        fprintf(stderr, "usage: probe_batch_call [block bytes, up to 32 MiB] [calls, 1-%d]\n",
                CALLS_MAX);
        return 2;
    }
    void *host = NULL;
    pm_deviceptr dev = 0;
    pm_stream_t s = NULL;
    pm_result r;
    /* every other block's room left empty, so that no two blocks touch */
    if ((r = pm_mem_host_alloc(&host, 2 * BLOCKS * block, 0)) != PM_SUCCESS)
        fail("pm_mem_host_alloc", r);
    if ((r = pm_device_alloc(&dev, 2 * BLOCKS * block)) != PM_SUCCESS)
        fail("pm_device_alloc", r);
    if ((r = pm_stream_create(&s)) != PM_SUCCESS)
        fail("pm_stream_create", r);
    static pm_deviceptr on_host[BLOCKS], on_device[BLOCKS];
    static size_t sizes[BLOCKS];
    for (size_t i = 0; i < BLOCKS; i++) { /* two permutations of the slots: scattered */
        on_host[i] = (pm_deviceptr)(uintptr_t)host + 2 * (i * 7919 % BLOCKS) * block;
        on_device[i] = dev + 2 * (i * 104729 % BLOCKS) * block;
        sizes[i] = block;
    }
    static double call[CALLS_MAX], whole[CALLS_MAX];
    for (int to_host = 0; to_host < 2; to_host++) {
        for (int k = 0; k < calls; k++) {
            const double t0 = 1e3 * now_ms();
            if ((r = pm_memcpy_batch_async(to_host ? on_host : on_device,
                                           to_host ? on_device : on_host, sizes, BLOCKS, s)) !=
                PM_SUCCESS)
                fail("pm_memcpy_batch_async", r);
            call[k] = 1e3 * now_ms() - t0;
            if ((r = pm_stream_synchronize(s)) != PM_SUCCESS)
                fail("pm_stream_synchronize", r);
            whole[k] = 1e3 * now_ms() - t0;
        }
        qsort(call, (size_t)calls, sizeof *call, by_value);
        qsort(whole, (size_t)calls, sizeof *whole, by_value);
        printf("%d x %zu KiB %s the device: the call %.1f us (fastest tenth), %.1f us (median); "
               "with the synchronization %.1f us, %.1f GB/s (median)\n",
               BLOCKS, block >> 10, to_host ? "from" : "to", call[calls / 10], call[calls / 2],
               whole[calls / 2], BLOCKS * (double)block / whole[calls / 2] / 1e3);
    }
    pm_stream_destroy(s);
    pm_device_free(dev);
    pm_mem_free_host(host);
    return 0;
}
