#include "classes.h"

unsigned pm__class_of(size_t n)
{
    if (n <= 512)
        return (unsigned)((n + 63) / 64) - 1;
    unsigned k = 63 - (unsigned)__builtin_clzll((unsigned long long)(n - 1)); /* n in (2^k, 2^(k+1)] */
    size_t step = (size_t)1 << (k - 3);
    size_t j = (n - ((size_t)1 << k) + step - 1) / step; /* 1..8 */
    return 8 + (k - 9) * 8 + (unsigned)(j - 1);
}

size_t pm__class_size(unsigned c)
{
    if (c < 8)
        return 64 * ((size_t)c + 1);
    unsigned k = 9 + (c - 8) / 8, j = (c - 8) % 8 + 1;
    return ((size_t)1 << k) + j * ((size_t)1 << (k - 3));
}

size_t pm__class_run_pages(unsigned c)
{
    const size_t size = pm__class_size(c);
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

unsigned pm__class_cache_cap(unsigned c)
{
    size_t cap = ((size_t)2 << 20) / pm__class_size(c); /* at most 2 MiB a class */
    return cap > 32 ? 32 : cap < 2 ? 2 : (unsigned)cap;
}
