#include "contract_cases.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pinmem.h"

static void expect(case_log *log, const char *label, long long got, long long expected)
{
    if (log->n == (int)(sizeof log->obs / sizeof log->obs[0]))
        return;
    observation *o = &log->obs[log->n++];
    snprintf(o->label, sizeof o->label, "%s", label);
    o->got = got;
    o->expected = expected;
}

static size_t page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static uint8_t *map_pages(size_t n, int prot)
{
    void *p = mmap(NULL, n * page(), prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
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
    expect(l, "register PROT_READ without READ_ONLY", a->host_register(ro, page(), 0),
           PM_ERROR_INVALID_VALUE);
    expect(l, "register PROT_READ with READ_ONLY", a->host_register(ro, page(), 8), PM_SUCCESS);
    expect(l, "... unregister", a->host_unregister(ro), PM_SUCCESS);
    munmap(ro, page());
}

static void register_stale_mapping(const host_api *a, case_log *l)
{
    const size_t len = 4 * page();
    uint8_t *buf = map_pages(4, PROT_READ | PROT_WRITE);
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
    {"register/stale_mapping", register_stale_mapping},
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

const host_api pinmem_host_api = {
    "pinmem",     p_alloc_host,     p_host_alloc, p_free_host,     p_register,
    p_unregister, p_device_pointer, p_get_flags,  p_address_range,
};
