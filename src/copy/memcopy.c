/* The CPU half of a staged copy. Staging moves far more bytes than any cache
 * holds, so ordinary stores first read every destination line they are about
 * to overwrite and later write it back: two memory passes for one. Streaming
 * (non-temporal) stores write whole lines straight to memory, which leaves
 * more of the memory system to the DMA engine reading or writing the other
 * side of the ring at the same time.
 *
 * Demoting stores go the other way for host-to-device copies: the ring is
 * small enough to stay in the CPU's last-level cache, so ordinary stores find
 * its lines there, and `cldemote` pushes each line out of the core's private
 * caches as soon as it is written, where the DMA engine's reads find it
 * without a trip to memory. Every byte then crosses memory once (the source
 * read) instead of three times, and the DMA engine reads a ring that threads
 * are filling about as fast as an idle one (bench/probe/ring_cache.c
 * measures it). Without the demotion, cached stores lose to streaming ones:
 * the DMA engine must then take each line from a core's private cache. */
#include <stdint.h>
#include <string.h>

#include "copy.h"

#if defined(__x86_64__) || defined(__SSE2__)
#include <cpuid.h>
#include <emmintrin.h>

enum { PREFETCH_AHEAD = 4096 };

/* `cldemote` lies in the hint-NOP space: a CPU without it does nothing. */
static inline void demote_line(void *p)
{
    __asm__ volatile(".byte 0x0f, 0x1c, 0x07" /* cldemote (%rdi) */ ::"D"(p) : "memory");
}

bool pm__copy_cpu_demotes(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((c >> 25) & 1u); /* CPUID.7.0:ECX[25] */
}

/* Copies whole 64-byte blocks with streaming stores, or with ordinary stores
 * each followed by a demotion of its line. The head up to the first aligned
 * destination byte (16 for streaming stores, which need it; a line for
 * demoting ones, so that each demotion covers what was just written) and the
 * tail shorter than a block use memcpy; ring slices start on page boundaries,
 * so they have neither. Always inlined with a constant `demote`, so each kind
 * gets a loop of its own. */
static inline __attribute__((always_inline)) void copy_blocks(uint8_t *dst, const uint8_t *src,
                                                              size_t n, bool demote)
{
    const uintptr_t align = demote ? 64 : 16;
    size_t head = (align - ((uintptr_t)dst & (align - 1))) & (align - 1);
    if (head > n)
        head = n;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    size_t blocks = n / 64;
    for (size_t i = 0; i < blocks; i++, dst += 64, src += 64) {
        /* The hardware prefetchers stop at every 4 KiB page boundary of the
         * source; asking for the line a page ahead keeps the loads streaming
         * across them, so a thread copies a piece in less time. A prefetch
         * never faults, past the end included. */
        _mm_prefetch((const char *)src + PREFETCH_AHEAD, _MM_HINT_T1);
        __m128i a = _mm_loadu_si128((const __m128i *)src);
        __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
        if (demote) {
            _mm_store_si128((__m128i *)dst, a);
            _mm_store_si128((__m128i *)(dst + 16), b);
            _mm_store_si128((__m128i *)(dst + 32), c);
            _mm_store_si128((__m128i *)(dst + 48), d);
            demote_line(dst);
        } else {
            _mm_stream_si128((__m128i *)dst, a);
            _mm_stream_si128((__m128i *)(dst + 16), b);
            _mm_stream_si128((__m128i *)(dst + 32), c);
            _mm_stream_si128((__m128i *)(dst + 48), d);
        }
    }
    memcpy(dst, src, n % 64);
    /* Streaming stores are weakly ordered: make them visible before the
     * caller hands the buffer to the DMA engine or to the user. */
    if (!demote)
        _mm_sfence();
}
#define HAVE_STREAMING 1
#else
#define HAVE_STREAMING 0
bool pm__copy_cpu_demotes(void) { return false; }
#endif

void pm__copy_bytes(void *dst, const void *src, size_t n, pm_copy_stores stores)
{
#if HAVE_STREAMING
    if (stores == PM_COPY_STORES_STREAMING) {
        copy_blocks(dst, src, n, false);
        return;
    }
    if (stores == PM_COPY_STORES_DEMOTING) {
        copy_blocks(dst, src, n, true);
        return;
    }
#else
    (void)stores;
#endif
    memcpy(dst, src, n);
}
