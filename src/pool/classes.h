/* Size classes of pool allocations: multiples of 64 bytes up to 512, then
 * eight classes per doubling up to 1 MiB, so no request is rounded up by more
 * than 1/8. Larger requests are rounded to whole pool pages (64 KiB). */
#ifndef PINMEM_POOL_CLASSES_H
#define PINMEM_POOL_CLASSES_H

#include <stddef.h>
#include <stdint.h>

#define PM__POOL_PAGE ((size_t)64 << 10)
#define PM__POOL_SMALL_MAX ((size_t)1 << 20)
#define PM__POOL_CLASSES 96

/* Per class, computed once (pm__classes_init): its size, the multiplier that
 * divides a run offset by the size (exact below 2^22: runs are at most 64
 * pages), the pages of one run, and how many blocks a thread cache keeps. */
typedef struct pm__class_info {
    uint32_t size;
    uint32_t run_pages;
    uint32_t cache_cap;
    uint64_t div_magic;
} pm__class_info;

#define PM__CLASS_DIV_SHIFT 43
extern pm__class_info pm__classes[PM__POOL_CLASSES];
void pm__classes_init(void);

/* The class of a request of n bytes, 1 <= n <= PM__POOL_SMALL_MAX. */
static inline unsigned pm__class_of(size_t n)
{
    if (n <= 512)
        return (unsigned)((n + 63) / 64) - 1;
    unsigned k = 63 - (unsigned)__builtin_clzll((unsigned long long)(n - 1));
    size_t step = (size_t)1 << (k - 3);
    size_t j = (n - ((size_t)1 << k) + step - 1) / step; /* 1..8 */
    return 8 + (k - 9) * 8 + (unsigned)(j - 1);
}

static inline size_t pm__class_size(unsigned c) { return pm__classes[c].size; }
static inline size_t pm__class_run_pages(unsigned c) { return pm__classes[c].run_pages; }
static inline unsigned pm__class_cache_cap(unsigned c) { return pm__classes[c].cache_cap; }
/* offset / size for offsets inside one run. */
static inline size_t pm__class_index(unsigned c, size_t offset)
{
    return (size_t)((offset * pm__classes[c].div_magic) >> PM__CLASS_DIV_SHIFT);
}

#endif
