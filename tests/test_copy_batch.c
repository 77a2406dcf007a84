/* pm_memcpy_batch_async: random batches (1 to 5,000 elements of 1 byte to 4
 * MiB, any alignment) between pageable, pinned, pool, registered and device
 * memory in every direction, checked byte for byte, with each way of moving
 * them; bad elements, each refused with its index before anything moves;
 * eight threads batching at once; order against other work on the stream;
 * a backend copy or the staging ring's pinning failing at every step. Every
 * case holds within an ordinary user's 8 MiB RLIMIT_MEMLOCK, or says it is
 * skipped where it cannot. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "copy/copy.h"
#include "copy/staging_engine.h"
#include "errors.h"
#include "copy_util.h"
#include "threads.h"
#include "test_hooks.h"

static uint64_t rng_state = 7;
static size_t rnd(size_t n)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (size_t)(rng_state >> 33) % n;
}

/* A size from 1 to max, about as many of each power of two. */
static size_t log_uniform(size_t max, uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    unsigned bits = 0;
    while (((size_t)1 << bits) < max)
        bits++;
    unsigned b = (unsigned)((*state >> 33) % (bits + 1));
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    size_t lo = b ? (size_t)1 << (b - 1) : 1, span = b ? lo : 1;
    size_t n = lo + (size_t)(*state >> 33) % span;
    return n < 1 ? 1 : n > max ? max : n;
}

static pm_copy_stats stats(void)
{
    pm_copy_stats s = {.struct_size = sizeof s};
    CHECK_RESULT(pm_copy_get_stats(&s), PM_SUCCESS);
    return s;
}

static void set_batch(pm_copy_batch batch, pm_copy_ring ring, size_t first_piece, unsigned pieces,
                      unsigned spin_us)
{
    pm_copy_config c = {.struct_size = sizeof c};
    CHECK_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    c.batch = batch;
    c.ring = ring;
    c.first_piece_bytes = first_piece;
    c.pieces = pieces;
    c.spin_us = spin_us;
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
}

/* The memory a batch copies between: each arena's first half is read, its
 * second half written, so that no copy of a batch depends on another. */
enum { PAGEABLE, PINNED, POOL, REGISTERED, DEVICE, KINDS };
static const char *const kind_names[KINDS] = {"pageable", "pinned", "pool", "registered",
                                              "device"};

typedef struct arenas {
    uint8_t *host[KINDS]; /* DEVICE: NULL */
    pm_deviceptr dev;
    size_t size[KINDS];
    void *registered_block; /* malloc'd, of which host[REGISTERED] is the page-aligned part */
    pm_mem_pool_t pool;
    bool registered;
} arenas;

static void arenas_close(arenas *a)
{
    if (a->registered)
        pm_mem_host_unregister(a->host[REGISTERED]);
    free(a->registered_block);
    free(a->host[PAGEABLE]);
    if (a->host[PINNED])
        pm_mem_free_host(a->host[PINNED]);
    if (a->host[POOL])
        pm_mem_free(a->host[POOL]);
    if (a->pool)
        pm_mem_pool_destroy(a->pool);
    device_free(a->dev);
    *a = (arenas){0};
}

/* The address of offset off in arena k. */
static pm_deviceptr at(const arenas *a, int k, size_t off)
{
    return k == DEVICE ? a->dev + off : (pm_deviceptr)(uintptr_t)(a->host[k] + off);
}

/* Whether the arenas were made: false, the case skipped or failed (said). */
static bool arenas_open(arenas *a, size_t pageable, size_t pinned, size_t device)
{
    *a = (arenas){0};
    a->size[PAGEABLE] = pageable;
    a->size[PINNED] = a->size[POOL] = a->size[REGISTERED] = pinned;
    a->size[DEVICE] = device;
    a->host[PAGEABLE] = malloc(pageable);
    a->dev = device_alloc(device);
    if (!a->host[PAGEABLE] || !a->dev)
        return false;
    pm_result r = pm_mem_alloc_host((void **)&a->host[PINNED], pinned);
    if (r == PM_SUCCESS) {
        pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
        r = pm_mem_pool_create(&a->pool, &props);
    }
    if (r == PM_SUCCESS)
        r = pm_mem_alloc_from_pool((void **)&a->host[POOL], pinned, a->pool);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    a->registered_block = malloc(pinned + page);
    if (r == PM_SUCCESS && a->registered_block) {
        a->host[REGISTERED] =
            (uint8_t *)(((uintptr_t)a->registered_block + page - 1) & ~(uintptr_t)(page - 1));
        r = pm_mem_host_register(a->host[REGISTERED], pinned, 0);
        a->registered = r == PM_SUCCESS;
    }
    if (r == PM_ERROR_OUT_OF_MEMORY && memlock_binds()) {
        printf("skipped: pinning the test's memory needs more than RLIMIT_MEMLOCK leaves (%s)\n",
               pm_last_error_detail());
        return false;
    }
    CHECK_RESULT(r, PM_SUCCESS);
    return r == PM_SUCCESS && a->registered_block;
}

/* Fills every arena's first half with its pattern (seed + kind). */
static void fill_sources(const arenas *a, unsigned seed, uint8_t *scratch)
{
    for (int k = 0; k < KINDS; k++) {
        size_t half = a->size[k] / 2;
        if (k != DEVICE) {
            fill(a->host[k], half, seed + (unsigned)k);
        } else {
            fill(scratch, half, seed + (unsigned)k);
            CHECK_RESULT(pm_memcpy_htod(a->dev, scratch, half), PM_SUCCESS);
        }
    }
}

/* One element: from arena src_kind at src_off, to dst_kind at dst_off. */
typedef struct element {
    int src_kind, dst_kind;
    size_t src_off, dst_off, bytes;
} element;

typedef struct batch {
    element *e;
    pm_deviceptr *dsts, *srcs;
    size_t *sizes;
    size_t count;
} batch;

static void batch_free(batch *b)
{
    free(b->e);
    free(b->dsts);
    free(b->srcs);
    free(b->sizes);
    *b = (batch){0};
}

/* A random batch of about count elements: sizes log-uniform up to max, at
 * any alignment, with gaps; an element that does not fit its arenas' halves
 * any more is left out. kinds: a bit mask of the kinds it may use. */
static bool make_batch(batch *b, const arenas *a, size_t count, size_t max, unsigned kinds,
                       uint64_t *state)
{
    *b = (batch){.e = calloc(count, sizeof *b->e), .dsts = calloc(count, sizeof *b->dsts),
                 .srcs = calloc(count, sizeof *b->srcs), .sizes = calloc(count, sizeof *b->sizes)};
    if (!b->e || !b->dsts || !b->srcs || !b->sizes)
        return false;
    size_t used_src[KINDS] = {0}, used_dst[KINDS] = {0};
    int allowed[KINDS], n_allowed = 0;
    for (int k = 0; k < KINDS; k++)
        if (kinds & (1u << k))
            allowed[n_allowed++] = k;
    for (size_t i = 0; i < 2 * count && b->count < count; i++) {
        element e = {.src_kind = allowed[rnd((size_t)n_allowed)],
                     .dst_kind = allowed[rnd((size_t)n_allowed)]};
        e.bytes = log_uniform(max, state);
        size_t skew = rnd(64), gap = rnd(4) == 0 ? rnd(8192) : 0, half_s, half_d;
        for (int attempt = 0; attempt < 2; attempt++) {
            if (attempt) { /* the small pinned arenas are full: the large ones */
                e.src_kind = e.src_kind == DEVICE ? DEVICE : PAGEABLE;
                e.dst_kind = e.dst_kind == DEVICE ? DEVICE : PAGEABLE;
            }
            half_s = a->size[e.src_kind] / 2;
            half_d = a->size[e.dst_kind] / 2;
            e.src_off = used_src[e.src_kind] + skew + gap;
            e.dst_off = half_d + used_dst[e.dst_kind] + rnd(64) + gap;
            if (e.src_off + e.bytes <= half_s && e.dst_off + e.bytes <= 2 * half_d)
                break;
        }
        if (e.src_off + e.bytes > half_s || e.dst_off + e.bytes > 2 * half_d)
            continue; /* it does not fit: another may */
        used_src[e.src_kind] = e.src_off + e.bytes;
        used_dst[e.dst_kind] = e.dst_off + e.bytes - half_d;
        b->e[b->count] = e;
        b->srcs[b->count] = at(a, e.src_kind, e.src_off);
        b->dsts[b->count] = at(a, e.dst_kind, e.dst_off);
        b->sizes[b->count++] = e.bytes;
    }
    return b->count > 0;
}

/* Every element's destination holds its source's pattern (the device
 * arena's second half read back into scratch). */
static size_t check_batch(const batch *b, const arenas *a, unsigned seed, uint8_t *scratch)
{
    size_t half = a->size[DEVICE] / 2, wrong = 0;
    CHECK_RESULT(pm_memcpy_dtoh(scratch, a->dev + half, half), PM_SUCCESS);
    for (size_t i = 0; i < b->count; i++) {
        const element *e = &b->e[i];
        const uint8_t *got = e->dst_kind == DEVICE ? scratch + (e->dst_off - half)
                                                   : a->host[e->dst_kind] + e->dst_off;
        for (size_t k = 0; k < e->bytes; k++)
            if (got[k] != pattern_byte(e->src_off + k, seed + (unsigned)e->src_kind)) {
                if (wrong++ < 3)
                    fprintf(stderr,
                            "element %zu of %zu (%s -> %s, %zu bytes): byte %zu is wrong\n", i,
                            b->count, kind_names[e->src_kind], kind_names[e->dst_kind], e->bytes,
                            k);
                break;
            }
    }
    return wrong;
}

/* Random batches with each way of moving them: counts from 1 to 5,000,
 * elements from 1 byte to 4 MiB. Pageable sources are overwritten as soon
 * as the call returns, as a caller may. */
static void random_batches(void)
{
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    arenas a;
    bool opened = arenas_open(&a, 24 << 20, 1 << 20, 24 << 20);
    SCOPED_MALLOC uint8_t *scratch = malloc(24 << 20);
    if (!opened || !scratch) {
        arenas_close(&a);
        CHECK(scratch != NULL);
        return;
    }
    static const pm_copy_batch ways[] = {PM_COPY_BATCH_GATHER, PM_COPY_BATCH_EACH,
                                         PM_COPY_BATCH_DRIVER, PM_COPY_BATCH_KERNEL};
    uint64_t state = 99;
    unsigned long long batches_before = stats().batch_calls;
    unsigned long long launches_before = stats().kernel_launches;
    unsigned rounds = 0;
    for (unsigned round = 0; round < 32; round++) {
        pm_copy_batch way = ways[round % 4];
        /* split and shared rings, small and large first pieces, spinning or not */
        set_batch(way, round % 2 ? PM_COPY_RING_SHARED : PM_COPY_RING_SPLIT,
                  round % 4 < 2 ? 4096 : 0, round % 5 + 1, round % 3 == 1 ? 50 : 0);
        size_t count = round % 8 == 3 ? 5000 : log_uniform(5000, &state);
        size_t max = round % 6 == 5 ? (4 << 20) : (size_t)(48 << 20) / (count + 8);
        max = max < 1 ? 1 : max > (4 << 20) ? (4 << 20) : max;
        unsigned seed = 1000 + round * 10;
        fill_sources(&a, seed, scratch);
        batch b;
        if (!make_batch(&b, &a, count, max, (1u << KINDS) - 1, &state)) {
            batch_free(&b);
            continue;
        }
        pm_result r = pm_memcpy_batch_async(b.dsts, b.srcs, b.sizes, b.count, s);
        CHECK_RESULT(r, PM_SUCCESS);
        fill(a.host[PAGEABLE], a.size[PAGEABLE] / 2, seed + 5); /* reused at once */
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
        fill(a.host[PAGEABLE], a.size[PAGEABLE] / 2, seed + PAGEABLE);
        if (r == PM_SUCCESS) {
            size_t wrong = check_batch(&b, &a, seed, scratch);
            if (wrong)
                fprintf(stderr, "round %u (batch way %d, %zu elements up to %zu bytes): %zu wrong\n",
                        round, (int)way, b.count, max, wrong);
            CHECK(wrong == 0);
            rounds++;
        }
        batch_free(&b);
    }
    CHECK(stats().batch_calls - batches_before == rounds);
    CHECK(stats().kernel_launches > launches_before);
    set_batch(PM_COPY_BATCH_DEFAULT, PM_COPY_RING_DEFAULT, 0, 0, 0);
    arenas_close(&a);
}

/* The kernel mode: small page-locked blocks move by launches, not DMAs, and
 * small pageable ones too where PINMEM_COPY_KERNEL_STAGED=1 asks (whole
 * buffers of them), both ways, byte for byte; with GATHER, or on a
 * capturing stream, no launch at all. */
static void kernel_mode(void)
{
    enum { N = 64, BYTES = 3001 };
    SCOPED_MALLOC uint8_t *src = malloc(N * BYTES), *back = malloc(N * BYTES);
    SCOPED_HOST uint8_t *pinned = NULL;
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(2 * N * BYTES);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(src && back && dev);
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&pinned, 2 * N * BYTES), "a 384 KB host allocation");
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    pm_deviceptr d[N], h[N];
    size_t n[N];
    /* The capturing stream is the posix backend's test hook. */
    const int ways = on_backend("posix") ? 3 : 2;
    for (int way = 0; way < ways; way++) {
        const bool kernel = way != 1, capture = way == 2;
        set_batch(kernel ? PM_COPY_BATCH_KERNEL : PM_COPY_BATCH_GATHER, PM_COPY_RING_DEFAULT, 0,
                  0, 0);
        fill(src, N * BYTES, 40 + way);
        fill(pinned, N * BYTES, 50 + way);
        memset(back, 0, N * BYTES);
        memset(pinned + N * BYTES, 0, N * BYTES);
        pm_copy_stats before = stats();
        /* odd elements page-locked (an address off by one byte from the
         * next), even ones pageable; the device side scattered */
        for (int i = 0; i < N; i++) {
            h[i] = (pm_deviceptr)(uintptr_t)(i % 2 ? pinned + i * BYTES : src + i * BYTES);
            d[i] = dev + (pm_deviceptr)((i * 37) % N) * 2 * BYTES + (pm_deviceptr)(i % 3);
            n[i] = BYTES - (size_t)(i % 5);
        }
        if (capture) { /* page-locked blocks only, as a capture takes */
            for (int i = 0; i < N; i++)
                h[i] = (pm_deviceptr)(uintptr_t)(pinned + i * BYTES);
            atomic_store(&pm__fault_capturing_stream, s);
        }
        CHECK_RESULT(pm_memcpy_batch_async(d, h, n, N, s), PM_SUCCESS);
        pm_deviceptr from[N];
        for (int i = 0; i < N; i++) {
            from[i] = d[i];
            uint8_t *to = i % 2 || capture ? pinned + N * BYTES + i * BYTES : back + i * BYTES;
            h[i] = (pm_deviceptr)(uintptr_t)to;
        }
        CHECK_RESULT(pm_memcpy_batch_async(h, from, n, N, s), PM_SUCCESS);
        atomic_store(&pm__fault_capturing_stream, NULL);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
        size_t wrong = 0;
        for (int i = 0; i < N; i++) {
            const uint8_t *want = capture || i % 2 ? pinned + i * BYTES : src + i * BYTES;
            wrong += memcmp((const uint8_t *)(uintptr_t)h[i], want, n[i]) != 0;
        }
        CHECK(wrong == 0);
        pm_copy_stats after = stats();
        unsigned long long launches = after.kernel_launches - before.kernel_launches;
        if (kernel && !capture) {
            /* the page-locked blocks each way, and the buffers of gathered
             * blocks where staged launches are on */
            const char *staged = getenv("PINMEM_COPY_KERNEL_STAGED");
            CHECK(launches >= (staged && strcmp(staged, "1") == 0 ? 4u : 2u));
            CHECK(after.kernel_bytes - before.kernel_bytes > N * (BYTES - 4));
        } else {
            CHECK(launches == 0);
        }
    }
    set_batch(PM_COPY_BATCH_DEFAULT, PM_COPY_RING_DEFAULT, 0, 0, 0);
}

/* One device allocation per element, and batches to and from them: the
 * device ranges the backend reports are each asked once. */
static void many_allocations(void)
{
    enum { N = 40, BYTES = 3000 };
    pm_deviceptr dev[N] = {0};
    SCOPED_MALLOC uint8_t *src = malloc(N * BYTES), *dst = malloc(N * BYTES);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(src && dst);
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    pm_deviceptr d1[N], s1[N], d2[N], s2[N];
    size_t n[N];
    bool ok = true;
    for (int i = 0; i < N && ok; i++) {
        ok = pm_device_alloc(&dev[i], BYTES) == PM_SUCCESS;
        d1[i] = dev[i];
        s1[i] = (pm_deviceptr)(uintptr_t)(src + i * BYTES);
        d2[i] = (pm_deviceptr)(uintptr_t)(dst + (N - 1 - i) * BYTES);
        s2[i] = dev[i];
        n[i] = BYTES;
    }
    CHECK(ok);
    if (ok) {
        fill(src, N * BYTES, 17);
        memset(dst, 0, N * BYTES);
        CHECK_RESULT(pm_memcpy_batch_async(d1, s1, n, N, s), PM_SUCCESS);
        CHECK_RESULT(pm_memcpy_batch_async(d2, s2, n, N, s), PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
        for (int i = 0; i < N; i++)
            CHECK(memcmp(dst + (N - 1 - i) * BYTES, src + i * BYTES, BYTES) == 0);
    }
    for (int i = 0; i < N; i++)
        device_free(dev[i]);
}

/* Pinned memory is registered in pieces and no copy may cross from one to
 * the next (test_copy.c's registration_pieces). With 64 KiB pieces, a batch
 * whose blocks lie in one piece, then straddle two, then lie in another,
 * then in the first again (each block after the first starting where what
 * the call knows of the last block does not reach) hands the kernel no
 * block that crosses a piece, and the bytes arrive, both ways. */
enum { PIECE = 64 << 10 };
static uintptr_t piece_base;
static atomic_int piece_crossings;
static pm_result (*real_block_copy)(const pm__block_copy *, size_t, unsigned long long,
                                    pm_stream_t);

static void check_host_side(pm_deviceptr p, unsigned long long n)
{
    const uintptr_t a = (uintptr_t)p;
    if (a >= piece_base && a < piece_base + 4 * PIECE &&
        (a - piece_base) / PIECE != (a + n - 1 - piece_base) / PIECE)
        atomic_fetch_add(&piece_crossings, 1);
}

static pm_result checked_block_copy(const pm__block_copy *blocks, size_t count,
                                    unsigned long long largest, pm_stream_t s)
{
    for (size_t i = 0; i < count; i++) {
        check_host_side(blocks[i].dst, blocks[i].bytes);
        check_host_side(blocks[i].src, blocks[i].bytes);
    }
    return real_block_copy(blocks, count, largest, s);
}

static size_t saved_piece;
static void restore_backend(pm__backend **b)
{
    (*b)->block_copy_async = real_block_copy;
    (*b)->registration_piece = saved_piece;
}

static void registration_pieces(void)
{
    enum { N = 4, BYTES = 5000 };
    pm_result ignored;
    pm__instance *inst = pm__instance_get(&ignored);
    __attribute__((cleanup(restore_backend))) pm__backend *b = &inst->backend;
    saved_piece = b->registration_piece;
    real_block_copy = b->block_copy_async;
    b->registration_piece = PIECE;
    b->block_copy_async = checked_block_copy;
    SCOPED_HOST uint8_t *pinned = NULL;
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(2 * N * BYTES);
    SCOPED_MALLOC uint8_t *back = malloc(4 * PIECE);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(dev && back);
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&pinned, 4 * PIECE), "a 256 KiB host allocation");
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    piece_base = (uintptr_t)pinned;
    atomic_store(&piece_crossings, 0);
    const size_t offsets[N] = {100, PIECE - BYTES / 2, 2 * PIECE + 7, 3 * BYTES};
    pm_deviceptr h[N], d[N];
    size_t n[N];
    for (int i = 0; i < N; i++) {
        h[i] = (pm_deviceptr)(uintptr_t)(pinned + offsets[i]);
        d[i] = dev + (pm_deviceptr)(N - 1 - i) * 2 * BYTES;
        n[i] = BYTES;
    }
    fill(pinned, 4 * PIECE, 61);
    memcpy(back, pinned, 4 * PIECE);
    const pm_copy_stats before = stats();
    CHECK_RESULT(pm_memcpy_batch_async(d, h, n, N, s), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    memset(pinned, 0, 4 * PIECE);
    CHECK_RESULT(pm_memcpy_batch_async(h, d, n, N, s), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    for (int i = 0; i < N; i++)
        CHECK(memcmp(pinned + offsets[i], back + offsets[i], BYTES) == 0);
    CHECK(stats().direct_bytes - before.direct_bytes == 2 * N * BYTES);
    CHECK(atomic_load(&piece_crossings) == 0);
}

/* A bad element fails the whole call with its index in the detail, and
 * nothing moves: the good elements before it leave their destinations as
 * they were. */
static void expect_refused(pm_deviceptr *dsts, pm_deviceptr *srcs, size_t *sizes, size_t count,
                           pm_stream_t s, pm_result want, const char *index_text,
                           const uint8_t *watch, size_t watch_bytes, unsigned watch_seed)
{
    pm_result r = pm_memcpy_batch_async(dsts, srcs, sizes, count, s);
    CHECK_RESULT(r, want);
    if (index_text && !strstr(pm_last_error_detail(), index_text)) {
        fprintf(stderr, "the detail does not name %s: %s\n", index_text, pm_last_error_detail());
        CHECK(false);
    }
    if (want != PM_ERROR_INVALID_HANDLE)
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    if (watch)
        CHECK(first_mismatch(watch, watch_bytes, watch_seed) == watch_bytes);
}

static void bad_elements(void)
{
    enum { N = 6, BYTES = 40000 };
    SCOPED_MALLOC uint8_t *host = malloc(2 * N * BYTES);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(2 * N * BYTES);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(host && dev);
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    /* elements 0..N-1: host [i] -> device [i], all good; destinations watched
     * through a copy to the second half of the host buffer first */
    pm_deviceptr dsts[N], srcs[N];
    size_t sizes[N];
    uint8_t *watch = host + N * BYTES;
    fill(host, N * BYTES, 3);
    fill(watch, N * BYTES, 4);
    CHECK_RESULT(pm_memcpy_htod(dev, watch, N * BYTES), PM_SUCCESS); /* the device holds 4 */
    uint8_t *back = malloc(N * BYTES);
    REQUIRE(back);
#define RESET()                                                                              \
    for (int i = 0; i < N; i++) {                                                            \
        dsts[i] = dev + (pm_deviceptr)i * BYTES;                                             \
        srcs[i] = (pm_deviceptr)(uintptr_t)(host + i * BYTES);                               \
        sizes[i] = BYTES;                                                                    \
    }
#define REFUSED(want, text)                                                                  \
    do {                                                                                     \
        expect_refused(dsts, srcs, sizes, N, s, want, text, NULL, 0, 0);                     \
        CHECK_RESULT(pm_memcpy_dtoh(back, dev, N * BYTES), PM_SUCCESS);                      \
        CHECK(first_mismatch(back, N * BYTES, 4) == N * BYTES); /* nothing moved */          \
    } while (0)
    RESET();
    dsts[3] = 0;
    REFUSED(PM_ERROR_INVALID_VALUE, "element 3");
    CHECK(strstr(pm_last_error_detail(), "destination pointer is NULL") != NULL);
    RESET();
    srcs[5] = 0;
    REFUSED(PM_ERROR_INVALID_VALUE, "element 5");
    RESET();
    sizes[2] = SIZE_MAX - 10; /* wraps */
    REFUSED(PM_ERROR_INVALID_VALUE, "element 2");
    RESET();
    srcs[4] = dev + 4 * BYTES + 100; /* its own destination */
    REFUSED(PM_ERROR_INVALID_VALUE, "element 4");
    RESET();
    dsts[4] = dsts[1] + 5; /* two destinations overlap */
    REFUSED(PM_ERROR_INVALID_VALUE, "element 4");
    CHECK(strstr(pm_last_error_detail(), "element 1") != NULL);
    RESET();
    srcs[5] = dsts[2] + BYTES - 1; /* a source another element writes */
    REFUSED(PM_ERROR_INVALID_VALUE, "element 5");
    CHECK(strstr(pm_last_error_detail(), "element 2") != NULL);
    RESET();
    dsts[5] = srcs[2] + 10; /* into host memory another element reads */
    srcs[5] = dev + 5 * BYTES;
    REFUSED(PM_ERROR_INVALID_VALUE, "element 5");
    CHECK(strstr(pm_last_error_detail(), "element 2") != NULL);
    CHECK(first_mismatch(host, N * BYTES, 3) == N * BYTES);
    RESET();
    srcs[1] = srcs[3]; /* two elements reading one source: fine */
    sizes[0] = 0; /* and one of 0 bytes */
    dsts[0] = 0;
    CHECK_RESULT(pm_memcpy_batch_async(dsts, srcs, sizes, N, s), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_dtoh(back, dev, N * BYTES), PM_SUCCESS);
    CHECK(first_mismatch(back, BYTES, 4) == BYTES); /* element 0 copied nothing */
    CHECK(memcmp(back + BYTES, host + 3 * BYTES, BYTES) == 0);
    CHECK(memcmp(back + 2 * BYTES, host + 2 * BYTES, BYTES) == 0);
    CHECK_RESULT(pm_memcpy_htod(dev, watch, N * BYTES), PM_SUCCESS); /* 4 again */
    if (strcmp(pm_backend_name(), "posix") == 0) {
        RESET();
        dsts[5] = dev + 2 * N * BYTES - 100; /* runs past the device allocation's end */
        REFUSED(PM_ERROR_INVALID_VALUE, "element 5");
        RESET();
        expect_refused(dsts, srcs, sizes, N, (pm_stream_t)(uintptr_t)0x1234, PM_ERROR_INVALID_HANDLE,
                       NULL, NULL, 0, 0);
        /* a stream that captures takes page-locked host memory only */
        RESET();
        atomic_store(&pm__fault_capturing_stream, s);
        pm_result r = pm_memcpy_batch_async(dsts, srcs, sizes, N, s);
        atomic_store(&pm__fault_capturing_stream, NULL);
        CHECK_RESULT(r, PM_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        CHECK(strstr(pm_last_error_detail(), "element 0") != NULL);
        CHECK(strstr(pm_last_error_detail() + 1, "pm_memcpy_batch_async") == NULL); /* once */
        CHECK_RESULT(pm_memcpy_dtoh(back, dev, N * BYTES), PM_SUCCESS);
        CHECK(first_mismatch(back, N * BYTES, 4) == N * BYTES);
    }
    RESET();
    CHECK_RESULT(pm_memcpy_batch_async(dsts, srcs, sizes, 0, s), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "count") != NULL);
    CHECK_RESULT(pm_memcpy_batch_async(NULL, srcs, sizes, N, s), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_batch_async(dsts, NULL, sizes, N, s), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_memcpy_batch_async(dsts, srcs, NULL, N, s), PM_ERROR_INVALID_VALUE);
    CHECK(strstr(pm_last_error_detail(), "sizes") != NULL);
    CHECK_RESULT(pm_memcpy_dtoh(back, dev, N * BYTES), PM_SUCCESS);
    CHECK(first_mismatch(back, N * BYTES, 4) == N * BYTES);
    free(back);
#undef RESET
#undef REFUSED
}

/* Eight threads, each its own stream, batching pageable blocks both ways at
 * once. */
typedef struct batcher {
    unsigned seed;
    int failures;
} batcher;

/* Whether [a, a + an) and [b, b + bn) share a byte. */
static bool ranges_meet(pm_deviceptr a, size_t an, pm_deviceptr b, size_t bn)
{
    return a < b + bn && b < a + an;
}

/* Random batches among two device allocations and two host buffers, some
 * with overlapping ranges: refused exactly when some element writes what
 * another writes or reads (checked pair by pair), naming one of them. */
static void overlaps_random(void)
{
    enum { AREA = 1 << 20, MAX = 64, TRIALS = 300 };
    SCOPED_MALLOC uint8_t *host_a = malloc(AREA), *host_b = malloc(AREA);
    SCOPED_DEVICE pm_deviceptr dev_a = device_alloc(AREA);
    SCOPED_DEVICE pm_deviceptr dev_b = device_alloc(AREA);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(host_a && host_b && dev_a && dev_b);
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    memset(host_a, 1, AREA);
    memset(host_b, 2, AREA);
    const pm_deviceptr hosts[2] = {(pm_deviceptr)(uintptr_t)host_a, (pm_deviceptr)(uintptr_t)host_b};
    const pm_deviceptr devs[2] = {dev_a, dev_b};
    pm_deviceptr dsts[MAX], srcs[MAX];
    size_t sizes[MAX];
    unsigned refused = 0;
    const int failed_before = check_failures;
    for (unsigned t = 0; t < TRIALS && check_failures == failed_before; t++) {
        const size_t n = 2 + rnd(MAX - 1);
        /* the denser the elements, the likelier an overlap */
        const size_t most = AREA / (n << (1 + 2 * rnd(4)));
        for (size_t i = 0; i < n; i++) {
            sizes[i] = 1 + rnd(most);
            const pm_deviceptr h = hosts[rnd(2)] + rnd(AREA - sizes[i]),
                               d = devs[rnd(2)] + rnd(AREA - sizes[i]);
            const bool to_device = rnd(2);
            dsts[i] = to_device ? d : h;
            srcs[i] = to_device ? h : d;
        }
        bool meet[MAX] = {false}, any = false;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++)
                if (i != j && (ranges_meet(dsts[i], sizes[i], dsts[j], sizes[j]) ||
                               ranges_meet(srcs[i], sizes[i], dsts[j], sizes[j])))
                    any = meet[i] = meet[j] = true;
        const pm_result r = pm_memcpy_batch_async(dsts, srcs, sizes, n, s);
        CHECK_RESULT(r, any ? PM_ERROR_INVALID_VALUE : PM_SUCCESS);
        if (r != PM_SUCCESS) {
            size_t named = SIZE_MAX;
            const char *at = strstr(pm_last_error_detail(), "element ");
            CHECK(at && sscanf(at, "element %zu", &named) == 1 && named < n && meet[named]);
            refused++;
        }
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    }
    printf("overlaps: %u of %u random batches refused\n", refused, TRIALS);
    if (check_failures == failed_before) /* both answers were asked for often */
        CHECK(refused > TRIALS / 5 && refused < TRIALS - TRIALS / 5);
}

/* Batches of equal power-of-two blocks on one grid, each way (a cache's
 * blocks, which the check proves apart without sorting), some with two
 * blocks in one slot and some with one block off the grid: refused exactly
 * when two destinations meet, naming one of them, and moved byte for byte
 * otherwise. */
static void overlaps_on_a_grid(void)
{
    enum { BLOCK = 4096, SLOTS = 256, AREA = BLOCK * SLOTS, MAX = 64, TRIALS = 300 };
    SCOPED_MALLOC uint8_t *host = malloc(AREA), *back = malloc(AREA);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(AREA);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(host && back && dev);
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    for (size_t i = 0; i < AREA; i++)
        host[i] = (uint8_t)(i * 7 + i / BLOCK);
    REQUIRE_RESULT(pm_memcpy_htod(dev, host, AREA), PM_SUCCESS);
    pm_deviceptr dsts[MAX], srcs[MAX];
    size_t sizes[MAX];
    unsigned refused = 0;
    const int failed_before = check_failures;
    for (unsigned t = 0; t < TRIALS && check_failures == failed_before; t++) {
        const bool to_device = t % 2 == 0;
        const unsigned kind = t / 2 % 4; /* apart, one slot twice, one off the grid, any */
        const size_t n = 2 + rnd(MAX - 1);
        const pm_deviceptr base = to_device ? dev : (pm_deviceptr)(uintptr_t)back;
        size_t slots[SLOTS];
        for (size_t k = 0; k < SLOTS; k++)
            slots[k] = k;
        for (size_t k = 0; k < n; k++) { /* the first n of a shuffle: distinct */
            const size_t j = k + rnd(SLOTS - k), swap = slots[k];
            slots[k] = slots[j];
            slots[j] = swap;
        }
        for (size_t i = 0; i < n; i++) {
            sizes[i] = BLOCK;
            dsts[i] = base + (kind == 3 ? rnd(SLOTS) : slots[i]) * BLOCK;
            srcs[i] = (to_device ? (pm_deviceptr)(uintptr_t)host : dev) + rnd(SLOTS) * BLOCK;
        }
        if (kind == 1)
            dsts[rnd(n - 1)] = dsts[n - 1];
        if (kind == 2) /* still inside the area */
            dsts[n - 1] += dsts[n - 1] - base + BLOCK < AREA ? 256 : -(pm_deviceptr)256;
        bool meet[MAX] = {false}, any = false;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++)
                if (i != j && ranges_meet(dsts[i], sizes[i], dsts[j], sizes[j]))
                    any = meet[i] = meet[j] = true;
        const pm_result r = pm_memcpy_batch_async(dsts, srcs, sizes, n, s);
        CHECK_RESULT(r, any ? PM_ERROR_INVALID_VALUE : PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
        if (r != PM_SUCCESS) {
            size_t named = SIZE_MAX;
            const char *at = strstr(pm_last_error_detail(), "element ");
            CHECK(at && sscanf(at, "element %zu", &named) == 1 && named < n && meet[named]);
            refused++;
            continue;
        }
        for (size_t i = 0; i < n && check_failures == failed_before; i++) {
            uint8_t got[BLOCK], want[BLOCK];
            CHECK_RESULT(pm_memcpy((pm_deviceptr)(uintptr_t)got, dsts[i], BLOCK), PM_SUCCESS);
            CHECK_RESULT(pm_memcpy((pm_deviceptr)(uintptr_t)want, srcs[i], BLOCK), PM_SUCCESS);
            CHECK(memcmp(got, want, BLOCK) == 0);
        }
    }
    printf("overlaps on a grid: %u of %u batches refused\n", refused, TRIALS);
    if (check_failures == failed_before)
        CHECK(refused > TRIALS / 10 && refused < TRIALS - TRIALS / 10);
}

static void *batch_thread(void *arg)
{
    batcher *w = arg;
    enum { BLOCKS = 96, BYTES = 24 << 10 };
    uint8_t *src = malloc(BLOCKS * BYTES), *dst = malloc(BLOCKS * BYTES);
    pm_deviceptr dev = 0;
    pm_stream_t s = NULL;
    if (!src || !dst || pm_device_alloc(&dev, 2 * BLOCKS * BYTES) != PM_SUCCESS ||
        pm_stream_create(&s) != PM_SUCCESS) {
        w->failures++;
        goto out;
    }
    pm_deviceptr d[BLOCKS], h[BLOCKS];
    size_t n[BLOCKS];
    for (unsigned round = 0; round < 6; round++) {
        unsigned seed = w->seed * 100 + round;
        fill(src, BLOCKS * BYTES, seed);
        memset(dst, 0, BLOCKS * BYTES);
        for (int i = 0; i < BLOCKS; i++) { /* scattered: block i to slot (i * 37) % BLOCKS */
            h[i] = (pm_deviceptr)(uintptr_t)(src + i * BYTES);
            d[i] = dev + (pm_deviceptr)((i * 37) % BLOCKS) * 2 * BYTES;
            n[i] = BYTES - (size_t)(i % 3) * 1000;
        }
        if (pm_memcpy_batch_async(d, h, n, BLOCKS, s) != PM_SUCCESS)
            w->failures++;
        for (int i = 0; i < BLOCKS; i++)
            h[i] = (pm_deviceptr)(uintptr_t)(dst + i * BYTES);
        if (pm_memcpy_batch_async(h, d, n, BLOCKS, s) != PM_SUCCESS)
            w->failures++;
        for (int i = 0; i < BLOCKS; i++)
            if (memcmp(dst + i * BYTES, src + i * BYTES, n[i]) != 0)
                w->failures++;
    }
out:
    if (s)
        pm_stream_destroy(s);
    device_free(dev);
    free(src);
    free(dst);
    return NULL;
}

static void eight_threads(void)
{
    pthread_t t[8];
    batcher w[8];
    for (unsigned i = 0; i < 8; i++)
        w[i] = (batcher){i + 1, 0};
    unsigned started = start_threads(t, 8, batch_thread, w, sizeof w[0]);
    CHECK(started == 8);
    join_threads(t, started);
    for (unsigned i = 0; i < started; i++)
        CHECK(w[i].failures == 0);
}

/* Stream order: a batch's page-locked reads wait for the work queued before
 * it (a host function that writes their source late), and the work queued
 * after it sees what it wrote; its pageable destinations hold their bytes
 * when it returns, after the earlier work. */
typedef struct late_write {
    uint8_t *p;
    size_t n;
    unsigned seed;
} late_write;

static void write_late(void *arg)
{
    late_write *w = arg;
    usleep(30000);
    fill(w->p, w->n, w->seed);
}

static void ordering(void)
{
    const size_t n = 200 << 10;
    SCOPED_HOST uint8_t *pinned = NULL;
    SCOPED_HOST uint8_t *pinned_back = NULL;
    SCOPED_MALLOC uint8_t *pageable = malloc(n), *pageable_back = malloc(n);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(4 * n);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(pageable && pageable_back && dev);
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&pinned, n), "a 200 KiB host allocation");
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&pinned_back, n), "a 200 KiB host allocation");
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    for (unsigned round = 0; round < 3; round++) {
        unsigned seed = 60 + round;
        fill(pinned, n, 1);
        fill(pageable, n, seed + 10);
        CHECK_RESULT(pm_memcpy_htod(dev + 2 * n, pageable, n), PM_SUCCESS); /* old bytes */
        late_write w = {pinned, n, seed};
        CHECK_RESULT(pm_stream_launch_host_func(s, write_late, &w), PM_SUCCESS);
        fill(pageable, n, seed + 20);
        /* queued before the batch: the device's third block gets seed + 20 */
        CHECK_RESULT(pm_memcpy_htod_async(dev + 2 * n, pageable, n, s), PM_SUCCESS);
        pm_deviceptr d[2] = {dev, (pm_deviceptr)(uintptr_t)pageable_back};
        pm_deviceptr f[2] = {(pm_deviceptr)(uintptr_t)pinned, dev + 2 * n};
        size_t z[2] = {n, n};
        CHECK_RESULT(pm_memcpy_batch_async(d, f, z, 2, s), PM_SUCCESS);
        /* the pageable destination is there on return, after the earlier work */
        CHECK(first_mismatch(pageable_back, n, seed + 20) == n);
        /* queued after the batch: reads what it wrote */
        CHECK_RESULT(pm_memcpy_dtoh_async(pinned_back, dev, n, s), PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
        CHECK(first_mismatch(pinned_back, n, seed) == n);
    }
}

/* A backend copy failing at each call of a batch in turn: a clean error
 * saying so, nothing left queued or hanging, and the next batch whole. Then
 * the staging ring failing to pin: the pageable blocks take the backend's
 * own path, and nothing stays pinned. */
static void fault_sweep(void)
{
    enum { N = 24, BYTES = 50000 };
    SCOPED_MALLOC uint8_t *src = malloc(N * BYTES), *dst = malloc(N * BYTES);
    SCOPED_HOST uint8_t *pinned = NULL;
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(2 * N * BYTES);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(src && dst && dev);
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&pinned, 4 * BYTES), "a 200 KB host allocation");
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    pm_deviceptr d[N], h[N];
    size_t n[N];
    /* ways 3 and 4: the kernel, with a DMA's fault point, then a launch's */
    static const pm_copy_batch ways[] = {PM_COPY_BATCH_GATHER, PM_COPY_BATCH_EACH,
                                         PM_COPY_BATCH_DRIVER, PM_COPY_BATCH_KERNEL,
                                         PM_COPY_BATCH_KERNEL};
    for (int way = 0; way < 5; way++) {
        pm__countdown *point = way == 4 ? &pm__fault_block_copy : &pm__fault_backend_copy;
        set_batch(ways[way], PM_COPY_RING_DEFAULT, 0, 0, 0);
        for (int dir = 0; dir < 2; dir++) {
            for (int k = 1;; k++) {
                unsigned seed = (unsigned)(way * 1000 + dir * 100 + k);
                fill(src, N * BYTES, seed);
                fill(pinned, 4 * BYTES, seed + 1);
                for (int i = 0; i < N; i++) {
                    /* four page-locked blocks among the pageable ones */
                    uint8_t *host = i % 6 == 0 ? pinned + (i / 6) * BYTES : src + i * BYTES;
                    if (dir == 1)
                        host = i % 6 == 0 ? pinned + (i / 6) * BYTES : dst + i * BYTES;
                    h[i] = (pm_deviceptr)(uintptr_t)host;
                    d[i] = dev + (pm_deviceptr)((i * 7) % N) * 2 * BYTES;
                    n[i] = BYTES - (size_t)i * 100;
                }
                unsigned long long pinned_before = stats().pinned_bytes;
                atomic_store(point, k);
                pm_result r = dir == 0 ? pm_memcpy_batch_async(d, h, n, N, s)
                                       : pm_memcpy_batch_async(h, d, n, N, s);
                bool fired = atomic_load(point) == 0;
                atomic_store(point, 0);
                CHECK(stats().pinned_bytes == pinned_before); /* nothing more pinned, or left */
                CHECK(fired ? r == PM_ERROR_UNKNOWN : r == PM_SUCCESS);
                if (fired)
                    CHECK(strstr(pm_last_error_detail(), "injected") != NULL);
                CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
                /* the engine is whole: the same batch, clean, comes out right */
                if (dir == 0) {
                    CHECK_RESULT(pm_memcpy_batch_async(d, h, n, N, s), PM_SUCCESS);
                    for (int i = 0; i < N; i++)
                        h[i] = (pm_deviceptr)(uintptr_t)(dst + i * BYTES);
                    CHECK_RESULT(pm_memcpy_batch_async(h, d, n, N, s), PM_SUCCESS);
                    CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
                    for (int i = 0; i < N; i++) {
                        const uint8_t *want = i % 6 == 0 ? pinned + (i / 6) * BYTES : src + i * BYTES;
                        CHECK(memcmp(dst + i * BYTES, want, n[i]) == 0);
                    }
                } else {
                    CHECK_RESULT(pm_memcpy_batch_async(h, d, n, N, s), PM_SUCCESS);
                    CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
                }
                if (!fired)
                    break;
                CHECK(k < 400);
                if (k >= 400)
                    break;
            }
        }
    }
    set_batch(PM_COPY_BATCH_DEFAULT, PM_COPY_RING_DEFAULT, 0, 0, 0);
    /* no ring: every other batch's ring fails to pin */
    unsigned long long baseline = 0;
    for (unsigned k = 0; k < 4; k++) {
        pm_copy_config c = {.struct_size = sizeof c};
        CHECK_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
        c.buffers = c.buffers == 6 ? 5 : 6; /* a new ring for every k */
        CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
        if (k == 0)
            baseline = stats().pinned_bytes;
        const bool fault = k % 2 == 0;
        atomic_store(&pm__fault_stage_pin, fault ? 1 : 0);
        pm_copy_stats before = stats();
        fill(src, N * BYTES, 500 + k);
        for (int i = 0; i < N; i++) {
            h[i] = (pm_deviceptr)(uintptr_t)(src + i * BYTES);
            d[i] = dev + (pm_deviceptr)i * 2 * BYTES;
            n[i] = BYTES;
        }
        CHECK_RESULT(pm_memcpy_batch_async(d, h, n, N, s), PM_SUCCESS);
        atomic_store(&pm__fault_stage_pin, 0);
        for (int i = 0; i < N; i++)
            h[i] = (pm_deviceptr)(uintptr_t)(dst + i * BYTES);
        CHECK_RESULT(pm_memcpy_batch_async(h, d, n, N, s), PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
        CHECK(memcmp(dst, src, N * BYTES) == 0);
        pm_copy_stats after = stats();
        if (fault) {
            CHECK(after.driver_bytes - before.driver_bytes >= N * BYTES);
            CHECK(strstr(after.ring_note, "injected") != NULL);
        }
        if (!after.ring_pinned)
            CHECK(after.pinned_bytes == baseline);
    }
}

/* An element of 0 bytes has its pointers left unlooked at, the first one
 * too: the place the batch runs in (on CUDA a thread without a context takes
 * its memory's device's, whose legacy stream orders the batch after that
 * device's earlier copies) comes from the first element that moves bytes. */
static pm_deviceptr place_asked;
static pm_result (*real_copy_place)(pm_stream_t, pm_deviceptr, pm_deviceptr, pm__place *);

static pm_result recording_copy_place(pm_stream_t s, pm_deviceptr a, pm_deviceptr b,
                                      pm__place *out)
{
    if (!place_asked) /* the call's own question, not its staging job's */
        place_asked = a;
    return real_copy_place(s, a, b, out);
}

static void restore_copy_place(pm__backend **b) { (*b)->copy_place = real_copy_place; }

static void empty_first_element(void)
{
    enum { BYTES = 5000 };
    pm_result ignored;
    __attribute__((cleanup(restore_copy_place))) pm__backend *b =
        &pm__instance_get(&ignored)->backend;
    real_copy_place = b->copy_place;
    b->copy_place = recording_copy_place;
    SCOPED_MALLOC uint8_t *host = malloc(BYTES);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(BYTES);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(host && dev);
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    fill(host, BYTES, 71);
    pm_deviceptr dsts[2] = {(pm_deviceptr)0x1000, dev}; /* element 0: a stray pointer, 0 bytes */
    pm_deviceptr srcs[2] = {0, (pm_deviceptr)(uintptr_t)host};
    size_t sizes[2] = {0, BYTES};
    place_asked = 0;
    CHECK_RESULT(pm_memcpy_batch_async(dsts, srcs, sizes, 2, s), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    if (place_asked != dev)
        fprintf(stderr, "the batch's place was asked of 0x%llx, not element 1's 0x%llx\n",
                place_asked, dev);
    CHECK(place_asked == dev);
    uint8_t back[BYTES];
    CHECK_RESULT(pm_memcpy_dtoh(back, dev, BYTES), PM_SUCCESS);
    CHECK(first_mismatch(back, BYTES, 71) == BYTES);
}

/* A batch that fails after it queued a DMA into pageable memory (DRIVER:
 * the driver's own path for a pageable destination, which the call waits
 * for) still waits for it: once the call has returned, failed or not, no
 * write of its own lands in pageable memory, which the caller may free. */
static pm_result (*real_copy_any)(pm_deviceptr, pm_deviceptr, size_t, pm_stream_t, bool, bool);

static pm_result failing_copy_any(pm_deviceptr dst, pm_deviceptr src, size_t bytes,
                                  pm_stream_t s, bool sync, bool device_only)
{
    (void)dst, (void)src, (void)bytes, (void)s, (void)sync, (void)device_only;
    return pm__fail(PM_ERROR_UNKNOWN, "a host-to-host copy failed (injected fault)");
}

static void restore_copy_any(pm__backend **b) { (*b)->copy_any = real_copy_any; }

static void sleep_then(void *arg)
{
    (void)arg;
    usleep(50000);
}

static void failed_driver_batch_waits(void)
{
    enum { BYTES = 40000 };
    pm_result ignored;
    __attribute__((cleanup(restore_copy_any))) pm__backend *b =
        &pm__instance_get(&ignored)->backend;
    real_copy_any = b->copy_any;
    SCOPED_MALLOC uint8_t *dst = malloc(BYTES), *other = malloc(2 * BYTES), *scratch = malloc(BYTES);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(BYTES);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(dst && other && scratch && dev);
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    fill(scratch, BYTES, 81);
    REQUIRE_RESULT(pm_memcpy_htod(dev, scratch, BYTES), PM_SUCCESS);
    set_batch(PM_COPY_BATCH_DRIVER, PM_COPY_RING_DEFAULT, 0, 0, 0);
    fill(dst, BYTES, 82);
    /* element 0: device to pageable, queued behind a slow task; element 1:
     * host to host, which fails */
    pm_deviceptr dsts[2] = {(pm_deviceptr)(uintptr_t)dst, (pm_deviceptr)(uintptr_t)(other + BYTES)};
    pm_deviceptr srcs[2] = {dev, (pm_deviceptr)(uintptr_t)other};
    size_t sizes[2] = {BYTES, BYTES};
    CHECK_RESULT(pm_stream_launch_host_func(s, sleep_then, NULL), PM_SUCCESS);
    b->copy_any = failing_copy_any;
    CHECK_RESULT(pm_memcpy_batch_async(dsts, srcs, sizes, 2, s), PM_ERROR_UNKNOWN);
    b->copy_any = real_copy_any;
    memcpy(scratch, dst, BYTES); /* what the caller found on return */
    CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
    const bool late = memcmp(scratch, dst, BYTES) != 0;
    if (late)
        fprintf(stderr, "the failed batch wrote its pageable destination after it returned\n");
    CHECK(!late);
    set_batch(PM_COPY_BATCH_DEFAULT, PM_COPY_RING_DEFAULT, 0, 0, 0);
}

/* A copy that fails part way counts what it handed over before the
 * failure: one element, a registered page then pageable bytes, to the
 * device, whose pageable piece's copy fails after the page went. A failed
 * pm_memcpy_async counts the page as direct bytes (copy.c counts each piece
 * as it is queued), and so does a failed batch of the same element, by DMA
 * or by the kernel (whose bytes are direct bytes, as in a batch that
 * succeeds). The batch itself is not counted among the calls. */
static void failed_batch_counts(void)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), tail = 100;
    SCOPED_MALLOC uint8_t *block = malloc(3 * page);
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(2 * page);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(block && dev);
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    uint8_t *host = (uint8_t *)(((uintptr_t)block + page - 1) & ~(uintptr_t)(page - 1));
    REQUIRE_PINNED(pm_mem_host_register(host, page, 0), "a one-page registration");
    pm_deviceptr src = (pm_deviceptr)(uintptr_t)host;
    size_t bytes = page + tail;
    /* 0: pm_memcpy_async, whose second backend copy is the tail's (the
     * driver's own path); 1: a batch, the DMA first, the staged tail's DMA
     * second; 2: the kernel, then the staged tail's DMA, the first copy. */
    static const pm_copy_batch ways[] = {PM_COPY_BATCH_GATHER, PM_COPY_BATCH_GATHER,
                                         PM_COPY_BATCH_KERNEL};
    static const int failing_pass[] = {2, 2, 1};
    for (int way = 0; way < 3; way++) {
        set_batch(ways[way], PM_COPY_RING_DEFAULT, 0, 0, 0);
        const pm_copy_stats before = stats();
        atomic_store(&pm__fault_backend_copy, failing_pass[way]);
        pm_result r = way == 0 ? pm_memcpy_async(dev, src, bytes, s)
                               : pm_memcpy_batch_async(&dev, &src, &bytes, 1, s);
        const bool fired = atomic_load(&pm__fault_backend_copy) == 0;
        atomic_store(&pm__fault_backend_copy, 0);
        CHECK_RESULT(r, PM_ERROR_UNKNOWN);
        CHECK(fired);
        CHECK_RESULT(pm_stream_synchronize(s), PM_SUCCESS);
        const pm_copy_stats after = stats();
        const unsigned long long direct = after.direct_bytes - before.direct_bytes;
        if (direct != page)
            fprintf(stderr, "way %d: a failed copy counted %llu direct bytes, not the %zu sent\n",
                    way, direct, page);
        CHECK(direct == page);
        CHECK(after.driver_bytes == before.driver_bytes);
        CHECK(after.batch_calls == before.batch_calls);
        if (way == 2)
            CHECK(after.kernel_bytes - before.kernel_bytes == page);
    }
    set_batch(PM_COPY_BATCH_DEFAULT, PM_COPY_RING_DEFAULT, 0, 0, 0);
    CHECK_RESULT(pm_mem_host_unregister(host), PM_SUCCESS);
}

/* While the ring is split (copies running both ways), a list of the
 * kernel's blocks takes a buffer as a host-to-device piece would (its buffer
 * counts as one): within that direction's half. Here two jobs run, one each
 * way, and host to device holds its half of a ring of two: a batch of
 * page-locked blocks then waits rather than take the one buffer left to the
 * other direction, and goes on once host to device gives its buffer back. */
typedef struct list_batch {
    pm_deviceptr d[8], h[8];
    size_t n[8];
    pm_stream_t s;
    pm_result r;
    atomic_bool done;
} list_batch;

static void *run_list_batch(void *arg)
{
    list_batch *lb = arg;
    lb->r = pm_memcpy_batch_async(lb->d, lb->h, lb->n, 8, lb->s);
    if (lb->r == PM_SUCCESS)
        lb->r = pm_stream_synchronize(lb->s);
    atomic_store(&lb->done, true);
    return NULL;
}

static void block_lists_keep_the_split(void)
{
    enum { N = 8, BYTES = 1000 };
    pm_copy_config c = {.struct_size = sizeof c}, saved;
    CHECK_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    saved = c;
    SCOPED_MALLOC uint8_t *src = malloc(c.chunk_bytes);
    SCOPED_HOST uint8_t *pinned = NULL;
    SCOPED_DEVICE pm_deviceptr dev = device_alloc(c.chunk_bytes);
    SCOPED_STREAM pm_stream_t s = NULL;
    REQUIRE(src && dev);
    REQUIRE_RESULT(pm_stream_create(&s), PM_SUCCESS);
    REQUIRE_PINNED(pm_mem_alloc_host((void **)&pinned, N * BYTES), "an 8 KB host allocation");
    c.buffers = 2;
    c.ring = PM_COPY_RING_SPLIT;
    c.batch = PM_COPY_BATCH_KERNEL;
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    list_batch lb = {.s = s};
    /* A staged copy starts the engine with this ring, split. */
    fill(src, c.chunk_bytes, 91);
    CHECK_RESULT(pm_memcpy_htod(dev, src, c.chunk_bytes), PM_SUCCESS);
    engine *eng = &pm__staging_engines[(unsigned)test_backend()->device_in_use % PM__ENGINES_MAX];
    pthread_mutex_lock(&eng->lock);
    const bool ready = eng->started && eng->ring_split && eng->n_buffers == 2 &&
                       eng->queue_count == 2;
    buffer *held = NULL;
    if (ready) { /* both ways running, the oldest free buffer a host-to-device piece's */
        eng->running[PM__HTOD]++;
        eng->running[PM__DTOH]++;
        held = &eng->ring[eng->queue[eng->queue_head]];
        eng->queue_head = (eng->queue_head + 1) % eng->n_buffers;
        eng->queue_count--;
        held->dir = PM__HTOD;
        eng->held[PM__HTOD]++;
    }
    pthread_mutex_unlock(&eng->lock);
    if (!ready) {
        printf("skipped: %s: the ring is not two free buffers, split\n", __func__);
        CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
        return;
    }
    fill(pinned, N * BYTES, 92);
    for (int i = 0; i < N; i++) {
        lb.h[i] = (pm_deviceptr)(uintptr_t)(pinned + i * BYTES);
        lb.d[i] = dev + (pm_deviceptr)((i * 3) % N) * BYTES;
        lb.n[i] = BYTES;
    }
    pthread_t t;
    const bool started = pthread_create(&t, NULL, run_list_batch, &lb) == 0;
    CHECK(started);
    usleep(100000);
    pthread_mutex_lock(&eng->lock);
    const bool went_on = atomic_load(&lb.done), other_half_free = eng->queue_count == 1;
    pm__staging_give_buffer(eng, held);
    pm__staging_count_running(eng, PM__DTOH, -1);
    pm__staging_count_running(eng, PM__HTOD, -1);
    pthread_mutex_unlock(&eng->lock);
    if (went_on)
        fprintf(stderr, "a list of blocks took the buffer of the other direction's half\n");
    CHECK(!went_on && other_half_free);
    if (started)
        pthread_join(t, NULL);
    CHECK_RESULT(lb.r, PM_SUCCESS);
    uint8_t back[BYTES];
    for (int i = 0; i < N; i++) {
        CHECK_RESULT(pm_memcpy_dtoh(back, lb.d[i], BYTES), PM_SUCCESS);
        CHECK(memcmp(back, pinned + i * BYTES, BYTES) == 0);
    }
    CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
}

int main(void)
{
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    printf("backend: %s\n", pm_backend_name());
    small_copy_config(0);
    bad_elements();
    empty_first_element();
    failed_driver_batch_waits();
    failed_batch_counts();
    block_lists_keep_the_split();
    overlaps_random();
    overlaps_on_a_grid();
    many_allocations();
    registration_pieces();
    random_batches();
    kernel_mode();
    ordering();
    eight_threads();
    fault_sweep();
    small_copy_config(0);
    pm_copy_stats st = stats();
    printf("batches: %llu calls, %llu copies, %llu driver calls that took several DMAs\n",
           st.batch_calls, st.batch_copies, st.dma_batch_calls);
    CHECK(st.dma_batch_calls > 0);
    return check_finish("test_copy_batch");
}
