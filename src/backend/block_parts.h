/* How the batch kernel shares blocks among its blocks of threads: few
 * blocks are cut into parts, so that every multiprocessor works, and a part
 * is what one block of threads copies. The launch (cuda_kernel.c) and the
 * POSIX stand-in for the kernel (posix.c) use these; cuda_kernel.cu does the
 * same arithmetic on the device, so the POSIX tests check it. */
#ifndef PINMEM_BLOCK_PARTS_H
#define PINMEM_BLOCK_PARTS_H

/* No block is cut into parts smaller than this. */
#define PM__BLOCK_PART_MIN (16ull << 10)

/* Parts a block for count blocks of at most largest bytes and a grid of at
 * most grid_max blocks of threads. */
static inline unsigned long long pm__block_parts(unsigned long long count,
                                                 unsigned long long largest, unsigned grid_max)
{
    if (count == 0 || count >= grid_max)
        return 1;
    unsigned long long parts = (grid_max + count - 1) / count,
                       most = largest / PM__BLOCK_PART_MIN;
    return parts < most ? parts : most ? most : 1;
}

/* Bytes [*lo, *hi) of a block of bytes that its part-th of parts copies:
 * each part a multiple of 16 bytes but the last, together all of it. */
static inline void pm__block_part_span(unsigned long long bytes, unsigned long long parts,
                                       unsigned long long part, unsigned long long *lo,
                                       unsigned long long *hi)
{
    const unsigned long long per = ((bytes + parts - 1) / parts + 15) & ~15ull;
    *lo = part * per < bytes ? part * per : bytes;
    *hi = bytes - *lo < per ? bytes : *lo + per;
}

#endif
