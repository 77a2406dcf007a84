/* What sysfs says about a PCI device: its nearest NUMA node and its link.
 * The driver names a device by bus id; sysfs by the same id in lower case
 * with a four-digit domain, under /sys/bus/pci/devices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

bool pm__pci_bus_id_normalize(const char *bus_id, char *out, size_t cap)
{
    unsigned domain, bus, dev, fn;
    char extra;
    if (!bus_id || sscanf(bus_id, "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &extra) != 4 ||
        bus > 0xff || dev > 0x1f || fn > 7)
        return false;
    int n = snprintf(out, cap, "%04x:%02x:%02x.%x", domain, bus, dev, fn);
    return n > 0 && (size_t)n < cap;
}

/* The first line of the device's sysfs file name, without its newline;
 * false when there is no such file. */
static bool read_attribute(const char *bus_id, const char *name, char *line, size_t cap)
{
    char id[32], path[128];
    if (!pm__pci_bus_id_normalize(bus_id, id, sizeof id))
        return false;
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/%s", id, name);
    return pm__read_first_line(path, line, cap);
}

int pm__pci_numa_node(const char *bus_id)
{
    char line[32];
    int node;
    if (!read_attribute(bus_id, "numa_node", line, sizeof line) || sscanf(line, "%d", &node) != 1)
        return -1;
    return node >= 0 ? node : -1;
}

/* Transfer rates per lane, in tenths of GT/s, of PCIe generations 1 to 6. */
static int generation_of(double gts)
{
    static const int rate[] = {25, 50, 80, 160, 320, 640};
    int tenths = (int)(gts * 10 + 0.5);
    for (int g = 0; g < 6; g++)
        if (tenths == rate[g])
            return g + 1;
    return 0;
}

void pm__pci_link(const char *bus_id, int *generation, int *width)
{
    char line[64];
    double gts = 0;
    int lanes = 0;
    *generation = *width = 0;
    /* "16.0 GT/s PCIe" (older kernels: "8 GT/s"); "Unknown" in some VMs. */
    if (read_attribute(bus_id, "current_link_speed", line, sizeof line) &&
        sscanf(line, "%lf GT/s", &gts) == 1)
        *generation = generation_of(gts);
    if (read_attribute(bus_id, "current_link_width", line, sizeof line) &&
        sscanf(line, "%d", &lanes) == 1 && lanes > 0 && lanes <= 32)
        *width = lanes;
}
