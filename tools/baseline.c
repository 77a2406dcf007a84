/* Picks the baseline for the backend pinmem chose, and keeps the detail of
 * the last baseline failure per thread, as pinmem keeps its own. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "baseline.h"

static _Thread_local char detail[256];

const char *baseline_detail(void) { return detail; }

pm_result baseline_fail(pm_result r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return r;
}

const baseline *baseline_open(const char *who)
{
    pm_result r = pm_init(0);
    const char *name = pm_backend_name();
    if (r != PM_SUCCESS || !name) {
        printf("%s: no backend: %s\n", who, pm_last_error_detail());
        return NULL;
    }
    const baseline *b = NULL;
    if (strcmp(name, "cuda") == 0) {
        pm_capabilities caps = {.struct_size = sizeof caps};
        r = pm_get_capabilities(&caps);
        if (r != PM_SUCCESS) {
            printf("%s: %s\n", who, pm_last_error_detail());
            return NULL;
        }
        b = baseline_cuda(caps.device_ordinal);
    } else if (strcmp(name, "posix") == 0) {
        b = baseline_posix();
    } else {
        baseline_fail(PM_ERROR_NOT_SUPPORTED, "no baseline for the %s backend", name);
    }
    if (!b)
        printf("%s: no baseline to compare with: %s\n", who, baseline_detail());
    return b;
}
