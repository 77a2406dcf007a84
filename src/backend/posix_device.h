/* The POSIX backend's simulated device. */
#ifndef PINMEM_POSIX_DEVICE_H
#define PINMEM_POSIX_DEVICE_H

#include "backend.h"

/* Fills the table's entries for device memory, pointer kinds and places:
 * one device, whose memory is host memory that pinmem treats as the
 * device's, and no contexts. */
void pm__posix_device_open(pm__backend *out);

#endif
