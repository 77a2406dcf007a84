#include "contract_cases.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "instance.h"
#include "pinmem.h"

static void expect(case_log *log, const char *label, long long got, long long expected)
{
    if (log->n == (int)(sizeof log->obs / sizeof log->obs[0]))
        return;
    observation *o = &log->obs[log->n++];
    snprintf(o->label, sizeof o->label, "%s", label);
    o->got = got;
    o->expected = expected;
    o->answer[0] = o->note[0] = '\0';
}

static size_t page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static uint8_t *map_pages(size_t n, int prot)
{
    void *p = mmap(NULL, n * page(), prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Memory a case works on was made; otherwise a failed row, and the case
 * stops (it would work on what was not made). */
static bool made(case_log *l, const char *what, const void *p)
{
    if (!p)
        expect(l, what, 0, 1);
    return p != NULL;
}

/* ------------------------------------------------------------ allocation */

static void alloc_arguments(const host_api *a, case_log *l)
{
    void *p = (void *)1;
    expect(l, "alloc_host(NULL, 4096)", a->alloc_host(NULL, 4096), PM_ERROR_INVALID_VALUE);
    expect(l, "host_alloc(NULL, 4096, 0)", a->host_alloc(NULL, 4096, 0), PM_ERROR_INVALID_VALUE);
    expect(l, "alloc_host(&p, 0)", a->alloc_host(&p, 0), PM_SUCCESS);
    expect(l, "... sets *p to NULL", p == NULL, 1);
    p = (void *)1;
    expect(l, "host_alloc(&p, 0, 0)", a->host_alloc(&p, 0, 0), PM_SUCCESS);
    expect(l, "... sets *p to NULL", p == NULL, 1);
    expect(l, "host_alloc flags 0x8", a->host_alloc(&p, 4096, 0x8), PM_ERROR_INVALID_VALUE);
    expect(l, "host_alloc flags 0x80000000", a->host_alloc(&p, 4096, 0x80000000u),
           PM_ERROR_INVALID_VALUE);
    expect(l, "alloc_host SIZE_MAX", a->alloc_host(&p, SIZE_MAX), PM_ERROR_OUT_OF_MEMORY);
    expect(l, "alloc_host 2^50", a->alloc_host(&p, (size_t)1 << 50), PM_ERROR_OUT_OF_MEMORY);
    expect(l, "host_alloc 2^50 PORTABLE", a->host_alloc(&p, (size_t)1 << 50, 1),
           PM_ERROR_OUT_OF_MEMORY);
}

static void alloc_alignment(const host_api *a, case_log *l)
{
    static const size_t sizes[] = {1, 100, 4097, 3u << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = NULL;
        char label[64];
        snprintf(label, sizeof label, "alloc_host(%zu)", sizes[i]);
        expect(l, label, a->alloc_host(&p, sizes[i]), PM_SUCCESS);
        expect(l, "... page aligned", p && ((uintptr_t)p % page()) == 0, 1);
        if (p) {
            ((volatile uint8_t *)p)[sizes[i] - 1] = 7; /* writable to the last byte */
            expect(l, "... free", a->free_host(p), PM_SUCCESS);
        }
    }
    void *wc = NULL;
    expect(l, "host_alloc(4096, WRITECOMBINED)", a->host_alloc(&wc, 4096, 4), PM_SUCCESS);
    if (wc)
        expect(l, "... free", a->free_host(wc), PM_SUCCESS);
}

static void alloc_free_errors(const host_api *a, case_log *l)
{
    void *p = NULL;
    expect(l, "free(NULL)", a->free_host(NULL), PM_SUCCESS);
    expect(l, "alloc_host(8192)", a->alloc_host(&p, 8192), PM_SUCCESS);
    if (!p)
        return;
    expect(l, "free interior +1", a->free_host((uint8_t *)p + 1), PM_ERROR_INVALID_VALUE);
    expect(l, "free interior +4096", a->free_host((uint8_t *)p + 4096), PM_ERROR_INVALID_VALUE);
    expect(l, "free", a->free_host(p), PM_SUCCESS);
    expect(l, "double free", a->free_host(p), PM_ERROR_INVALID_VALUE);

    void *m = malloc(4096);
    expect(l, "free of malloc memory", a->free_host(m), PM_ERROR_INVALID_VALUE);
    free(m);

    uint8_t *buf = map_pages(2, PROT_READ | PROT_WRITE);
    if (!made(l, "map 2 pages", buf))
        return;
    expect(l, "register 2 pages", a->host_register(buf, 2 * page(), 0), PM_SUCCESS);
    expect(l, "free of registered memory", a->free_host(buf), PM_ERROR_INVALID_VALUE);
    expect(l, "unregister", a->host_unregister(buf), PM_SUCCESS);
    munmap(buf, 2 * page());
}

/* -------------------------------------------------- flags, device pointer */

static void flags_of_allocations(const host_api *a, case_log *l)
{
    static const unsigned alloc_flags[] = {0, 1, 2, 3, 4, 5, 6, 7};
    void *p = NULL;
    unsigned f = 0;
    expect(l, "alloc_host(4096)", a->alloc_host(&p, 4096), PM_SUCCESS);
    if (!made(l, "... made", p))
        return;
    expect(l, "get_flags(alloc_host)", a->get_flags(&f, p), PM_SUCCESS);
    expect(l, "... == DEVICEMAP", f, 0x2);
    f = 0;
    expect(l, "get_flags(interior +100)", a->get_flags(&f, (uint8_t *)p + 100), PM_SUCCESS);
    expect(l, "... == DEVICEMAP", f, 0x2);
    a->free_host(p);
    for (size_t i = 0; i < sizeof alloc_flags / sizeof alloc_flags[0]; i++) {
        char label[64];
        p = NULL;
        f = 0;
        snprintf(label, sizeof label, "host_alloc(flags %u)", alloc_flags[i]);
        expect(l, label, a->host_alloc(&p, 3 * page(), alloc_flags[i]), PM_SUCCESS);
        if (!made(l, "... made", p))
            continue;
        expect(l, "... get_flags", a->get_flags(&f, p), PM_SUCCESS);
        expect(l, "... == flags | DEVICEMAP", f, alloc_flags[i] | 0x2);
        f = 0;
        a->get_flags(&f, (uint8_t *)p + 2 * page() + 5);
        expect(l, "... interior pointer, same flags", f, alloc_flags[i] | 0x2);
        a->free_host(p);
    }
}

static void flags_errors(const host_api *a, case_log *l)
{
    unsigned f = 0;
    void *m = malloc(64), *p = NULL;
    expect(l, "get_flags(pageable)", a->get_flags(&f, m), PM_ERROR_INVALID_VALUE);
    a->alloc_host(&p, 4096);
    expect(l, "get_flags(NULL out)", a->get_flags(NULL, p), PM_ERROR_INVALID_VALUE);
    a->free_host(p);
    expect(l, "get_flags(freed memory)", a->get_flags(&f, p), PM_ERROR_INVALID_VALUE);
    free(m);
}

static void device_pointers(const host_api *a, case_log *l)
{
    static const unsigned alloc_flags[] = {0, 4, 1};
    for (size_t i = 0; i < sizeof alloc_flags / sizeof alloc_flags[0]; i++) {
        void *p = NULL;
        unsigned long long d = 0;
        char label[64];
        snprintf(label, sizeof label, "host_alloc(flags %u)", alloc_flags[i]);
        expect(l, label, a->host_alloc(&p, 2 * page(), alloc_flags[i]), PM_SUCCESS);
        if (!made(l, "... made", p))
            continue;
        expect(l, "... get_device_pointer", a->get_device_pointer(&d, p, 0), PM_SUCCESS);
        expect(l, "... equals the host pointer", d == (uintptr_t)p, 1);
        d = 0;
        expect(l, "... interior", a->get_device_pointer(&d, (uint8_t *)p + 4321, 0), PM_SUCCESS);
        expect(l, "... interior equals its host pointer", d == (uintptr_t)p + 4321, 1);
        expect(l, "... flags 1", a->get_device_pointer(&d, p, 1), PM_ERROR_INVALID_VALUE);
        expect(l, "... NULL out", a->get_device_pointer(NULL, p, 0), PM_ERROR_INVALID_VALUE);
        a->free_host(p);
    }
    unsigned long long d = 0;
    void *m = malloc(64);
    expect(l, "get_device_pointer(pageable)", a->get_device_pointer(&d, m, 0),
           PM_ERROR_INVALID_VALUE);
    free(m);
    uint8_t *buf = map_pages(2, PROT_READ | PROT_WRITE);
    if (!made(l, "map 2 pages", buf))
        return;
    expect(l, "register(+100, 5000, 0)", a->host_register(buf + 100, 5000, 0), PM_SUCCESS);
    expect(l, "... get_device_pointer", a->get_device_pointer(&d, buf + 200, 0), PM_SUCCESS);
    expect(l, "... equals the host pointer", d == (uintptr_t)(buf + 200), 1);
    a->host_unregister(buf + 100);
    munmap(buf, 2 * page());
}

/* -------------------------------------------------------- address ranges */

static void address_ranges(const host_api *a, case_log *l)
{
    void *p = NULL;
    unsigned long long base = 0;
    size_t size = 0;
    expect(l, "alloc_host(100)", a->alloc_host(&p, 100), PM_SUCCESS);
    uintptr_t u = (uintptr_t)p;
    expect(l, "range(base)", a->get_address_range(&base, &size, u), PM_SUCCESS);
    expect(l, "... base", base == u, 1);
    expect(l, "... size 100", (long long)size, 100);
    base = 0;
    size = 0;
    expect(l, "range(base + 50)", a->get_address_range(&base, &size, u + 50), PM_SUCCESS);
    expect(l, "... base", base == u, 1);
    expect(l, "... size 100", (long long)size, 100);
    base = 0;
    expect(l, "range(base + 99, size out NULL)", a->get_address_range(&base, NULL, u + 99),
           PM_SUCCESS);
    expect(l, "... base", base == u, 1);
    expect(l, "range(both out NULL)", a->get_address_range(NULL, NULL, u + 10), PM_SUCCESS);
    a->free_host(p);

    uint8_t *buf = map_pages(3, PROT_READ | PROT_WRITE);
    if (!made(l, "map 3 pages", buf))
        return;
    a->host_register(buf + 100, 5000, 0);
    base = 0;
    size = 0;
    expect(l, "range in a registration", a->get_address_range(&base, &size, (uintptr_t)buf + 4000),
           PM_SUCCESS);
    expect(l, "... base = registered pointer", base == (uintptr_t)buf + 100, 1);
    expect(l, "... size = registered size", (long long)size, 5000);
    a->host_unregister(buf + 100);
    munmap(buf, 3 * page());

    void *m = malloc(64);
    expect(l, "range(pageable)", a->get_address_range(&base, &size, (uintptr_t)m),
           PM_ERROR_NOT_FOUND);
    free(m);
}

/* ---------------------------------------------------------- registration */

static void register_arguments(const host_api *a, case_log *l)
{
    uint8_t *buf = map_pages(4, PROT_READ | PROT_WRITE);
    if (!made(l, "map 4 pages", buf))
        return;
    expect(l, "register(NULL)", a->host_register(NULL, 4096, 0), PM_ERROR_INVALID_VALUE);
    expect(l, "register(size 0)", a->host_register(buf, 0, 0), PM_ERROR_INVALID_VALUE);
    expect(l, "register(flags 0x10)", a->host_register(buf, 4096, 0x10), PM_ERROR_INVALID_VALUE);
    expect(l, "register(IOMEMORY on ordinary memory)", a->host_register(buf, 4096, 4),
           PM_ERROR_INVALID_VALUE);
    expect(l, "register kernel address space",
           a->host_register((void *)(uintptr_t)0xffff800000000000ull, 4096, 0),
           PM_ERROR_NOT_SUPPORTED);
    expect(l, "register [top - 100, +200): wraps around",
           a->host_register((void *)(UINTPTR_MAX - 100), 200, 0), PM_ERROR_INVALID_VALUE);
    expect(l, "... unregister it", a->host_unregister((void *)(UINTPTR_MAX - 100)),
           PM_ERROR_HOST_MEMORY_NOT_REGISTERED);
    /* In the last page without wrapping (pinmem: NOT_SUPPORTED, as for other
     * kernel addresses); the table has no row. */
    expect(l, "register [top - 100, +101): the last page, no wrap",
           a->host_register((void *)(UINTPTR_MAX - 100), 101, 0), EXPECT_UNKNOWN);
    expect(l, "register [top - 4095, +4096): the whole last page",
           a->host_register((void *)(UINTPTR_MAX - 4095), 4096, 0), EXPECT_UNKNOWN);
    expect(l, "register(+100, 5000) unaligned", a->host_register(buf + 100, 5000, 0), PM_SUCCESS);
    expect(l, "same range again", a->host_register(buf + 100, 5000, 0),
           PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    expect(l, "overlapping range", a->host_register(buf + 4096, 4096, 0),
           PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    expect(l, "disjoint range on other pages", a->host_register(buf + 3 * page(), page(), 0),
           PM_SUCCESS);
    expect(l, "unregister interior", a->host_unregister(buf + 200), PM_ERROR_INVALID_VALUE);
    expect(l, "unregister NULL", a->host_unregister(NULL), PM_ERROR_INVALID_VALUE);
    expect(l, "unregister", a->host_unregister(buf + 100), PM_SUCCESS);
    expect(l, "unregister twice", a->host_unregister(buf + 100),
           PM_ERROR_HOST_MEMORY_NOT_REGISTERED);
    expect(l, "unregister disjoint", a->host_unregister(buf + 3 * page()), PM_SUCCESS);
    void *m = malloc(64);
    expect(l, "unregister pageable", a->host_unregister(m), PM_ERROR_HOST_MEMORY_NOT_REGISTERED);
    free(m);
    munmap(buf, 4 * page());
}

static void register_flags(const host_api *a, case_log *l)
{
    static const unsigned reg[] = {1, 2, 8, 0};
    static const unsigned reported[] = {0x3, 0x2, 0x2, 0x2};
    uint8_t *buf = map_pages(1, PROT_READ | PROT_WRITE);
    if (!made(l, "map a page", buf))
        return;
    for (size_t i = 0; i < sizeof reg / sizeof reg[0]; i++) {
        unsigned f = 0;
        char label[64];
        snprintf(label, sizeof label, "register(flags %u)", reg[i]);
        expect(l, label, a->host_register(buf, page(), reg[i]), PM_SUCCESS);
        expect(l, "... get_flags", a->get_flags(&f, buf + 10), PM_SUCCESS);
        expect(l, "... reported flags", f, reported[i]);
        expect(l, "... unregister", a->host_unregister(buf), PM_SUCCESS);
    }
    munmap(buf, page());
}

static void register_other_memory(const host_api *a, case_log *l)
{
    void *p = NULL;
    a->alloc_host(&p, 2 * page());
    expect(l, "register host_alloc memory", a->host_register(p, page(), 0), PM_ERROR_INVALID_VALUE);
    expect(l, "unregister host_alloc memory", a->host_unregister(p), PM_ERROR_INVALID_VALUE);
    a->free_host(p);

    uint8_t *gone = map_pages(2, PROT_READ | PROT_WRITE);
    munmap(gone, 2 * page());
    expect(l, "register an unmapped range", a->host_register(gone, 2 * page(), 0),
           PM_ERROR_INVALID_VALUE);

    uint8_t *ro = map_pages(1, PROT_READ);
    if (!made(l, "map a read-only page", ro))
        return;
    expect(l, "register PROT_READ without READ_ONLY", a->host_register(ro, page(), 0),
           PM_ERROR_INVALID_VALUE);
    expect(l, "register PROT_READ with READ_ONLY", a->host_register(ro, page(), 8), PM_SUCCESS);
    expect(l, "... unregister", a->host_unregister(ro), PM_SUCCESS);
    munmap(ro, page());
}

/* A registration row; one that registered where the row expects a refusal
 * is undone (not a row: both sides run the same rows whatever they answer),
 * so that the rows after it start as they should. */
static void register_row(const host_api *a, case_log *l, const char *label, uint8_t *q,
                         size_t n, unsigned flags, long long expected)
{
    int rc = a->host_register(q, n, flags);
    expect(l, label, rc, expected);
    if (rc == 0 && expected != PM_SUCCESS)
        a->host_unregister(q);
}

/* A registration may share a page with another, but not one of the other
 * READ_ONLY-ness (docs/driver-behavior.md). Whether two READ_ONLY ones may
 * share a page, and which answer wins where a registration also overlaps
 * the other's bytes, the table does not say yet: the differential test
 * prints the driver's answers. */
static void register_read_only_pages(const host_api *a, case_log *l)
{
    const size_t P = page();
    uint8_t *buf = map_pages(3, PROT_READ | PROT_WRITE);
    if (!made(l, "map 3 pages", buf))
        return;
    register_row(a, l, "READ_ONLY [P+2000, +100)", buf + P + 2000, 100, 8, PM_SUCCESS);
    register_row(a, l, "writable [P, +1000), on its page", buf + P, 1000, 0,
                 PM_ERROR_INVALID_VALUE);
    register_row(a, l, "writable [P+3000, +P), from its page into the next", buf + P + 3000, P, 0,
                 PM_ERROR_INVALID_VALUE);
    register_row(a, l, "writable [P-1000, +2000), its last page the READ_ONLY one's",
                 buf + P - 1000, 2000, 0, PM_ERROR_INVALID_VALUE);
    register_row(a, l, "writable [100, +P-200), on page 0 only", buf + 100, P - 200, 0,
                 PM_SUCCESS);
    register_row(a, l, "READ_ONLY [P-50, +40), on the writable one's page", buf + P - 50, 40, 8,
                 PM_ERROR_INVALID_VALUE);
    register_row(a, l, "writable [P+2050, +10), on the READ_ONLY one's bytes", buf + P + 2050, 10,
                 0, EXPECT_UNKNOWN);
    register_row(a, l, "READ_ONLY [P+2200, +100), on the READ_ONLY one's page", buf + P + 2200,
                 100, 8, EXPECT_UNKNOWN);
    expect(l, "unregister the READ_ONLY one", a->host_unregister(buf + P + 2000), PM_SUCCESS);
    register_row(a, l, "writable [P, +1000), once it is gone", buf + P, 1000, 0, PM_SUCCESS);
    expect(l, "... unregister", a->host_unregister(buf + P), PM_SUCCESS);
    expect(l, "unregister the one on page 0", a->host_unregister(buf + 100), PM_SUCCESS);
    munmap(buf, 3 * P);
}

static void register_stale_mapping(const host_api *a, case_log *l)
{
    const size_t len = 4 * page();
    uint8_t *buf = map_pages(4, PROT_READ | PROT_WRITE);
    if (!made(l, "map 4 pages", buf))
        return;
    expect(l, "register", a->host_register(buf, len, 0), PM_SUCCESS);
    munmap(buf, len);
    void *again = mmap(buf, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                       -1, 0);
    expect(l, "mmap again at the same address", again == (void *)buf, 1);
    expect(l, "register the new mapping", a->host_register(buf, len, 0),
           PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    expect(l, "unregister the stale registration", a->host_unregister(buf), PM_SUCCESS);
    expect(l, "register the new mapping now", a->host_register(buf, len, 0), PM_SUCCESS);
    expect(l, "... unregister", a->host_unregister(buf), PM_SUCCESS);
    munmap(buf, len);
}

/* ---------------------------------------------------------------- sweeps */

/* Every call that takes a pointer, at every pointer around an object: the
 * byte before it, the start of its first page, its first and last bytes, the
 * byte after it, the last byte of its last page and the byte after that page.
 * Objects are allocations of odd sizes and registrations, aligned and not
 * (registered inside a mapping with a mapped guard page on either side, so
 * that every pointer probed is mapped memory). Each probe runs on an object
 * in its first state: a call that took it away (free, unregister) is
 * followed by a fresh one, a registration a probe made is undone.
 *
 * Expected answers are the driver's, which answers for bytes, not pages
 * (docs/driver-behavior.md): inside the object's bytes, the spec's rows; in
 * the rest of its pages, those of pageable memory, except that a byte of an
 * allocation's pages cannot be registered (it is pinned already) while a
 * byte beside a registration can (two registrations may share a page). Memory
 * beside an allocation's pages is whatever the allocator placed there, and
 * the driver packs write-combined allocations closer than pages: those rows
 * are EXPECT_LAYOUT. */

enum sweep_call { S_FLAGS, S_DEVPTR, S_RANGE, S_REGISTER, S_UNREGISTER, S_FREE, S_CALLS };
static const char *const call_names[S_CALLS] = {"get_flags", "get_device_pointer",
                                                "get_address_range", "register(q, 1)",
                                                "unregister", "free_host"};
enum { P_BEFORE, P_PAGE, P_FIRST, P_LAST, P_AFTER, P_PAGE_LAST, P_PAGE_AFTER, P_POINTERS };
static const char *const pointer_names[P_POINTERS] = {"p-1",    "page(p)",   "p",    "p+size-1",
                                                      "p+size", "end(p)-1", "end(p)"};
/* Where a probed pointer lies, seen from the object. */
enum { IN_BYTES, IN_PAGES, BESIDE };

typedef struct sweep_spec {
    const char *name;
    int registered;  /* 0: allocated with alloc_host (flags ~0u) or host_alloc(flags) */
    unsigned flags;  /* host_alloc flags, or register flags */
    size_t offset;   /* registrations: from the first page after the guard page */
    size_t size;
} sweep_spec;

typedef struct sweep_object {
    const sweep_spec *spec;
    uint8_t *p;
    uint8_t *map; /* registrations: guard page, pages, guard page */
    size_t map_len;
} sweep_object;

static uintptr_t page_down(uintptr_t a) { return a & ~(uintptr_t)(page() - 1); }
static uintptr_t page_up(uintptr_t a) { return page_down(a + page() - 1); }

static int object_make(const host_api *a, sweep_object *o)
{
    const sweep_spec *sp = o->spec;
    void *p = NULL;
    if (!sp->registered) {
        int rc = sp->flags == ~0u ? a->alloc_host(&p, sp->size) : a->host_alloc(&p, sp->size, sp->flags);
        o->p = p;
        return rc == 0 && p ? 0 : -1;
    }
    if (!o->map) {
        o->map_len = page_up(sp->offset + sp->size) + 2 * page();
        o->map = map_pages(o->map_len / page(), PROT_READ | PROT_WRITE);
        if (!o->map)
            return -1;
    }
    o->p = o->map + page() + sp->offset;
    return a->host_register(o->p, sp->size, sp->flags) == 0 ? 0 : -1;
}

static void object_drop(const host_api *a, sweep_object *o)
{
    if (o->spec->registered)
        a->host_unregister(o->p);
    else
        a->free_host(o->p);
}

static uint8_t *pointer_at(const sweep_object *o, int which)
{
    const uintptr_t p = (uintptr_t)o->p, end = page_up(p + o->spec->size);
    switch (which) {
    case P_BEFORE: return (uint8_t *)(p - 1);
    case P_PAGE: return (uint8_t *)page_down(p);
    case P_FIRST: return (uint8_t *)p;
    case P_LAST: return (uint8_t *)(p + o->spec->size - 1);
    case P_AFTER: return (uint8_t *)(p + o->spec->size);
    case P_PAGE_LAST: return (uint8_t *)(end - 1);
    default: return (uint8_t *)end;
    }
}

static int where(const sweep_object *o, const uint8_t *q)
{
    const uintptr_t p = (uintptr_t)o->p, u = (uintptr_t)q;
    if (u >= p && u - p < o->spec->size)
        return IN_BYTES;
    if (u >= page_down(p) && u < page_up(p + o->spec->size))
        return IN_PAGES;
    return BESIDE;
}

/* The flags queries report for the object (spec: DEVICEMAP always, and
 * PORTABLE kept from a registration's flags). */
static unsigned reported_flags(const sweep_spec *sp)
{
    if (sp->registered)
        return (sp->flags & 1) | 0x2;
    return (sp->flags == ~0u ? 0 : sp->flags) | 0x2;
}

/* Write-combined allocations, which the driver packs closer than pages. */
static bool packed(const sweep_spec *sp)
{
    return !sp->registered && sp->flags != ~0u && (sp->flags & 4);
}

/* The driver's answer, or EXPECT_LAYOUT. */
static long long sweep_expected(const sweep_object *o, int call, const uint8_t *q)
{
    const int at = where(o, q), reg = o->spec->registered, base = q == o->p;
    if (at != IN_BYTES && !reg && (at == BESIDE || packed(o->spec)))
        return EXPECT_LAYOUT;
    if (call == S_FREE) /* not the base of a live allocation, or the base of the one */
        return !reg && base ? PM_SUCCESS : PM_ERROR_INVALID_VALUE;
    if (at == IN_BYTES) {
        switch (call) {
        case S_FLAGS: case S_DEVPTR: case S_RANGE: return PM_SUCCESS;
        case S_REGISTER: return reg ? PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED : PM_ERROR_INVALID_VALUE;
        default: return reg && base ? PM_SUCCESS : PM_ERROR_INVALID_VALUE;
        }
    }
    switch (call) { /* pageable memory, in the object's pages or beside a registration */
    case S_FLAGS: case S_DEVPTR: return PM_ERROR_INVALID_VALUE;
    case S_RANGE: return PM_ERROR_NOT_FOUND;
    case S_REGISTER: return reg ? PM_SUCCESS : PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    default: return PM_ERROR_HOST_MEMORY_NOT_REGISTERED;
    }
}

/* "INVALID_VALUE", or the number of a code pinmem has no name for. */
static void code_name(char *out, size_t cap, int rc)
{
    const char *n = pm_result_name((pm_result)rc);
    if (strcmp(n, "PM_ERROR_UNRECOGNIZED") == 0)
        snprintf(out, cap, "code %d", rc);
    else
        snprintf(out, cap, "%s", strncmp(n, "PM_ERROR_", 9) == 0 ? n + 9 : n + 3);
}

/* "p+12", "p-4096", "q": an address relative to the object's base, or to q. */
static void relative(char *out, size_t cap, const char *name, uintptr_t v, uintptr_t to)
{
    if (v == to)
        snprintf(out, cap, "%s", name);
    else if (v > to)
        snprintf(out, cap, "%s+%llu", name, (unsigned long long)(v - to));
    else
        snprintf(out, cap, "%s-%llu", name, (unsigned long long)(to - v));
}

static bool is_mapped(const void *q)
{
    return msync((void *)page_down((uintptr_t)q), page(), MS_ASYNC) == 0;
}

/* One probe: the call at q, recorded with its answer spelled out. Returns
 * the call's code. */
static int probe(const host_api *a, case_log *l, sweep_object *o, int call, int which)
{
    uint8_t *q = pointer_at(o, which);
    const uintptr_t p = (uintptr_t)o->p;
    unsigned f = 0;
    unsigned long long d = 0, b = 0;
    size_t n = 0;
    int rc = 0;
    bool right = true;
    const bool mapped = is_mapped(q); /* before the call, which may unmap it */
    char value[40] = "", at[24];
    switch (call) {
    case S_FLAGS:
        rc = a->get_flags(&f, q);
        right = f == reported_flags(o->spec);
        snprintf(value, sizeof value, " flags=0x%x", f);
        break;
    case S_DEVPTR:
        rc = a->get_device_pointer(&d, q, 0);
        right = d == (uintptr_t)q;
        relative(at, sizeof at, "q", (uintptr_t)d, (uintptr_t)q);
        snprintf(value, sizeof value, " d=%s", at);
        break;
    case S_RANGE:
        rc = a->get_address_range(&b, &n, (uintptr_t)q);
        right = b == p && n == o->spec->size;
        relative(at, sizeof at, "p", (uintptr_t)b, p);
        snprintf(value, sizeof value, " base=%s size=%zu", at, n);
        break;
    case S_REGISTER:
        rc = a->host_register(q, 1, 0);
        if (rc == 0)
            a->host_unregister(q);
        break;
    case S_UNREGISTER:
        rc = a->host_unregister(q);
        break;
    default:
        rc = a->free_host(q);
        break;
    }
    if (l->n < (int)(sizeof l->obs / sizeof l->obs[0])) {
        observation *ob = &l->obs[l->n++];
        snprintf(ob->label, sizeof ob->label, "%s | %s | %s", o->spec->name, call_names[call],
                 pointer_names[which]);
        ob->got = rc != 0 ? rc : right ? 0 : GOT_WRONG_VALUE;
        ob->expected = sweep_expected(o, call, q);
        char name[32];
        code_name(name, sizeof name, rc);
        snprintf(ob->answer, sizeof ob->answer, "%s%s", name, rc == 0 ? value : "");
        char known[24] = "";
        if (a->describe)
            a->describe(q, known, sizeof known);
        snprintf(ob->note, sizeof ob->note, "%s%s%s", mapped ? "" : "q unmapped",
                 !mapped && known[0] ? ", " : "", known);
    }
    return rc;
}

static void sweep(const host_api *a, case_log *l, const sweep_spec *specs, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        sweep_object o = {.spec = &specs[i]};
        char label[96];
        snprintf(label, sizeof label, "%s | make", specs[i].name);
        if (object_make(a, &o) != 0) {
            expect(l, label, -1, 0);
            if (o.map)
                munmap(o.map, o.map_len);
            continue;
        }
        bool alive = true;
        for (int call = 0; call < S_CALLS && alive; call++) {
            for (int which = 0; which < P_POINTERS && alive; which++) {
                int rc = probe(a, l, &o, call, which);
                /* Whatever took the object away, or may have: start again. */
                if (rc == 0 && (call == S_UNREGISTER || call == S_FREE)) {
                    if (pointer_at(&o, which) != o.p)
                        object_drop(a, &o);
                    alive = object_make(a, &o) == 0;
                    if (!alive)
                        expect(l, label, -1, 0);
                }
            }
        }
        if (alive)
            object_drop(a, &o);
        if (o.map)
            munmap(o.map, o.map_len);
    }
}

#define MIB_3 (((size_t)1 << 20) + 3)

static void sweep_alloc_host(const host_api *a, case_log *l)
{
    static const sweep_spec specs[] = {
        {"alloc_host(1)", 0, ~0u, 0, 1},         {"alloc_host(100)", 0, ~0u, 0, 100},
        {"alloc_host(4095)", 0, ~0u, 0, 4095},   {"alloc_host(4097)", 0, ~0u, 0, 4097},
        {"alloc_host(1M+3)", 0, ~0u, 0, MIB_3},
    };
    sweep(a, l, specs, sizeof specs / sizeof specs[0]);
}

static void sweep_host_alloc(const host_api *a, case_log *l)
{
    static const sweep_spec specs[] = {
        {"host_alloc(1, WC)", 0, 4, 0, 1},         {"host_alloc(100, WC)", 0, 4, 0, 100},
        {"host_alloc(4095, WC)", 0, 4, 0, 4095},   {"host_alloc(4097, WC)", 0, 4, 0, 4097},
        {"host_alloc(1M+3, WC)", 0, 4, 0, MIB_3},  {"host_alloc(1, PORTABLE)", 0, 1, 0, 1},
        {"host_alloc(4097, PORTABLE)", 0, 1, 0, 4097},
    };
    sweep(a, l, specs, sizeof specs / sizeof specs[0]);
}

static void sweep_register(const host_api *a, case_log *l)
{
    const size_t pg = page();
    const sweep_spec specs[] = {
        {"register(aligned, 2 pages)", 1, 0, 0, 2 * pg},
        {"register(aligned, 5000)", 1, 0, 0, 5000},
        {"register(+100, 5000)", 1, 0, 100, 5000},
        {"register(+100, 1)", 1, 0, 100, 1},
        {"register(page-1, 2)", 1, 0, pg - 1, 2},
        {"register(+100, to a page end)", 1, 1, 100, 2 * pg - 100},
    };
    sweep(a, l, specs, sizeof specs / sizeof specs[0]);
}

const contract_case contract_cases[] = {
    {"alloc/arguments", alloc_arguments},
    {"alloc/alignment", alloc_alignment},
    {"alloc/free_errors", alloc_free_errors},
    {"flags/allocations", flags_of_allocations},
    {"flags/errors", flags_errors},
    {"flags/device_pointers", device_pointers},
    {"range/address_ranges", address_ranges},
    {"register/arguments", register_arguments},
    {"register/flags", register_flags},
    {"register/other_memory", register_other_memory},
    {"register/read_only_pages", register_read_only_pages},
    {"register/stale_mapping", register_stale_mapping},
    {"sweep/alloc_host", sweep_alloc_host},
    {"sweep/host_alloc", sweep_host_alloc},
    {"sweep/register", sweep_register},
};
const size_t contract_case_count = sizeof contract_cases / sizeof contract_cases[0];

static int p_alloc_host(void **pp, size_t n) { return pm_mem_alloc_host(pp, n); }
static int p_host_alloc(void **pp, size_t n, unsigned f) { return pm_mem_host_alloc(pp, n, f); }
static int p_free_host(void *p) { return pm_mem_free_host(p); }
static int p_register(void *p, size_t n, unsigned f) { return pm_mem_host_register(p, n, f); }
static int p_unregister(void *p) { return pm_mem_host_unregister(p); }
static int p_device_pointer(unsigned long long *d, void *p, unsigned f)
{
    return pm_mem_host_get_device_pointer(d, p, f);
}
static int p_get_flags(unsigned *f, void *p) { return pm_mem_host_get_flags(f, p); }
static int p_address_range(unsigned long long *b, size_t *s, unsigned long long d)
{
    return pm_mem_get_address_range(b, s, d);
}

static void p_describe(const void *q, char *out, size_t cap)
{
    pm_result r;
    pm__instance *inst = pm__instance_get(&r);
    pm__range range;
    if (inst && !pm__ranges_find(inst->ranges, (uintptr_t)q, &range) &&
        pm__ranges_find_extent(inst->ranges, (uintptr_t)q, &range))
        snprintf(out, cap, "pinmem's pages");
}

const host_api pinmem_host_api = {
    "pinmem",     p_alloc_host,     p_host_alloc, p_free_host,     p_register,
    p_unregister, p_device_pointer, p_get_flags,  p_address_range, p_describe,
};
