/* Size classes of pool allocations: multiples of 64 bytes up to 512, then
 * eight classes per doubling up to 1 MiB, so no request is rounded up by more
 * than 1/8. Larger requests are rounded to whole pool pages (64 KiB). */
#ifndef PINMEM_POOL_CLASSES_H
#define PINMEM_POOL_CLASSES_H

#include <stddef.h>

#define PM__POOL_PAGE ((size_t)64 << 10)
#define PM__POOL_SMALL_MAX ((size_t)1 << 20)
#define PM__POOL_CLASSES 96

/* The class of a request of n bytes, 1 <= n <= PM__POOL_SMALL_MAX. */
unsigned pm__class_of(size_t n);
size_t pm__class_size(unsigned c);
/* Pages in one run of class c, chosen so that a run wastes little. */
size_t pm__class_run_pages(unsigned c);
/* Blocks a thread cache keeps per class. */
unsigned pm__class_cache_cap(unsigned c);

#endif
