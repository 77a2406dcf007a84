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
