/* Page-locked memory: allocate it, ask about it, pin memory you already have. */
#include <pinmem.h>
#include <stdio.h>
#include <stdlib.h>

static void check(pm_result r, const char *what)
{
    if (r != PM_SUCCESS) {
        fprintf(stderr, "%s: %s: %s\n", what, pm_result_name(r), pm_last_error_detail());
        exit(1);
    }
}

int main(void)
{
    void *buf;
    unsigned flags;
    pm_deviceptr dptr;
    check(pm_mem_host_alloc(&buf, 1 << 20, PM_MEMHOSTALLOC_PORTABLE), "pm_mem_host_alloc");
    check(pm_mem_host_get_flags(&flags, buf), "pm_mem_host_get_flags");
    check(pm_mem_host_get_device_pointer(&dptr, buf, 0), "pm_mem_host_get_device_pointer");
    printf("pinmem %s, %s backend: 1 MiB pinned at %p, flags 0x%x, device pointer 0x%llx\n",
           pm_version_string(), pm_backend_name(), buf, flags, dptr);
    check(pm_mem_free_host(buf), "pm_mem_free_host");

    char *data = malloc(100000); /* any memory, any alignment, as with the driver */
    if (!data)
        return 1;
    check(pm_mem_host_register(data, 100000, 0), "pm_mem_host_register");
    check(pm_mem_host_unregister(data), "pm_mem_host_unregister");
    free(data);
    return 0;
}
