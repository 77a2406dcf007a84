/* Random sequences of every host-API call, good arguments and bad ones of
 * every kind (NULL, interior pointers, double frees, stale pointers, wild
 * pointers that are mapped but not pinmem's, unmapped ones, sizes 0 and huge,
 * bad flags, destroyed pools), each answer checked against a reference model
 * of what is allocated, registered and pooled. The seed is printed and can be
 * given back (PINMEM_TEST_SEED; PINMEM_TEST_STEPS sets the length). Each
 * step draws from numbers of its own, made from the seed and the step's
 * index, so that a step makes the same choices on every backend even where
 * earlier answers differed (whether a destroyed pool's handle comes back for
 * a new pool depends on the allocator): a failure on a GPU replays on POSIX
 * with the same seed. A failed registration describes itself and its
 * neighbours. Before the sequence, the situations it reaches only rarely are
 * tried once each. Pins at most a few MiB, so that it runs under an 8 MiB
 * RLIMIT_MEMLOCK; where the limit refuses pool memory, the model accepts
 * that refusal and counts it. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "copy_util.h"

enum { max_allocs = 16, max_regs = 12, max_pool_allocs = 48, max_pools = 2, stale_slots = 32 };
enum { arena_pages = 64, ro_page = 40, hole_page = 48 };

typedef struct object {
    uint8_t *p;
    size_t size;
    unsigned flags;           /* what get_flags reports */
    uintptr_t ext_lo, ext_hi; /* what pinmem claims for it: an allocation's pages, a
                                 registration's bytes */
    bool driver_placed;       /* CUDA write-combined: the driver placed it, exactly its bytes */
    unsigned register_flags;  /* registrations: the flags given */
    unsigned long long step;  /* the step that made it */
} object;

typedef struct pool_alloc {
    uint8_t *p;
    size_t size;
} pool_alloc;

static struct model {
    object allocs[max_allocs];
    int n_allocs;
    object regs[max_regs];
    int n_regs;
    pool_alloc pallocs[max_pool_allocs];
    int n_pallocs;
    pm_mem_pool_t pools[max_pools]; /* live pools made here (the default pool besides) */
    int n_pools;
    pm_mem_pool_t destroyed[8];
    unsigned n_destroyed;
    struct {
        void *p;
        bool pool; /* a pool block: may lie in a chunk the model does not see */
    } stale[stale_slots];
    unsigned n_stale;
} m;

static uint64_t rng, seed;
static size_t page;
static bool cuda, limit_binds, read_only_supported;
static uint8_t *arena, *pageable, *in_out;
static void *unmapped;
static pm_deviceptr dev;
static pm_mem_pool_t default_pool;
static unsigned long long steps_done, refusals;
static int data_anchor;
static const size_t dev_bytes = 64 << 10;

static uint64_t rnd(uint64_t n) { return n ? xorshift64(&rng) % n : 0; }

/* The numbers of one step (splitmix64 of the seed and the step). */
static void rng_for_step(unsigned long long step)
{
    uint64_t z = seed + (step + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    rng = z ? z : 1; /* xorshift's one fixed point */
}
static bool one_in(unsigned n) { return rnd(n) == 0; }
static uintptr_t page_down(uintptr_t a) { return a & ~(uintptr_t)(page - 1); }
static uintptr_t page_up(uintptr_t a) { return page_down(a + page - 1); }

/* Checks an answer; on a mismatch says which step of which seed. */
static void expect_result(pm_result got, pm_result want, const char *call, const void *q)
{
    if (got != want && check_failed_())
        fprintf(stderr, "step %llu: %s(%p) gave %s, the model expected %s (%s)\n", steps_done,
                call, q, pm_result_name(got), pm_result_name(want), pm_last_error_detail());
    if (got != PM_SUCCESS && pm_last_error_detail()[0] == '\0' && check_failed_())
        fprintf(stderr, "step %llu: %s failed without a detail\n", steps_done, call);
}

static void remember_stale(void *p, bool pool)
{
    m.stale[m.n_stale % stale_slots].p = p;
    m.stale[m.n_stale % stale_slots].pool = pool;
    m.n_stale++;
}

/* A refusal the environment makes: RLIMIT_MEMLOCK binds and was reached. */
static bool refused_by_limit(pm_result r)
{
    if (r != PM_ERROR_OUT_OF_MEMORY || !limit_binds ||
        !strstr(pm_last_error_detail(), "RLIMIT_MEMLOCK"))
        return false;
    refusals++;
    return true;
}

/* ------------------------------------------------------------ the model */

static const object *alloc_at(uintptr_t q) /* in the bytes of a live allocation */
{
    for (int i = 0; i < m.n_allocs; i++)
        if (q - (uintptr_t)m.allocs[i].p < m.allocs[i].size)
            return &m.allocs[i];
    return NULL;
}

static const object *reg_at(uintptr_t q)
{
    for (int i = 0; i < m.n_regs; i++)
        if (q - (uintptr_t)m.regs[i].p < m.regs[i].size)
            return &m.regs[i];
    return NULL;
}

static const pool_alloc *pool_alloc_at(uintptr_t q)
{
    for (int i = 0; i < m.n_pallocs; i++)
        if (q - (uintptr_t)m.pallocs[i].p < m.pallocs[i].size)
            return &m.pallocs[i];
    return NULL;
}

/* What registering [lo, hi) runs into, as the registry and the driver answer:
 * the bytes of an allocation or a pool block (INVALID_VALUE), those of a
 * registration or the rest of an allocation's pages (ALREADY_REGISTERED); of
 * several, the first in address order whose bytes it overlaps decides, else
 * the first whose pages it overlaps. Pool blocks stand for the chunks around
 * them, which are pool memory to their last byte. */
typedef struct conflict_search {
    uintptr_t lo, hi, bytes_base, ext_base;
    pm_result bytes_answer;
    bool on_bytes, on_ext;
} conflict_search;

static void consider(conflict_search *c, uintptr_t ext_lo, uintptr_t ext_hi, uintptr_t p,
                     size_t size, bool registration)
{
    if (ext_hi <= c->lo || ext_lo >= c->hi)
        return;
    if (p < c->hi && c->lo < p + size) {
        if (!c->on_bytes || ext_lo < c->bytes_base) {
            c->bytes_base = ext_lo;
            c->bytes_answer = registration ? PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED
                                           : PM_ERROR_INVALID_VALUE;
        }
        c->on_bytes = true;
    }
    c->on_ext = true;
}

static pm_result conflict_in(uintptr_t lo, uintptr_t hi)
{
    conflict_search c = {.lo = lo, .hi = hi};
    for (int i = 0; i < m.n_regs; i++)
        consider(&c, m.regs[i].ext_lo, m.regs[i].ext_hi, (uintptr_t)m.regs[i].p, m.regs[i].size,
                 true);
    for (int i = 0; i < m.n_allocs; i++)
        consider(&c, m.allocs[i].ext_lo, m.allocs[i].ext_hi, (uintptr_t)m.allocs[i].p,
                 m.allocs[i].size, false);
    for (int i = 0; i < m.n_pallocs; i++) {
        const uintptr_t b = page_down((uintptr_t)m.pallocs[i].p),
                        e = page_up((uintptr_t)m.pallocs[i].p + m.pallocs[i].size);
        consider(&c, b, e, b, e - b, false);
    }
    if (c.on_bytes)
        return c.bytes_answer;
    return c.on_ext ? PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED : PM_SUCCESS;
}

/* What registering [lo, hi) with flags f meets on the pages it shares with
 * registrations: the driver refuses one that would share a page with a
 * registration of the other READ_ONLY-ness (INVALID_VALUE). Two READ_ONLY
 * ones on a page are not in the spec's table yet: pinmem registers them,
 * and on CUDA the model takes the driver's answer. */
typedef enum { SHARES_FINE, SHARES_OTHER_KIND, SHARES_READ_ONLY } page_sharing;

static page_sharing sharing_in(uintptr_t lo, uintptr_t hi, unsigned f)
{
    const bool ro = (f & PM_MEMHOSTREGISTER_READ_ONLY) != 0;
    page_sharing found = SHARES_FINE;
    for (int i = 0; i < m.n_regs; i++) {
        const object *o = &m.regs[i];
        if (page_down((uintptr_t)o->p) >= page_up(hi) || page_down(lo) >= page_up(o->ext_hi))
            continue;
        if (((o->register_flags & PM_MEMHOSTREGISTER_READ_ONLY) != 0) != ro)
            return SHARES_OTHER_KIND;
        if (ro)
            found = SHARES_READ_ONLY;
    }
    return found;
}

/* On CUDA, the pages around an allocation the driver placed (write-combined
 * ones, packed closer than pages) hold whatever else the driver put there:
 * the driver answers for them, and the spec's table does not say how. */
static bool beside_driver_placed(uintptr_t lo, uintptr_t hi)
{
    for (int i = 0; cuda && i < m.n_allocs; i++)
        if (m.allocs[i].driver_placed && lo < page_up(m.allocs[i].ext_hi) &&
            page_down(m.allocs[i].ext_lo) < hi)
            return true;
    return false;
}

static bool is_mapped(uintptr_t page_addr)
{
    return msync((void *)page_addr, page, MS_ASYNC) == 0;
}

/* ------------------------------------------------- what happened to the arena */

/* The last few registrations, refusals and unregistrations that touched each
 * arena page, so that a surprising answer can be told with its history. */
enum { history_len = 4 };
typedef struct page_event {
    unsigned long long step;
    const char *call;
    size_t offset, bytes; /* the range, from the arena's start */
    unsigned flags;
    pm_result result;
} page_event;
static struct {
    page_event events[history_len];
    unsigned count;
} history[arena_pages];

static bool in_arena(uintptr_t u, size_t n)
{
    const size_t len = arena_pages * page;
    return u >= (uintptr_t)arena && u - (uintptr_t)arena <= len && n <= len - (u - (uintptr_t)arena);
}

static void remember_pages(const char *call, const uint8_t *q, size_t n, unsigned flags,
                           pm_result r)
{
    const uintptr_t u = (uintptr_t)q;
    if (!q || !n || !in_arena(u, n))
        return;
    const page_event e = {steps_done, call, u - (uintptr_t)arena, n, flags, r};
    for (uintptr_t a = page_down(u); a < u + n; a += page) {
        size_t i = (a - (uintptr_t)arena) / page;
        history[i].events[history[i].count++ % history_len] = e;
    }
}

static void print_range(const char *indent, size_t offset, size_t bytes, unsigned flags)
{
    fprintf(stderr, "%sarena page %zu + %zu, %zu bytes (pages %zu-%zu), flags %#x\n", indent,
            offset / page, offset % page, bytes, offset / page, (offset + bytes - 1) / page, flags);
}

/* A registration whose answer surprised the model: where it lies, what else
 * is registered on its pages, and what happened to those pages before. */
static void describe_registration(const uint8_t *q, size_t n, unsigned flags)
{
    const uintptr_t u = (uintptr_t)q;
    if (!in_arena(u, n)) {
        fprintf(stderr, "  %p, %zu bytes, flags %#x: not in the arena (%p)\n", (const void *)q,
                n, flags, (void *)arena);
        return;
    }
    print_range("  the range: ", u - (uintptr_t)arena, n, flags);
    const uintptr_t lo = page_down(u), hi = page_up(u + n);
    const uintptr_t ro = (uintptr_t)arena + ro_page * page, hole = (uintptr_t)arena + hole_page * page;
    if (lo <= ro && hi > ro)
        fprintf(stderr, "  it covers the read-only page (%d)\n", ro_page);
    if (lo <= hole && hi > hole)
        fprintf(stderr, "  it covers the hole (page %d), %s now\n", hole_page,
                is_mapped(hole) ? "mapped" : "unmapped");
    for (int i = 0; i < m.n_regs; i++) {
        const object *o = &m.regs[i];
        if (page_down((uintptr_t)o->p) < hi && lo < page_up((uintptr_t)o->p + o->size)) {
            fprintf(stderr, "  registered on its pages since step %llu: ", o->step);
            print_range("", (uintptr_t)o->p - (uintptr_t)arena, o->size, o->register_flags);
        }
    }
    for (uintptr_t a = lo; a < hi; a += page) {
        size_t i = (a - (uintptr_t)arena) / page;
        unsigned c = history[i].count, first = c > history_len ? c - history_len : 0;
        for (unsigned k = first; k < c; k++) {
            const page_event *e = &history[i].events[k % history_len];
            fprintf(stderr, "  page %zu, step %llu: %s gave %s for ", i, e->step, e->call,
                    pm_result_name(e->result));
            print_range("", e->offset, e->bytes, e->flags);
        }
    }
}

static bool pool_is_live(pm_mem_pool_t pool)
{
    if (pool && pool == default_pool)
        return true;
    for (int i = 0; i < m.n_pools; i++)
        if (m.pools[i] == pool)
            return true;
    return false;
}

/* ------------------------------------------------------------- pointers */

/* A pointer for a query or a free: around what is live, stale, or wild. */
static uint8_t *pick_pointer(bool for_unregister)
{
    switch (rnd(12)) {
    case 0:
    case 1:
        if (m.n_allocs) {
            /* Beside an allocation's pages may be pool memory, which only
             * unregister tells apart (the model does not see pool chunks). */
            const object *o = &m.allocs[rnd(m.n_allocs)];
            uint8_t *after = o->p + o->size;
            switch (rnd(for_unregister ? 2 : 4)) {
            case 0: return o->p;
            case 1: return o->p + rnd(o->size);
            case 2: return after;
            default: return o->p - 1;
            }
        }
        break;
    case 2:
    case 3:
        if (m.n_regs) {
            const object *o = &m.regs[rnd(m.n_regs)];
            switch (rnd(4)) {
            case 0: return o->p;
            case 1: return o->p + rnd(o->size);
            case 2: return o->p + o->size;
            default: return (uint8_t *)page_down((uintptr_t)o->p);
            }
        }
        break;
    case 4:
    case 5:
        if (m.n_pallocs) {
            const pool_alloc *a = &m.pallocs[rnd(m.n_pallocs)];
            /* Beside a block may be pool memory or not: only unregister must know. */
            switch (rnd(for_unregister ? 2 : 3)) {
            case 0: return a->p;
            case 1: return a->p + rnd(a->size);
            default: return a->p + a->size;
            }
        }
        break;
    case 6:
        if (m.n_stale) {
            unsigned i = (unsigned)rnd(m.n_stale < stale_slots ? m.n_stale : stale_slots);
            if (!for_unregister || !m.stale[i].pool)
                return m.stale[i].p;
        }
        break;
    case 7: return arena + rnd(arena_pages * page);
    case 8: return pageable + rnd(4096);
    case 9:
        switch (rnd(4)) {
        case 0: return NULL;
        case 1: return (uint8_t *)&data_anchor;
        case 2: return (uint8_t *)unmapped + rnd(page);
        default: return (uint8_t *)(uintptr_t)0xffff800000001000ull;
        }
    default: break;
    }
    return arena + rnd(arena_pages * page);
}

static bool answer_unsettled(uintptr_t q)
{
    return !alloc_at(q) && !reg_at(q) && beside_driver_placed(q, q + 1);
}

/* ------------------------------------------------------------ the calls */

static void op_host_alloc(void)
{
    static const size_t sizes[] = {0, 1, 100, 4095, 4096, 4097, 65539, (size_t)1 << 50, SIZE_MAX};
    static const unsigned flags[] = {0, 1, 2, 4, 5, 7, 8, 0x80000000u};
    const size_t size = sizes[rnd(sizeof sizes / sizeof sizes[0])];
    const unsigned f = flags[rnd(sizeof flags / sizeof flags[0])];
    const bool plain = one_in(3), null_out = one_in(20);
    void *p = (void *)1;
    pm_result r = plain ? pm_mem_alloc_host(null_out ? NULL : &p, size)
                        : pm_mem_host_alloc(null_out ? NULL : &p, size, f);
    const unsigned used = plain ? 0 : f;
    pm_result want = PM_SUCCESS;
    if (null_out || (used & ~7u))
        want = PM_ERROR_INVALID_VALUE;
    else if (size > ((size_t)1 << 40))
        want = PM_ERROR_OUT_OF_MEMORY;
    else if (size && m.n_allocs == max_allocs)
        want = r; /* the model holds no more: free it again below */
    else if (size && refused_by_limit(r))
        return;
    expect_result(r, want, "pm_mem_host_alloc", NULL);
    if (r != PM_SUCCESS || null_out)
        return;
    if (size == 0) {
        CHECK(p == NULL);
        return;
    }
    REQUIRE(p != NULL && p != (void *)1);
    ((volatile uint8_t *)p)[0] = 1;
    ((volatile uint8_t *)p)[size - 1] = 2;
    if (m.n_allocs == max_allocs) {
        CHECK_RESULT(pm_mem_free_host(p), PM_SUCCESS);
        return;
    }
    const bool driver_placed = cuda && (used & 4);
    if (!driver_placed)
        CHECK((uintptr_t)p % page == 0);
    m.allocs[m.n_allocs++] = (object){
        .p = p,
        .size = size,
        .flags = used | 2,
        .ext_lo = driver_placed ? (uintptr_t)p : page_down((uintptr_t)p),
        .ext_hi = driver_placed ? (uintptr_t)p + size : page_up((uintptr_t)p + size),
        .driver_placed = driver_placed,
    };
}

static void op_free_host(void)
{
    uint8_t *q = pick_pointer(false);
    pm_result r = pm_mem_free_host(q);
    int hit = -1;
    for (int i = 0; i < m.n_allocs; i++)
        if (m.allocs[i].p == q)
            hit = i;
    expect_result(r, !q || hit >= 0 ? PM_SUCCESS : PM_ERROR_INVALID_VALUE, "pm_mem_free_host", q);
    if (hit >= 0 && r == PM_SUCCESS) {
        remember_stale(q, false);
        m.allocs[hit] = m.allocs[--m.n_allocs];
    }
}

static void op_register(void)
{
    uint8_t *q;
    size_t n;
    unsigned f = one_in(4) ? PM_MEMHOSTREGISTER_PORTABLE : 0;
    if (one_in(8))
        f |= PM_MEMHOSTREGISTER_READ_ONLY;
    if (one_in(16))
        f |= PM_MEMHOSTREGISTER_IOMEMORY;
    if (one_in(20))
        f |= 0x10; /* not a flag */
    switch (rnd(10)) {
    case 0: /* inside what pinmem already pinned */
        if (m.n_allocs && one_in(2)) {
            const object *o = &m.allocs[rnd(m.n_allocs)];
            q = o->p + rnd(o->size);
            n = 1 + rnd(o->size - (size_t)(q - o->p));
            break;
        }
        if (m.n_pallocs) {
            const pool_alloc *a = &m.pallocs[rnd(m.n_pallocs)];
            q = a->p + rnd(a->size);
            n = 1 + rnd(a->size - (size_t)(q - a->p));
            break;
        }
        /* fall through */
    case 1:
        switch (rnd(5)) {
        case 0: q = NULL; n = page; break;
        case 1: q = arena; n = 0; break;
        case 2: q = (uint8_t *)(UINTPTR_MAX - 100); n = 200; break;
        case 3: q = (uint8_t *)unmapped; n = page; break;
        default: q = pageable + rnd(64); n = 1 + rnd(4000); break;
        }
        break;
    default: { /* the arena: a few pages, maybe over the read-only page or the hole */
        size_t first = rnd(arena_pages), pages = 1 + rnd(4);
        if (first + pages > arena_pages)
            pages = arena_pages - first;
        q = arena + first * page + (one_in(2) ? rnd(page) : 0);
        n = 1 + rnd(pages * page - (size_t)(q - (arena + first * page)));
        break;
    }
    }
    pm_result r = pm_mem_host_register(q, n, f);
    const uintptr_t u = (uintptr_t)q, lo = page_down(u);
    pm_result want = PM_SUCCESS;
    bool foreign = (uint8_t *)q >= pageable && (uint8_t *)q < pageable + 8192;
    if (!q || n == 0 || (f & ~0xfu))
        want = PM_ERROR_INVALID_VALUE;
    else if (n - 1 > UINTPTR_MAX - u)
        want = PM_ERROR_INVALID_VALUE;
    else if ((f & PM_MEMHOSTREGISTER_READ_ONLY) && !read_only_supported)
        want = PM_ERROR_NOT_SUPPORTED;
    else {
        const uintptr_t hi = page_up(u + n);
        const pm_result conflict = conflict_in(u, u + n);
        const page_sharing sharing = sharing_in(u, u + n, f);
        bool in_arena = u >= (uintptr_t)arena && u + n <= (uintptr_t)arena + arena_pages * page;
        bool over_hole = in_arena && lo <= (uintptr_t)arena + hole_page * page &&
                         hi > (uintptr_t)arena + hole_page * page;
        bool over_ro = in_arena && lo <= (uintptr_t)arena + ro_page * page &&
                       hi > (uintptr_t)arena + ro_page * page;
        if (conflict != PM_SUCCESS)
            want = conflict;
        else if (beside_driver_placed(lo, hi))
            want = r; /* the driver's answer: its pages are pinned */
        else if (sharing == SHARES_OTHER_KIND)
            want = PM_ERROR_INVALID_VALUE;
        else if (sharing == SHARES_READ_ONLY && cuda)
            want = r; /* the driver's answer, not in the table yet */
        else if (!in_arena && !foreign)
            want = PM_ERROR_INVALID_VALUE; /* unmapped */
        else if (over_hole && is_mapped((uintptr_t)arena + hole_page * page))
            want = r; /* someone else's mapping landed in the hole */
        else if (over_hole || (over_ro && !(f & PM_MEMHOSTREGISTER_READ_ONLY)) ||
                 (f & PM_MEMHOSTREGISTER_IOMEMORY))
            want = PM_ERROR_INVALID_VALUE;
        else if (m.n_regs == max_regs)
            want = r; /* the model holds no more: undone below */
        else if (refused_by_limit(r))
            return;
    }
    expect_result(r, want, "pm_mem_host_register", q);
    if (r != want)
        describe_registration(q, n, f);
    remember_pages("register", q, n, f, r);
    if (r != PM_SUCCESS)
        return;
    if (m.n_regs == max_regs || foreign) {
        CHECK_RESULT(pm_mem_host_unregister(q), PM_SUCCESS);
        remember_pages("unregister", q, n, f, PM_SUCCESS);
        return;
    }
    m.regs[m.n_regs++] = (object){
        .p = q,
        .size = n,
        .flags = (f & PM_MEMHOSTREGISTER_PORTABLE) | 2,
        .ext_lo = u,
        .ext_hi = u + n,
        .register_flags = f,
        .step = steps_done,
    };
}

static void op_unregister(void)
{
    uint8_t *q = pick_pointer(true);
    pm_result r = pm_mem_host_unregister(q);
    int hit = -1;
    for (int i = 0; i < m.n_regs; i++)
        if (m.regs[i].p == q)
            hit = i;
    /* Past an allocation's bytes, or beside a registration's in its pages:
     * not registered, as for pageable memory. */
    pm_result want = PM_ERROR_HOST_MEMORY_NOT_REGISTERED;
    const uintptr_t u = (uintptr_t)q;
    if (!q)
        want = PM_ERROR_INVALID_VALUE;
    else if (hit >= 0)
        want = PM_SUCCESS;
    else if (reg_at(u) || alloc_at(u) || pool_alloc_at(u))
        want = PM_ERROR_INVALID_VALUE;
    expect_result(r, want, "pm_mem_host_unregister", q);
    if (hit >= 0 && r == PM_SUCCESS) {
        remember_pages("unregister", q, m.regs[hit].size, m.regs[hit].register_flags, r);
        remember_stale(q, false);
        m.regs[hit] = m.regs[--m.n_regs];
    }
}

/* pm_mem_check_access over the arena: every page read-write but the
 * read-only one (refused to writes where the kernel says what a mapping
 * permits) and the hole (refused, unless something was mapped there since). */
static void check_access_of(const uint8_t *q, size_t n)
{
    const uintptr_t u = (uintptr_t)q;
    const unsigned access = 1 + (unsigned)rnd(3);
    pm_result r = pm_mem_check_access((pm_deviceptr)u, n, access, NULL, NULL);
    if (!in_arena(u, n))
        return;
    const uintptr_t ro = (uintptr_t)arena + ro_page * page, hole = (uintptr_t)arena + hole_page * page;
    const bool over_ro = u < ro + page && ro < u + n, over_hole = u < hole + page && hole < u + n;
    if (over_hole && is_mapped(hole))
        return;
    pm_capabilities caps = {.struct_size = sizeof caps};
    const bool tells = pm_get_capabilities(&caps) == PM_SUCCESS && caps.access_checks_permissions;
    const bool refused = over_hole || (over_ro && (access & PM_ACCESS_WRITE) && tells);
    expect_result(r, refused ? PM_ERROR_INVALID_VALUE : PM_SUCCESS, "pm_mem_check_access", q);
}

static void op_query(void)
{
    uint8_t *q = pick_pointer(false);
    const uintptr_t u = (uintptr_t)q;
    const object *o = alloc_at(u);
    if (!o)
        o = reg_at(u);
    const pool_alloc *a = o ? NULL : pool_alloc_at(u);
    const bool settled = !answer_unsettled(u);
    unsigned f = 0;
    pm_deviceptr d = 0, base = 0;
    size_t size = 0;
    pm_result r;
    switch (rnd(4)) {
    case 3:
        check_access_of(q, 1 + rnd(2 * page));
        break;
    case 0:
        if (one_in(30)) {
            expect_result(pm_mem_host_get_flags(NULL, q), PM_ERROR_INVALID_VALUE,
                          "pm_mem_host_get_flags(NULL)", q);
            break;
        }
        r = pm_mem_host_get_flags(&f, q);
        if (!settled)
            break;
        expect_result(r, o || a ? PM_SUCCESS : PM_ERROR_INVALID_VALUE, "pm_mem_host_get_flags", q);
        if (r == PM_SUCCESS && (o || a))
            CHECK(f == (o ? o->flags : (PM_MEMHOSTALLOC_PORTABLE | PM_MEMHOSTALLOC_DEVICEMAP)));
        break;
    case 1: {
        const unsigned bad = one_in(30) ? 1u : 0u;
        const bool null_out = one_in(30);
        r = pm_mem_host_get_device_pointer(null_out ? NULL : &d, q, bad);
        if (bad || null_out) {
            expect_result(r, PM_ERROR_INVALID_VALUE, "pm_mem_host_get_device_pointer(bad)", q);
            break;
        }
        if (!settled)
            break;
        expect_result(r, o || a ? PM_SUCCESS : PM_ERROR_INVALID_VALUE,
                      "pm_mem_host_get_device_pointer", q);
        if (r == PM_SUCCESS && (o || a))
            CHECK(d == (pm_deviceptr)u);
        break;
    }
    default:
        if (one_in(30)) {
            expect_result(pm_mem_get_address_range(NULL, NULL, (pm_deviceptr)u), PM_SUCCESS,
                          "pm_mem_get_address_range(NULL, NULL)", q);
            break;
        }
        r = pm_mem_get_address_range(&base, &size, (pm_deviceptr)u);
        if (!settled)
            break;
        /* device memory answers its allocation; on posix it is a mapping of
         * the process, which a pointer beside an allocation can reach */
        const bool in_dev = dev && u >= dev && u - dev < dev_bytes;
        expect_result(r, o || a || in_dev ? PM_SUCCESS : PM_ERROR_NOT_FOUND,
                      "pm_mem_get_address_range", q);
        if (r == PM_SUCCESS && in_dev)
            CHECK(base == dev && size == dev_bytes);
        if (r == PM_SUCCESS && o)
            CHECK(base == (uintptr_t)o->p && size == o->size);
        if (r == PM_SUCCESS && a)
            CHECK(base == (uintptr_t)a->p && size == a->size);
        break;
    }
}

/* ---------------------------------------------------------------- pools */

static pm_mem_pool_t pick_destroyed(void)
{
    return m.n_destroyed ? m.destroyed[rnd(m.n_destroyed < 8 ? m.n_destroyed : 8)] : NULL;
}

static pm_mem_pool_t pick_pool(void)
{
    switch (rnd(8)) {
    case 0: return NULL;
    case 1:
    case 2: return default_pool;
    case 3:
        if (m.n_destroyed)
            return pick_destroyed();
        /* fall through */
    default: return m.n_pools ? m.pools[rnd(m.n_pools)] : default_pool;
    }
}

static void op_pool_create(void)
{
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, (int)rnd(3)}};
    pm_result want = PM_SUCCESS;
    const pm_mem_pool_props *arg = &props;
    switch (rnd(8)) {
    case 0: arg = NULL; want = PM_ERROR_INVALID_VALUE; break;
    case 1: props.location.type = PM_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT; want = PM_ERROR_INVALID_VALUE; break;
    case 2: props.location = (pm_mem_location){PM_MEM_LOCATION_TYPE_HOST_NUMA, 999}; want = PM_ERROR_INVALID_VALUE; break;
    case 3: props.handle_types = 1; want = PM_ERROR_INVALID_VALUE; break;
    case 4: props.reserved[rnd(sizeof props.reserved)] = 1; want = PM_ERROR_INVALID_VALUE; break;
    case 5: props.location.type = PM_MEM_LOCATION_TYPE_INVALID; want = PM_ERROR_INVALID_VALUE; break;
    default: break;
    }
    if (want == PM_SUCCESS && m.n_pools == max_pools)
        return;
    pm_mem_pool_t pool = NULL;
    pm_result r = pm_mem_pool_create(one_in(40) ? NULL : &pool, arg);
    if (!pool && r == PM_ERROR_INVALID_VALUE && want == PM_SUCCESS)
        return; /* the NULL handle pointer */
    expect_result(r, want, "pm_mem_pool_create", NULL);
    if (r == PM_SUCCESS)
        m.pools[m.n_pools++] = pool;
}

static void op_pool_destroy(void)
{
    pm_mem_pool_t pool;
    switch (rnd(5)) {
    case 0: pool = NULL; break;
    case 1: pool = default_pool; break;
    case 2: /* a live pool rarely: the next one costs pinning its first chunk */
        pool = m.n_pools && one_in(4) ? m.pools[rnd(m.n_pools)] : pick_destroyed();
        break;
    default: pool = pick_destroyed(); break;
    }
    pm_result r = pm_mem_pool_destroy(pool);
    int hit = -1;
    for (int i = 0; i < m.n_pools; i++)
        if (m.pools[i] == pool)
            hit = i;
    expect_result(r, hit >= 0 ? PM_SUCCESS : PM_ERROR_INVALID_VALUE, "pm_mem_pool_destroy", pool);
    if (hit >= 0 && r == PM_SUCCESS) {
        m.pools[hit] = m.pools[--m.n_pools];
        /* Its allocations stay live until freed; its handle may come back as
         * another pool's, which the model then counts as live. */
        m.destroyed[m.n_destroyed++ % 8] = pool;
    }
}

static void op_pool_alloc(void)
{
    static const size_t sizes[] = {0, 1, 64, 100, 1000, 4096, 70000, (size_t)1 << 50};
    const size_t size = sizes[rnd(sizeof sizes / sizeof sizes[0])];
    pm_mem_pool_t pool = pick_pool();
    const bool null_out = one_in(30), async = one_in(3);
    void *p = NULL;
    pm_result r = async ? pm_mem_alloc_from_pool_async(null_out ? NULL : &p, size, pool, NULL)
                        : pm_mem_alloc_from_pool(null_out ? NULL : &p, size, pool);
    pm_result want = PM_SUCCESS;
    if (null_out || !pool_is_live(pool))
        want = PM_ERROR_INVALID_VALUE;
    else if (size > ((size_t)1 << 46))
        want = PM_ERROR_OUT_OF_MEMORY;
    else if (size && refused_by_limit(r))
        return;
    expect_result(r, want, "pm_mem_alloc_from_pool", pool);
    if (r != PM_SUCCESS || null_out)
        return;
    if (size == 0) {
        CHECK(p == NULL);
        return;
    }
    REQUIRE(p != NULL);
    memset(p, 0x5a, size < 256 ? size : 256);
    ((volatile uint8_t *)p)[size - 1] = 3;
    if (m.n_pallocs == max_pool_allocs) {
        CHECK_RESULT(pm_mem_free(p), PM_SUCCESS);
        return;
    }
    m.pallocs[m.n_pallocs++] = (pool_alloc){p, size};
}

static void op_pool_free(void)
{
    uint8_t *q = pick_pointer(false);
    const bool async = one_in(3);
    pm_result r = async ? pm_mem_free_async(q, NULL) : pm_mem_free(q);
    int hit = -1;
    for (int i = 0; i < m.n_pallocs; i++)
        if (m.pallocs[i].p == q)
            hit = i;
    expect_result(r, !q || hit >= 0 ? PM_SUCCESS : PM_ERROR_INVALID_VALUE, "pm_mem_free", q);
    if (hit >= 0 && r == PM_SUCCESS) {
        remember_stale(q, true);
        m.pallocs[hit] = m.pallocs[--m.n_pallocs];
    }
    if (async && one_in(4))
        CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
}

static void op_pool_misc(void)
{
    pm_mem_pool_t pool = pick_pool();
    const pm_result want = pool_is_live(pool) ? PM_SUCCESS : PM_ERROR_INVALID_VALUE;
    uint64_t v = 0;
    if (one_in(8)) /* rarely: pinning again after a trim costs a granule's worth */
        expect_result(pm_mem_pool_trim_to(pool, rnd(2) ? 0 : 1 << 20), want, "pm_mem_pool_trim_to",
                      pool);
    else
        expect_result(pm_mem_pool_get_attribute(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT, &v), want,
                      "pm_mem_pool_get_attribute", pool);
}

/* --------------------------------------------------------------- copies */

/* Whether the test may write [p, p + n): not over the arena's read-only page,
 * its hole or its end. */
static bool writable(const uint8_t *p, size_t n)
{
    const uint8_t *end = arena + arena_pages * page;
    if (p < arena || p >= end)
        return true;
    if (n > (size_t)(end - p))
        return false;
    const uintptr_t lo = page_down((uintptr_t)p), hi = page_up((uintptr_t)p + n);
    const uintptr_t ro = (uintptr_t)arena + ro_page * page, hole = (uintptr_t)arena + hole_page * page;
    return !(lo <= ro && hi > ro) && !(lo <= hole && hi > hole);
}

/* A few bytes of pinned or pageable memory to the device and back. */
static void op_copy(void)
{
    uint8_t *src = NULL;
    size_t n = 1 + rnd(4096);
    switch (rnd(5)) {
    case 0:
        if (m.n_allocs) {
            const object *o = &m.allocs[rnd(m.n_allocs)];
            src = o->p + rnd(o->size);
            n = 1 + rnd(o->size - (size_t)(src - o->p));
        }
        break;
    case 1:
        if (m.n_regs) /* may run past the registration into pageable memory */
            src = m.regs[rnd(m.n_regs)].p;
        break;
    case 2:
        if (m.n_pallocs) {
            const pool_alloc *a = &m.pallocs[rnd(m.n_pallocs)];
            src = a->p;
            n = 1 + rnd(a->size);
        }
        break;
    case 3: /* bad arguments */
        switch (rnd(3)) {
        case 0:
            expect_result(pm_memcpy_htod(dev, NULL, 16), PM_ERROR_INVALID_VALUE, "pm_memcpy_htod", NULL);
            break;
        case 1:
            expect_result(pm_memcpy_htod(dev, pageable, 0), PM_SUCCESS, "pm_memcpy_htod(0 bytes)", NULL);
            break;
        default:
            expect_result(pm_memcpy_dtoh((void *)(UINTPTR_MAX - 10), dev, 100),
                          PM_ERROR_INVALID_VALUE, "pm_memcpy_dtoh(wrapping)", NULL);
            break;
        }
        return;
    default: src = pageable; break;
    }
    if (!src)
        src = pageable;
    if (n > dev_bytes || !writable(src, n))
        return;
    const unsigned seed = (unsigned)rnd(1000);
    fill(src, n, seed);
    const bool async = one_in(2);
    if (async) {
        CHECK_RESULT(pm_memcpy_htod_async(dev, src, n, NULL), PM_SUCCESS);
        CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    } else {
        CHECK_RESULT(pm_memcpy_htod(dev, src, n), PM_SUCCESS);
    }
    memset(in_out, 0, n);
    CHECK_RESULT(pm_memcpy_dtoh(in_out, dev, n), PM_SUCCESS);
    CHECK(first_mismatch(in_out, n, seed) == n);
}

static void op_invalidate(void)
{
    switch (rnd(4)) {
    case 0:
        expect_result(pm_mem_invalidate(NULL, 0), PM_SUCCESS, "pm_mem_invalidate(NULL, 0)", NULL);
        break;
    case 1:
        expect_result(pm_mem_invalidate(NULL, 100), PM_ERROR_INVALID_VALUE, "pm_mem_invalidate", NULL);
        break;
    case 2:
        expect_result(pm_mem_invalidate((void *)(UINTPTR_MAX - 10), 100), PM_ERROR_INVALID_VALUE,
                      "pm_mem_invalidate(wrapping)", NULL);
        break;
    default: {
        uint8_t *q = pick_pointer(false);
        expect_result(pm_mem_invalidate(q ? q : arena, 1 + rnd(3 * page)), PM_SUCCESS,
                      "pm_mem_invalidate", q);
        break;
    }
    }
}

/* ------------------------------------------------ rare situations, once each */

/* What the sequence reaches only a few times a run or less, on pages that
 * other registrations share or touched before, each tried once in a mapping
 * of its own and answered as the model answers it: a failure names the
 * situation. */
typedef struct situation {
    const char *name;
    uint8_t *map;
    size_t len;
    void *registered[4];
    int n_registered;
} situation;

static bool situation_start(situation *s, const char *name, size_t pages)
{
    *s = (situation){.name = name, .len = pages * page};
    s->map = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        CHECK(!"a mapping for a rare situation");
    }
    return s->map != NULL;
}

static void situation_expect(const situation *s, const char *call, pm_result got, pm_result want)
{
    if (got != want && check_failed_())
        fprintf(stderr, "rare situation \"%s\": %s gave %s, the model expected %s (%s)\n",
                s->name, call, pm_result_name(got), pm_result_name(want),
                pm_last_error_detail());
}

static void situation_register(situation *s, size_t offset, size_t n, unsigned flags,
                               pm_result want)
{
    char call[96];
    snprintf(call, sizeof call, "register(+%zu, %zu bytes, flags %#x)", offset, n, flags);
    pm_result r = pm_mem_host_register(s->map + offset, n, flags);
    situation_expect(s, call, r, want);
    if (r == PM_SUCCESS && s->n_registered < 4)
        s->registered[s->n_registered++] = s->map + offset;
    else if (r == PM_SUCCESS)
        pm_mem_host_unregister(s->map + offset);
}

static void situation_unregister(situation *s, size_t offset, pm_result want)
{
    char call[64];
    snprintf(call, sizeof call, "unregister(+%zu)", offset);
    pm_result r = pm_mem_host_unregister(s->map + offset);
    situation_expect(s, call, r, want);
    for (int i = 0; r == PM_SUCCESS && i < s->n_registered; i++)
        if (s->registered[i] == s->map + offset)
            s->registered[i] = s->registered[--s->n_registered];
}

static void situation_end(situation *s)
{
    while (s->n_registered)
        CHECK_RESULT(pm_mem_host_unregister(s->registered[--s->n_registered]), PM_SUCCESS);
    if (s->map)
        munmap(s->map, s->len);
}

static void rare_situations(void)
{
    const size_t P = page;
    const unsigned RO = PM_MEMHOSTREGISTER_READ_ONLY;
    const pm_result ro_answer = read_only_supported ? PM_SUCCESS : PM_ERROR_NOT_SUPPORTED;
    situation s;

    if (situation_start(&s, "READ_ONLY over writable pages and a read-only one", 3)) {
        mprotect(s.map + P, P, PROT_READ);
        situation_register(&s, 100, 3 * P - 200, 0, PM_ERROR_INVALID_VALUE);
        situation_register(&s, 100, 3 * P - 200, RO, ro_answer);
        situation_end(&s);
    }
    if (situation_start(&s, "three registrations in one page, the last from its start", 2)) {
        situation_register(&s, 2000, 100, 0, PM_SUCCESS);
        situation_register(&s, 3000, 100, 0, PM_SUCCESS);
        situation_register(&s, 0, 1000, 0, PM_SUCCESS);
        situation_register(&s, 3500, P, PM_MEMHOSTREGISTER_PORTABLE, PM_SUCCESS);
        situation_end(&s);
    }
    if (read_only_supported &&
        situation_start(&s, "registrations sharing pages with a READ_ONLY one", 3)) {
        situation_register(&s, P + 2000, 100, RO, PM_SUCCESS);
        situation_register(&s, P, 1000, 0, PM_ERROR_INVALID_VALUE);
        situation_register(&s, P + 3000, P, 0, PM_ERROR_INVALID_VALUE);
        situation_register(&s, 100, P - 200, 0, PM_SUCCESS);
        situation_register(&s, P - 50, 40, RO, PM_ERROR_INVALID_VALUE);
        /* Two READ_ONLY ones on a page: pinmem's answer; the driver's is
         * printed until the spec's table has the row. */
        pm_result r = pm_mem_host_register(s.map + P + 2200, 100, RO);
        if (cuda)
            printf("rare situation \"%s\": a second READ_ONLY registration on the page: %s "
                   "(the driver's answer, not yet in the table)\n",
                   s.name, pm_result_name(r));
        else
            situation_expect(&s, "register(+P+2200, 100 bytes, READ_ONLY)", r, PM_SUCCESS);
        if (r == PM_SUCCESS)
            CHECK_RESULT(pm_mem_host_unregister(s.map + P + 2200), PM_SUCCESS);
        situation_unregister(&s, P + 2000, PM_SUCCESS);
        situation_register(&s, P, 1000, 0, PM_SUCCESS); /* the page holds none now */
        situation_end(&s);
    }
    if (situation_start(&s, "over the bytes of one unregistered while it shared a page", 2)) {
        situation_register(&s, 100, 100, 0, PM_SUCCESS);
        situation_register(&s, 1000, 100, 0, PM_SUCCESS);
        situation_unregister(&s, 100, PM_SUCCESS);
        situation_register(&s, 0, 500, 0, PM_SUCCESS);
        situation_unregister(&s, 1000, PM_SUCCESS);
        situation_register(&s, 600, P, 0, PM_SUCCESS);
        situation_end(&s);
    }
    if (situation_start(&s, "on a page where registrations were refused", 3)) {
        situation_register(&s, 3000, 100, 0, PM_SUCCESS);
        situation_register(&s, 0, 2 * P, 0, PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        situation_register(&s, 0, 1000, PM_MEMHOSTREGISTER_IOMEMORY, PM_ERROR_INVALID_VALUE);
        munmap(s.map + 2 * P, P);
        situation_register(&s, 3200, 2 * P, 0, PM_ERROR_INVALID_VALUE); /* over the hole */
        situation_register(&s, 0, 1000, 0, PM_SUCCESS);
        situation_register(&s, 3200, P, 0, PM_SUCCESS);
        situation_end(&s);
    }
    if (situation_start(&s, "pages registered READ_ONLY, written, registered again", 2)) {
        situation_register(&s, 0, 2 * P, RO, ro_answer);
        memset(s.map + P, 1, P); /* written while registered */
        if (read_only_supported)
            situation_unregister(&s, 0, PM_SUCCESS);
        memset(s.map, 2, 2 * P);
        situation_register(&s, 0, 2 * P, 0, PM_SUCCESS);
        situation_end(&s);
    }
    if (situation_start(&s, "frees and unregisters beside an unaligned registration", 2)) {
        situation_register(&s, 100, 100, 0, PM_SUCCESS);
        situation_expect(&s, "free_host(page start)", pm_mem_free_host(s.map),
                         PM_ERROR_INVALID_VALUE);
        situation_expect(&s, "free(page start)", pm_mem_free(s.map), PM_ERROR_INVALID_VALUE);
        situation_unregister(&s, 0, PM_ERROR_HOST_MEMORY_NOT_REGISTERED);
        situation_unregister(&s, 150, PM_ERROR_INVALID_VALUE);
        situation_register(&s, 1000, 100, 0, PM_SUCCESS);
        situation_register(&s, 0, 50, 0, PM_SUCCESS);
        situation_end(&s);
    }
    if (situation_start(&s, "page-aligned, its last page holding another registration", 3)) {
        situation_register(&s, P + 500, 100, 0, PM_SUCCESS);
        situation_register(&s, 0, P + 200, 0, PM_SUCCESS);
        situation_register(&s, P + 700, P, PM_MEMHOSTREGISTER_PORTABLE, PM_SUCCESS);
        situation_end(&s);
    }
}

/* ------------------------------------------------------------ the run */

static void setup(void)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
    arena = mmap(NULL, arena_pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unmapped = (void *)(uintptr_t)page; /* below mmap_min_addr: never mapped */
    pageable = malloc(8192);
    in_out = malloc(dev_bytes);
    if (arena == MAP_FAILED || !pageable || !in_out) {
        fprintf(stderr, "setup: out of memory\n");
        exit(1);
    }
    mprotect(arena + ro_page * page, page, PROT_READ);
    munmap(arena + hole_page * page, page);
    pm_capabilities c = {.struct_size = sizeof c};
    CHECK_RESULT(pm_get_capabilities(&c), PM_SUCCESS);
    cuda = strcmp(c.backend, "cuda") == 0;
    limit_binds = c.pinning_limited_by_memlock_rlimit;
    read_only_supported = c.read_only_host_register_supported;
    dev = device_alloc(dev_bytes);
    CHECK_RESULT(pm_mem_get_default_pool(&default_pool), PM_SUCCESS);
}

static void teardown(void)
{
    while (m.n_allocs)
        CHECK_RESULT(pm_mem_free_host(m.allocs[--m.n_allocs].p), PM_SUCCESS);
    while (m.n_regs)
        CHECK_RESULT(pm_mem_host_unregister(m.regs[--m.n_regs].p), PM_SUCCESS);
    while (m.n_pallocs)
        CHECK_RESULT(pm_mem_free(m.pallocs[--m.n_pallocs].p), PM_SUCCESS);
    while (m.n_pools)
        CHECK_RESULT(pm_mem_pool_destroy(m.pools[--m.n_pools]), PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    CHECK_RESULT(pm_mem_pool_trim_to(default_pool, 0), PM_SUCCESS);
    if (dev)
        device_free(dev);
    munmap(arena, arena_pages * page);
    free(pageable);
    free(in_out);
}

static unsigned long long env_number(const char *name, unsigned long long fallback)
{
    const char *s = getenv(name);
    return s && *s ? strtoull(s, NULL, 0) : fallback;
}

int main(void)
{
    seed = env_number("PINMEM_TEST_SEED", 0x5eed0f9a11ull);
    const unsigned long long steps = env_number("PINMEM_TEST_STEPS", 20000);
    printf("seed %#" PRIx64 " (PINMEM_TEST_SEED), %llu steps\n", seed, steps);
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    setup();
    rare_situations();
    void (*const ops[])(void) = {
        op_host_alloc, op_host_alloc, op_free_host, op_free_host, op_register, op_register,
        op_register,   op_unregister, op_unregister, op_query,    op_query,    op_query,
        op_query,      op_pool_create, op_pool_destroy, op_pool_alloc, op_pool_alloc,
        op_pool_alloc, op_pool_free,  op_pool_free,  op_pool_misc, op_copy,    op_copy,
        op_invalidate,
    };
    for (steps_done = 0; steps_done < steps && check_failures < 100; steps_done++) {
        rng_for_step(steps_done);
        ops[rnd(sizeof ops / sizeof ops[0])]();
    }
    teardown();
    if (refusals)
        printf("%llu requests refused by RLIMIT_MEMLOCK (accepted: the limit binds here)\n",
               refusals);
    return check_finish("api_random");
}
