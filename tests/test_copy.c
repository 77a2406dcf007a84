/* pm_memcpy_*: every size from 1 byte, offsets and alignments, both
 * directions, sync and async, across every kind of boundary, from several
 * threads, both ways at once, cut into pieces every way the settings allow,
 * in stream order; bad arguments; the pinned budget. Every case
 * holds within an ordinary user's 8 MiB RLIMIT_MEMLOCK, or says it is
 * skipped where it cannot. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "copy/copy.h"
#include "copy/store_choice.h"
#include "test_hooks.h"
#include "copy_util.h"
#include "threads.h"

static uint64_t rng_state = 42;
static size_t rnd(size_t n)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (size_t)(rng_state >> 33) % n;
}

static void round_trip_reusing(uint8_t *src, uint8_t *dst, size_t n, pm_deviceptr dev, bool async,
                               pm_stream_t s, unsigned seed, bool pageable);

/* Host [src, +n) to the device and back into dst, checked byte for byte.
 * An all-pageable source is overwritten as soon as the asynchronous copy
 * returns, as its caller may. */
static void round_trip(uint8_t *src, uint8_t *dst, size_t n, pm_deviceptr dev, bool async,
                       pm_stream_t s, unsigned seed)
{
    round_trip_reusing(src, dst, n, dev, async, s, seed, false);
}

static void round_trip_reusing(uint8_t *src, uint8_t *dst, size_t n, pm_deviceptr dev, bool async,
                               pm_stream_t s, unsigned seed, bool pageable)
{
    fill(src, n, seed);
    memset(dst, 0, n);
    if (async) {
        CHECK_RESULT(pm_memcpy_htod_async(dev, src, n, s), PM_SUCCESS);
        if (pageable)
            fill(src, n, seed + 1);
        CHECK_RESULT(pm_memcpy_dtoh_async(dst, dev, n, s), PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    } else {
        CHECK_RESULT(pm_memcpy_htod(dev, src, n), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_dtoh(dst, dev, n), PM_SUCCESS);
    }
    size_t bad = first_mismatch(dst, n, seed);
    if (bad != n)
        fprintf(stderr, "round trip of %zu bytes (%s): first wrong byte at %zu\n", n,
                async ? "async" : "sync", bad);
    CHECK(bad == n);
}

static void random_sizes(void)
{
    const size_t cap = 3 << 20;
    SCOPED_MALLOC uint8_t *src = malloc(cap + 64), *dst = malloc(cap + 64);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(cap + 64);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(src && dst && dev);
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    for (int i = 0; i < 120; i++) {
        size_t n = i < 20 ? (size_t)i + 1 : (size_t)1 << rnd(22);
        n = n > 1 ? n + rnd(n) : n;
        if (n > cap)
            n = cap;
        size_t so = rnd(64), doff = rnd(64);
        round_trip_reusing(src + so, dst + doff, n, dev + rnd(64), i % 2, s, (unsigned)i, true);
    }
}

/* Copies that start in one kind of memory and end in another. */
static void boundaries(void)
{
    const size_t page = 4096, n = 1 << 20;
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(3 * n);
    SCOPED_MALLOC uint8_t *back = malloc(3 * n);
    /* pageable, then a registration in the middle, then pageable again */
    SCOPED_MALLOC uint8_t *buf = aligned_alloc(page, 3 * n);
    REQUIRE(dev && back && buf);
    REQUIRE_PINNED(pm_mem_host_register(buf + n + 100, n - 200, 0), "a 1 MiB registration");
    round_trip(buf, back, 3 * n, dev, false, NULL, 1);
    round_trip(buf + n + 50, back, n, dev, true, NULL, 2);     /* into and out of it */
    round_trip(buf + n + 200, back, n / 2, dev, false, NULL, 3); /* inside it */
    CHECK_RESULT(pm_mem_host_unregister(buf + n + 100), PM_SUCCESS);
    /* two registrations back to back */
    REQUIRE_PINNED(pm_mem_host_register(buf, n, 0), "a 1 MiB registration");
    pm_result second = pm_mem_host_register(buf + n, n, 0);
    if (second == PM_SUCCESS) {
        round_trip(buf + n / 2, back, n, dev, true, NULL, 4);
        CHECK_RESULT(pm_mem_host_unregister(buf + n), PM_SUCCESS);
    }
    CHECK_RESULT(pm_mem_host_unregister(buf), PM_SUCCESS);
    REQUIRE_PINNED(second, "a second 1 MiB registration");
    /* past the end of a host allocation */
    SCOPED_HOST uint8_t *h = NULL;
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&h, 2 * n), "a 2 MiB host allocation");
    round_trip(h + 7, back, 2 * n - 7, dev, false, NULL, 6);
    CHECK_RESULT(pm_mem_free_host(h), PM_SUCCESS);
    h = NULL;
    /* page-locked memory on both sides of a copy's far end */
    REQUIRE_PINNED(pm_mem_host_alloc((void **)&h, n, PM_MEMHOSTALLOC_WRITECOMBINED),
                   "a 1 MiB host allocation");
    round_trip(h + n - 300, back, 300, dev, true, NULL, 7);
    pm_copy_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_copy_get_stats(&st), PM_SUCCESS);
    CHECK(st.direct_bytes > 0 && st.staged_bytes > 0 && st.driver_bytes > 0);
}

/* Which pageable copies take the backend's own path: up to direct_max to the
 * device and up to dtoh_direct_max from it, whose default is the smaller of
 * its own and direct_max. */
static void direct_by_direction(void)
{
    enum { N = 64 << 10 };
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(N);
    SCOPED_MALLOC uint8_t *src = malloc(N), *dst = malloc(N);
    REQUIRE(dev && src && dst);
    pm_copy_config saved = {.struct_size = sizeof saved};
    REQUIRE_RESULT(pm_copy_get_config(&saved), PM_SUCCESS);
    static const struct {
        size_t direct_max, dtoh_direct_max, bytes;
        bool htod_staged, dtoh_staged;
    } cases[] = {
        {N, 0, N, false, true},             /* from the device: 32 KiB by default */
        {N, 0, 16 << 10, false, false},
        {16 << 10, 0, 32 << 10, true, true}, /* a smaller direct_max binds both */
        {(size_t)-1, 0, 8 << 10, true, true},
        {4 << 10, N, N, true, false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        pm_copy_config c = saved;
        c.direct_max = cases[k].direct_max;
        c.dtoh_direct_max = cases[k].dtoh_direct_max;
        CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
        const size_t n = cases[k].bytes;
        pm_copy_stats before = {.struct_size = sizeof before}, mid = before, after = before;
        CHECK_RESULT(pm_copy_get_stats(&before), PM_SUCCESS);
        fill(src, n, (unsigned)k);
        CHECK_RESULT(pm_memcpy_htod(dev, src, n), PM_SUCCESS);
        CHECK_RESULT(pm_copy_get_stats(&mid), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_dtoh(dst, dev, n), PM_SUCCESS);
        CHECK_RESULT(pm_copy_get_stats(&after), PM_SUCCESS);
        CHECK(memcmp(src, dst, n) == 0);
        CHECK(mid.staged_bytes - before.staged_bytes == (cases[k].htod_staged ? n : 0));
        CHECK(after.staged_bytes - mid.staged_bytes == (cases[k].dtoh_staged ? n : 0));
    }
    CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
}

/* A copy across two neighbouring pool allocations. */
static void across_pool_blocks(void)
{
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(100 << 10);
    SCOPED_MALLOC uint8_t *back = malloc(100 << 10);
    REQUIRE(dev && back);
    pm_mem_pool_t pool = NULL;
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    REQUIRE_RESULT(pm_mem_pool_create(&pool, &props), PM_SUCCESS);
    uint8_t *a = NULL, *b = NULL;
    pm_result ra = pm_mem_alloc_from_pool((void **)&a, 64 << 10, pool);
    pm_result rb = ra == PM_SUCCESS ? pm_mem_alloc_from_pool((void **)&b, 64 << 10, pool) : ra;
    if (ra == PM_SUCCESS && rb == PM_SUCCESS) {
        uint8_t *lo = a < b ? a : b;
        /* neighbours, as a fresh pool places them */
        if ((size_t)((a < b ? b : a) - lo) == (64 << 10))
            round_trip(lo + 1000, back, 100 << 10, dev, true, NULL, 5);
    }
    if (a)
        CHECK_RESULT(pm_mem_free(a), PM_SUCCESS);
    if (b)
        CHECK_RESULT(pm_mem_free(b), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    REQUIRE_PINNED(rb, "a pool's memory");
}

typedef struct worker {
    unsigned seed;
    int failures;
    bool on_own_stream; /* PM_STREAM_PER_THREAD, not a stream it makes */
} worker;

static void *copy_thread(void *arg)
{
    worker *w = arg;
    const size_t n = (1 << 20) + 12345;
    uint8_t *src = malloc(n), *dst = malloc(n);
    pm_deviceptr dev = 0;
    pm_stream_t s = w->on_own_stream ? PM_STREAM_PER_THREAD : NULL;
    if (!src || !dst || pm_device_alloc(&dev, n) != PM_SUCCESS ||
        (!s && pm_stream_create(&s) != PM_SUCCESS)) {
        w->failures++;
        if (dev)
            device_free(dev);
        free(src);
        free(dst);
        return NULL;
    }
    for (unsigned round = 0; round < 8; round++) {
        unsigned seed = w->seed * 100 + round;
        fill(src, n, seed);
        bool async = round % 2;
        pm_result r1 = async ? pm_memcpy_htod_async(dev, src, n, s) : pm_memcpy_htod(dev, src, n);
        pm_result r2 = async ? pm_memcpy_dtoh_async(dst, dev, n, s) : pm_memcpy_dtoh(dst, dev, n);
        if (r1 != PM_SUCCESS || r2 != PM_SUCCESS || first_mismatch(dst, n, seed) != n)
            w->failures++;
    }
    if (!w->on_own_stream)
        pm_stream_destroy(s);
    device_free(dev);
    free(src);
    free(dst);
    return NULL;
}

/* Runs copy_thread on n threads (seeds from seed), each checked, each on a
 * stream it makes or on its own default stream. */
static void copy_threads(unsigned n, unsigned seed, bool on_own_streams)
{
    pthread_t t[8];
    worker w[8];
    n = n < 8 ? n : 8;
    for (unsigned i = 0; i < n; i++)
        w[i] = (worker){seed + i, 0, on_own_streams};
    unsigned started = start_threads(t, n, copy_thread, w, sizeof w[0]);
    CHECK(started == n);
    join_threads(t, started);
    for (unsigned i = 0; i < started; i++)
        CHECK(w[i].failures == 0);
}

static void eight_threads(void) { copy_threads(8, 1, false); }

/* Each thread's own stream is made on its first copy and ended when it
 * exits, eight at once. */
static void eight_threads_on_their_own_streams(void) { copy_threads(8, 11, true); }

/* Rings of one to four buffers, so that device-to-host copies queue none,
 * one or two DMAs ahead (half the ring) while four threads copy both ways and
 * compete for the few buffers: every byte arrives and no copy waits forever.
 * (With one buffer, a worker that stopped being a filler in the middle of a
 * slice once left the rest of its piece to threads that all slept; the
 * rounds are repeated because that needs the steering to move at that very
 * moment.) */
static void small_rings(void)
{
    pm_copy_config saved = {.struct_size = sizeof saved};
    CHECK_RESULT(pm_copy_get_config(&saved), PM_SUCCESS);
    for (unsigned k = 0; k < 12; k++) {
        unsigned buffers = k % 4 + 1;
        pm_copy_config c = saved;
        c.buffers = buffers;
        CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
        copy_threads(4, 100 + 10 * buffers, false);
    }
    CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
}

/* Both ways at once: four threads copying pageable memory to the device and
 * four copying it back, each on a stream of its own, with the ring split
 * between the directions and shared: every byte arrives both ways and no
 * copy waits forever. */
typedef struct one_way {
    bool to_device;
    unsigned seed;
    int failures;
} one_way;

static void *one_way_thread(void *arg)
{
    one_way *w = arg;
    const size_t n = (1 << 20) + 4321;
    uint8_t *host = malloc(n), *check = malloc(n);
    pm_deviceptr dev = 0;
    pm_stream_t s = NULL;
    if (!host || !check || pm_device_alloc(&dev, n) != PM_SUCCESS ||
        pm_stream_create(&s) != PM_SUCCESS) {
        w->failures++;
        goto out;
    }
    fill(host, n, w->seed);
    if (pm_memcpy_htod(dev, host, n) != PM_SUCCESS)
        w->failures++;
    for (unsigned round = 0; round < 10; round++) {
        unsigned seed = w->seed * 100 + round;
        if (w->to_device) { /* many copies in, one back to check */
            fill(host, n, seed);
            if (pm_memcpy_htod_async(dev, host, n, s) != PM_SUCCESS ||
                pm_stream_synchronize(s) != PM_SUCCESS)
                w->failures++;
            if (round % 5 == 4 && (pm_memcpy_dtoh(check, dev, n) != PM_SUCCESS ||
                                   first_mismatch(check, n, seed) != n))
                w->failures++;
        } else { /* many copies out of what went in first */
            memset(host, 0, n);
            if (pm_memcpy_dtoh_async(host, dev, n, s) != PM_SUCCESS ||
                first_mismatch(host, n, w->seed) != n)
                w->failures++;
        }
    }
out:
    if (s)
        pm_stream_destroy(s);
    device_free(dev);
    free(host);
    free(check);
    return NULL;
}

static void both_ways(void)
{
    pm_copy_config saved = {.struct_size = sizeof saved};
    REQUIRE_RESULT(pm_copy_get_config(&saved), PM_SUCCESS);
    for (int shared = 0; shared < 2; shared++) {
        pm_copy_config c = saved;
        c.ring = shared ? PM_COPY_RING_SHARED : PM_COPY_RING_SPLIT;
        CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
        pthread_t t[8];
        one_way w[8];
        for (unsigned i = 0; i < 8; i++)
            w[i] = (one_way){.to_device = i % 2 == 0, .seed = 300 + 10 * (unsigned)shared + i};
        unsigned started = start_threads(t, 8, one_way_thread, w, sizeof w[0]);
        CHECK(started == 8);
        join_threads(t, started);
        for (unsigned i = 0; i < started; i++)
            CHECK(w[i].failures == 0);
    }
    CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
}

/* The staging workers of every engine running now. */
static unsigned staging_threads_now(void)
{
    pm_copy_stats st = {.struct_size = sizeof st};
    CHECK_RESULT(pm_copy_get_stats(&st), PM_SUCCESS);
    return st.staging_threads;
}

/* A round trip through memory of each engine: at dev and in the next 2 MiB
 * unit, whose parity differs. */
static bool round_trips_on_both_engines(unsigned seed)
{
    const size_t n = (512 << 10) + 777, unit = (size_t)2 << 20;
    uint8_t *src SCOPED_MALLOC = malloc(n), *dst SCOPED_MALLOC = malloc(n);
    pm_deviceptr dev SCOPED_DEVICE = device_alloc(2 * unit + n);
    REQUIRE_OR(src && dst && dev, false);
    const pm_deviceptr at[2] = {dev, dev + (unit - (size_t)(dev & (unit - 1)))};
    bool ok = true;
    for (unsigned k = 0; k < 2; k++) {
        fill(src, n, seed + k);
        memset(dst, 0, n);
        CHECK_RESULT(pm_memcpy_htod(at[k], src, n), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_dtoh(dst, at[k], n), PM_SUCCESS);
        ok &= first_mismatch(dst, n, seed + k) == n;
    }
    CHECK(ok);
    return ok;
}

/* Copies on two engines at once, as on two devices (the hook takes a copy's
 * engine by its device memory's 2 MiB unit): eight threads copying both ways
 * with the two engines' workers, and four both ways at once, every byte
 * arriving; each engine starts its own workers; a new shape of engine stops
 * both, and copies on each start it again. */
static void two_engines(void)
{
    pm_copy_config saved = {.struct_size = sizeof saved};
    REQUIRE_RESULT(pm_copy_get_config(&saved), PM_SUCCESS);
    atomic_store(&pm__fault_engines_split, true);
    if (round_trips_on_both_engines(600))
        CHECK(staging_threads_now() == 2 * saved.workers);
    copy_threads(8, 610, false);
    pthread_t t[4];
    one_way w[4];
    for (unsigned i = 0; i < 4; i++)
        w[i] = (one_way){.to_device = i % 2 == 0, .seed = 620 + i};
    unsigned started = start_threads(t, 4, one_way_thread, w, sizeof w[0]);
    CHECK(started == 4);
    join_threads(t, started);
    for (unsigned i = 0; i < started; i++)
        CHECK(w[i].failures == 0);
    pm_copy_config fewer = saved;
    fewer.workers = saved.workers > 1 ? saved.workers - 1 : 2;
    CHECK_RESULT(pm_copy_set_config(&fewer), PM_SUCCESS);
    CHECK(staging_threads_now() == 0);
    if (round_trips_on_both_engines(630))
        CHECK(staging_threads_now() == 2 * fewer.workers);
    CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
    atomic_store(&pm__fault_engines_split, false);
}

/* Whether one plan keeps its rules: the pieces follow one another from 0 to the
 * copy, the first is the first piece (or the whole copy), each is twice the
 * one before until the target, none is larger than a buffer, the slices
 * counted are the slices of the pieces, and copies from the device larger
 * than a slice and up to PM__DTOH_SLICES_MAX take the finer slices. A copy of
 * one range from the device takes dtoh_first_piece, and above
 * PM__DTOH_FINE_MAX twice the finer slice; every other job first_piece. */
static bool plan_is_right(pm__direction dir, bool one_range, size_t chunk, size_t first_piece,
                          size_t dtoh_first_piece, unsigned pieces, size_t bytes)
{
    const pm__copy_settings set = {.slice_bytes = 16 << 10,
                                   .dtoh_slice_bytes = 4 << 10,
                                   .first_piece = first_piece,
                                   .dtoh_first_piece = dtoh_first_piece,
                                   .pieces = pieces};
    const pm__piece_plan p = pm__plan_pieces(&set, dir, chunk, bytes, one_range);
    size_t first = dir == PM__DTOH && one_range ? dtoh_first_piece : first_piece;
    first = first ? first : set.slice_bytes;
    first = first < chunk ? first : chunk;
    const bool fine = dir == PM__DTOH && bytes > set.slice_bytes && bytes <= PM__DTOH_SLICES_MAX;
    const size_t fine_slice = one_range && bytes > PM__DTOH_FINE_MAX ? 2 * set.dtoh_slice_bytes
                                                                     : set.dtoh_slice_bytes;
    bool ok = p.first == first && p.target >= p.first && p.target <= chunk &&
              p.slice == (fine ? fine_slice : set.slice_bytes);
    size_t off = 0, slices = 0, last = 0;
    for (unsigned i = 0; off < bytes && ok; i++) {
        size_t n = pm__plan_piece(&p, i, off);
        size_t want = i == 0 ? first : last * 2 < p.target ? last * 2 : p.target;
        want = want < bytes - off ? want : bytes - off;
        ok = n == want && n > 0 && n <= chunk;
        slices += (n + p.slice - 1) / p.slice;
        off += n;
        last = n;
    }
    ok = ok && off == bytes && slices == pm__plan_slices(&p);
    if (!ok)
        fprintf(stderr, "plan of %zu bytes (dir %d, one range %d, chunk %zu, first %zu / %zu, "
                        "pieces %u) is wrong\n",
                bytes, (int)dir, (int)one_range, chunk, first_piece, dtoh_first_piece, pieces);
    return ok;
}

/* Plans of every shape the settings allow, each direction's first piece
 * unlike the other's, so that a plan that took the wrong one shows. */
static void piece_plans(void)
{
    static const size_t chunks[] = {64 << 10, 4 << 20};
    static const size_t firsts[] = {0, 4 << 10, 64 << 10, 512 << 10, 8 << 20};
    static const unsigned pieces[] = {1, 3, 8, 1024};
    static const size_t sizes[] = {1, 4095, 4096, 100000, 1 << 20, (4 << 20) + 1,
                                   (64 << 20) + 12345};
    /* Every combination by one index, so that the first wrong plan ends the
     * case with one line rather than one for each of the others. */
    bool right = true;
    for (size_t i = 0; right && i < 2 * 2 * 2 * 5 * 4 * 7; i++) {
        const size_t z = i % 7, k = i / 7 % 4, f = i / 28 % 5, c = i / 140 % 2;
        const bool one_range = i / 280 % 2;
        const pm__direction dir = i / 560 ? PM__DTOH : PM__HTOD;
        right = plan_is_right(dir, one_range, chunks[c], firsts[f], firsts[(f + 2) % 5],
                              pieces[k], sizes[z]);
    }
    CHECK(right);
}

/* Copies cut every way the settings allow, with workers that spin between
 * them: every byte arrives. */
static void piece_settings(void)
{
    const size_t cap = (3 << 20) + 999;
    SCOPED_MALLOC uint8_t *src = malloc(cap), *dst = malloc(cap);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(cap);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(src && dst && dev);
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    pm_copy_config saved = {.struct_size = sizeof saved};
    REQUIRE_RESULT(pm_copy_get_config(&saved), PM_SUCCESS);
    static const size_t firsts[] = {4 << 10, 8 << 10, 64 << 10, 1 << 20};
    static const unsigned pieces[] = {1, 2, 16, 300};
    for (unsigned k = 0; k < 16; k++) {
        pm_copy_config c = saved;
        c.first_piece_bytes = firsts[k % 4];
        c.dtoh_first_piece_bytes = firsts[(k + 1) % 4];
        c.pieces = pieces[k / 4];
        c.spin_us = k % 3 == 0 ? 200 : k % 3 == 1 ? 1000 : UINT_MAX; /* UINT_MAX: none */
        c.dtoh_slice_bytes = k / 2 % 2 ? 4 << 10 : 0; /* 0: the default */
        CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
        size_t n = 1 + rnd(cap);
        round_trip(src, dst, n, dev, k % 2, s, 700 + k);
    }
    CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
}

/* Later copies on one stream land after earlier ones; across streams, a
 * synchronized stream's copies are visible to the next stream's. */
static void ordering(void)
{
    const size_t n = 512 << 10;
    SCOPED_MALLOC uint8_t *src = malloc(n), *dst = malloc(n);
    SCOPED_HOST uint8_t *pinned = NULL;
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(n);
    SCOPED_STREAM pm_stream_t a = NULL, b = NULL;
    REQUIRE(src && dst && dev);
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&pinned, n), "a 512 KiB host allocation");
    REQUIRE_RESULT(pm_stream_create(&a), PM_SUCCESS);
    REQUIRE_RESULT(pm_stream_create(&b), PM_SUCCESS);
    for (unsigned k = 0; k < 6; k++) {
        fill(k % 2 ? pinned : src, n, 50 + k);
        CHECK_RESULT(pm_memcpy_htod_async(dev, k % 2 ? pinned : src, n, a), PM_SUCCESS);
        if (k % 2)
            CHECK_RESULT(pm_stream_synchronize(a), PM_SUCCESS); /* before pinned is refilled */
    }
    CHECK_RESULT(pm_memcpy_dtoh_async(dst, dev, n, a), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(a), PM_SUCCESS);
    CHECK(first_mismatch(dst, n, 55) == n);
    fill(src, n, 77);
    CHECK_RESULT(pm_memcpy_htod_async(dev, src, n, a), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(a), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_dtoh_async(pinned, dev, n, b), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(b), PM_SUCCESS);
    CHECK(first_mismatch(pinned, n, 77) == n);
}

/* The per-thread default stream's work waits here until the case opens the
 * gate, or 3 s pass, so that a copy that wrongly waits for it still ends. */
static atomic_int own_gate_open;
static void wait_own_gate(void *arg)
{
    (void)arg;
    for (int waited_ms = 0; !atomic_load(&own_gate_open) && waited_ms < 3000; waited_ms++)
        usleep(1000);
    atomic_store(&own_gate_open, 1);
}

/* The bytes of eight of the engine's slices (0: unknown), for copies of
 * several slices in fewer pieces than the ring has buffers. */
static size_t eight_slices(void)
{
    pm_copy_config c = {.struct_size = sizeof c};
    CHECK_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    return 8 * c.slice_bytes;
}

/* The per-thread default stream is each thread's own, so a copy on it
 * keeps every DMA in the caller's stream's order, whichever thread queues
 * it: while that stream waits at a gate, the device memory must not
 * change, and once it has passed, a copy back on it reads the new bytes. The
 * copy is a few slices, in fewer pieces than the ring has buffers, so that it
 * need not wait for the gate to reuse one. Rounds take turns: a kept lane,
 * no lane (the caller stages alone), a lane made for the copy (the place
 * does not last, as a context the user made on cuda). */
static void per_thread_stream(void)
{
    const size_t n = eight_slices();
    REQUIRE(n);
    SCOPED_MALLOC uint8_t *src = malloc(n);
    SCOPED_HOST uint8_t *seen = NULL;
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(n);
    REQUIRE(src && dev);
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&seen, n), "a host allocation of eight slices");
    pm_stream_t other = NULL;
    REQUIRE_RESULT(pm_stream_create(&other), PM_SUCCESS);
    const pm_stream_t own = PM_STREAM_PER_THREAD;
    /* On an H200, every round on a lane failed without either of its waits. */
    for (unsigned k = 0; k < 66; k++) {
        fill(src, n, 90 + k);
        CHECK_RESULT(pm_memcpy_htod(dev, src, n), PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS); /* landed, not just read */
        fill(src, n, 190 + k);
        atomic_store(&own_gate_open, 0);
        CHECK_RESULT(pm_stream_launch_host_func(own, wait_own_gate, NULL), PM_SUCCESS);
        atomic_store(&pm__fault_lane, k % 3 == 1);
        atomic_store(&pm__fault_places_pass, k % 3 == 2);
        CHECK_RESULT(pm_memcpy_htod_async(dev, src, n, own), PM_SUCCESS);
        atomic_store(&pm__fault_places_pass, false);
        CHECK(atomic_exchange(&pm__fault_lane, 0) == 0);
        CHECK(!atomic_load(&own_gate_open)); /* returned without waiting for the stream */
        CHECK_RESULT(pm_memcpy_dtoh_async(seen, dev, n, other), PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(other), PM_SUCCESS);
        CHECK(first_mismatch(seen, n, 90 + k) == n); /* nothing arrived past the gate */
        /* Queued behind the copy before the gate opens, so that it would run
         * beside the copy's DMAs were the stream not to wait for them. */
        CHECK_RESULT(pm_memcpy_dtoh_async(seen, dev, n, own), PM_SUCCESS);
        atomic_store(&own_gate_open, 1);
        CHECK_RESULT(pm_stream_synchronize(own), PM_SUCCESS);
        CHECK(first_mismatch(seen, n, 190 + k) == n);
    }
    CHECK_RESULT(pm_stream_destroy(other), PM_SUCCESS);
}

static void *open_own_gate_soon(void *arg)
{
    (void)arg;
    usleep(2000);
    atomic_store(&own_gate_open, 1);
    return NULL;
}

/* A copy to pageable memory on the per-thread default stream reads the
 * device memory only after the work queued there before it, whichever
 * thread queues its DMAs: here a copy into that memory held at a gate that
 * another thread opens a moment after the copy back starts. A third of the
 * rounds find no lane, and a third fail to order the stream behind the lane
 * at the end (the lane is then waited for); every other run of three makes a
 * lane for each copy (the place does not last) instead of keeping one. */
static void per_thread_stream_from_device(void)
{
    const size_t n = eight_slices();
    REQUIRE(n);
    SCOPED_MALLOC uint8_t *seen = malloc(n);
    SCOPED_HOST uint8_t *pinned = NULL;
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(n);
    REQUIRE(seen && dev);
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&pinned, n), "a host allocation of eight slices");
    const pm_stream_t own = PM_STREAM_PER_THREAD;
    for (unsigned k = 0; k < 36; k++) {
        fill(pinned, n, 10 + k);
        CHECK_RESULT(pm_memcpy_htod(dev, pinned, n), PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
        fill(pinned, n, 110 + k);
        atomic_store(&own_gate_open, 0);
        CHECK_RESULT(pm_stream_launch_host_func(own, wait_own_gate, NULL), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_htod_async(dev, pinned, n, own), PM_SUCCESS);
        pthread_t opener;
        if (pthread_create(&opener, NULL, open_own_gate_soon, NULL) != 0) {
            atomic_store(&own_gate_open, 1);
            CHECK(!"a thread to open the gate");
            break;
        }
        atomic_store(&pm__fault_lane, (int)(k % 3));
        atomic_store(&pm__fault_places_pass, k / 3 % 2 == 1);
        CHECK_RESULT(pm_memcpy_dtoh_async(seen, dev, n, own), PM_SUCCESS);
        atomic_store(&pm__fault_places_pass, false);
        CHECK(atomic_exchange(&pm__fault_lane, 0) == 0);
        pthread_join(opener, NULL);
        CHECK(first_mismatch(seen, n, 110 + k) == n);
    }
    CHECK_RESULT(pm_stream_synchronize(own), PM_SUCCESS);
}

/* The buffers of a copy on a lane made for it (a place that does not last;
 * on cuda their markers are flags) are waited for by the next copy to take
 * them: here a copy through the whole ring twice, on another stream, while
 * the first copy's DMAs wait at the gate. Had it not waited, it would
 * overwrite the bytes those DMAs have yet to move. */
static void one_off_lane_buffers_are_waited_for(void)
{
    pm_copy_config c = {.struct_size = sizeof c};
    REQUIRE_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    const size_t n = eight_slices(), big = 2 * (size_t)c.buffers * c.chunk_bytes;
    SCOPED_MALLOC uint8_t *src = malloc(n);
    SCOPED_MALLOC uint8_t *other_src = malloc(big);
    SCOPED_MALLOC uint8_t *seen = malloc(n);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(n);
    SCOPED_DEVICE pm_deviceptr other_dev = device_alloc(big);
    REQUIRE(src && other_src && seen && dev && other_dev);
    pm_stream_t other = NULL;
    REQUIRE_RESULT(pm_stream_create(&other), PM_SUCCESS);
    const pm_stream_t own = PM_STREAM_PER_THREAD;
    for (unsigned k = 0; k < 4; k++) {
        fill(src, n, 60 + k);
        fill(other_src, big, 160 + k);
        atomic_store(&own_gate_open, 0);
        CHECK_RESULT(pm_stream_launch_host_func(own, wait_own_gate, NULL), PM_SUCCESS);
        atomic_store(&pm__fault_places_pass, true);
        CHECK_RESULT(pm_memcpy_htod_async(dev, src, n, own), PM_SUCCESS);
        atomic_store(&pm__fault_places_pass, false);
        memset(src, 0, n);
        pthread_t opener;
        if (pthread_create(&opener, NULL, open_own_gate_soon, NULL) != 0) {
            atomic_store(&own_gate_open, 1);
            CHECK(!"a thread to open the gate");
            break;
        }
        CHECK_RESULT(pm_memcpy_htod_async(other_dev, other_src, big, other), PM_SUCCESS);
        pthread_join(opener, NULL);
        CHECK_RESULT(pm_stream_synchronize(own), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_dtoh(seen, dev, n), PM_SUCCESS);
        CHECK(first_mismatch(seen, n, 60 + k) == n);
    }
    CHECK_RESULT(pm_stream_synchronize(other), PM_SUCCESS);
    CHECK_RESULT(pm_stream_destroy(other), PM_SUCCESS);
}

/* The synchronous forms are ordered on the default stream, as the driver's
 * are on its legacy stream: a synchronous copy lands after, and reads after,
 * an asynchronous copy queued there before it, whichever path it takes
 * (small pageable copies go the driver's own way, whole page-locked ones
 * straight to DMA). */
static void sync_after_default_stream(void)
{
    const size_t big = 4 << 20, small = 4096;
    SCOPED_MALLOC uint8_t *pageable = malloc(small), *back = malloc(small);
    SCOPED_HOST uint8_t *pinned = NULL, *pinned_small = NULL;
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(big);
    REQUIRE(pageable && back && dev);
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&pinned, big), "a 4 MiB host allocation");
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&pinned_small, small), "a 4 KiB host allocation");
    for (unsigned k = 0; k < 8; k++) {
        uint8_t *src = k % 2 ? pinned_small : pageable;
        fill(pinned, big, 90 + k);
        fill(src, small, 100 + k);
        CHECK_RESULT(pm_memcpy_htod_async(dev, pinned, big, NULL), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_htod(dev, src, small), PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_dtoh(back, dev, small), PM_SUCCESS);
        CHECK(first_mismatch(back, small, 100 + k) == small); /* the later copy's bytes */
        /* A synchronous read waits for the asynchronous write before it (the
         * stream is idle here: pinned may be refilled). */
        fill(pinned, big, 110 + k);
        CHECK_RESULT(pm_memcpy_htod_async(dev, pinned, big, NULL), PM_SUCCESS);
        uint8_t *dst = k % 2 ? pinned_small : back;
        CHECK_RESULT(pm_memcpy_dtoh(dst, dev, small), PM_SUCCESS);
        CHECK(first_mismatch(dst, small, 110 + k) == small);
    }
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
}

static void bad_arguments(void)
{
    uint8_t buf[16];
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(16);
    REQUIRE(dev);
    CHECK_RESULT(pm_memcpy_htod(dev, NULL, 16), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_htod(0, buf, 16), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_dtoh(NULL, dev, 16), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_dtoh(buf, 0, 16), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_htod(dev, buf, 0), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_htod(dev, (void *)(UINTPTR_MAX - 8), 16), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_dtoh(buf, UINT64_MAX - 8, 16), PM_ERROR_INVALID_VALUE);
    if (on_backend("posix")) /* the driver trusts stream handles */
        CHECK_RESULT(pm_memcpy_htod_async(dev, buf, 16, (pm_stream_t)buf), PM_ERROR_INVALID_HANDLE);
    CHECK_RESULT(pm_mem_invalidate(NULL, 16), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_mem_invalidate(buf, 0), PM_SUCCESS);
    CHECK_RESULT(pm_mem_invalidate((void *)(UINTPTR_MAX - 8), 16), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_copy_get_config(NULL), PM_ERROR_INVALID_VALUE);
    pm_copy_config c = {.struct_size = 4}; /* smaller than struct_size itself */
    CHECK_RESULT(pm_copy_get_config(&c), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_copy_set_config(&c), PM_ERROR_INVALID_VALUE);
    c.struct_size = sizeof c;
    CHECK_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    CHECK(c.workers >= 1 && c.htod_workers >= 1 && c.chunk_bytes >= 4096 && c.buffers >= 1);
    c.registration_cache = 2;
    CHECK_RESULT(pm_copy_set_config(&c), PM_ERROR_INVALID_VALUE);
    c.registration_cache = 0;
    c.staging_stores = (pm_copy_stores)(PM_COPY_STORES_DEMOTING + 1);
    CHECK_RESULT(pm_copy_set_config(&c), PM_ERROR_INVALID_VALUE);
    c.staging_stores = PM_COPY_STORES_DEFAULT;
    c.slice_bytes = (size_t)2 << 30;
    CHECK_RESULT(pm_copy_set_config(&c), PM_ERROR_INVALID_VALUE);
    c.slice_bytes = 0;
    c.workers = 100000;
    CHECK_RESULT(pm_copy_set_config(&c), PM_ERROR_INVALID_VALUE);
    c.workers = 0;
    c.htod_workers = 100000;
    CHECK_RESULT(pm_copy_set_config(&c), PM_ERROR_INVALID_VALUE);
    pm_copy_stats st = {.struct_size = 4};
    CHECK_RESULT(pm_copy_get_stats(&st), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_copy_get_stats(NULL), PM_ERROR_INVALID_VALUE);
}

/* Every kind of stores gives the same bytes, at odd offsets and sizes (the
 * streaming and demoting copies have an unaligned head and a short tail), and
 * the staging counters move. */
static void store_kinds(void)
{
    const size_t cap = (5 << 20) + 200;
    /* dst runs up to 5 past src */
    SCOPED_MALLOC uint8_t *src = malloc(cap + 32), *dst = malloc(cap + 32);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(cap);
    REQUIRE(src && dst && dev);
    pm_copy_config saved = {.struct_size = sizeof saved};
    REQUIRE_RESULT(pm_copy_get_config(&saved), PM_SUCCESS);
    for (int kind = PM_COPY_STORES_CACHED; kind <= PM_COPY_STORES_DEMOTING; kind++) {
        pm_copy_config c = saved;
        c.staging_stores = (pm_copy_stores)kind;
        c.direct_max = c.dtoh_direct_max = (size_t)-1; /* everything staged */
        CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
        CHECK_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
        pm_copy_stats before = {.struct_size = sizeof before}, after = before;
        CHECK_RESULT(pm_copy_get_stats(&before), PM_SUCCESS);
        for (size_t off = 0; off < 20; off += 7)
            for (size_t n = 1; n < cap - off; n = n * 5 + 3)
                round_trip(src + off, dst + (off ^ 5), n, dev, kind != PM_COPY_STORES_CACHED,
                           NULL, (unsigned)(n + off));
        CHECK_RESULT(pm_copy_get_stats(&after), PM_SUCCESS);
        CHECK(after.staged_pieces > before.staged_pieces);
        CHECK(after.staging_copy_ns > before.staging_copy_ns);
    }
    CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
    pm_copy_config now = {.struct_size = sizeof now};
    CHECK_RESULT(pm_copy_get_config(&now), PM_SUCCESS);
    CHECK(now.staging_stores == PM_COPY_STORES_DEFAULT); /* DEFAULT is the default again */
}

/* The engine steers how many workers fill host-to-device buffers, never
 * past htod_workers, and copies stay right whatever the count. */
static void steered_fillers(void)
{
    const size_t n = 2 << 20; /* 32 small-config buffers: large enough to steer */
    SCOPED_MALLOC uint8_t *src = malloc(n), *dst = malloc(n);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(n);
    REQUIRE(src && dst && dev);
    pm_copy_config saved = {.struct_size = sizeof saved};
    REQUIRE_RESULT(pm_copy_get_config(&saved), PM_SUCCESS);
    CHECK(saved.htod_workers == 2);
    for (unsigned most = 2; most >= 1; most--) {
        pm_copy_config c = saved;
        c.htod_workers = most;
        CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
        for (int k = 0; k < 12; k++) {
            round_trip(src, dst, n, dev, k % 2, NULL, (unsigned)k);
            pm_copy_stats st = {.struct_size = sizeof st};
            CHECK_RESULT(pm_copy_get_stats(&st), PM_SUCCESS);
            CHECK(st.htod_fillers >= 1 && st.htod_fillers <= most);
        }
    }
    CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
}

/* Synchronous host-to-device copies from 64 MiB time each kind of stores in
 * turn where the CPU demotes (plain first, then demoting, as many times as
 * the trials take), and
 * the bytes arrive either way; elsewhere none demotes. A new shape of engine
 * starts learning afresh. */
static void learnt_stores(void)
{
    const size_t n = (size_t)64 << 20;
    SCOPED_MALLOC uint8_t *src = malloc(n), *dst = malloc(n);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(n);
    REQUIRE(src && dst && dev);
    pm_copy_config saved = {.struct_size = sizeof saved};
    REQUIRE_RESULT(pm_copy_get_config(&saved), PM_SUCCESS);
    CHECK(saved.staging_stores == PM_COPY_STORES_DEFAULT);
    pm_copy_config c = saved;
    c.buffers = saved.buffers + 1;
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    const bool demotes = pm__copy_cpu_demotes();
    for (unsigned k = 0; k < 2 * PM__STORE_FIRST_TRIALS; k++) {
        pm_copy_stats before = {.struct_size = sizeof before}, after = before;
        CHECK_RESULT(pm_copy_get_stats(&before), PM_SUCCESS);
        round_trip(src, dst, n, dev, false, NULL, k + 11);
        CHECK_RESULT(pm_copy_get_stats(&after), PM_SUCCESS);
        CHECK(after.staged_bytes - before.staged_bytes == 2 * n);
        /* device to host never demotes */
        CHECK(after.demoted_bytes - before.demoted_bytes == (demotes && k % 2 ? n : 0));
    }
    round_trip(src, dst, n, dev, true, NULL, 17); /* whichever kind won */
    CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
}

/* Memory pinmem maps and pins itself is registered in pieces (256 GiB on the
 * CUDA backend) and no DMA may cross from one piece to the next. With 1 MiB
 * pieces set on whichever backend runs, the DMAs of copies from and into a
 * pinned allocation and a pool allocation each stay inside one piece (a
 * wrapper around the backend's copies checks), and the bytes arrive. */
static size_t test_piece;
static uintptr_t test_piece_base, test_piece_end; /* the allocation under test */
static atomic_int crossings;
static pm_result (*real_htod_async)(pm_deviceptr, const void *, size_t, pm_stream_t, bool);
static pm_result (*real_dtoh_async)(void *, pm_deviceptr, size_t, pm_stream_t, bool);

static void check_piece(const void *host, size_t n)
{
    uintptr_t a = (uintptr_t)host;
    if (a >= test_piece_base && a < test_piece_end && /* not the staging ring's */
        (a - test_piece_base) / test_piece != (a + n - 1 - test_piece_base) / test_piece)
        atomic_fetch_add(&crossings, 1);
}

static pm_result checked_htod(pm_deviceptr d, const void *src, size_t n, pm_stream_t s, bool pinned)
{
    if (pinned)
        check_piece(src, n);
    return real_htod_async(d, src, n, s, pinned);
}

static pm_result checked_dtoh(void *dst, pm_deviceptr d, size_t n, pm_stream_t s, bool pinned)
{
    if (pinned)
        check_piece(dst, n);
    return real_dtoh_async(dst, d, n, s, pinned);
}

/* Puts the backend's copies and piece size back, however the case ends. */
static size_t saved_piece;
static void restore_backend(pm__backend **b)
{
    (*b)->copy_htod_async = real_htod_async;
    (*b)->copy_dtoh_async = real_dtoh_async;
    (*b)->registration_piece = saved_piece;
}

/* The DMAs of round trips through buffer (of n bytes, pinned), each checked
 * against the pieces of the extent it lies in. */
static void pieces_of(pm__ranges *ranges, uint8_t *buffer, size_t n, uint8_t *other,
                      pm_deviceptr dev, unsigned seed)
{
    pm__range r;
    REQUIRE(pm__ranges_find_extent(ranges, (uintptr_t)buffer, &r));
    test_piece_base = r.pin_base;
    test_piece_end = r.pin_base + r.pin_len;
    atomic_store(&crossings, 0);
    for (size_t off = 0; off < 3; off++) { /* odd starts inside the pieces */
        uint8_t *pinned = buffer + off * 4099;
        round_trip(pinned, other, n - off * 4099, dev, off == 1, NULL, (unsigned)(seed + off));
        round_trip(other, pinned, n - off * 4099, dev, off == 2, NULL, (unsigned)(seed + 9 + off));
    }
    CHECK(atomic_load(&crossings) == 0);
}

static void registration_pieces(void)
{
    pm_result ignored;
    pm__instance *inst = pm__instance_get(&ignored);
    /* A user's registration is one registration, as the user made it: it is not cut. */
    pm__range user = {.base = 4096, .size = 8u << 20, .pin_base = 4096, .pin_len = 8u << 20,
                      .kind = PM__RANGE_REGISTERED};
    uintptr_t lo = 0, hi = 0;
    CHECK(pm__copy_pinned_piece(&user, 1 << 20, 4096 + 10, &lo, &hi));
    CHECK(lo == 4096 && hi == 4096 + (8u << 20));
    pm__range own = user;
    own.kind = PM__RANGE_POOL;
    CHECK(pm__copy_pinned_piece(&own, 1 << 20, 4096 + (1u << 20) + 10, &lo, &hi));
    CHECK(lo == 4096 + (1u << 20) && hi == 4096 + (2u << 20));
    CHECK(pm__copy_pinned_piece(&own, 1 << 20, 4096 + (8u << 20) - 1, &lo, &hi));
    CHECK(lo == 4096 + (7u << 20) && hi == 4096 + (8u << 20));
    CHECK(pm__copy_pinned_piece(&own, 0, 4096 + 10, &lo, &hi));
    CHECK(lo == 4096 && hi == 4096 + (8u << 20));
    CHECK(!pm__copy_pinned_piece(&own, 1 << 20, 4096 + (8u << 20), &lo, &hi));
    /* 1.5 MiB: two pieces of 1 MiB, within an ordinary user's RLIMIT_MEMLOCK */
    const size_t n = (3 << 19) + 123;
    SCOPED_MALLOC uint8_t *other = malloc(n);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(n);
    REQUIRE(other && dev);
    __attribute__((cleanup(restore_backend))) pm__backend *b = &inst->backend;
    saved_piece = b->registration_piece;
    real_htod_async = b->copy_htod_async;
    real_dtoh_async = b->copy_dtoh_async;
    b->copy_htod_async = checked_htod;
    b->copy_dtoh_async = checked_dtoh;
    test_piece = 1 << 20;
    b->registration_piece = test_piece;
    {
        SCOPED_HOST uint8_t *host = NULL;
        REQUIRE_PINNED(pm_mem_host_alloc((void **)&host, n, 0), "a 1.5 MiB host allocation");
        pieces_of(inst->ranges, host, n, other, dev, 1);
    }
    pm_mem_pool_t pool = NULL;
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    REQUIRE_RESULT(pm_mem_pool_create(&pool, &props), PM_SUCCESS);
    uint8_t *pooled = NULL;
    pm_result r = pm_mem_alloc_from_pool((void **)&pooled, n, pool);
    if (r == PM_SUCCESS) {
        pieces_of(inst->ranges, pooled, n, other, dev, 21);
        CHECK_RESULT(pm_mem_free(pooled), PM_SUCCESS);
    }
    CHECK_RESULT(pm_mem_pool_destroy(pool), PM_SUCCESS);
    REQUIRE_PINNED(r, "1.5 MiB of a pool's memory");
}

/* Past the budget, pinning fails with a detail and staged copies go on. */
static void budget(void)
{
    const size_t n = 3 << 20;
    SCOPED_MALLOC uint8_t *src = malloc(n), *dst = malloc(n);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(n);
    REQUIRE(src && dst && dev);
    round_trip(src, dst, n, dev, false, NULL, 8); /* the ring is pinned */
    pm_copy_config c = {.struct_size = sizeof c};
    REQUIRE_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    pm_copy_stats st = {.struct_size = sizeof st};
    REQUIRE_RESULT(pm_copy_get_stats(&st), PM_SUCCESS);
    c.pinned_budget = st.pinned_bytes + (1 << 20);
    REQUIRE_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    void *p = NULL;
    CHECK_RESULT(pm_mem_alloc_host(&p, 4 << 20), PM_ERROR_OUT_OF_MEMORY);
    CHECK(strstr(pm_last_error_detail(), "budget") != NULL);
    CHECK_RESULT(pm_mem_host_register(src, n, 0), PM_ERROR_OUT_OF_MEMORY);
    round_trip(src, dst, n, dev, false, NULL, 9); /* the ring was pinned before the cap */
    CHECK_RESULT(pm_mem_alloc_host(&p, 4096), PM_SUCCESS);
    CHECK_RESULT(pm_mem_free_host(p), PM_SUCCESS);
    c.pinned_budget = 0;
    REQUIRE_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    SCOPED_HOST void *big = NULL;
    REQUIRE_PINNED(pm_mem_alloc_host(&big, 4 << 20), "a 4 MiB host allocation");
}

/* pm_copy_set_config waits for the copies in flight, not for every copy
 * that starts while it waits: four threads that copy without a pause, so
 * that one of them always holds the gate, once kept it out until they
 * stopped. */
static atomic_bool config_changed;

static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *copy_until_changed(void *arg)
{
    const size_t n = 1 << 20;
    double *give_up = arg;
    SCOPED_MALLOC uint8_t *src = malloc(n);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(n);
    REQUIRE_OR(src && dev, NULL);
    fill(src, n, 5);
    while (!atomic_load(&config_changed) && seconds_now() < *give_up)
        CHECK_RESULT(pm_memcpy_dtoh(src, dev, n), PM_SUCCESS);
    return NULL;
}

static void config_amid_copies(void)
{
    pm_copy_config c = {.struct_size = sizeof c};
    REQUIRE_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    double give_up = seconds_now() + 10;
    atomic_store(&config_changed, false);
    pthread_t t[4];
    double args[4] = {give_up, give_up, give_up, give_up};
    unsigned started = start_threads(t, 4, copy_until_changed, args, sizeof args[0]);
    CHECK(started == 4);
    usleep(100000); /* the copies are under way */
    c.spin_us = c.spin_us == UINT_MAX ? 100 : UINT_MAX;
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    const double changed_at = seconds_now();
    atomic_store(&config_changed, true);
    join_threads(t, started);
    if (changed_at >= give_up - 1)
        fprintf(stderr, "pm_copy_set_config waited until the copies stopped\n");
    CHECK(changed_at < give_up - 1);
    c.spin_us = c.spin_us == UINT_MAX ? 100 : UINT_MAX;
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
}

/* The statistics, which count the engine's threads without holding the
 * copy gate, read beside new shapes of engine (pm_copy_set_config stops it,
 * the next copy starts it): each read counts no threads, the old shape's or
 * the new one's. The stop once zeroed the count outside the engine's lock,
 * a data race ThreadSanitizer reports. */
static atomic_bool shapes_done;

static void *read_stats_until_done(void *arg)
{
    const unsigned *counts = arg;
    while (!atomic_load(&shapes_done)) {
        const unsigned n = staging_threads_now();
        CHECK(n == 0 || n == counts[0] || n == counts[1]);
    }
    return NULL;
}

static void stats_amid_new_shapes(void)
{
    pm_copy_config saved = {.struct_size = sizeof saved};
    REQUIRE_RESULT(pm_copy_get_config(&saved), PM_SUCCESS);
    const size_t n = 256 << 10;
    SCOPED_MALLOC uint8_t *src = malloc(n);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(n);
    REQUIRE(src && dev);
    fill(src, n, 41);
    unsigned counts[2] = {saved.workers, saved.workers > 1 ? saved.workers - 1 : 2};
    atomic_store(&shapes_done, false);
    pthread_t reader;
    REQUIRE(start_threads(&reader, 1, read_stats_until_done, counts, sizeof counts) == 1);
    pm_copy_config c = saved;
    for (unsigned i = 0; i < 40; i++) {
        CHECK_RESULT(pm_memcpy_htod(dev, src, n), PM_SUCCESS); /* starts the engine */
        c.workers = counts[(i + 1) % 2];
        CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    }
    atomic_store(&shapes_done, true);
    join_threads(&reader, 1);
    CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
}

int main(void)
{
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    small_copy_config(0);
    bad_arguments();
    random_sizes();
    boundaries();
    across_pool_blocks();
    direct_by_direction();
    eight_threads();
    eight_threads_on_their_own_streams();
    small_rings();
    both_ways();
    two_engines();
    piece_plans();
    piece_settings();
    steered_fillers();
    registration_pieces();
    ordering();
    per_thread_stream();
    per_thread_stream_from_device();
    one_off_lane_buffers_are_waited_for();
    sync_after_default_stream();
    store_kinds();
    learnt_stores();
    budget();
    config_amid_copies();
    stats_amid_new_shapes();
    return check_finish("test_copy");
}
