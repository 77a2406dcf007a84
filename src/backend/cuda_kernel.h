/* The batch kernel of the CUDA backend (cuda_kernel.c). */
#ifndef PINMEM_CUDA_KERNEL_H
#define PINMEM_CUDA_KERNEL_H

#include <stdbool.h>

#include "backend.h"
#include "cuda_loader.h"

/* Remembers the driver and pinmem's context; loads nothing. usable: the
 * device addresses page-locked host memory by its host pointer (unified
 * addressing, and host pointers for registered memory). */
void pm__cuda_kernel_open(const pm__cuda_api *api, CUdevice device, CUcontext primary,
                          bool usable);
/* Loads the kernel into the primary context on the first call (once; a
 * failure is remembered) and says whether it is there. */
bool pm__cuda_kernel_loaded(void);
/* Launches the kernel over count blocks on s (pinmem's context current). */
CUresult pm__cuda_kernel_launch(const pm__block_copy *blocks, size_t count,
                                unsigned long long largest, CUstream s);

#endif
