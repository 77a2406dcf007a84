/* A DLPack deleter that needs no interpreter (pinmem.h, pm_dlpack_deleter). */
#include <stdint.h>

#include "pinmem.h"

/* DLPack's DLManagedTensor (dlpack.h), as far as its layout. */
typedef struct dl_tensor {
    void *data;
    struct {
        int32_t device_type, device_id;
    } device;
    int32_t ndim;
    struct {
        uint8_t code, bits;
        uint16_t lanes;
    } dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} dl_tensor;

typedef struct dl_managed_tensor {
    dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct dl_managed_tensor *self);
} dl_managed_tensor;

void pm_dlpack_deleter(void *managed)
{
    if (managed)
        __atomic_store_n(&((dl_managed_tensor *)managed)->manager_ctx, NULL, __ATOMIC_RELEASE);
}
