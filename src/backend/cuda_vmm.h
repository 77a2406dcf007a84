/* Pool chunks in driver VMM host granules (cuda_vmm.c). Callers hold a
 * context (the backend's ctx_enter). */
#ifndef PINMEM_CUDA_VMM_H
#define PINMEM_CUDA_VMM_H

#include <stdbool.h>
#include <stddef.h>

#include "cuda_loader.h"

/* The granule, or 0 when this driver cannot back pools with VMM host memory. */
size_t pm__cuda_vmm_open(const pm__cuda_api *api);
pm_result pm__cuda_vmm_reserve(size_t len, size_t align, void **base);
/* [p, p + len): whole granules, none mapped. */
pm_result pm__cuda_vmm_commit(void *p, size_t len, int numa_node);
void pm__cuda_vmm_decommit(void *p, size_t len);
void pm__cuda_vmm_unreserve(void *base, size_t len);

#endif
