/* One rule for the structs that carry their size: an older, smaller
 * struct_size is read or filled as far as it goes (nothing past it is
 * touched), a larger one is refused with PM_ERROR_INVALID_VALUE, as is one
 * too small to hold struct_size, and NULL. */
#include <stdbool.h>
#include <stddef.h>

#include "check.h"

/* A buffer larger than any of the structs, so that a call writing past
 * struct_size shows in the sentinel bytes. */
typedef union probe {
    size_t struct_size;
    unsigned char bytes[4096];
} probe;

static void fill_probe(probe *p, size_t struct_size)
{
    memset(p->bytes, 0xA5, sizeof p->bytes);
    p->struct_size = struct_size;
}

static bool untouched_after(const probe *p, size_t from)
{
    for (size_t i = from; i < sizeof p->bytes; i++)
        if (p->bytes[i] != 0xA5)
            return false;
    return true;
}

typedef pm_result (*get_fn)(void *);

static pm_result get_caps(void *p) { return pm_get_capabilities(p); }
static pm_result get_pool_stats(void *p) { return pm_mem_pool_get_stats(NULL, p); }
static pm_result get_copy_config(void *p) { return pm_copy_get_config(p); }
static pm_result get_copy_stats(void *p) { return pm_copy_get_stats(p); }
static pm_result get_setting(void *p) { return pm_get_setting(0, p); }

/* A get call: every size from the smallest to ours fills as far as it goes;
 * larger, smaller than struct_size itself, or NULL: refused. */
static void getter(const char *name, get_fn get, size_t ours, size_t old_size)
{
    probe p;
    size_t sizes[] = {sizeof(size_t), old_size, ours};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        fill_probe(&p, sizes[i]);
        CHECK_RESULT(get(&p), PM_SUCCESS);
        CHECK(p.struct_size == sizes[i]);
        if (!untouched_after(&p, sizes[i]))
            fprintf(stderr, "%s wrote past struct_size %zu\n", name, sizes[i]);
        CHECK(untouched_after(&p, sizes[i]));
    }
    size_t bad[] = {ours + 1, ours + 64, 4, 0};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        fill_probe(&p, bad[i]);
        pm_result r = get(&p);
        if (r != PM_ERROR_INVALID_VALUE)
            fprintf(stderr, "%s with struct_size %zu gave %s\n", name, bad[i], pm_result_name(r));
        CHECK(r == PM_ERROR_INVALID_VALUE);
        CHECK(untouched_after(&p, sizeof(size_t)));
    }
    CHECK_RESULT(get(NULL), PM_ERROR_INVALID_VALUE);
}

/* pm_copy_set_config: an older struct sets the fields it has and leaves
 * the others as they are; a larger one is refused. */
static void setter(void)
{
    pm_copy_config saved = {.struct_size = sizeof saved};
    REQUIRE_RESULT(pm_copy_get_config(&saved), PM_SUCCESS);
    pm_copy_config c = saved;
    c.htod_workers = 1;
    c.slice_bytes = 64 << 10;
    REQUIRE_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    /* A version that ends before staging_stores: workers changes, the
     * fields after it (slice_bytes, htod_workers) stay. */
    pm_copy_config older = saved;
    older.struct_size = offsetof(pm_copy_config, staging_stores);
    older.workers = 2;
    older.slice_bytes = 128 << 10; /* past its end: not read */
    older.htod_workers = 2;
    CHECK_RESULT(pm_copy_set_config(&older), PM_SUCCESS);
    pm_copy_config now = {.struct_size = sizeof now};
    CHECK_RESULT(pm_copy_get_config(&now), PM_SUCCESS);
    CHECK(now.workers == 2);
    CHECK(now.slice_bytes == 64 << 10);
    CHECK(now.htod_workers == 1);
    /* struct_size alone: nothing changes */
    size_t bare = sizeof(size_t);
    CHECK_RESULT(pm_copy_set_config((const pm_copy_config *)&bare), PM_SUCCESS);
    pm_copy_config same = {.struct_size = sizeof same};
    CHECK_RESULT(pm_copy_get_config(&same), PM_SUCCESS);
    CHECK(same.workers == now.workers && same.chunk_bytes == now.chunk_bytes &&
          same.buffers == now.buffers && same.direct_max == now.direct_max &&
          same.slice_bytes == now.slice_bytes && same.htod_workers == now.htod_workers &&
          same.staging_stores == now.staging_stores && same.pinned_budget == now.pinned_budget);
    probe p;
    fill_probe(&p, sizeof(pm_copy_config) + 8);
    memcpy(p.bytes + sizeof(size_t), (const unsigned char *)&saved + sizeof(size_t),
           sizeof saved - sizeof(size_t));
    CHECK_RESULT(pm_copy_set_config((const pm_copy_config *)&p), PM_ERROR_INVALID_VALUE);
    fill_probe(&p, 4);
    CHECK_RESULT(pm_copy_set_config((const pm_copy_config *)&p), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_copy_set_config(NULL), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
}

int main(void)
{
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    getter("pm_get_capabilities", get_caps, sizeof(pm_capabilities),
           offsetof(pm_capabilities, host_numa_node));
    getter("pm_mem_pool_get_stats", get_pool_stats, sizeof(pm_pool_stats),
           offsetof(pm_pool_stats, granule));
    getter("pm_copy_get_config", get_copy_config, sizeof(pm_copy_config),
           offsetof(pm_copy_config, staging_stores));
    getter("pm_copy_get_stats", get_copy_stats, sizeof(pm_copy_stats),
           offsetof(pm_copy_stats, staged_pieces));
    getter("pm_get_setting", get_setting, sizeof(pm_setting), offsetof(pm_setting, source));
    setter();
    return check_finish("test_versioned");
}
