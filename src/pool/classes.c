#include "classes.h"

pm__class_info pm__classes[PM__POOL_CLASSES];

static size_t size_of_class(unsigned c)
{
    if (c < 8)
        return 64 * ((size_t)c + 1);
    unsigned k = 9 + (c - 8) / 8, j = (c - 8) % 8 + 1;
    return ((size_t)1 << k) + j * ((size_t)1 << (k - 3));
}

static size_t run_pages_of_class(size_t size)
{
    size_t best = 1, best_waste = (size_t)-1;
    /* The fewest pages whose tail is under 1/16 of the run, else the least waste. */
    for (size_t pages = (size + PM__POOL_PAGE - 1) / PM__POOL_PAGE; pages <= 64; pages++) {
        size_t bytes = pages * PM__POOL_PAGE, waste = bytes % size;
        if (waste * 16 <= bytes)
            return pages;
        if (waste * best < best_waste * pages) {
            best = pages;
            best_waste = waste;
        }
    }
    return best;
}

void pm__classes_init(void)
{
    for (unsigned c = 0; c < PM__POOL_CLASSES; c++) {
        size_t size = size_of_class(c);
        /* About 128 KiB a class, at most 32 blocks, and one block of the larger ones. */
        size_t cap = ((size_t)128 << 10) / size;
        pm__classes[c] = (pm__class_info){
            .size = (uint32_t)size,
            .run_pages = (uint32_t)run_pages_of_class(size),
            .cache_cap = cap > 32 ? 32 : cap < 1 ? 1 : (uint32_t)cap,
            /* ceil(2^43 / size): exact for offsets below 2^22 and sizes below 2^21 */
            .div_magic = (((uint64_t)1 << PM__CLASS_DIV_SHIFT) + size - 1) / size,
        };
    }
}
