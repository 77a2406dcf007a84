/* Settings: every PINMEM_* variable and every pm_copy_config field is held
 * to the same rules, whichever way it comes. From the environment (each
 * case in a child, as the variables are read once): a bad value makes
 * pm_init and later calls fail with INVALID_VALUE naming the variable; a
 * good one is in effect, page-rounded where it is a size of memory, and
 * pm_copy_set_config(pm_copy_get_config()) takes it back. From code: the
 * same values are refused or taken the same way. pm_get_setting tells
 * where each value came from; pm_set_pinned_budget is the budget of
 * pm_copy_config. */
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

/* The setting named name, or false. */
static bool setting(const char *name, pm_setting *out)
{
    out->struct_size = sizeof *out;
    for (unsigned i = 0; pm_get_setting(i, out) == PM_SUCCESS; i++)
        if (strcmp(out->name, name) == 0)
            return true;
    return false;
}

static pm_copy_config current(void)
{
    pm_copy_config c = {.struct_size = sizeof c};
    CHECK_RESULT(pm_copy_get_config(&c), PM_SUCCESS);
    return c;
}

/* Field by field (the struct has padding). */
static bool same_config(const pm_copy_config *a, const pm_copy_config *b)
{
    return a->workers == b->workers && a->chunk_bytes == b->chunk_bytes &&
           a->buffers == b->buffers && a->direct_max == b->direct_max &&
           a->registration_cache == b->registration_cache &&
           a->cache_min_bytes == b->cache_min_bytes && a->cache_max_bytes == b->cache_max_bytes &&
           a->pinned_budget == b->pinned_budget && a->staging_stores == b->staging_stores &&
           a->slice_bytes == b->slice_bytes && a->htod_workers == b->htod_workers &&
           a->first_piece_bytes == b->first_piece_bytes && a->pieces == b->pieces &&
           a->spin_us == b->spin_us && a->ring == b->ring && a->batch == b->batch &&
           a->dtoh_direct_max == b->dtoh_direct_max && a->dtoh_slice_bytes == b->dtoh_slice_bytes &&
           a->dtoh_first_piece_bytes == b->dtoh_first_piece_bytes;
}

/* The configuration in effect goes back in unchanged. */
static void round_trip(void)
{
    pm_copy_config before = current();
    CHECK_RESULT(pm_copy_set_config(&before), PM_SUCCESS);
    pm_copy_config after = current();
    CHECK(same_config(&before, &after));
}

typedef enum { BAD, GOOD } verdict;

/* One environment case: NAME=value; for a good one, what the field of
 * pm_copy_config then reads (field_offset of a size_t, unsigned or int
 * field; SIZE_MAX: none to look at). */
typedef struct env_case {
    const char *name, *value;
    verdict expect;
    size_t field_offset, width;
    unsigned long long expect_field;
} env_case;

#define FIELD(f) offsetof(pm_copy_config, f), sizeof(((pm_copy_config *)0)->f)
#define NO_FIELD SIZE_MAX, 0

static const env_case env_cases[] = {
    {"PINMEM_COPY_WORKERS", "99999", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_WORKERS", "-1", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_WORKERS", "4x", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_WORKERS", "3", GOOD, FIELD(workers), 3},
    {"PINMEM_COPY_WORKERS", "256", GOOD, FIELD(workers), 256},
    {"PINMEM_COPY_WORKERS", "257", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_HTOD_WORKERS", "100000", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_HTOD_WORKERS", "200", GOOD, NO_FIELD, 0}, /* more than all: all */
    {"PINMEM_COPY_BUFFERS", "100000", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_BUFFERS", "1025", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_BUFFERS", "7", GOOD, FIELD(buffers), 7},
    {"PINMEM_COPY_CHUNK", "3G", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_CHUNK", "1", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_CHUNK", "-1", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_CHUNK", "65537", GOOD, FIELD(chunk_bytes), 65536 + 4096},
    {"PINMEM_COPY_CHUNK", "1MiB", GOOD, FIELD(chunk_bytes), MIB},
    {"PINMEM_COPY_CHUNK", "0", GOOD, FIELD(chunk_bytes), 4 * MIB},
    {"PINMEM_COPY_SLICE", "1", GOOD, FIELD(slice_bytes), 4 * KIB},
    {"PINMEM_COPY_SLICE", "1T", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_DTOH_SLICE", "0", GOOD, FIELD(dtoh_slice_bytes), 128 * KIB},
    {"PINMEM_COPY_DTOH_SLICE", "1", GOOD, FIELD(dtoh_slice_bytes), 4 * KIB},
    {"PINMEM_COPY_DTOH_SLICE", "256K", GOOD, FIELD(dtoh_slice_bytes), 256 * KIB},
    {"PINMEM_COPY_DTOH_SLICE", "1T", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_DTOH_SLICE", "-1", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_DIRECT_MAX", "-1", GOOD, FIELD(direct_max), SIZE_MAX},
    {"PINMEM_COPY_DIRECT_MAX", "0", GOOD, FIELD(direct_max), 512 * KIB},
    {"PINMEM_COPY_DIRECT_MAX", "64K", GOOD, FIELD(direct_max), 64 * KIB},
    {"PINMEM_COPY_DIRECT_MAX", "-2", BAD, NO_FIELD, 0},
    /* From the device: its own default, or direct_max where that is smaller. */
    {"PINMEM_COPY_DTOH_DIRECT_MAX", "0", GOOD, FIELD(dtoh_direct_max), 32 * KIB},
    {"PINMEM_COPY_DTOH_DIRECT_MAX", "1M", GOOD, FIELD(dtoh_direct_max), MIB},
    {"PINMEM_COPY_DTOH_DIRECT_MAX", "-1", GOOD, FIELD(dtoh_direct_max), SIZE_MAX},
    {"PINMEM_COPY_DTOH_DIRECT_MAX", "-2", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_DIRECT_MAX", "16K", GOOD, FIELD(dtoh_direct_max), 16 * KIB},
    {"PINMEM_COPY_DIRECT_MAX", "-1", GOOD, FIELD(dtoh_direct_max), SIZE_MAX},
    {"PINMEM_COPY_STORES", "streaming", GOOD, FIELD(staging_stores), PM_COPY_STORES_STREAMING},
    {"PINMEM_COPY_STORES", "fast", BAD, NO_FIELD, 0},
    {"PINMEM_REGISTRATION_CACHE", "1", GOOD, FIELD(registration_cache), 1},
    {"PINMEM_REGISTRATION_CACHE", "2", BAD, NO_FIELD, 0},
    {"PINMEM_REGISTRATION_CACHE", "yes", BAD, NO_FIELD, 0},
    {"PINMEM_REGISTRATION_CACHE_MIN", "1", GOOD, FIELD(cache_min_bytes), 4 * KIB},
    {"PINMEM_REGISTRATION_CACHE_MAX", "1G", GOOD, FIELD(cache_max_bytes), GIB},
    {"PINMEM_PINNED_BUDGET", "64M", GOOD, FIELD(pinned_budget), 64 * MIB},
    {"PINMEM_PINNED_BUDGET", "abc", BAD, NO_FIELD, 0},
    {"PINMEM_PINNED_BUDGET", "99999999999999999999", BAD, NO_FIELD, 0},
    {"PINMEM_PINNED_BUDGET", "20000000000G", BAD, NO_FIELD, 0},
    {"PINMEM_PINNED_BUDGET", "-1", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_FIRST_PIECE", "1", GOOD, FIELD(first_piece_bytes), 4 * KIB},
    {"PINMEM_COPY_FIRST_PIECE", "0", GOOD, FIELD(first_piece_bytes), 512 * KIB}, /* the slice */
    {"PINMEM_COPY_FIRST_PIECE", "128K", GOOD, FIELD(first_piece_bytes), 128 * KIB},
    {"PINMEM_COPY_FIRST_PIECE", "512M", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_FIRST_PIECE", "-1", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_DTOH_FIRST_PIECE", "0", GOOD, FIELD(dtoh_first_piece_bytes), 2 * MIB},
    {"PINMEM_COPY_DTOH_FIRST_PIECE", "5000", GOOD, FIELD(dtoh_first_piece_bytes), 8 * KIB},
    {"PINMEM_COPY_DTOH_FIRST_PIECE", "1M", GOOD, FIELD(dtoh_first_piece_bytes), MIB},
    {"PINMEM_COPY_DTOH_FIRST_PIECE", "512M", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_DTOH_FIRST_PIECE", "x", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_PIECES", "8", GOOD, FIELD(pieces), 8},
    {"PINMEM_COPY_PIECES", "0", GOOD, FIELD(pieces), 1},
    {"PINMEM_COPY_PIECES", "1025", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_PIECES", "4K", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_SPIN_US", "100", GOOD, FIELD(spin_us), 100},
    {"PINMEM_COPY_SPIN_US", "-1", GOOD, FIELD(spin_us), UINT_MAX},
    {"PINMEM_COPY_SPIN_US", "0", GOOD, FIELD(spin_us), UINT_MAX}, /* the default: none */
    {"PINMEM_COPY_SPIN_US", "10001", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_SPIN_US", "-2", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_RING", "shared", GOOD, FIELD(ring), PM_COPY_RING_SHARED},
    {"PINMEM_COPY_RING", "default", GOOD, FIELD(ring), PM_COPY_RING_SPLIT},
    {"PINMEM_COPY_RING", "half", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_RING", "2", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_BATCH", "driver", GOOD, FIELD(batch), PM_COPY_BATCH_DRIVER},
    {"PINMEM_COPY_BATCH", "each", GOOD, FIELD(batch), PM_COPY_BATCH_EACH},
    {"PINMEM_COPY_BATCH", "default", GOOD, FIELD(batch), PM_COPY_BATCH_KERNEL},
    {"PINMEM_COPY_BATCH", "gather", GOOD, FIELD(batch), PM_COPY_BATCH_GATHER},
    {"PINMEM_COPY_BATCH", "kernel", GOOD, FIELD(batch), PM_COPY_BATCH_KERNEL},
    {"PINMEM_COPY_BATCH", "dma", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_KERNEL_MAX", "64K", GOOD, NO_FIELD, 0},
    {"PINMEM_COPY_KERNEL_MAX", "-1", GOOD, NO_FIELD, 0},
    {"PINMEM_COPY_KERNEL_MAX", "512M", BAD, NO_FIELD, 0},
    {"PINMEM_COPY_KERNEL_MAX", "0", GOOD, NO_FIELD, 0},
    {"PINMEM_COPY_KERNEL_PER_SM", "0", GOOD, NO_FIELD, 0},
    {"PINMEM_COPY_KERNEL_PER_SM", "2", GOOD, NO_FIELD, 0},
    {"PINMEM_STATS", "yes", BAD, NO_FIELD, 0},
    {"PINMEM_POOL_VMM", "2", BAD, NO_FIELD, 0},
    {"PINMEM_POOL_VMM", "1", GOOD, NO_FIELD, 0},
    {"PINMEM_DEVICE", "-3", BAD, NO_FIELD, 0},
    {"PINMEM_BACKEND", "posix", GOOD, NO_FIELD, 0},
    {"PINMEM_BACKEND", "bogus", BAD, NO_FIELD, 0},
    {"PINMEM_THREAD_CPUS", "process", GOOD, NO_FIELD, 0},
    {"PINMEM_THREAD_CPUS", "caller", GOOD, NO_FIELD, 0},
    {"PINMEM_THREAD_CPUS", "all", BAD, NO_FIELD, 0},
};

/* What pm_get_setting says of a good case, for settings no field shows. */
static const struct {
    const char *name, *value, *reads;
} setting_reads[] = {
    {"PINMEM_COPY_KERNEL_MAX", "0", "512K"}, /* 0: the default */
    {"PINMEM_COPY_KERNEL_MAX", "-1", "-1"},
    {"PINMEM_COPY_KERNEL_PER_SM", "0", "4"},
    {"PINMEM_COPY_KERNEL_PER_SM", "2", "2"},
};

static void check_setting_reads(const env_case *k, const pm_setting *st)
{
    for (size_t i = 0; i < sizeof setting_reads / sizeof *setting_reads; i++) {
        if (strcmp(setting_reads[i].name, k->name) || strcmp(setting_reads[i].value, k->value))
            continue;
        if (strcmp(st->value, setting_reads[i].reads) != 0)
            fprintf(stderr, "%s=%s reads %s, expected %s\n", k->name, k->value, st->value,
                    setting_reads[i].reads);
        CHECK(strcmp(st->value, setting_reads[i].reads) == 0);
    }
}

static unsigned long long field_value(const pm_copy_config *c, size_t offset, size_t width)
{
    const unsigned char *p = (const unsigned char *)c + offset;
    if (width == sizeof(unsigned long long)) {
        unsigned long long v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    unsigned v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* In the child: 0 when the case came out as expected. */
static int run_env_case(const env_case *k)
{
    pm_result r = pm_init(0);
    if (k->expect == BAD) {
        CHECK_RESULT(r, PM_ERROR_INVALID_VALUE);
        CHECK(strstr(pm_last_error_detail(), k->name) != NULL);
        void *p = NULL;
        CHECK_RESULT(pm_mem_alloc_host(&p, 4096), PM_ERROR_INVALID_VALUE); /* and every call */
        pm_copy_config c = {.struct_size = sizeof c};
        CHECK_RESULT(pm_copy_get_config(&c), PM_ERROR_INVALID_VALUE);
        return check_failures;
    }
    REQUIRE_RESULT_OR(r, PM_SUCCESS, check_failures);
    if (k->field_offset != SIZE_MAX) {
        pm_copy_config c = current();
        unsigned long long got = field_value(&c, k->field_offset, k->width);
        if (got != k->expect_field)
            fprintf(stderr, "%s=%s: the field reads %llu, expected %llu\n", k->name, k->value,
                    got, k->expect_field);
        CHECK(got == k->expect_field);
    }
    round_trip();
    if (strcmp(k->name, "PINMEM_PINNED_BUDGET") == 0) {
        /* no cap by code stays no cap through a round trip */
        CHECK_RESULT(pm_set_pinned_budget(0), PM_SUCCESS);
        round_trip();
        CHECK(current().pinned_budget == 0);
        CHECK_RESULT(pm_set_pinned_budget(k->expect_field), PM_SUCCESS);
    }
    pm_setting st;
    CHECK(setting(k->name, &st));
    bool zero = strcmp(k->value, "0") == 0;
    CHECK(strcmp(st.source, zero ? "default" : "environment") == 0);
    check_setting_reads(k, &st);
    if (strcmp(k->name, "PINMEM_COPY_HTOD_WORKERS") == 0) {
        /* read as the engine takes it: at most every worker */
        pm_setting all;
        CHECK(setting("PINMEM_COPY_WORKERS", &all));
        CHECK(strtoull(st.value, NULL, 10) <= strtoull(all.value, NULL, 10));
    }
    return check_failures;
}

static void environment(void)
{
    for (size_t i = 0; i < sizeof env_cases / sizeof *env_cases; i++) {
        const env_case *k = &env_cases[i];
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            check_failures = 0; /* the child counts its own */
            setenv(k->name, k->value, 1);
            if (strcmp(k->name, "PINMEM_BACKEND") != 0)
                setenv("PINMEM_BACKEND", "posix", 1);
            int failed = run_env_case(k);
            fflush(stdout);
            fflush(stderr);
            _exit(failed ? 1 : 0);
        }
        int status = 0;
        REQUIRE(pid > 0 && waitpid(pid, &status, 0) == pid);
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok)
            fprintf(stderr, "environment %s=%s: expected %s\n", k->name, k->value,
                    k->expect == BAD ? "a refusal" : "it taken");
        CHECK(ok);
    }
}

/* The same rules for values from code. */
static void code(void)
{
    pm_copy_config saved = current();
    pm_copy_config c;
#define EXPECT_REFUSED(field, value)                                                         \
    do {                                                                                     \
        c = saved;                                                                           \
        c.field = value;                                                                     \
        CHECK_RESULT(pm_copy_set_config(&c), PM_ERROR_INVALID_VALUE);                        \
        CHECK(strstr(pm_last_error_detail(), #field) != NULL);                               \
        pm_copy_config same = current();                                                     \
        CHECK(same_config(&same, &saved));                                                   \
    } while (0)
#define EXPECT_TAKEN(field, value, reads)                                                    \
    do {                                                                                     \
        c = saved;                                                                           \
        c.field = value;                                                                     \
        CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);                                    \
        pm_copy_config now = current();                                                      \
        if (now.field != (reads))                                                            \
            fprintf(stderr, "%s = %llu reads %llu\n", #field, (unsigned long long)(value),   \
                    (unsigned long long)now.field);                                          \
        CHECK(now.field == (reads));                                                         \
        round_trip();                                                                        \
        CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);                                \
    } while (0)
    EXPECT_REFUSED(workers, 99999);
    EXPECT_REFUSED(workers, 257);
    EXPECT_REFUSED(workers, UINT_MAX);
    EXPECT_REFUSED(htod_workers, 100000);
    EXPECT_REFUSED(buffers, 100000);
    EXPECT_REFUSED(buffers, 1025);
    EXPECT_REFUSED(chunk_bytes, 3 * GIB);
    EXPECT_REFUSED(chunk_bytes, 1);
    EXPECT_REFUSED(chunk_bytes, (size_t)-1);
    CHECK(strstr(pm_last_error_detail(), "chunk_bytes = 18446744073709551615") != NULL);
    EXPECT_REFUSED(cache_max_bytes, (size_t)1 << 63);
    CHECK(strstr(pm_last_error_detail(), "= 9223372036854775808") != NULL);
    EXPECT_REFUSED(slice_bytes, 2 * GIB);
    EXPECT_REFUSED(dtoh_slice_bytes, 512 * MIB);
    EXPECT_REFUSED(dtoh_slice_bytes, (size_t)-1);
    EXPECT_REFUSED(registration_cache, 2);
    EXPECT_REFUSED(registration_cache, -1);
    EXPECT_REFUSED(staging_stores, (pm_copy_stores)4);
    EXPECT_REFUSED(staging_stores, (pm_copy_stores)-1);
    EXPECT_REFUSED(cache_min_bytes, (size_t)-1);
    EXPECT_REFUSED(first_piece_bytes, 512 * MIB);
    EXPECT_REFUSED(first_piece_bytes, (size_t)-1);
    EXPECT_REFUSED(dtoh_first_piece_bytes, 512 * MIB);
    EXPECT_REFUSED(dtoh_first_piece_bytes, (size_t)-1);
    EXPECT_REFUSED(pieces, 1025);
    EXPECT_REFUSED(spin_us, 10001);
    EXPECT_REFUSED(spin_us, UINT_MAX - 1);
    EXPECT_REFUSED(ring, (pm_copy_ring)3);
    EXPECT_REFUSED(ring, (pm_copy_ring)-1);
    EXPECT_REFUSED(batch, (pm_copy_batch)5);
    EXPECT_TAKEN(workers, 256, 256u);
    EXPECT_TAKEN(buffers, 1024, 1024u);
    EXPECT_TAKEN(chunk_bytes, 65537, 65536 + 4096);
    EXPECT_TAKEN(chunk_bytes, 256 * MIB, 256 * MIB);
    EXPECT_TAKEN(slice_bytes, 1, 4 * KIB);
    EXPECT_TAKEN(direct_max, (size_t)-1, (size_t)-1);
    EXPECT_TAKEN(direct_max, 0, 512 * KIB); /* 0: the default */
    EXPECT_TAKEN(direct_max, 12345, 12345u);
    EXPECT_TAKEN(dtoh_direct_max, (size_t)-1, (size_t)-1);
    EXPECT_TAKEN(dtoh_direct_max, 0, 32 * KIB); /* 0: the default */
    EXPECT_TAKEN(dtoh_direct_max, 12345, 12345u);
    EXPECT_TAKEN(dtoh_slice_bytes, 0, 128 * KIB); /* 0: the default */
    EXPECT_TAKEN(dtoh_slice_bytes, 5000, 8 * KIB); /* whole pages */
    EXPECT_TAKEN(cache_min_bytes, 1, 4 * KIB);
    EXPECT_TAKEN(workers, 0, saved.workers); /* 0: the default */
    EXPECT_TAKEN(staging_stores, PM_COPY_STORES_CACHED, PM_COPY_STORES_CACHED);
    EXPECT_TAKEN(pinned_budget, 64 * MIB, 64 * MIB);
    EXPECT_TAKEN(first_piece_bytes, 1, 4 * KIB);
    EXPECT_TAKEN(first_piece_bytes, 0, saved.slice_bytes); /* 0: the default, the slice */
    EXPECT_TAKEN(first_piece_bytes, 256 * MIB, 256 * MIB);
    EXPECT_TAKEN(dtoh_first_piece_bytes, 0, 2 * MIB); /* 0: the default */
    EXPECT_TAKEN(dtoh_first_piece_bytes, 1, 4 * KIB);
    EXPECT_TAKEN(pieces, 1024, 1024u);
    EXPECT_TAKEN(pieces, 0, 1u);
    EXPECT_TAKEN(spin_us, 200, 200u);
    EXPECT_TAKEN(spin_us, UINT_MAX, UINT_MAX);
    EXPECT_TAKEN(spin_us, 0, UINT_MAX); /* 0: the default, none */
    EXPECT_TAKEN(ring, PM_COPY_RING_SHARED, PM_COPY_RING_SHARED);
    EXPECT_TAKEN(ring, PM_COPY_RING_DEFAULT, PM_COPY_RING_SPLIT);
    EXPECT_TAKEN(batch, PM_COPY_BATCH_EACH, PM_COPY_BATCH_EACH);
    EXPECT_TAKEN(batch, PM_COPY_BATCH_DEFAULT, PM_COPY_BATCH_KERNEL);
    EXPECT_TAKEN(batch, PM_COPY_BATCH_KERNEL, PM_COPY_BATCH_KERNEL);
    /* where each value came from */
    c = saved;
    c.workers = saved.workers + 1;
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    pm_setting st;
    CHECK(setting("PINMEM_COPY_WORKERS", &st) && strcmp(st.source, "code") == 0);
    CHECK(setting("PINMEM_COPY_CHUNK", &st) && strcmp(st.source, "default") == 0);
    c.workers = 0;
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    CHECK(setting("PINMEM_COPY_WORKERS", &st) && strcmp(st.source, "default") == 0);
    CHECK_RESULT(pm_copy_set_config(&saved), PM_SUCCESS);
    round_trip();
}

/* A round trip leaves the staging engine running. */
static void engine_kept(void)
{
    enum { BYTES = 16 << 20 };
    char *host = malloc(BYTES);
    pm_deviceptr dev = 0;
    REQUIRE(host);
    memset(host, 1, BYTES);
    REQUIRE_RESULT(pm_device_alloc(&dev, BYTES), PM_SUCCESS);
    CHECK_RESULT(pm_memcpy_htod(dev, host, BYTES), PM_SUCCESS);
    pm_copy_stats before = {.struct_size = sizeof before}, after = before;
    CHECK_RESULT(pm_copy_get_stats(&before), PM_SUCCESS);
    round_trip();
    CHECK_RESULT(pm_copy_get_stats(&after), PM_SUCCESS);
    CHECK(before.staging_threads > 0 && after.staging_threads == before.staging_threads);
    CHECK(before.ring_pinned == after.ring_pinned && after.pinned_bytes == before.pinned_bytes);
    CHECK_RESULT(pm_device_free(dev), PM_SUCCESS);
    free(host);
}

static void settings_list(void)
{
    pm_setting st = {.struct_size = sizeof st};
    unsigned n = 0;
    while (pm_get_setting(n, &st) == PM_SUCCESS) {
        CHECK(strncmp(st.name, "PINMEM_", 7) == 0);
        CHECK(st.value[0] != '\0' && st.doc && st.allowed && st.default_value);
        n++;
    }
    CHECK(n >= 15);
    CHECK_RESULT(pm_get_setting(n, &st), PM_ERROR_NOT_FOUND);
    CHECK_RESULT(pm_get_setting(0, NULL), PM_ERROR_INVALID_VALUE);
    CHECK(setting("PINMEM_COPY_CHUNK", &st) && strcmp(st.value, "4M") == 0);
    CHECK(setting("PINMEM_COPY_SPIN_US", &st) && strcmp(st.value, "-1") == 0);
    CHECK(setting("PINMEM_COPY_RING", &st) && strcmp(st.value, "split") == 0);
    CHECK(setting("PINMEM_COPY_BATCH", &st) && strcmp(st.value, "kernel") == 0);
    CHECK(setting("PINMEM_COPY_FIRST_PIECE", &st) && strcmp(st.value, "512K") == 0);
    CHECK(setting("PINMEM_COPY_DTOH_FIRST_PIECE", &st) && strcmp(st.value, "2M") == 0);
}

/* pm_set_pinned_budget and pm_copy_config.pinned_budget are one setting. */
static void budget(void)
{
    unsigned long long b = 1;
    CHECK_RESULT(pm_get_pinned_budget(&b), PM_SUCCESS);
    CHECK(b == 0);
    CHECK_RESULT(pm_get_pinned_budget(NULL), PM_ERROR_INVALID_VALUE);
    CHECK_RESULT(pm_set_pinned_budget(123 * MIB), PM_SUCCESS);
    CHECK(current().pinned_budget == 123 * MIB);
    pm_setting st;
    CHECK(setting("PINMEM_PINNED_BUDGET", &st) && strcmp(st.source, "code") == 0 &&
          strcmp(st.value, "123M") == 0);
    pm_copy_config c = current();
    c.pinned_budget = 7 * MIB;
    CHECK_RESULT(pm_copy_set_config(&c), PM_SUCCESS);
    CHECK_RESULT(pm_get_pinned_budget(&b), PM_SUCCESS);
    CHECK(b == 7 * MIB);
    void *p = NULL;
    CHECK_RESULT(pm_mem_alloc_host(&p, 8 * MIB), PM_ERROR_OUT_OF_MEMORY);
    CHECK(strstr(pm_last_error_detail(), "budget") != NULL);
    CHECK_RESULT(pm_set_pinned_budget(0), PM_SUCCESS); /* none */
    CHECK_RESULT(pm_get_pinned_budget(&b), PM_SUCCESS);
    CHECK(b == 0);
    CHECK(current().pinned_budget == 0);
    CHECK(setting("PINMEM_PINNED_BUDGET", &st) && strcmp(st.source, "default") == 0);
}

int main(void)
{
    environment();
    if (pm_init(0) != PM_SUCCESS) {
        printf("pm_init: %s\n", pm_last_error_detail());
        return 1;
    }
    settings_list();
    engine_kept();
    code();
    budget();
    return check_finish("test_options");
}
