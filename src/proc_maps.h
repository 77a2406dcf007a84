/* What the kernel says of this process's mappings without touching their
 * memory: the one that holds an address and what it permits, asked through
 * the PROCMAP_QUERY ioctl of /proc/self/maps (Linux 6.11 and later), or, on
 * older kernels, every mapping in address order read from that file's text. */
#ifndef PINMEM_PROC_MAPS_H
#define PINMEM_PROC_MAPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pm__mapping {
    uintptr_t start, end;
    bool readable, writable;
    bool shared; /* MAP_SHARED, or a file's or shmem's shared mapping */
} pm__mapping;

/* /proc/self/maps opened for queries, or -1 where the kernel cannot answer
 * them (the file is then closed) or the file cannot be opened; *for_now then
 * says whether that may pass (the process or the system out of file
 * descriptors or memory), so that asking again later may succeed. */
int pm__proc_maps_open(bool *for_now);

/* 0 with *m the mapping that holds address; otherwise -1 with errno ENOENT
 * where no mapping does, or another errno where the kernel did not answer. */
int pm__proc_maps_query(int fd, uintptr_t address, pm__mapping *m);

/* A reading of the file's text, a line a mapping, lowest address first. */
typedef struct pm__maps_text {
    int fd;
    size_t len, pos; /* of the bytes read into buf, those not yet parsed */
    size_t read_size; /* the next read's */
    bool read_all;
    char buf[4096];
    /* The first bytes of the last mapping's name ("" for none, "[heap]",
     * a file's path), for callers that tell kinds of mapping apart. */
    char name[32];
} pm__maps_text;

/* 0 with t ready, or -1 (errno set) where the file cannot be opened. */
int pm__maps_text_open(pm__maps_text *t);
/* 1 with *m the next mapping, 0 after the last, or -1 (errno set) where the
 * text could not be read or parsed. */
int pm__maps_text_next(pm__maps_text *t, pm__mapping *m);
void pm__maps_text_close(pm__maps_text *t);
/* Whether the text can be read here. */
bool pm__maps_text_readable(void);

#endif
