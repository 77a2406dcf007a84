/* A kernel job's pieces through the ring's device twin: each buffer of
 * gathered blocks moves whole by one DMA to its twin and one launch of the
 * batch kernel scatters it there (or gathers, then one DMA back). The
 * launches run on a stream of the engine's own, so that the copy's stream
 * goes on to the next buffer's DMA while a launch runs: on one stream each
 * launch waited for the DMA before it and held back the next (on the H100,
 * 81% of a contiguous copy's rate against 96% beside it, docs/design.md). */
#include "../errors.h"
#include "../instance.h"
#include "staging_engine.h"

void pm__staging_ensure_twin_locked(engine *eng)
{
    if (eng->scratch || eng->scratch_failed)
        return;
    const pm__backend *be = pm__instance_backend();
    pm_deviceptr d = 0;
    pm_stream_t launches = NULL;
    if (be->device_alloc(&d, (size_t)eng->n_buffers * eng->chunk) != PM_SUCCESS) {
        eng->scratch_failed = true;
    } else if (be->stream_create(&launches) != PM_SUCCESS) {
        be->device_release(d);
        eng->scratch_failed = true;
    } else {
        eng->scratch = d;
        eng->launches = launches;
    }
}

void pm__staging_release_twin(engine *eng)
{
    const pm__backend *be = pm__instance_backend();
    if (eng->launches)
        be->stream_destroy(eng->launches); /* waits for the last launches */
    eng->launches = NULL;
    for (unsigned i = 0; i < eng->n_buffers; i++)
        if (eng->ring[i].twin_mark.handle)
            be->marker_release(&eng->ring[i].twin_mark);
    if (eng->scratch)
        be->device_release(eng->scratch);
    eng->scratch = 0;
    eng->scratch_failed = false;
}

/* b's twin, and where a piece's list lies in b and in the twin: right after
 * its bytes, so that one DMA takes both to the device. A kernel job's pieces
 * end list_reserve() before the buffer's end, and the list fits there. */
static pm_deviceptr twin_of(const engine *eng, const buffer *b)
{
    return eng->scratch + (pm_deviceptr)((size_t)(b - eng->ring) * eng->chunk);
}

static size_t list_at(const buffer *b) { return (b->bytes + 15) & ~(size_t)15; }

static pm__block_copy *list_of(const buffer *b)
{
    return (pm__block_copy *)((uint8_t *)b->p + list_at(b));
}

static const pm__block_copy *list_near(const engine *eng, const buffer *b)
{
    return (const pm__block_copy *)(uintptr_t)(twin_of(eng, b) + list_at(b));
}

/* After a launch between b's twin and the blocks was queued (r: how that
 * went), b's twin marker behind it; as pm__staging_mark_behind does for b's
 * marker where that fails. */
static pm_result mark_twin(const engine *eng, const pm__backend *be, buffer *b, pm_result r)
{
    if (r == PM_SUCCESS)
        r = be->marker_rerecord(eng->launches, &b->twin_mark);
    if (r == PM_SUCCESS || be->marker_rerecord(eng->launches, &b->twin_mark) == PM_SUCCESS)
        b->twin_pending = true;
    else if (be->stream_synchronize(eng->launches) == PM_SUCCESS)
        b->twin_pending = false;
    return r;
}

bool pm__staging_twin_queue(const pm__backend *be, job *j, buffer *b, size_t i, pm_result *r)
{
    const engine *eng = j->eng;
    const size_t end = b->offset + b->bytes, cap = list_reserve(eng) / sizeof(pm__block_copy);
    size_t n = 0;
    if (!eng->scratch)
        return false;
    for (size_t k = i, off = b->offset; off < end; k++, n++) {
        if (!j->segs[k].kernel || n == cap)
            return false;
        off = j->segs[k].at + j->segs[k].bytes;
    }
    const pm_deviceptr twin = twin_of(eng, b);
    pm__block_copy *list = list_of(b);
    n = 0;
    for (size_t off = b->offset; off < end; i++) {
        const pm__segment *s = &j->segs[i];
        size_t in = off - s->at, take = min_size(s->bytes - in, end - off);
        pm_deviceptr near = twin + (off - b->offset);
        list[n++] = (pm__block_copy){.dst = j->dir == PM__HTOD ? s->dev + in : near,
                                     .src = j->dir == PM__HTOD ? near : s->dev + in,
                                     .bytes = take};
        off += take;
    }
    b->list_count = n;
    const size_t list_bytes = n * sizeof *list;
    if (j->dir == PM__HTOD) {
        /* The twin is written once its last launch is done; the launch of
         * this piece follows b's marker (pm__staging_twin_scatter). */
        *r = b->twin_pending ? be->marker_wait(j->stream, &b->twin_mark) : PM_SUCCESS;
        if (*r == PM_SUCCESS)
            *r = pm__copy_backend(be, PM__HTOD, b->p, twin, list_at(b) + list_bytes, j->stream,
                                  PM__VIA_PINNED);
        return true;
    }
    /* From the device: the gather follows the work before the job on its
     * stream (pm__staging_twin_start), and the DMA back follows the gather. */
    *r = pm__copy_backend(be, PM__HTOD, list, twin + list_at(b), list_bytes, eng->launches,
                          PM__VIA_PINNED);
    if (*r == PM_SUCCESS)
        *r = pm__copy_backend_blocks(be, list, n, list_near(eng, b), eng->launches);
    *r = mark_twin(eng, be, b, *r);
    /* Even where the gather failed, b's marker (recorded next on the job's
     * stream) must cover what the launch stream did with b: the list's read
     * may still be queued there. */
    const pm_result waited =
        b->twin_pending ? be->marker_wait(j->stream, &b->twin_mark) : PM_SUCCESS;
    if (waited != PM_SUCCESS)
        be->stream_synchronize(eng->launches);
    if (*r == PM_SUCCESS)
        *r = waited;
    if (*r == PM_SUCCESS)
        *r = pm__copy_backend(be, PM__DTOH, b->p, twin, b->bytes, j->stream, PM__VIA_PINNED);
    if (*r == PM_SUCCESS)
        atomic_fetch_add_explicit(&pm__copy_count.kernel_bytes, b->bytes, memory_order_relaxed);
    return true;
}

bool pm__staging_twin_start(const pm__backend *be, job *j)
{
    return j->eng->scratch && pm__staging_follow(be, j->eng->launches, j->stream) == PM_SUCCESS;
}

pm_result pm__staging_twin_scatter(const pm__backend *be, job *j, buffer *b)
{
    const engine *eng = j->eng;
    atomic_store_explicit(&j->launched, true, memory_order_relaxed); /* read after the job's slices */
    pm_result r = be->marker_wait(eng->launches, &b->mark);
    if (r == PM_SUCCESS)
        r = pm__copy_backend_blocks(be, list_of(b), b->list_count, list_near(eng, b),
                                    eng->launches);
    r = mark_twin(eng, be, b, r);
    if (r == PM_SUCCESS)
        atomic_fetch_add_explicit(&pm__copy_count.kernel_bytes, b->bytes, memory_order_relaxed);
    return r;
}

pm_result pm__staging_twin_join(const pm__backend *be, const job *j)
{
    if (!atomic_load_explicit(&j->launched, memory_order_relaxed))
        return PM_SUCCESS;
    const engine *eng = j->eng;
    const pm_result r = pm__staging_follow(be, j->stream, eng->launches);
    /* Where the stream could not be told to wait, the launches are waited
     * for here: the job's stream then finds them done. */
    return r == PM_SUCCESS ? r : be->stream_synchronize(eng->launches);
}
