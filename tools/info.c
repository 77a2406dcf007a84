#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "commands.h"
#include "pinmem.h"

static void print_memlock_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
        printf("  RLIMIT_MEMLOCK:        unknown\n");
        return;
    }
    char soft[32] = "unlimited", hard[32] = "unlimited";
    if (rl.rlim_cur != RLIM_INFINITY)
        human_size((size_t)rl.rlim_cur, soft, sizeof soft);
    if (rl.rlim_max != RLIM_INFINITY)
        human_size((size_t)rl.rlim_max, hard, sizeof hard);
    printf("  RLIMIT_MEMLOCK:        %s (hard %s)\n", soft, hard);
}

/* CAP_IPC_LOCK (bit 14) in this process's effective capabilities. */
static int can_lock_past_the_limit(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long caps = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "CapEff: %llx", &caps) == 1)
            break;
    if (f)
        fclose(f);
    return (int)((caps >> 14) & 1);
}

/* What bounds how much can be pinned: the limit, or what lifts it. */
static void print_pinning_bound(const pm_capabilities *c)
{
    struct rlimit rl;
    char limit[32] = "unknown";
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        human_size((size_t)rl.rlim_cur, limit, sizeof limit);
    printf("  pinning bound by:      ");
    if (c->pinning_limited_by_memlock_rlimit)
        printf("RLIMIT_MEMLOCK (%s)\n", limit);
    else if (strcmp(c->backend, "cuda") == 0)
        printf("nothing: the CUDA driver pins past RLIMIT_MEMLOCK\n");
    else if (can_lock_past_the_limit())
        printf("nothing: CAP_IPC_LOCK lifts RLIMIT_MEMLOCK\n");
    else
        printf("nothing: RLIMIT_MEMLOCK is unlimited\n");
}

static int by_value(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* How many nodes, then which: "1 (node 0)", "2 (nodes 0, 1)". */
static void print_numa_nodes(void)
{
    enum { most = 1024 };
    static int ids[most];
    int n = 0;
    DIR *d = opendir("/sys/devices/system/node");
    struct dirent *e;
    while (d && (e = readdir(d)) && n < most) {
        int id;
        char extra;
        if (sscanf(e->d_name, "node%d%c", &id, &extra) == 1)
            ids[n++] = id;
    }
    if (d)
        closedir(d);
    if (n == 0) {
        printf("  NUMA nodes:            none reported\n");
        return;
    }
    qsort(ids, (size_t)n, sizeof ids[0], by_value);
    printf("  NUMA nodes:            %d (node%s ", n, n > 1 ? "s" : "");
    for (int i = 0; i < n; i++)
        printf("%s%d", i ? ", " : "", ids[i]);
    printf(")\n");
}

/* "gen5 x16", "gen5, width unknown", "unknown". */
static const char *pcie_link(const pm_device_info *d, char *buf, size_t cap)
{
    char gen[16] = "gen unknown", width[24] = "width unknown";
    if (!d->pcie_generation && !d->pcie_width)
        return "unknown";
    if (d->pcie_generation)
        snprintf(gen, sizeof gen, "gen%d", d->pcie_generation);
    if (d->pcie_width)
        snprintf(width, sizeof width, "x%d", d->pcie_width);
    snprintf(buf, cap, "%s%s%s", gen, d->pcie_generation && d->pcie_width ? " " : ", ", width);
    return buf;
}

static const char *yes_no(int v) { return v ? "yes" : "no"; }

/* Every device, the one pinmem uses marked. */
static void print_devices(void)
{
    int count = 0;
    if (pm_device_count(&count) != PM_SUCCESS) {
        printf("devices:                 unknown (%s)\n", pm_last_error_detail());
        return;
    }
    printf("devices:                 %d (* marks the one pinmem uses)\n", count);
    for (int i = 0; i < count; i++) {
        pm_device_info d = {.struct_size = sizeof d};
        if (pm_device_get_info(i, &d) != PM_SUCCESS) {
            printf("    %d: unknown (%s)\n", i, pm_last_error_detail());
            continue;
        }
        char link[48];
        printf("  %c %d: %s\n", d.in_use ? '*' : ' ', d.ordinal, d.name);
        printf("       PCI bus id %s; PCIe link %s; nearest NUMA node ",
               d.pci_bus_id[0] ? d.pci_bus_id : "none", pcie_link(&d, link, sizeof link));
        if (d.host_numa_node >= 0)
            printf("%d\n", d.host_numa_node);
        else
            printf("unknown\n");
        printf("       can map host memory %s; unified addressing %s; host pointer for "
               "registered memory %s;\n",
               yes_no(d.can_map_host_memory), yes_no(d.unified_addressing),
               yes_no(d.can_use_host_pointer_for_registered_mem));
        printf("       read-only registration %s; pageable access via host page tables %s\n",
               d.read_only_host_register_supported ? "supported" : "not supported",
               yes_no(d.pageable_memory_access_uses_host_page_tables));
    }
}

/* The staging ring pageable copies go through (each device's engine has one
 * of this shape), and why it is smaller than configured, or why there is
 * none. */
static void print_ring(void)
{
    pm_copy_stats st = {.struct_size = sizeof st};
    if (pm_copy_get_stats(&st) != PM_SUCCESS)
        return;
    char size[32];
    if (st.ring_buffers)
        printf("  staging ring:          %u x %s%s%s%s\n", st.ring_buffers,
               human_size((size_t)st.ring_buffer_bytes, size, sizeof size),
               st.ring_pinned ? " a device" : " a device (pinned at its first staged copy)",
               st.ring_note[0] ? "; " : "", st.ring_note);
    else
        printf("  staging ring:          none (%s)\n", st.ring_note);
}

/* Every PINMEM_* setting in effect, and where its value came from. */
static void print_settings(void)
{
    printf("settings (the PINMEM_* variables; value, and where it came from):\n");
    pm_setting st = {.struct_size = sizeof st};
    for (unsigned i = 0; pm_get_setting(i, &st) == PM_SUCCESS; i++)
        printf("  %-30s = %-8s (%s)\n", st.name, st.value, st.source);
}

int cmd_info(void)
{
    printf("pinmem %s\n", pm_version_string());
    pm_result r = pm_init(0);
    if (r != PM_SUCCESS) {
        printf("  backend:               none: %s (%s)\n", pm_result_name(r),
               pm_last_error_detail());
        return 1;
    }
    pm_capabilities c = {.struct_size = sizeof c};
    pm_get_capabilities(&c);
    char page[32], huge[32];
    printf("  backend:               %s\n", c.backend);
    if (c.driver_version)
        printf("  driver version:        %d.%d\n", c.driver_version / 1000,
               c.driver_version % 1000 / 10);
    else
        printf("  driver version:        none (no CUDA driver in use)\n");
    printf("  device:                %s (ordinal %d)\n", c.device_name, c.device_ordinal);
    printf("  can map host memory:   %s\n", c.can_map_host_memory ? "yes" : "no");
    printf("  unified addressing:    %s\n", c.unified_addressing ? "yes" : "no");
    printf("  host pointer for registered memory: %s\n",
           c.can_use_host_pointer_for_registered_mem ? "yes" : "no");
    printf("  read-only registration: %s\n",
           c.read_only_host_register_supported ? "supported" : "not supported");
    printf("  pageable access via host page tables: %s\n",
           c.pageable_memory_access_uses_host_page_tables ? "yes" : "no");
    print_pinning_bound(&c);
    printf("  host NUMA node:        %d\n", c.host_numa_node);
    printf("  page size:             %s\n", human_size(c.page_size, page, sizeof page));
    printf("  huge page size:        %s\n",
           c.huge_page_size ? human_size(c.huge_page_size, huge, sizeof huge) : "none");
    printf("  transparent huge pages: %s\n", c.huge_page_mode);
    printf("  address checks:        %s\n",
           c.access_checks_permissions ? "each mapping's permissions (/proc/self/maps)"
                                       : "mapped or not (/proc/self/maps unreadable)");
    print_memlock_limit();
    print_numa_nodes();
    print_ring();
    print_devices();
    print_settings();
    return 0;
}
