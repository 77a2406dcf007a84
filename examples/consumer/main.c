/* The smallest program that uses an installed pinmem. */
#include <pinmem.h>
#include <stdio.h>

int main(void)
{
    void *p = NULL;
    pm_result r = pm_mem_alloc_host(&p, 1 << 20);
    if (r != PM_SUCCESS) {
        fprintf(stderr, "%s: %s\n", pm_result_name(r), pm_last_error_detail());
        return 1;
    }
    unsigned flags = 0;
    pm_mem_host_get_flags(&flags, p);
    printf("pinmem %s on %s: 1 MiB pinned, flags 0x%x\n", pm_version_string(), pm_backend_name(),
           flags);
    return pm_mem_free_host(p) == PM_SUCCESS ? 0 : 1;
}
