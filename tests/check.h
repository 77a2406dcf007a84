/* A minimal test harness: CHECK counts failures, SKIP exits with the status
 * ctest reports as skipped. */
#ifndef PINMEM_TEST_CHECK_H
#define PINMEM_TEST_CHECK_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pinmem.h"

#define SKIP_STATUS 77

/* Atomic: checks may fail on several threads at once. */
static _Atomic int check_failures;

/* The first failures say where; after that only the count grows, so that a
 * loop that keeps failing cannot flood the output. */
#define CHECK_PRINT_LIMIT 40

static inline int check_failed_(void)
{
    int n = ++check_failures;
    if (n == CHECK_PRINT_LIMIT + 1)
        fprintf(stderr, "(more failed checks are counted, not printed)\n");
    return n <= CHECK_PRINT_LIMIT;
}

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond) && check_failed_())                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    } while (0)

#define CHECK_RESULT(call, expected)                                                     \
    do {                                                                                 \
        pm_result got_ = (call);                                                         \
        if (got_ != (expected) && check_failed_())                                       \
            fprintf(stderr, "%s:%d: %s gave %s, expected %s (%s)\n", __FILE__, __LINE__, \
                    #call, pm_result_name(got_), pm_result_name(expected),               \
                    pm_last_error_detail());                                             \
    } while (0)

/* As CHECK and CHECK_RESULT, but a failure also ends the current case (the
 * enclosing function returns; REQUIRE_OR returns value): later steps would
 * use what the failed step did not make. */
#define REQUIRE_OR(cond, value)                                                      \
    do {                                                                             \
        if (!(cond)) {                                                               \
            if (check_failed_())                                                     \
                fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
            return value;                                                            \
        }                                                                            \
    } while (0)
#define REQUIRE(cond) REQUIRE_OR(cond, )
#define REQUIRE_RESULT_OR(call, expected, value)                                         \
    do {                                                                                 \
        pm_result got_ = (call);                                                         \
        if (got_ != (expected)) {                                                        \
            if (check_failed_())                                                         \
                fprintf(stderr, "%s:%d: %s gave %s, expected %s (%s)\n", __FILE__,      \
                        __LINE__, #call, pm_result_name(got_), pm_result_name(expected), \
                        pm_last_error_detail());                                         \
            return value;                                                                \
        }                                                                                \
    } while (0)
#define REQUIRE_RESULT(call, expected) REQUIRE_RESULT_OR(call, expected, )

/* Ends the current case (not the whole test) when the environment cannot give
 * what it needs, saying why. */
#define SKIP_CASE(why)                                       \
    do {                                                     \
        printf("skipped: %s: %s\n", __func__, why);          \
        return;                                              \
    } while (0)

#define SKIP(why)                          \
    do {                                   \
        printf("skipped: %s\n", why);      \
        return SKIP_STATUS;                \
    } while (0)

/* 1 in a ThreadSanitizer build: it checks every access and gives each fresh
 * page shadow pages, so the largest cases shrink under it, where races, not
 * sizes, are what it is for. */
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif
#ifndef UNDER_TSAN
#define UNDER_TSAN 0
#endif

/* pm_backend_name() is NULL when no backend could be initialised. */
static inline int on_backend(const char *name)
{
    const char *b = pm_backend_name();
    return b && strcmp(b, name) == 0;
}

#define SKIP_UNLESS_CUDA()                                       \
    do {                                                         \
        if (!on_backend("cuda"))                                 \
            SKIP("no CUDA driver");                              \
    } while (0)

/* xorshift64: the tests' random numbers, the same sequence on every run. */
static inline uint64_t xorshift64(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* Kilobytes this process has locked (VmLck), 0 when unknown. */
static inline unsigned long long locked_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %llu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

static inline int check_finish(const char *name)
{
    if (check_failures)
        printf("%s: %d check(s) failed\n", name, check_failures);
    else
        printf("%s: all checks passed\n", name);
    return check_failures ? 1 : 0;
}

#endif
