/* The POSIX backend's simulated device. */
#ifndef PINMEM_POSIX_DEVICE_H
#define PINMEM_POSIX_DEVICE_H

#include "backend.h"

/* Fills the table's entries for device memory, pointer kinds and places:
 * one device, whose memory is host memory that pinmem treats as the
 * device's, and no contexts. */
void pm__posix_device_open(pm__backend *out);
/* Whether any page of [lo, hi) belongs to device memory, which the driver's
 * host-memory calls refuse as they refuse memory the CPU cannot touch. */
bool pm__posix_device_overlaps(uintptr_t lo, uintptr_t hi);

#endif
