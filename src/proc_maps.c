#include "proc_maps.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
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
#define VMA_SHARED 0x8u

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
                       .writable = (q.vma_flags & VMA_WRITABLE) != 0,
                       .shared = (q.vma_flags & VMA_SHARED) != 0};
    return 0;
}

int pm__proc_maps_open(bool *for_now)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    *for_now = fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOMEM);
    pm__mapping m;
    if (fd >= 0 && pm__proc_maps_query(fd, (uintptr_t)&m, &m) != 0) {
        close(fd); /* no PROCMAP_QUERY here */
        fd = -1;
    }
    return fd;
}

int pm__maps_text_open(pm__maps_text *t)
{
    if (PM__TEST_FAULT(pm__fault_maps_text)) {
        errno = ENOENT; /* as where /proc is not mounted */
        return -1;
    }
    t->fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    t->len = t->pos = 0;
    t->read_size = 512;
    t->read_all = false;
    t->name[0] = '\0';
    return t->fd >= 0 ? 0 : -1;
}

void pm__maps_text_close(pm__maps_text *t)
{
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
}

bool pm__maps_text_readable(void)
{
    pm__maps_text t;
    if (pm__maps_text_open(&t) != 0)
        return false;
    pm__maps_text_close(&t);
    return true;
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Keeps the unparsed bytes and reads more after them, once: 0, or -1 on an
 * error. */
static int refill(pm__maps_text *t)
{
    memmove(t->buf, t->buf + t->pos, t->len - t->pos);
    t->len -= t->pos;
    t->pos = 0;
    /* The kernel formats only the lines a read asks for: small reads first,
     * as the mapping sought is often among the first. */
    size_t want = min_size(sizeof t->buf - t->len, t->read_size);
    if (t->read_size < sizeof t->buf)
        t->read_size *= 2;
    ssize_t got;
    do
        got = read(t->fd, t->buf + t->len, want);
    while (got < 0 && errno == EINTR);
    if (got < 0)
        return -1;
    t->read_all = got == 0;
    t->len += (size_t)got;
    return 0;
}

/* The hexadecimal number at t->buf[*at], ended by `end`; false if there is none. */
static bool parse_hex(const pm__maps_text *t, size_t *at, char end, uintptr_t *value)
{
    uintptr_t v = 0;
    size_t i = *at, digits = 0;
    for (; i < t->len && t->buf[i] != end; i++, digits++) {
        char c = t->buf[i];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                                            : 16u;
        if (d == 16 || digits == 2 * sizeof v)
            return false;
        v = v << 4 | d;
    }
    if (i == t->len || digits == 0)
        return false;
    *at = i + 1;
    *value = v;
    return true;
}

/* Copies into t->name the head of the name after the four fields that
 * follow the range (perms, offset, device, inode) from t->buf[at]. */
static void read_name_head(pm__maps_text *t, size_t at)
{
    size_t i = at, n = 0;
    for (int spaces = 0; spaces < 4 && i < t->len && t->buf[i] != '\n'; i++)
        spaces += t->buf[i] == ' ';
    while (i < t->len && t->buf[i] == ' ')
        i++;
    while (i < t->len && t->buf[i] != '\n' && n + 1 < sizeof t->name)
        t->name[n++] = t->buf[i++];
    t->name[n] = '\0';
}

int pm__maps_text_next(pm__maps_text *t, pm__mapping *m)
{
    /* A line starts "start-end perms offset device inode", padded to column
     * 73 before its name: the head of that name lies within this much. */
    enum { HEAD_MAX = 128 };
    while (t->len - t->pos < HEAD_MAX && !t->read_all)
        if (refill(t) != 0)
            return -1;
    if (t->pos == t->len)
        return 0;
    size_t at = t->pos;
    uintptr_t start, end;
    if (!parse_hex(t, &at, '-', &start) || !parse_hex(t, &at, ' ', &end) || at + 4 > t->len ||
        end < start) {
        errno = EIO;
        return -1;
    }
    *m = (pm__mapping){.start = start,
                       .end = end,
                       .readable = t->buf[at] == 'r',
                       .writable = t->buf[at + 1] == 'w',
                       .shared = t->buf[at + 3] == 's'};
    read_name_head(t, at);
    /* The rest of the line (a file's name may outgrow the buffer). */
    for (;;) {
        const char *nl = memchr(t->buf + at, '\n', t->len - at);
        if (nl) {
            t->pos = (size_t)(nl - t->buf) + 1;
            return 1;
        }
        t->pos = t->len;
        if (t->read_all)
            return 1;
        if (refill(t) != 0)
            return -1;
        at = 0;
    }
}
