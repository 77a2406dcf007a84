/* Two registrations that share a page, and copies across both and the gap
 * between them. The driver registers bytes, not pages, and refuses a DMA
 * that runs from a registration into pageable memory: each registration's
 * bytes must reach the backend as page-locked pieces of their own, and the
 * gap and the rest of their pages (pageable to the driver) never inside a
 * page-locked piece. A wrapper around the backend's queued copies records
 * the page-locked pieces; the bytes are checked as well. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "copy_util.h"

enum { max_pieces = 64 };

static struct {
    uintptr_t lo, hi; /* the mapping watched */
    uintptr_t piece_lo[max_pieces], piece_hi[max_pieces];
    atomic_int n;
} seen;

static pm_result (*real_htod_async)(pm_deviceptr, const void *, size_t, pm_stream_t, bool);
static pm_result (*real_dtoh_async)(void *, pm_deviceptr, size_t, pm_stream_t, bool);

static void note(const void *host, size_t n, bool pinned)
{
    const uintptr_t a = (uintptr_t)host;
    if (!pinned || a + n <= seen.lo || a >= seen.hi)
        return; /* pageable, or a staging buffer */
    int i = atomic_fetch_add(&seen.n, 1);
    if (i < max_pieces) {
        seen.piece_lo[i] = a;
        seen.piece_hi[i] = a + n;
    }
}

static pm_result noted_htod(pm_deviceptr d, const void *src, size_t n, pm_stream_t s, bool pinned)
{
    note(src, n, pinned);
    return real_htod_async(d, src, n, s, pinned);
}

static pm_result noted_dtoh(void *dst, pm_deviceptr d, size_t n, pm_stream_t s, bool pinned)
{
    note(dst, n, pinned);
    return real_dtoh_async(dst, d, n, s, pinned);
}

/* The page-locked pieces of the last copy within [seen.lo, seen.hi) are
 * exactly want[0..count), in order. */
static void check_pieces(const uintptr_t (*want)[2], int count, const char *what)
{
    const int n = atomic_load(&seen.n);
    bool same = n == count;
    for (int i = 0; same && i < n; i++)
        same = seen.piece_lo[i] == want[i][0] && seen.piece_hi[i] == want[i][1];
    CHECK(same);
    if (!same) {
        fprintf(stderr, "%s: %d page-locked pieces, expected %d:\n", what, n, count);
        for (int i = 0; i < n && i < max_pieces; i++)
            fprintf(stderr, "  [+%llu, +%llu)\n", (unsigned long long)(seen.piece_lo[i] - seen.lo),
                    (unsigned long long)(seen.piece_hi[i] - seen.lo));
    }
}

/* [from, from + n) of the mapping to the device and back, both directions
 * split as want says; async or not. */
static void copy_across(uint8_t *from, size_t n, const uintptr_t (*want)[2], int count,
                        uint8_t *back, pm_deviceptr dev, bool async, unsigned seed)
{
    fill(from, n, seed);
    atomic_store(&seen.n, 0);
    CHECK_RESULT(async ? pm_memcpy_htod_async(dev, from, n, NULL) : pm_memcpy_htod(dev, from, n),
                 PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    check_pieces(want, count, async ? "htod async" : "htod");
    memset(back, 0, n);
    CHECK_RESULT(pm_memcpy_dtoh(back, dev, n), PM_SUCCESS);
    CHECK(first_mismatch(back, n, seed) == n);

    memset(from, 0, n);
    fill(back, n, seed + 1);
    CHECK_RESULT(pm_memcpy_htod(dev, back, n), PM_SUCCESS);
    atomic_store(&seen.n, 0);
    CHECK_RESULT(async ? pm_memcpy_dtoh_async(from, dev, n, NULL) : pm_memcpy_dtoh(from, dev, n),
                 PM_SUCCESS);
    CHECK_RESULT(pm_stream_synchronize(NULL), PM_SUCCESS);
    check_pieces(want, count, async ? "dtoh async" : "dtoh");
    CHECK(first_mismatch(from, n, seed + 1) == n);
}

int main(void)
{
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    small_copy_config(0);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    /* A guard page, the shared page, the page the second registration runs
     * into, a guard page. */
    uint8_t *map = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *back = malloc(4 * page);
    pm_deviceptr dev = device_alloc(4 * page);
    REQUIRE_OR(map != MAP_FAILED && back && dev, check_finish("copy_shared_page"));
    uint8_t *const shared = map + page;
    uint8_t *const a = shared + 100, *const b = shared + 2000;
    const size_t a_len = 1000, b_len = page; /* b runs 2000 bytes into the next page */
    REQUIRE_RESULT_OR(pm_mem_host_register(a, a_len, 0), PM_SUCCESS,
                      check_finish("copy_shared_page"));
    pm_result second = pm_mem_host_register(b, b_len, 0);
    CHECK_RESULT(second, PM_SUCCESS);
    if (second == PM_SUCCESS) {
        pm_result ignored;
        pm__backend *be = &pm__instance_get(&ignored)->backend;
        real_htod_async = be->copy_htod_async;
        real_dtoh_async = be->copy_dtoh_async;
        be->copy_htod_async = noted_htod;
        be->copy_dtoh_async = noted_dtoh;
        seen.lo = (uintptr_t)map;
        seen.hi = (uintptr_t)map + 4 * page;
        const uintptr_t a_lo = (uintptr_t)a, a_hi = a_lo + a_len, b_lo = (uintptr_t)b;
        /* From before the first registration to past the second, through the
         * gap between them. */
        uint8_t *from = shared + 50;
        const size_t n = (size_t)(b + b_len + 500 - from);
        const uintptr_t both[2][2] = {{a_lo, a_hi}, {b_lo, b_lo + b_len}};
        copy_across(from, n, both, 2, back, dev, false, 1);
        copy_across(from, n, both, 2, back, dev, true, 2);
        /* From inside the first into the middle of the second. */
        from = a + 10;
        const size_t m = (size_t)(b + 700 - from);
        const uintptr_t parts[2][2] = {{a_lo + 10, a_hi}, {b_lo, b_lo + 700}};
        copy_across(from, m, parts, 2, back, dev, true, 3);
        /* The gap alone, and the gap with the first registration's last byte. */
        copy_across(a + a_len, (size_t)(b - (a + a_len)), NULL, 0, back, dev, true, 4);
        const uintptr_t last[1][2] = {{a_hi - 1, a_hi}};
        copy_across(a + a_len - 1, (size_t)(b - (a + a_len)) + 1, last, 1, back, dev, false, 5);
        /* With the first gone, the second is still one page-locked piece,
         * and the first's bytes are pageable. */
        CHECK_RESULT(pm_mem_host_unregister(a), PM_SUCCESS);
        const uintptr_t second[1][2] = {{b_lo, b_lo + b_len}};
        copy_across(a, (size_t)(b + b_len - a), second, 1, back, dev, true, 6);
        be->copy_htod_async = real_htod_async;
        be->copy_dtoh_async = real_dtoh_async;
        CHECK_RESULT(pm_mem_host_unregister(b), PM_SUCCESS);
    } else {
        CHECK_RESULT(pm_mem_host_unregister(a), PM_SUCCESS);
    }
    device_free(dev);
    free(back);
    munmap(map, 4 * page);
    return check_finish("copy_shared_page");
}
