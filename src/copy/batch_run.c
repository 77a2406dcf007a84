/* The lists a batch is planned into, and moving what they hold. */
#include <stdlib.h>

#include "../errors.h"
#include "batch.h"

/* A list's first room: the batch's element count, within bounds (a huge
 * batch whose elements mostly go elsewhere would hold much memory idle). */
enum { FIRST_MIN = 64, FIRST_MAX = 4096 };

/* The next room for a list of entries of size bytes; 0 where it would not fit
 * in memory's addresses. */
static size_t grown(size_t cap, size_t hint, size_t size)
{
    const size_t more =
        cap ? 2 * cap : hint < FIRST_MIN ? FIRST_MIN : hint > FIRST_MAX ? FIRST_MAX : hint;
    return more > cap && more <= SIZE_MAX / size ? more : 0;
}

/* A list's entries v (of size bytes, room for *cap) moved to more room: the
 * entries' new place, *cap updated; or NULL, v and *cap as they were. */
static void *grow_list(void *v, size_t *cap, size_t hint, size_t size)
{
    const size_t more = grown(*cap, hint, size);
    void *moved = more ? realloc(v, more * size) : NULL;
    if (moved)
        *cap = more;
    return moved;
}

bool pm__dmas_grow(pm__dmas *d, size_t hint)
{
    /* The three lists share one room: each grows from it, and it moves on
     * once all three have. */
    size_t dst_cap = d->cap, src_cap = d->cap, bytes_cap = d->cap;
    pm_deviceptr *dst = grow_list(d->dst, &dst_cap, hint, sizeof *dst);
    d->dst = dst ? dst : d->dst;
    pm_deviceptr *src = dst ? grow_list(d->src, &src_cap, hint, sizeof *src) : NULL;
    d->src = src ? src : d->src;
    size_t *bytes = src ? grow_list(d->bytes, &bytes_cap, hint, sizeof *bytes) : NULL;
    d->bytes = bytes ? bytes : d->bytes;
    d->cap = bytes ? bytes_cap : d->cap;
    return bytes != NULL;
}

bool pm__segments_grow(pm__segments *s, size_t hint)
{
    pm__segment *v = grow_list(s->v, &s->cap, hint, sizeof *v);
    s->v = v ? v : s->v;
    return v != NULL;
}

bool pm__blocks_grow(pm__blocks *k, size_t hint)
{
    pm__block_copy *v = grow_list(k->v, &k->cap, hint, sizeof *v);
    k->v = v ? v : k->v;
    return v != NULL;
}

static void dmas_free(pm__dmas *d)
{
    free(d->dst);
    free(d->src);
    free(d->bytes);
}

void pm__batch_plan_free(pm__batch_plan *p)
{
    dmas_free(&p->now);
    dmas_free(&p->queued);
    dmas_free(&p->host);
    free(p->kernel.v);
    free(p->staged[0].v);
    free(p->staged[1].v);
}

static pm_result out_of_memory(void)
{
    return pm__fail(PM_ERROR_OUT_OF_MEMORY, "%s: out of memory", PM__BATCH_NAME);
}

/* The pageable pieces of one direction through the staging engine; where no
 * ring can be pinned, each through the backend's own path. */
static pm_result run_staged(const pm__copy_settings *set, const pm__backend *b, pm__direction dir,
                            const pm__segments *s, pm_stream_t stream)
{
    if (s->n == 0)
        return PM_SUCCESS;
    bool no_ring = false;
    pm__detail_saved before; /* a batch that succeeds another way leaves it as it was */
    pm__detail_save(&before);
    pm_result r = pm__staged_segments(set, dir, s->v, s->n, s->bytes, stream, s->kernel, &no_ring);
    if (!no_ring)
        return r;
    for (size_t i = 0; i < s->n; i++) {
        const pm__segment *g = &s->v[i];
        if (pm__regcache_overlaps(g->host, g->bytes))
            return r; /* the driver would read through the cache's registration */
        pm_result each = pm__copy_backend(b, dir, g->host, g->dev, g->bytes, stream,
                                          PM__VIA_PAGEABLE);
        if (each != PM_SUCCESS)
            return each;
        pm__count(&pm__copy_count.driver_bytes, g->bytes);
    }
    pm__detail_restore(&before);
    return PM_SUCCESS;
}

/* The blocks as DMAs, where no ring can be pinned for their lists. */
static pm_result blocks_as_dmas(const pm__backend *b, const pm__blocks *k, pm_stream_t stream,
                                bool one_call)
{
    pm__dmas d = {0};
    bool ok = true;
    for (size_t i = 0; i < k->n && ok; i++)
        ok = pm__dmas_add(&d, k->n, k->v[i].dst, k->v[i].src, (size_t)k->v[i].bytes);
    pm_result r = ok ? pm__copy_backend_batch(b, d.dst, d.src, d.bytes, d.n, 0, stream, one_call)
                     : out_of_memory();
    dmas_free(&d);
    return r;
}

/* The page-locked blocks for the kernel, each list in a staging buffer;
 * where no ring can be pinned, as DMAs instead. */
static pm_result run_blocks(const pm__copy_settings *set, const pm__backend *b,
                            const pm__blocks *k, pm_stream_t stream, bool one_call)
{
    if (k->n == 0)
        return PM_SUCCESS;
    bool no_ring = false;
    pm__detail_saved before;
    pm__detail_save(&before);
    pm_result r = pm__staged_blocks(set, k->v, k->n, stream, &no_ring);
    if (no_ring && (r = blocks_as_dmas(b, k, stream, one_call)) == PM_SUCCESS)
        pm__detail_restore(&before);
    if (r == PM_SUCCESS)
        pm__count(&pm__copy_count.direct_bytes, k->bytes);
    return r;
}

pm_result pm__batch_run(const pm__copy_settings *set, const pm__backend *b, pm__batch_plan *p,
                        pm_stream_t stream, bool one_call)
{
    pm_result r = PM_SUCCESS;
    if (p->now.n + p->queued.n > 0) {
        /* One call takes both groups, the one the driver reads now first. */
        const size_t now = p->now.n;
        pm__dmas *all = now ? &p->now : &p->queued;
        for (size_t i = 0; now && i < p->queued.n; i++)
            if (!pm__dmas_add(all, p->hint, p->queued.dst[i], p->queued.src[i],
                              p->queued.bytes[i]))
                return out_of_memory();
        r = pm__copy_backend_batch(b, all->dst, all->src, all->bytes, all->n, now, stream,
                                   one_call);
    }
    if (r == PM_SUCCESS) {
        pm__count(&pm__copy_count.direct_bytes, p->direct);
        pm__count(&pm__copy_count.driver_bytes, p->driver);
        r = run_blocks(set, b, &p->kernel, stream, one_call);
    }
    for (size_t i = 0; i < p->host.n && r == PM_SUCCESS; i++)
        r = b->copy_any(p->host.dst[i], p->host.src[i], p->host.bytes[i], stream, false, false);
    if (r == PM_SUCCESS)
        r = run_staged(set, b, PM__HTOD, &p->staged[PM__HTOD], stream);
    if (r == PM_SUCCESS)
        r = run_staged(set, b, PM__DTOH, &p->staged[PM__DTOH], stream);
    if (p->wait) {
        /* Failed or not: once the call returns, the caller may free a pageable destination. */
        pm__detail_saved failure;
        pm__detail_save(&failure);
        const pm_result waited = b->stream_synchronize(stream);
        if (r != PM_SUCCESS)
            pm__detail_restore(&failure);
        else
            r = waited;
    }
    return r;
}
