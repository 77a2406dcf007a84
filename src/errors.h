/* Per-thread error reporting: every failing path records a detail sentence
 * (and the raw driver code when the failure came from the driver). */
#ifndef PINMEM_ERRORS_H
#define PINMEM_ERRORS_H

#include "pinmem.h"

#if defined(__GNUC__)
#define PM__PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define PM__PRINTF(fmt, args)
#endif

/* Records the detail for this thread and returns r, so callers can write
 * `return pm__fail(PM_ERROR_INVALID_VALUE, "...")`. */
pm_result pm__fail(pm_result r, const char *fmt, ...) PM__PRINTF(2, 3);
/* Same, also keeping the raw driver code. */
pm_result pm__fail_driver(pm_result r, int driver_code, const char *fmt, ...) PM__PRINTF(3, 4);

/* The calling thread's detail and driver code, kept around an internal
 * attempt whose failure is recovered from (another backend, another way to
 * pin), so that a call that succeeds leaves them as they were. */
typedef struct pm__detail_saved {
    char text[512];
    int driver_code;
} pm__detail_saved;
void pm__detail_save(pm__detail_saved *s);
void pm__detail_restore(const pm__detail_saved *s);

#endif
