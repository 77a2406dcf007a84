/* pm_get_setting: every PINMEM_* setting in effect (options.h), the copy
 * engine's defaults chosen first. */
#include <string.h>

#include "copy/copy.h"
#include "host_func.h"
#include "instance.h"
#include "no_cancel.h"
#include "options.h"
#include "versioned.h"

pm_result pm_get_setting(unsigned index, pm_setting *setting)
{
    PM__NO_CANCEL;
    /* It reads the copy settings, as pm_copy_get_config does. */
    PM__REFUSED_IN_HOST_FUNC("pm_get_setting");
    PM__INSTANCE_OR_RETURN(inst);
    (void)inst;
    pm_result r = PM__STRUCT_SIZE_CHECK("pm_get_setting", setting);
    if (r != PM_SUCCESS)
        return r;
    pm__copy_enter(); /* the engine publishes its settings once chosen */
    pm__copy_leave();
    pm_setting full = {.struct_size = setting->struct_size};
    if (!pm__option_describe(index, &full))
        return pm__fail(PM_ERROR_NOT_FOUND, "pm_get_setting: there are %d settings",
                        (int)PM__OPT_COUNT);
    memcpy(setting, &full, setting->struct_size);
    return PM_SUCCESS;
}
