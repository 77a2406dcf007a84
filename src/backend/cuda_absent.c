/* Built instead of cuda.c when the CUDA headers were not found. */
#include "../errors.h"
#include "backend.h"

pm_result pm__backend_cuda_open(pm__backend *out)
{
    (void)out;
    return pm__fail(PM_ERROR_NO_DEVICE, "pinmem was built without the CUDA headers");
}

bool pm__backend_cuda_in_host_func(void) { return false; }
