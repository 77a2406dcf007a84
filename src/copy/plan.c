/* How a staged job is cut into pieces and slices (copy.h says why each size
 * is what it is), and where its segments lie. Plain arithmetic, below the
 * staging engine, so that the engine's lock never covers more than a lookup. */
#include <unistd.h>

#include "copy.h"

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

static size_t slices_of(size_t bytes, size_t slice) { return (bytes + slice - 1) / slice; }

pm__piece_plan pm__plan_pieces(const pm__copy_settings *set, pm__direction dir, size_t chunk,
                               size_t bytes, bool one_range)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    pm__piece_plan p = {.bytes = bytes, .chunk = chunk};
    p.slice = min_size(set->slice_bytes, chunk);
    if (dir == PM__DTOH && bytes > p.slice && bytes <= PM__DTOH_SLICES_MAX &&
        set->dtoh_slice_bytes && set->dtoh_slice_bytes < p.slice)
        p.slice = min_size(one_range && bytes > PM__DTOH_FINE_MAX ? 2 * set->dtoh_slice_bytes
                                                                  : set->dtoh_slice_bytes,
                           p.slice);
    const size_t first = dir == PM__DTOH && one_range ? set->dtoh_first_piece : set->first_piece;
    p.first = min_size(first ? first : set->slice_bytes, chunk);
    size_t share = bytes / (set->pieces ? set->pieces : 1);
    share = (share + page - 1) / page * page;
    p.target = share < p.first ? p.first : min_size(share, chunk);
    return p;
}

size_t pm__plan_piece(const pm__piece_plan *p, unsigned k, size_t offset)
{
    size_t n = p->first;
    for (unsigned i = 0; i < k && n < p->target; i++)
        n *= 2;
    n = min_size(n, p->target);
    return min_size(n, p->bytes - offset);
}

size_t pm__plan_slices(const pm__piece_plan *p)
{
    size_t off = 0, slices = 0;
    unsigned k = 0;
    for (; off < p->bytes; k++) {
        size_t n = pm__plan_piece(p, k, off);
        if (n == p->target)
            break; /* the ramp is over: the rest comes in whole target pieces */
        slices += slices_of(n, p->slice);
        off += n;
    }
    size_t rest = p->bytes - off;
    return slices + rest / p->target * slices_of(p->target, p->slice) +
           slices_of(rest % p->target, p->slice);
}

size_t pm__segment_at(const pm__segment *segs, size_t n, size_t at)
{
    size_t lo = 0, hi = n; /* the answer lies in [lo, hi) */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (segs[mid].at <= at)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}
