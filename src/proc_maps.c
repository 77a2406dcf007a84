#include "proc_maps.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "test_hooks.h"

/* struct procmap_query of include/uapi/linux/fs.h, declared here so that the
 * library builds with older kernel headers; names and build ids are not asked
 * for (their sizes stay 0). */
struct procmap_query_v1 {
    uint64_t size;
    uint64_t query_flags;
    uint64_t query_addr;
    uint64_t vma_start;
    uint64_t vma_end;
    uint64_t vma_flags;
    uint64_t vma_page_size;
    uint64_t vma_offset;
    uint64_t inode;
    uint32_t dev_major;
    uint32_t dev_minor;
    uint32_t vma_name_size;
    uint32_t build_id_size;
    uint64_t vma_name_addr;
    uint64_t build_id_addr;
};

#define PROCMAP_QUERY_REQUEST _IOWR('f', 17, struct procmap_query_v1)
#define VMA_READABLE 0x1u
#define VMA_WRITABLE 0x2u

int pm__proc_maps_query(int fd, uintptr_t address, pm__mapping *m)
{
    /* query_flags 0: the mapping that covers the address, not the next one */
    struct procmap_query_v1 q = {.size = sizeof q, .query_addr = address};
    if (PM__TEST_FAULT(pm__fault_maps_query)) {
        errno = ENOTTY; /* as a kernel before 6.11 answers */
        return -1;
    }
    if (ioctl(fd, PROCMAP_QUERY_REQUEST, &q) != 0)
        return -1;
    *m = (pm__mapping){.start = (uintptr_t)q.vma_start,
                       .end = (uintptr_t)q.vma_end,
                       .readable = (q.vma_flags & VMA_READABLE) != 0,
                       .writable = (q.vma_flags & VMA_WRITABLE) != 0};
    return 0;
}

int pm__proc_maps_open(void)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    pm__mapping m;
    if (fd >= 0 && pm__proc_maps_query(fd, (uintptr_t)&m, &m) != 0) {
        close(fd); /* no PROCMAP_QUERY here */
        fd = -1;
    }
    return fd;
}
