/* The registry of every pinned range pinmem owns.
 *
 * Invariants (checked by pm__ranges_validate in tests and debug builds):
 *  - pinned extents [pin_base, pin_base + pin_len) never overlap, so the
 *    extent's base is a unique key. Memory pinmem maps itself (host
 *    allocations, pool chunks) has whole pages; a registration's extent is
 *    exactly its bytes, as the driver's is, so two registrations may share
 *    a page; allocations the driver placed have exactly their bytes too;
 *  - the user's bytes [base, base + size) lie inside the extent, and
 *    pin_base + pin_len never wraps around the address space;
 *  - registrations that share a page are all read_only or all not;
 *  - lookups are O(log n) (AVL tree), under a reader-writer lock.
 *
 * The bytes of an extent outside the user's (the rest of an allocation's
 * last page) are pinned but belong to nobody: the driver answers queries
 * about them as about pageable memory, and refuses to register them again.
 *
 * A range is first inserted PENDING (claiming its extent while the backend
 * pins it, so two threads can never pin overlapping ranges), then published
 * or withdrawn. Queries do not see pending ranges. */
#ifndef PINMEM_RANGES_H
#define PINMEM_RANGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pinmem.h"

typedef enum pm__range_kind {
    PM__RANGE_ALLOC = 1,      /* pm_mem_host_alloc / pm_mem_alloc_host */
    PM__RANGE_REGISTERED = 2, /* pm_mem_host_register */
    PM__RANGE_POOL = 4,       /* a chunk of a memory pool */
} pm__range_kind;

typedef struct pm__range {
    uintptr_t base;     /* what the user was given or registered */
    size_t size;        /* what the user asked for */
    uintptr_t pin_base; /* the extent claimed (see above) */
    size_t pin_len;
    unsigned flags;     /* the flags word queries report */
    unsigned kind;      /* pm__range_kind */
    unsigned backend_tag; /* the backend's note of how it pinned the range */
    bool read_only;     /* a registration made with READ_ONLY */
} pm__range;

typedef struct pm__ranges pm__ranges;

pm__ranges *pm__ranges_create(void);
void pm__ranges_destroy(pm__ranges *set);

/* Claims r's extent as pending. On overlap returns false and copies a
 * (published or pending) range in the way to *conflict: of those whose
 * extents r's extent overlaps, the first in address order whose user bytes
 * it overlaps, else the first. false with conflict->kind == 0 means out of
 * memory, or an extent that is empty or runs past the top of the address
 * space (callers rule those out first). */
bool pm__ranges_claim(pm__ranges *set, const pm__range *r, pm__range *conflict);
/* The same, for a range whose pages others may share (registrations): under
 * the claim's lock, take(bytes, ctx) is given the bytes of the pages (of page
 * bytes) r's extent touches that no other claimed extent touches, that is
 * what pinning r pins anew; when it returns false nothing is claimed and
 * conflict->kind is 0. The driver lets no page hold registrations of both
 * kinds of read_only, so a range that would share a page with a registration
 * of the other kind is not claimed either: *conflict is that registration,
 * which, unlike one in the way, has no byte in common with r. */
bool pm__ranges_claim_pages(pm__ranges *set, const pm__range *r, size_t page,
                            bool (*take)(size_t bytes, void *ctx), void *ctx,
                            pm__range *conflict);
/* Makes a claimed range visible to queries, with its final fields. */
void pm__ranges_publish(pm__ranges *set, const pm__range *r);
/* Drops a pending claim: the backend failed, or finished unpinning a retired range. */
void pm__ranges_withdraw(pm__ranges *set, uintptr_t pin_base);
/* The same for a range claimed with pm__ranges_claim_pages: returns the
 * bytes of the pages it touched that no other claimed extent touches, that
 * is what unpinning it gave back. Over any sequence of claims and withdraws
 * the two count every page once, however many registrations share it. */
size_t pm__ranges_withdraw_pages(pm__ranges *set, uintptr_t pin_base, size_t page);

/* Where addr lies among the published ranges. */
typedef enum pm__range_place {
    PM__PLACE_NONE = 0, /* in no extent: memory pinmem does not track */
    PM__PLACE_BYTES,    /* in a range's user bytes */
    PM__PLACE_SLACK,    /* in an extent, outside its user bytes */
} pm__range_place;
pm__range_place pm__ranges_locate(pm__ranges *set, uintptr_t addr, pm__range *out);
/* The published range whose user bytes contain addr. */
bool pm__ranges_find(pm__ranges *set, uintptr_t addr, pm__range *out);
/* The published range whose pinned extent contains addr. */
bool pm__ranges_find_extent(pm__ranges *set, uintptr_t addr, pm__range *out);
/* In one look (copies ask this of every piece): the published range whose
 * pinned extent contains addr, else the one with the lowest extent base above
 * addr. */
typedef enum { PM__EXTENT_NONE, PM__EXTENT_AT, PM__EXTENT_AFTER } pm__extent_found;
pm__extent_found pm__ranges_extent_at_or_after(pm__ranges *set, uintptr_t addr, pm__range *out);
/* Also in one look (a batch asks this of its blocks): true with the
 * published range whose pinned extent contains addr, else false with the gap
 * around addr that no published extent touches, [*gap_lo, *gap_hi): from the
 * end of the extent below (0 where none) to the base of the one above
 * (UINTPTR_MAX where none). */
bool pm__ranges_extent_or_gap(pm__ranges *set, uintptr_t addr, pm__range *out,
                              uintptr_t *gap_lo, uintptr_t *gap_hi);

/* Retires the published range whose user base is exactly base and whose
 * kind is in kind_mask: queries stop seeing it, but its extent stays claimed
 * until pm__ranges_withdraw, so nobody can pin those pages again while the
 * backend is still unpinning them. *out receives the range retired, or
 * otherwise the range whose extent contains base. */
typedef enum pm__retire_outcome {
    PM__RETIRED = 0,
    PM__RETIRE_NOT_TRACKED, /* no range's extent contains base */
    PM__RETIRE_MISMATCH,    /* a range's user bytes do, but base is not its start,
                               or the kind differs */
    PM__RETIRE_SLACK,       /* an extent does, outside its user bytes */
} pm__retire_outcome;
pm__retire_outcome pm__ranges_retire(pm__ranges *set, uintptr_t base, unsigned kind_mask,
                                     pm__range *out);

size_t pm__ranges_count(pm__ranges *set);
/* Calls fn on every published range in address order, under the read lock. */
void pm__ranges_foreach(pm__ranges *set, void (*fn)(const pm__range *, void *), void *ctx);
/* Checks the tree's invariants; returns false (and why) when one is broken. */
bool pm__ranges_validate(pm__ranges *set, const char **why);

#endif
