#include "posix_pages.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Raw system calls, as in posix.c: sanitizer runtimes make mlock a no-op. */
static int lock_pages(uintptr_t p, size_t len) { return (int)syscall(SYS_mlock, (void *)p, len); }
static void unlock_pages(uintptr_t p, size_t len) { syscall(SYS_munlock, (void *)p, len); }

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* The count of registrations on each page they cover in part: open
 * addressing keyed by the page's address (never 0: page 0 cannot be
 * registered). */
typedef struct page_count {
    uintptr_t page;
    size_t count;
} page_count;

static struct {
    pthread_mutex_t lock; /* guards the table, and orders each count's fall to
                             zero with the munlock it allows */
    page_count *slots;
    size_t cap, used; /* cap: 0 or a power of two */
} shared = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

/* The product's upper half, which every bit of the page number stirs (its
 * low bits follow the number's low bits alone, all zero above 4 KiB pages). */
static size_t home_of(uintptr_t page)
{
    return (size_t)(((uint64_t)(page >> 12) * 0x9E3779B97F4A7C15ull) >> 32) & (shared.cap - 1);
}

/* lock held, table made: the slot holding page, or the empty one where it would go. */
static page_count *slot_for(uintptr_t page)
{
    size_t i = home_of(page);
    while (shared.slots[i].page && shared.slots[i].page != page)
        i = (i + 1) & (shared.cap - 1);
    return &shared.slots[i];
}

/* lock held: the slot holding page, or NULL. */
static page_count *find(uintptr_t page)
{
    if (!shared.cap)
        return NULL;
    page_count *slot = slot_for(page);
    return slot->page ? slot : NULL;
}

/* lock held: room for one more page, the table growing at half full. */
static bool reserve_slot(void)
{
    if (shared.cap && 2 * (shared.used + 1) <= shared.cap)
        return true;
    const size_t old_cap = shared.cap, cap = old_cap ? 2 * old_cap : 64;
    page_count *old = shared.slots, *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return false;
    shared.slots = slots;
    shared.cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].page)
            *slot_for(old[i].page) = old[i];
    free(old);
    return true;
}

/* lock held: empties slot, moving back the entries after it that their
 * lookups would no longer reach. */
static void remove_slot(page_count *slot)
{
    size_t hole = (size_t)(slot - shared.slots), i = hole;
    for (;;) {
        i = (i + 1) & (shared.cap - 1);
        if (!shared.slots[i].page)
            break;
        const size_t home = home_of(shared.slots[i].page);
        /* It moves when its home is not in the cyclic range (hole, i]. */
        if (i > hole ? home <= hole || home > i : home <= hole && home > i) {
            shared.slots[hole] = shared.slots[i];
            hole = i;
        }
    }
    shared.slots[hole] = (page_count){0, 0};
    shared.used--;
}

/* The pages of [lo, hi) that [p, p + bytesize) covers only in part: at most
 * its first and its last. Returns how many. */
static int partial_pages(void *p, size_t bytesize, uintptr_t lo, uintptr_t hi, uintptr_t out[2])
{
    const size_t page = page_size();
    const uintptr_t start = (uintptr_t)p, end = start + bytesize;
    const bool one_page = hi - lo == page;
    int n = 0;
    if (start != lo || (one_page && end != hi))
        out[n++] = lo;
    if (!one_page && end != hi)
        out[n++] = hi - page;
    return n;
}

/* lock held: one registration fewer on page; unlocks it at zero. A page
 * never counted (I/O memory is not locked) has no one else to keep it. */
static void drop(uintptr_t page)
{
    page_count *slot = find(page);
    if (slot && --slot->count > 0)
        return;
    unlock_pages(page, page_size());
    if (slot)
        remove_slot(slot);
}

/* lock held: one registration more on page; false when the table cannot grow. */
static bool add(uintptr_t page)
{
    page_count *slot = find(page);
    if (!slot) {
        if (!reserve_slot())
            return false;
        slot = slot_for(page);
        slot->page = page;
        shared.used++;
    }
    slot->count++;
    return true;
}

int pm__posix_lock_registration(void *p, size_t bytesize, uintptr_t lo, uintptr_t hi)
{
    uintptr_t pages[2];
    const int n = partial_pages(p, bytesize, lo, hi, pages);
    /* Counted before locking: a neighbour's unregistration that runs
     * meanwhile then leaves the shared page locked. */
    pthread_mutex_lock(&shared.lock);
    int counted = 0;
    while (counted < n && add(pages[counted]))
        counted++;
    const bool all = counted == n;
    while (!all && counted > 0) { /* nothing was locked yet: only the counts go back */
        page_count *slot = find(pages[--counted]);
        if (--slot->count == 0)
            remove_slot(slot);
    }
    pthread_mutex_unlock(&shared.lock);
    if (!all)
        return -1;
    if (lock_pages(lo, hi - lo) != 0) {
        /* mlock can fail after locking part of the range (faulting ran out
         * of memory). */
        int err = errno;
        pm__posix_unlock_registration(p, bytesize, lo, hi);
        return err;
    }
    return 0;
}

void pm__posix_unlock_registration(void *p, size_t bytesize, uintptr_t lo, uintptr_t hi)
{
    uintptr_t pages[2];
    const int n = partial_pages(p, bytesize, lo, hi, pages);
    const size_t page = page_size();
    const uintptr_t own_lo = n > 0 && pages[0] == lo ? lo + page : lo;
    const uintptr_t own_hi = n > 0 && pages[n - 1] == hi - page ? hi - page : hi;
    if (own_hi > own_lo)
        unlock_pages(own_lo, own_hi - own_lo);
    pthread_mutex_lock(&shared.lock);
    for (int i = 0; i < n; i++)
        drop(pages[i]);
    pthread_mutex_unlock(&shared.lock);
}
