#include "errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *pm_result_name(pm_result r)
{
    switch (r) {
#define PM_RESULT_NAME_(name, value, text) \
    case name:                             \
        return #name;
        PM_RESULT_LIST(PM_RESULT_NAME_)
#undef PM_RESULT_NAME_
    }
    return "PM_ERROR_UNRECOGNIZED";
}

const char *pm_result_string(pm_result r)
{
    switch (r) {
#define PM_RESULT_TEXT_(name, value, text) \
    case name:                             \
        return text;
        PM_RESULT_LIST(PM_RESULT_TEXT_)
#undef PM_RESULT_TEXT_
    }
    return "unrecognized result code";
}

/* Thread-local, so no lock and no cross-thread clobbering. */
static _Thread_local char last_detail[512];
static _Thread_local int last_driver_code;

static void record(int driver_code, const char *fmt, va_list ap)
{
    vsnprintf(last_detail, sizeof last_detail, fmt, ap);
    last_driver_code = driver_code;
}

pm_result pm__fail(pm_result r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(0, fmt, ap);
    va_end(ap);
    return r;
}

pm_result pm__fail_driver(pm_result r, int driver_code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(driver_code, fmt, ap);
    va_end(ap);
    return r;
}

void pm__detail_save(pm__detail_saved *s)
{
    _Static_assert(sizeof s->text == sizeof last_detail, "a saved detail holds a whole one");
    /* Only the text: pool allocations save it on every slow path, and it is mostly empty. */
    size_t used = strnlen(last_detail, sizeof last_detail - 1);
    memcpy(s->text, last_detail, used);
    s->text[used] = '\0';
    s->driver_code = last_driver_code;
}

void pm__detail_restore(const pm__detail_saved *s)
{
    size_t used = strnlen(s->text, sizeof s->text - 1);
    memcpy(last_detail, s->text, used);
    last_detail[used] = '\0';
    last_driver_code = s->driver_code;
}

const char *pm_last_error_detail(void) { return last_detail; }

int pm_last_driver_error(void) { return last_driver_code; }
