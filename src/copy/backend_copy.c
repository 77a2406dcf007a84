/* The copy engine's one way to the backend's copy calls, with the test
 * fault point in front, so that every DMA the engine queues (the front
 * end's, the staging ring's, the cache's) can be made to fail. */
#include "../errors.h"
#include "../test_hooks.h"
#include "copy.h"

pm_result pm__copy_backend(const pm__backend *b, pm__direction dir, void *host, pm_deviceptr dev,
                           size_t n, pm_stream_t s, pm__copy_via via)
{
    if (PM__TEST_FAULT(pm__fault_backend_copy))
        return pm__fail(PM_ERROR_UNKNOWN, "%s copy failed (injected fault)",
                        dir == PM__HTOD ? "host-to-device" : "device-to-host");
    if (via == PM__VIA_SYNC)
        return dir == PM__HTOD ? b->copy_htod(dev, host, n) : b->copy_dtoh(host, dev, n);
    bool pinned = via == PM__VIA_PINNED;
    return dir == PM__HTOD ? b->copy_htod_async(dev, host, n, s, pinned)
                           : b->copy_dtoh_async(host, dev, n, s, pinned);
}

pm_result pm__copy_backend_blocks(const pm__backend *b, const pm__block_copy *blocks, size_t count,
                                  const pm__block_copy *kernel_reads, pm_stream_t s)
{
    if (PM__TEST_FAULT(pm__fault_block_copy))
        return pm__fail(PM_ERROR_UNKNOWN, "a launch of %zu block copies failed (injected fault)",
                        count);
    unsigned long long largest = 0;
    for (size_t i = 0; i < count; i++)
        largest = blocks[i].bytes > largest ? blocks[i].bytes : largest;
    pm_result r = b->block_copy_async(kernel_reads ? kernel_reads : blocks, count, largest, s);
    if (r == PM_SUCCESS)
        atomic_fetch_add_explicit(&pm__copy_count.kernel_launches, 1, memory_order_relaxed);
    return r;
}

pm_result pm__copy_backend_batch(const pm__backend *b, const pm_deviceptr *dsts,
                                 const pm_deviceptr *srcs, const size_t *sizes, size_t count,
                                 size_t read_now, pm_stream_t s, bool one_call)
{
    if (PM__TEST_FAULT(pm__fault_backend_copy))
        return pm__fail(PM_ERROR_UNKNOWN, "a batch of %zu copies failed (injected fault)", count);
    bool batched = false;
    pm_result r = b->copy_batch_async(dsts, srcs, sizes, count, read_now, s, one_call, &batched);
    if (r == PM_SUCCESS && batched)
        atomic_fetch_add_explicit(&pm__copy_count.dma_batch_calls, 1, memory_order_relaxed);
    return r;
}
