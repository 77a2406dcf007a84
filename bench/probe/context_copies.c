/* What a context the user made costs pinmem's staged copies. Pageable
 * copies on a made stream, in turn: in device 0's primary context into its
 * memory, in a cuCtxCreate context into the primary context's memory, and
 * in that context into its own memory; each timed until its stream is done,
 * median of 15, as GB/s and as a share of the first. Measures pinmem.
 * ./probe_context_copies */
#include <string.h>

#include "pinmem.h"
#include "probe.h"

enum { VARIANTS = 3, ROUNDS = 15 };

int main(void)
{
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    CUcontext primary = probe_context();
    CUdevice dev;
    TRY(cuCtxGetDevice(&dev));
    const size_t most = (size_t)64 << 20;
    char *host = malloc(most);
    if (!host)
        return 1;
    memset(host, 1, most);
    CUdeviceptr in_primary, in_theirs;
    CUstream on_primary, on_theirs;
    TRY(cuMemAlloc(&in_primary, most));
    TRY(cuStreamCreate(&on_primary, CU_STREAM_NON_BLOCKING));
    CUcontext theirs;
    TRY(cuCtxCreate(&theirs, NULL, 0, dev));
    TRY(cuMemAlloc(&in_theirs, most));
    TRY(cuStreamCreate(&on_theirs, CU_STREAM_NON_BLOCKING));
    const struct {
        const char *name;
        CUcontext ctx;
        CUstream s;
        CUdeviceptr d;
    } v[VARIANTS] = {{"primary, its memory", primary, on_primary, in_primary},
                     {"theirs, primary's memory", theirs, on_theirs, in_primary},
                     {"theirs, its memory", theirs, on_theirs, in_theirs}};
    for (int to_host = 0; to_host < 2; to_host++)
        for (size_t n = (size_t)1 << 20; n <= most; n *= 4) {
            double t[VARIANTS][ROUNDS];
            for (int r = 0; r < ROUNDS; r++)
                for (int k = 0; k < VARIANTS; k++) {
                    const int w = (k + r) % VARIANTS; /* each goes first in turn */
                    TRY(cuCtxSetCurrent(v[w].ctx));
                    const double t0 = now_ms();
                    pm_result got = to_host ? pm_memcpy_dtoh_async(host, v[w].d, n, v[w].s)
                                            : pm_memcpy_htod_async(v[w].d, host, n, v[w].s);
                    TRY(cuStreamSynchronize(v[w].s));
                    t[w][r] = now_ms() - t0;
                    if (got != PM_SUCCESS) {
                        printf("copy: %s\n", pm_last_error_detail());
                        return 1;
                    }
                }
            printf("%s %4zu MiB:", to_host ? "from the device" : "to the device  ", n >> 20);
            double first = 0;
            for (int k = 0; k < VARIANTS; k++) {
                const double gbps = (double)n / (probe_median(t[k], ROUNDS) * 1e6);
                first = k ? first : gbps;
                printf("  %s %6.2f GB/s (%.2fx)", v[k].name, gbps, gbps / first);
            }
            printf("\n");
        }
    TRY(cuCtxSetCurrent(theirs));
    TRY(cuStreamDestroy(on_theirs));
    TRY(cuMemFree(in_theirs));
    TRY(cuCtxSetCurrent(primary));
    TRY(cuCtxDestroy(theirs));
    TRY(cuStreamDestroy(on_primary));
    TRY(cuMemFree(in_primary));
    free(host);
    return 0;
}
