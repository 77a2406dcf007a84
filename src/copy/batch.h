/* The parts of pm_memcpy_batch_async, lowest first (batch.c says how a batch
 * is checked, planned and moved):
 *   batch_overlap   the check that no copy of a batch depends on another
 *   batch_run       the lists a batch is planned into, and moving them
 *   batch           the call: each element checked and planned in one pass
 * The appends are inline: a batch makes thousands of them in one call. */
#ifndef PINMEM_COPY_BATCH_H
#define PINMEM_COPY_BATCH_H

#include "copy.h"

#define PM__BATCH_NAME "pm_memcpy_batch_async"

/* A range an element writes or reads. tag: the element's index times two,
 * plus one for a destination. */
typedef struct pm__span {
    pm_deviceptr lo, hi;
    size_t tag;
} pm__span;

/* The ranges of a batch in one kind of memory, host or device (on a GPU they
 * never share an address, so each kind is checked alone; where device memory
 * is host memory, posix, the two lists are checked as one). */
typedef struct pm__spans {
    pm__span *v; /* room for two ranges an element */
    size_t n;
    pm_deviceptr differ; /* the bits in which some start differs from the first */
    bool has_dst;
} pm__spans;

static inline void pm__spans_add(pm__spans *s, pm_deviceptr lo, pm_deviceptr hi, size_t index,
                                 bool dst)
{
    s->v[s->n++] = (pm__span){lo, hi, index << 1 | dst};
    s->differ |= lo ^ s->v[0].lo;
    s->has_dst |= dst;
}

/* PM_SUCCESS when no destination in s overlaps another range of s; else
 * PM_ERROR_INVALID_VALUE naming both elements. Reorders s; tmp has room for
 * s->n ranges. */
pm_result pm__batch_check_overlaps(pm__spans *s, pm__span *tmp);

/* Growing lists of DMAs, staging segments and kernel blocks. Each first
 * grows to about hint entries (the batch's element count): most batches put
 * every element in one list. */
typedef struct pm__dmas {
    pm_deviceptr *dst, *src;
    size_t *bytes;
    size_t n, cap;
} pm__dmas;

typedef struct pm__segments {
    pm__segment *v;
    size_t n, cap, bytes;
    bool kernel; /* some segment may move by the batch kernel */
} pm__segments;

typedef struct pm__blocks {
    pm__block_copy *v;
    size_t n, cap;
    unsigned long long bytes;
} pm__blocks;

bool pm__dmas_grow(pm__dmas *d, size_t hint);
bool pm__segments_grow(pm__segments *s, size_t hint);
bool pm__blocks_grow(pm__blocks *k, size_t hint);

static inline bool pm__dmas_add(pm__dmas *d, size_t hint, pm_deviceptr dst, pm_deviceptr src,
                                size_t n)
{
    if (d->n == d->cap && !pm__dmas_grow(d, hint))
        return false;
    d->dst[d->n] = dst;
    d->src[d->n] = src;
    d->bytes[d->n++] = n;
    return true;
}

static inline bool pm__segments_add(pm__segments *s, size_t hint, uint8_t *host, pm_deviceptr dev,
                                    size_t n, bool kernel)
{
    if (s->n == s->cap && !pm__segments_grow(s, hint))
        return false;
    s->v[s->n++] = (pm__segment){.host = host, .dev = dev, .bytes = n, .at = s->bytes,
                                 .kernel = kernel};
    s->bytes += n;
    s->kernel |= kernel;
    return true;
}

static inline bool pm__blocks_add(pm__blocks *k, size_t hint, pm_deviceptr dst, pm_deviceptr src,
                                  size_t n)
{
    if (k->n == k->cap && !pm__blocks_grow(k, hint))
        return false;
    k->v[k->n++] = (pm__block_copy){.dst = dst, .src = src, .bytes = n};
    k->bytes += n;
    return true;
}

/* Everything a batch moves, sorted by how it moves. */
typedef struct pm__batch_plan {
    size_t hint;         /* the batch's element count */
    pm__dmas now;        /* pageable sources for the driver to read during its call (DRIVER) */
    pm__dmas queued;     /* page-locked and device memory: DMAs in stream order */
    pm__blocks kernel;   /* page-locked and device memory: by the batch kernel, in stream order */
    pm__dmas host;       /* host to host, each the backend's own copy */
    pm__segments staged[2]; /* pageable pieces through the staging engine, by direction */
    bool wait;           /* pageable destinations given to the driver: wait for the stream */
    unsigned long long direct, driver; /* of now and queued: page-locked, and the driver's */
} pm__batch_plan;

void pm__batch_plan_free(pm__batch_plan *p);

/* Moves what p holds: the DMAs first, so the DMA engine works while the
 * threads gather, and the kernel's blocks; then host to host; then the staged
 * pieces, and a wait where p says so. Each part's bytes are counted once it
 * is queued, failed call or not, as copy.c counts a copy's pieces. one_call:
 * the DMAs may go in one driver call. */
pm_result pm__batch_run(const pm__copy_settings *set, const pm__backend *b, pm__batch_plan *p,
                        pm_stream_t stream, bool one_call);

#endif
