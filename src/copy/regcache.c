/* The registration cache: large pageable buffers that are copied again and
 * again stay registered between copies, so later copies go straight to DMA.
 *
 * The danger is staleness: the driver keeps a registration's pages after the
 * user unmaps or discards that memory, and would send old bytes. So the cache
 * works only where it hears every change: each cached range is also
 * registered with a userfaultfd that reports munmap (brk shrink included),
 * madvise(MADV_DONTNEED/REMOVE) and mremap. Without userfaultfd the cache
 * registers nothing. pm_mem_invalidate covers anything else.
 *
 * A reported change dooms the entries it touches: no new copy uses them, and
 * copies that would reach the driver with those addresses are staged
 * instead, until a thread of the cache has undone the registration (which waits
 * for all device work, so it never happens on a copy's path).
 *
 * The monitor reads events while holding the cache lock. munmap and madvise
 * return only once their event has been read, so by the time the user can map
 * new memory at an address, the entry there is doomed, and any copy that
 * looks it up afterwards waits for the lock and sees that.
 *
 * Since the allocator itself unmaps and discards memory (a heap trimmed by
 * free), nothing calls it under the cache lock, and the monitor never calls
 * it at all: undoing registrations (the driver, then free) runs on a thread
 * of its own, so that an unmap's event is read even while that thread waits
 * for an allocator lock held by the thread that unmaps.
 *
 * Only private memory is cached: a shared mapping's pages can be dropped
 * (truncated, punched, removed by another process) with no event here. */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../budget.h"
#include "../errors.h"
#include "../instance.h"
#include "../proc_maps.h"
#include "../thread_start.h"
#include "copy.h"

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

struct pm__regcache_entry {
    uintptr_t lo, hi;  /* whole pages */
    int refs;          /* copies using it */
    bool ready;        /* registered with the driver and the userfaultfd */
    bool doomed;       /* no new copy may use it; undone once refs is 0 */
    bool undoing;      /* the undoer is unregistering it */
    bool in_uffd;      /* its watch stands (set and cleared under the lock) */
    unsigned long long last_use;
    struct pm__regcache_entry *next;
    struct pm__regcache_entry *undo_next; /* the undoer's own list, while undoing */
};
typedef struct pm__regcache_entry entry;

static const unsigned long long listen_features =
    UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP;

/* Process-wide (part of the instance). */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t undone;
    entry *entries;
    _Atomic size_t count; /* entries, for a lock-free "none" on every copy */
    size_t bytes;         /* live, not doomed */
    unsigned long long tick;
    int uffd, wake_fd;
    pthread_cond_t undo_wanted; /* wakes the undoer */
    bool undo_pending, undoer_running;
} rc = {.lock = PTHREAD_MUTEX_INITIALIZER, .undone = PTHREAD_COND_INITIALIZER, .uffd = -1,
        .wake_fd = -1, .undo_wanted = PTHREAD_COND_INITIALIZER};

/* Whether the cache hears unmaps: the userfaultfd and the monitor start on
 * first use; a start that failed for want of descriptors or threads is
 * tried again by the next call that asks. */
enum { LISTEN_NOT_YET, LISTEN_YES, LISTEN_NEVER };
static pthread_mutex_t listen_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int listen_state;

static void wake_monitor(void)
{
    uint64_t one = 1;
    if (rc.wake_fd >= 0 && write(rc.wake_fd, &one, sizeof one) < 0) {
        /* a full counter already wakes it */
    }
}

/* The mapping that holds addr; false if none. */
static bool mapping_around(uintptr_t addr, uintptr_t *start, uintptr_t *end)
{
    pm__maps_text t;
    pm__mapping m;
    bool found = false;
    if (pm__maps_text_open(&t) != 0)
        return false;
    while (!found && pm__maps_text_next(&t, &m) == 1 && m.start <= addr)
        if (addr < m.end) {
            *start = m.start;
            *end = m.end;
            found = true;
        }
    pm__maps_text_close(&t);
    return found;
}

/* Takes [lo, hi) out of the userfaultfd, where anything of it is mapped.
 * The kernel refuses the whole range when part of it is not mapped at all,
 * or is memory a userfaultfd cannot watch; then each mapping in it is
 * taken out alone. */
static void uffd_unregister(uintptr_t lo, uintptr_t hi)
{
    if (lo >= hi)
        return;
    struct uffdio_range range = {.start = lo, .len = hi - lo};
    if (ioctl(rc.uffd, UFFDIO_UNREGISTER, &range) == 0 || errno != EINVAL)
        return;
    pm__maps_text t;
    pm__mapping m;
    if (pm__maps_text_open(&t) != 0)
        return;
    while (pm__maps_text_next(&t, &m) == 1 && m.start < hi)
        if (lo < m.end) {
            range.start = m.start > lo ? m.start : lo;
            range.len = (m.end < hi ? m.end : hi) - range.start;
            ioctl(rc.uffd, UFFDIO_UNREGISTER, &range); /* fails for what it cannot watch */
        }
    pm__maps_text_close(&t);
}

/* lock held: takes the parts of [lo, hi) that no live entry covers out of
 * the userfaultfd (what a moved or grown mapping carried along). */
static void unregister_outside_live(uintptr_t lo, uintptr_t hi)
{
    for (uintptr_t at = lo; at < hi;) {
        uintptr_t next = hi;
        bool covered = false;
        for (entry *e = rc.entries; e; e = e->next) {
            if (e->doomed || !e->in_uffd || e->hi <= at || e->lo >= hi)
                continue;
            if (e->lo <= at) {
                covered = true;
                next = e->hi;
                break;
            }
            if (e->lo < next)
                next = e->lo;
        }
        if (!covered)
            uffd_unregister(at, next);
        at = next;
    }
}

/* lock held: dooms the entries that overlap [lo, hi), and takes what is
 * left of them out of the userfaultfd, so that no stale registration stays
 * behind: [gone_lo, gone_hi) is unmapped already (the kernel forgot it),
 * the rest may still be mapped, or moved on (see read_events_locked). */
static void doom_locked(uintptr_t lo, uintptr_t hi, uintptr_t gone_lo, uintptr_t gone_hi)
{
    for (entry *e = rc.entries; e; e = e->next) {
        if (e->hi <= lo || e->lo >= hi || e->doomed)
            continue;
        e->doomed = true;
        rc.bytes -= e->hi - e->lo;
        atomic_fetch_add_explicit(&pm__copy_count.cache_invalidations, 1, memory_order_relaxed);
        if (!e->in_uffd)
            continue;
        e->in_uffd = false;
        if (gone_lo >= gone_hi || e->hi <= gone_lo || e->lo >= gone_hi) {
            uffd_unregister(e->lo, e->hi);
        } else {
            uffd_unregister(e->lo, gone_lo > e->lo ? gone_lo : e->lo);
            uffd_unregister(gone_hi < e->hi ? gone_hi : e->hi, e->hi);
        }
    }
}

static void doom_range_locked(uintptr_t lo, uintptr_t hi) { doom_locked(lo, hi, 0, 0); }

/* lock held: reads every queued event. */
static void read_events_locked(void)
{
    struct uffd_msg msg;
    uintptr_t start, end;
    while (read(rc.uffd, &msg, sizeof msg) == (ssize_t)sizeof msg) {
        switch (msg.event) {
        case UFFD_EVENT_UNMAP:
            doom_locked(msg.arg.remove.start, msg.arg.remove.end, msg.arg.remove.start,
                        msg.arg.remove.end);
            break;
        case UFFD_EVENT_REMOVE:
            doom_range_locked(msg.arg.remove.start, msg.arg.remove.end);
            break;
        case UFFD_EVENT_REMAP: {
            /* mremap moved the mapping (realloc of a large block does): the
             * old range is gone, and the mapping at the new one, grown
             * perhaps, is still registered with the userfaultfd. */
            uintptr_t from = msg.arg.remap.from, to = msg.arg.remap.to;
            doom_locked(from, from + msg.arg.remap.len, from, from + msg.arg.remap.len);
            if (mapping_around(to, &start, &end))
                unregister_outside_live(start, end);
            else
                uffd_unregister(to, to + msg.arg.remap.len);
            break;
        }
        case UFFD_EVENT_PAGEFAULT: {
            /* Only where faults on missing pages are registered (the
             * fallback mode, see register_range): a page of a cached range
             * went missing without an event we saw first (drop the entry),
             * or a page a mapping grew by in place, which carried the
             * registration along (drop that). Unregistering wakes the
             * fault, which proceeds as if we had never been there. */
            const uintptr_t page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
            uintptr_t page = (uintptr_t)msg.arg.pagefault.address & ~(page_size - 1);
            doom_range_locked(page, page + 1);
            if (mapping_around(page, &start, &end))
                unregister_outside_live(start, end);
            uffd_unregister(page, page + page_size); /* a whole page, as the kernel wants */
            break;
        }
        default:
            break;
        }
    }
}

/* Undoes the registrations of doomed entries nobody uses. Only the undoer
 * marks entries undoing and removes ready ones, so those it marks stay put
 * meanwhile, and its own list of them can be walked without the lock. */
static void undo_doomed(void)
{
    entry *todo = NULL;
    pthread_mutex_lock(&rc.lock);
    for (entry *e = rc.entries; e; e = e->next)
        if (e->doomed && e->refs == 0 && e->ready) {
            e->undoing = true;
            e->undo_next = todo;
            todo = e;
        }
    pthread_mutex_unlock(&rc.lock);
    if (!todo)
        return;
    for (entry *e = todo; e; e = e->undo_next) {
        pm__instance_backend()->cache_unregister((void *)e->lo, e->hi - e->lo);
        pm__budget_give(e->hi - e->lo);
    }
    pthread_mutex_lock(&rc.lock);
    for (entry **link = &rc.entries; *link;) {
        entry *e = *link;
        if (e->undoing) {
            *link = e->next;
            atomic_fetch_sub(&rc.count, 1);
        } else {
            link = &e->next;
        }
    }
    pthread_cond_broadcast(&rc.undone);
    pthread_mutex_unlock(&rc.lock);
    while (todo) {
        entry *next = todo->undo_next;
        free(todo);
        todo = next;
    }
}

static void *undoer_main(void *unused)
{
    (void)unused;
    pm__thread_begin("pinmem-cache");
    pm__instance_backend()->own_thread_start();
    for (;;) {
        pthread_mutex_lock(&rc.lock);
        while (!rc.undo_pending)
            pthread_cond_wait(&rc.undo_wanted, &rc.lock);
        rc.undo_pending = false;
        pthread_mutex_unlock(&rc.lock);
        undo_doomed();
    }
    return NULL;
}

/* The monitor: reads events and dooms entries, and hands the undoing over. */
static void *monitor_main(void *unused)
{
    (void)unused;
    pm__thread_begin("pinmem-cache");
    for (;;) {
        struct pollfd fds[2] = {{.fd = rc.uffd, .events = POLLIN}, {.fd = rc.wake_fd, .events = POLLIN}};
        if (poll(fds, 2, -1) < 0 && errno != EINTR)
            break;
        uint64_t drained;
        if (fds[1].revents & POLLIN && read(rc.wake_fd, &drained, sizeof drained) < 0) {
            /* nothing to drain */
        }
        pthread_mutex_lock(&rc.lock);
        read_events_locked();
        rc.undo_pending = true;
        pthread_cond_signal(&rc.undo_wanted);
        pthread_mutex_unlock(&rc.lock);
    }
    return NULL;
}

/* A userfaultfd that reports the events, or -1 with *for_good set where the
 * kernel will never give one (not built in, not permitted, too old). */
static int open_uffd(bool *for_good)
{
    /* Unprivileged processes may only ask for faults from user mode (the
     * events are delivered all the same). */
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    if (fd < 0) {
        *for_good = errno != EMFILE && errno != ENFILE && errno != ENOMEM;
        return -1;
    }
    struct uffdio_api api = {.api = UFFD_API, .features = listen_features};
    if (ioctl(fd, UFFDIO_API, &api) != 0 || (api.features & listen_features) != listen_features) {
        close(fd);
        *for_good = true;
        return -1;
    }
    return fd;
}

/* listen_lock held: opens the userfaultfd and starts the monitor. */
static int start_listening(void)
{
    bool for_good = false;
    rc.uffd = open_uffd(&for_good);
    if (rc.uffd < 0)
        return for_good ? LISTEN_NEVER : LISTEN_NOT_YET;
    rc.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    /* The undoer, once started, waits for work across a failed start of the monitor. */
    if (rc.wake_fd >= 0 && !rc.undoer_running)
        rc.undoer_running = pm__thread_start(&thread, &attr, undoer_main, NULL) == 0;
    bool started = rc.wake_fd >= 0 && rc.undoer_running &&
                   pm__thread_start(&thread, &attr, monitor_main, NULL) == 0;
    pthread_attr_destroy(&attr);
    if (started)
        return LISTEN_YES;
    close(rc.uffd);
    if (rc.wake_fd >= 0)
        close(rc.wake_fd);
    rc.uffd = rc.wake_fd = -1;
    return LISTEN_NOT_YET; /* out of descriptors or threads for now */
}

bool pm__regcache_listening(void)
{
    int state = atomic_load_explicit(&listen_state, memory_order_acquire);
    if (state != LISTEN_NOT_YET)
        return state == LISTEN_YES;
    pthread_mutex_lock(&listen_lock);
    state = atomic_load_explicit(&listen_state, memory_order_relaxed);
    if (state == LISTEN_NOT_YET) {
        state = start_listening();
        atomic_store_explicit(&listen_state, state, memory_order_release);
    }
    pthread_mutex_unlock(&listen_lock);
    return state == LISTEN_YES;
}

/* lock held: dooms the least recently used idle entries until want more
 * bytes fit under max. */
static bool make_room_locked(size_t want, size_t max)
{
    while (rc.bytes + want > max) {
        entry *oldest = NULL;
        for (entry *e = rc.entries; e; e = e->next)
            if (!e->doomed && e->ready && e->refs == 0 && (!oldest || e->last_use < oldest->last_use))
                oldest = e;
        if (!oldest)
            return false;
        doom_range_locked(oldest->lo, oldest->hi);
    }
    return true;
}

/* Whether every page of [lo, hi) lies in private mappings. */
static bool all_private(uintptr_t lo, uintptr_t hi)
{
    pm__maps_text t;
    pm__mapping m;
    bool ok = true;
    uintptr_t covered = lo;
    if (pm__maps_text_open(&t) != 0)
        return false;
    while (ok && covered < hi && pm__maps_text_next(&t, &m) == 1 && m.start < hi)
        if (lo < m.end) {
            ok = !m.shared && m.start <= covered;
            covered = m.end;
        }
    pm__maps_text_close(&t);
    return ok && covered >= hi;
}

/* Has the userfaultfd watch e's range in mode, under the lock and with
 * in_uffd set, so that the monitor's unwatching around a moved mapping
 * cannot end the watch unseen; true without a watch where e was doomed
 * meanwhile (settle_fresh hands it to the undoer). */
static bool start_watch(entry *e, unsigned long long mode)
{
    struct uffdio_register reg = {.range = {.start = e->lo, .len = e->hi - e->lo}, .mode = mode};
    pthread_mutex_lock(&rc.lock);
    bool ok = e->doomed || ioctl(rc.uffd, UFFDIO_REGISTER, &reg) == 0;
    e->in_uffd = !e->doomed && ok;
    pthread_mutex_unlock(&rc.lock);
    return ok;
}

/* Registers a fresh entry's range with the driver, watched by the
 * userfaultfd.
 *
 * The watch is for write-protect faults, which never come (no page is ever
 * write-protected): it exists for its events, and starts before the driver
 * pins, so that an unmap or discard from then on is heard (after, a range
 * unmapped and mapped anew meanwhile would stay cached with its old pages).
 * Missing-page faults are the fallback where the kernel cannot watch writes
 * to the memory; that watch starts after the pinning, which faults pages in
 * from the kernel, and a userfaultfd in user-mode-only mode would refuse
 * those. Then every fault on a missing page of the range, and of whatever a
 * mapping grows by in place (mremap gives no event for that), goes through
 * the monitor, and in user-mode-only mode a system call that writes into
 * such a page fails with EFAULT. A watch left by a failed registration is
 * ended by settle_fresh. */
static bool register_range(entry *fresh)
{
    const uintptr_t lo = fresh->lo, hi = fresh->hi;
    if (!all_private(lo, hi))
        return false;
    if (pm__budget_take(hi - lo, "registration cache") != PM_SUCCESS)
        return false;
    const bool writes = start_watch(fresh, UFFDIO_REGISTER_MODE_WP);
    const pm__backend *b = pm__instance_backend();
    bool ok = b->cache_register((void *)lo, hi - lo) == PM_SUCCESS;
    if (ok && !writes && !start_watch(fresh, UFFDIO_REGISTER_MODE_MISSING)) {
        b->cache_unregister((void *)lo, hi - lo); /* not anonymous memory, say */
        ok = false;
    }
    if (!ok)
        pm__budget_give(hi - lo);
    return ok;
}

/* Under the lock: the ready entry that covers [lo, hi) (*hit), else a
 * fresh one reserved for it (*spare, allocated before the lock was taken),
 * or NULL where another registration is in the way, the range does not fit,
 * or memory ran out. */
static entry *lookup_locked(const pm__copy_settings *set, uintptr_t lo, uintptr_t hi, bool *hit,
                            entry **spare)
{
    bool blocked = false;
    for (entry *e = rc.entries; e; e = e->next) {
        if (e->hi <= lo || e->lo >= hi)
            continue;
        if (!e->doomed && e->ready && e->lo <= lo && hi <= e->hi) {
            e->refs++;
            e->last_use = ++rc.tick;
            *hit = true;
            return e;
        }
        /* A smaller or shifted registration is in the way: replace it once
         * the undoer has undone it; until then this copy is staged. */
        if (!e->doomed && e->ready && e->refs == 0)
            doom_range_locked(e->lo, e->hi);
        blocked = true;
    }
    entry *fresh = NULL;
    /* A registration of more than one piece would have boundaries inside it
     * that a cached copy's single DMA must not cross. */
    size_t piece = pm__instance_backend()->registration_piece;
    bool fits = hi - lo <= set->cache_max_bytes && (piece == 0 || hi - lo <= piece);
    if (!blocked && fits && make_room_locked(hi - lo, set->cache_max_bytes)) {
        fresh = *spare;
        *spare = NULL;
    }
    if (fresh) {
        *fresh = (entry){.lo = lo, .hi = hi, .refs = 1, .last_use = ++rc.tick, .next = rc.entries};
        rc.entries = fresh;
        rc.bytes += hi - lo;
        atomic_fetch_add(&rc.count, 1);
    }
    return fresh;
}

/* A fresh entry once its range's registration ended (ok: it worked): ready
 * for this copy, or NULL where it was invalidated meanwhile or failed. */
static entry *settle_fresh(entry *fresh, uintptr_t lo, uintptr_t hi, bool ok)
{
    pthread_mutex_lock(&rc.lock);
    if (ok && fresh->doomed) {
        /* Invalidated while it was being registered: not for this copy (the
         * doom ended its watch, if it had one yet). */
        fresh->ready = true;
        fresh->refs = 0;
        pthread_mutex_unlock(&rc.lock);
        wake_monitor();
        return NULL;
    }
    if (ok) {
        fresh->ready = true;
    } else {
        if (fresh->in_uffd) /* a watch for writes, started before the registration failed */
            uffd_unregister(lo, hi);
        for (entry **link = &rc.entries; *link; link = &(*link)->next)
            if (*link == fresh) {
                *link = fresh->next;
                break;
            }
        if (!fresh->doomed)
            rc.bytes -= hi - lo;
        atomic_fetch_sub(&rc.count, 1);
        /* An invalidation may be waiting for this entry to go. */
        pthread_cond_broadcast(&rc.undone);
    }
    pthread_mutex_unlock(&rc.lock);
    if (!ok) {
        free(fresh);
        fresh = NULL;
    }
    if (fresh)
        atomic_fetch_add_explicit(&pm__copy_count.cache_registrations, 1, memory_order_relaxed);
    return fresh;
}

pm__regcache_entry *pm__regcache_acquire(const pm__copy_settings *set, const void *p, size_t bytes)
{
    if (!set->registration_cache || !pm__regcache_listening())
        return NULL;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE) - 1;
    const uintptr_t lo = (uintptr_t)p & ~page, hi = ((uintptr_t)p + bytes + page) & ~page;
    entry *spare = calloc(1, sizeof *spare);
    pthread_mutex_lock(&rc.lock);
    read_events_locked(); /* as fresh as the lock allows */
    bool hit = false;
    entry *e = lookup_locked(set, lo, hi, &hit, &spare);
    pthread_mutex_unlock(&rc.lock);
    free(spare);
    if (hit) {
        atomic_fetch_add_explicit(&pm__copy_count.cache_hits, 1, memory_order_relaxed);
        return e;
    }
    wake_monitor();
    return e ? settle_fresh(e, lo, hi, register_range(e)) : NULL;
}

void pm__regcache_release(pm__regcache_entry *e)
{
    pthread_mutex_lock(&rc.lock);
    bool undo = --e->refs == 0 && e->doomed;
    pthread_mutex_unlock(&rc.lock);
    if (undo)
        wake_monitor();
}

bool pm__regcache_overlaps(const void *p, size_t bytes)
{
    if (atomic_load_explicit(&rc.count, memory_order_acquire) == 0)
        return false;
    const uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    bool hit = false;
    pthread_mutex_lock(&rc.lock);
    read_events_locked();
    for (entry *e = rc.entries; e && !hit; e = e->next)
        hit = e->lo < hi && lo < e->hi;
    pthread_mutex_unlock(&rc.lock);
    return hit;
}

pm__memory_kind pm__regcache_kind(const void *p, size_t bytes, pm__memory_kind kind)
{
    return kind == PM__MEMORY_HOST_DRIVER_PINNED && pm__regcache_overlaps(p, bytes)
               ? PM__MEMORY_HOST
               : kind;
}

void pm__regcache_invalidate(uintptr_t lo, uintptr_t hi, bool wait)
{
    if (atomic_load_explicit(&rc.count, memory_order_acquire) == 0)
        return;
    pthread_mutex_lock(&rc.lock);
    read_events_locked();
    doom_range_locked(lo, hi);
    wake_monitor();
    /* Until nothing overlaps: each entry goes when the undoer has undone
     * it, or when its registration failed. An entry another copy added
     * meanwhile is doomed in turn, or nothing would ever undo it. */
    for (bool pending = wait; pending;) {
        pending = false;
        for (entry *e = rc.entries; e && !pending; e = e->next)
            pending = e->lo < hi && lo < e->hi;
        if (pending) {
            pthread_cond_wait(&rc.undone, &rc.lock);
            doom_range_locked(lo, hi);
            wake_monitor();
        }
    }
    pthread_mutex_unlock(&rc.lock);
}
