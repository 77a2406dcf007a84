/* Where host pages go among NUMA nodes: the nodes the machine has, a range
 * bound to one of them, and the CPUs of a node, whose threads fault pages in
 * there where the kernel refuses memory policies. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../errors.h"
#include "../test_hooks.h"
#include "backend.h"

int pm__only_numa_node(void)
{
    FILE *f = fopen("/sys/devices/system/node/online", "re");
    char line[64] = "";
    int node = -1, used = 0;
    if (f) {
        if (!fgets(line, sizeof line, f))
            line[0] = '\0';
        fclose(f);
    }
    /* "0" names one node; "0-1" or "0,2" several. */
    if (sscanf(line, "%d%n", &node, &used) != 1 || node < 0 || (line[used] && line[used] != '\n'))
        return -1;
    return node;
}

bool pm__numa_node_exists(int node)
{
    if (node < 0 || node > 4095)
        return false;
    char path[64];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d", node);
    if (access(path, F_OK) == 0)
        return true;
    /* Without sysfs NUMA information the machine has exactly node 0. */
    return node == 0 && access("/sys/devices/system/node", F_OK) != 0;
}

pm_result pm__bind_to_node(void *p, size_t len, int node)
{
    enum { mpol_bind = 2 };
    unsigned long mask[4096 / (8 * sizeof(unsigned long))] = {0};
    mask[(unsigned)node / (8 * sizeof(unsigned long))] |= 1ul << ((unsigned)node % (8 * sizeof(unsigned long)));
    if (PM__TEST_POLICIES_REFUSED())
        errno = EPERM;
    else if (syscall(SYS_mbind, p, len, mpol_bind, mask, (unsigned long)4096 + 1, 0) == 0)
        return PM_SUCCESS;
    /* A container's default seccomp profile refuses memory policies to a
     * process without CAP_SYS_NICE (EPERM), and a kernel without NUMA has
     * none (ENOSYS), a refusal the driver's own pools (placed by its kernel
     * module) never meet: the pages are left to first touch from the node's
     * CPUs instead. */
    if (errno == EPERM || errno == ENOSYS)
        return PM_SUCCESS;
    return pm__fail(PM_ERROR_INVALID_VALUE, "mbind to NUMA node %d failed: %s", node,
                    strerror(errno));
}

bool pm__placed_by_touch(int node)
{
    return node >= 0 && (pm__only_numa_node() < 0 || PM__TEST_POLICIES_REFUSED());
}

bool pm__run_on_node(int node)
{
    char path[64];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", node);
    cpu_set_t set;
    return pm__read_cpu_list(path, &set) && sched_setaffinity(0, sizeof set, &set) == 0;
}
