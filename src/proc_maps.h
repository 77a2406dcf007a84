/* The kernel's answer for one address of this process: the mapping that
 * holds it and what it permits, asked through the PROCMAP_QUERY ioctl of
 * /proc/self/maps (Linux 6.11 and later) without touching the memory. */
#ifndef PINMEM_PROC_MAPS_H
#define PINMEM_PROC_MAPS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct pm__mapping {
    uintptr_t start, end;
    bool readable, writable;
} pm__mapping;

/* /proc/self/maps opened for queries, or -1 where the kernel cannot answer
 * them (the file is then closed). */
int pm__proc_maps_open(void);

/* 0 with *m the mapping that holds address; otherwise -1 with errno ENOENT
 * where no mapping does, or another errno where the kernel did not answer. */
int pm__proc_maps_query(int fd, uintptr_t address, pm__mapping *m);

#endif
