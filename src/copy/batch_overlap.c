/* The check that no copy of a batch depends on another: sorted by start, a
 * range overlaps an earlier one exactly when it starts before the furthest
 * end seen so far; a destination may overlap nothing, a source no
 * destination. (An element's own two ranges are checked with the element.)
 * Equal blocks on one grid, the common batch, are told apart by a bitmap
 * first, which spares them the sort. */
#include <stdint.h>
#include <string.h>

#include "../errors.h"
#include "batch.h"

/* A digit of the sort is at most this many bits wide, and no wider than the
 * count of ranges needs: its counters must stay in the first cache levels. */
enum { DIGIT_MIN = 8, DIGIT_MAX = 11 };

/* Sorts v by start, stably, with tmp as large as v: a digit at a time from
 * the lowest, over only the bits where some starts differ (nearby addresses
 * share their high bits, aligned blocks their low ones), in the fewest
 * passes that digits of up to most bits allow. A thousand starts that differ
 * in ten bits (64 KiB blocks within 64 MiB) take one pass. qsort's calls of
 * a comparison took most of a 1,000-block batch's planning. */
static void sort_by_start(pm__span *v, pm__span *tmp, size_t n, pm_deviceptr differ)
{
    if (n < 2 || differ == 0)
        return;
    const unsigned low = (unsigned)__builtin_ctzll(differ),
                   width = 64 - (unsigned)__builtin_clzll(differ) - low;
    unsigned most = DIGIT_MIN;
    while (most < DIGIT_MAX && ((size_t)1 << most) < n)
        most++;
    const unsigned passes = (width + most - 1) / most, digit = (width + passes - 1) / passes;
    const size_t radix = (size_t)1 << digit;
    size_t at[(size_t)1 << DIGIT_MAX];
    pm__span *from = v, *to = tmp;
    for (unsigned pass = 0; pass < passes; pass++) {
        const unsigned shift = low + pass * digit;
        memset(at, 0, radix * sizeof *at);
        for (size_t i = 0; i < n; i++)
            at[(from[i].lo >> shift) & (radix - 1)]++;
        for (size_t k = 0, sum = 0; k < radix; k++) {
            const size_t here = at[k];
            at[k] = sum;
            sum += here;
        }
        for (size_t i = 0; i < n; i++)
            to[at[(from[i].lo >> shift) & (radix - 1)]++] = from[i];
        pm__span *t = from;
        from = to;
        to = t;
    }
    if (from != v)
        memcpy(v, from, n * sizeof *v);
}

static bool is_dst(const pm__span *s) { return s->tag & 1; }

/* The slots a grid's bitmap covers: 8 KiB on the stack. */
enum { GRID_SLOTS = 1 << 16 };

/* Destinations only, all of one power-of-two size and on one grid (a cache's
 * blocks): two overlap exactly when they take the same slot, so one pass
 * over a bitmap of slots proves them apart without sorting. False where s is
 * not such a set, its grid is too wide, or two share a slot: the sort then
 * answers, and names the elements. */
static bool grid_proves_apart(const pm__spans *s)
{
    const pm__span *v = s->v;
    const pm_deviceptr len = v[0].hi - v[0].lo, phase = v[0].lo & (len - 1);
    if (len & (len - 1))
        return false;
    pm_deviceptr lo = v[0].lo;
    for (size_t k = 0; k < s->n; k++) {
        if (!is_dst(&v[k]) || v[k].hi - v[k].lo != len || (v[k].lo & (len - 1)) != phase)
            return false;
        if (v[k].lo < lo)
            lo = v[k].lo;
    }
    const unsigned shift = (unsigned)__builtin_ctzll(len);
    uint64_t taken[GRID_SLOTS / 64] = {0};
    for (size_t k = 0; k < s->n; k++) {
        const pm_deviceptr slot = (v[k].lo - lo) >> shift;
        if (slot >= GRID_SLOTS || taken[slot / 64] >> (slot % 64) & 1)
            return false;
        taken[slot / 64] |= (uint64_t)1 << (slot % 64);
    }
    return true;
}

pm_result pm__batch_check_overlaps(pm__spans *s, pm__span *tmp)
{
    if (!s->has_dst)
        return PM_SUCCESS; /* sources may share bytes */
    if (grid_proves_apart(s))
        return PM_SUCCESS;
    sort_by_start(s->v, tmp, s->n, s->differ);
    const pm__span *far_any = NULL, *far_dst = NULL;
    for (size_t k = 0; k < s->n; k++) {
        const pm__span *x = &s->v[k];
        const pm__span *hit = is_dst(x) && far_any && x->lo < far_any->hi    ? far_any
                              : !is_dst(x) && far_dst && x->lo < far_dst->hi ? far_dst
                                                                             : NULL;
        if (hit)
            return pm__fail(PM_ERROR_INVALID_VALUE,
                            "%s: element %zu's %s (0x%llx, %llu bytes) overlaps element %zu's %s "
                            "(0x%llx, %llu bytes): the copies of a batch may not depend on each "
                            "other",
                            PM__BATCH_NAME, x->tag >> 1, is_dst(x) ? "destination" : "source",
                            x->lo, x->hi - x->lo, hit->tag >> 1,
                            is_dst(hit) ? "destination" : "source", hit->lo, hit->hi - hit->lo);
        if (!far_any || x->hi > far_any->hi)
            far_any = x;
        if (is_dst(x) && (!far_dst || x->hi > far_dst->hi))
            far_dst = x;
    }
    return PM_SUCCESS;
}
