/* Built instead of baseline_cuda.c where the CUDA headers were not found. */
#include "baseline.h"

const baseline *baseline_cuda(int device_ordinal)
{
    (void)device_ordinal;
    baseline_fail(PM_ERROR_NOT_SUPPORTED, "the benchmarks were built without the CUDA headers");
    return NULL;
}
