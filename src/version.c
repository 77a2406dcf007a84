#include "pinmem.h"

#define PM_STR_(x) #x
#define PM_STR(x) PM_STR_(x)
int pm_version(void) { return PM_VERSION_NUMBER; }
const char *pm_version_string(void)
{
    return PM_STR(PM_VERSION_MAJOR) "." PM_STR(PM_VERSION_MINOR) "." PM_STR(PM_VERSION_PATCH);
}
