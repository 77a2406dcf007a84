/* The registry alone, against a brute-force model: random claims, publishes,
 * retires and lookups (of user bytes, and of the extent at or after an
 * address, as copies ask), with the tree's invariants checked throughout;
 * registrations of exact bytes that share pages, with every page counted
 * once; which range a conflict names, and the rest of an allocation's pages. */
#include <stdint.h>

#include "check.h"
#include "ranges.h"

enum { slots = 4096, steps = 200000 };
static const uintptr_t arena = (uintptr_t)1 << 40, page = 4096;

typedef struct model_slot {
    int state; /* 0 free, 1 published */
    pm__range r;
} model_slot;

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t next(void) { return xorshift64(&rng); }

/* Extents that are empty or run past the top of the address space are
 * refused: the overlap check orders extents by their ends. */
static void wrapping_claims(pm__ranges *set)
{
    const uintptr_t top_page = UINTPTR_MAX - page + 1;
    pm__range near_top = {.pin_base = top_page - page, .pin_len = page, .base = top_page - page,
                          .size = 1, .kind = PM__RANGE_REGISTERED};
    pm__range conflict;
    REQUIRE(pm__ranges_claim(set, &near_top, &conflict));
    pm__ranges_publish(set, &near_top);
    const pm__range bad[] = {
        {.pin_base = top_page, .pin_len = page, .base = top_page, .size = 1},
        {.pin_base = top_page - page, .pin_len = 3 * page, .base = top_page - page, .size = 1},
        {.pin_base = UINTPTR_MAX - 100, .pin_len = 200, .base = UINTPTR_MAX - 100, .size = 200},
        {.pin_base = arena, .pin_len = 0, .base = arena, .size = 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pm__range r = bad[i];
        r.kind = PM__RANGE_REGISTERED;
        conflict.kind = 99;
        CHECK(!pm__ranges_claim(set, &r, &conflict));
        CHECK(conflict.kind == 0);
    }
    pm__range out;
    CHECK(pm__ranges_find(set, top_page - page, &out));
    CHECK(!pm__ranges_find(set, UINTPTR_MAX - 50, &out));
    CHECK(!pm__ranges_find_extent(set, top_page, &out));
    CHECK(pm__ranges_retire(set, top_page - page, PM__RANGE_REGISTERED, &out) == PM__RETIRED);
    pm__ranges_withdraw(set, top_page - page);
    CHECK(pm__ranges_count(set) == 0);
    CHECK(pm__ranges_validate(set, NULL));
}

static bool take_into(size_t bytes, void *total)
{
    *(size_t *)total += bytes;
    return true;
}

static bool refuse(size_t bytes, void *ctx)
{
    (void)bytes;
    (void)ctx;
    return false;
}

/* How many registrations of the model touch page k of the arena. */
static int touching(const uintptr_t (*regs)[2], int n, uintptr_t page_lo)
{
    int count = 0;
    for (int i = 0; i < n; i++)
        count += regs[i][0] < page_lo + page && page_lo < regs[i][1];
    return count;
}

/* Registrations of exact bytes, one to a few pages long, packed so that they
 * share pages: a claim succeeds exactly when no bytes overlap, and what the
 * claims take and the withdraws give back always equals the pages touched. */
static void shared_pages(pm__ranges *set)
{
    enum { arena_pages = 16, live_max = 24, rounds = 20000 };
    uintptr_t regs[live_max][2];
    int n = 0;
    size_t taken = 0;
    for (int round = 0; round < rounds; round++) {
        if (n < live_max && next() % 2) {
            uintptr_t lo = arena + next() % (arena_pages * page - 64);
            uintptr_t len = 1 + next() % (next() % 4 ? 200 : 2 * page);
            if (lo + len > arena + arena_pages * page)
                len = arena + arena_pages * page - lo;
            bool overlaps = false;
            for (int i = 0; i < n; i++)
                overlaps |= regs[i][0] < lo + len && lo < regs[i][1];
            size_t fresh_pages = 0;
            for (uintptr_t pg = lo & ~(page - 1); pg < lo + len; pg += page)
                fresh_pages += !touching((const uintptr_t(*)[2])regs, n, pg);
            pm__range r = {.base = lo, .size = len, .pin_base = lo, .pin_len = len,
                           .kind = PM__RANGE_REGISTERED};
            pm__range conflict;
            size_t got = 0;
            bool claimed = pm__ranges_claim_pages(set, &r, page, take_into, &got, &conflict);
            CHECK(claimed == !overlaps);
            if (claimed) {
                CHECK(got == fresh_pages * page);
                taken += got;
                pm__ranges_publish(set, &r);
                regs[n][0] = lo;
                regs[n++][1] = lo + len;
            } else {
                CHECK(conflict.kind == PM__RANGE_REGISTERED);
            }
        } else if (n > 0) {
            int i = (int)(next() % (uint64_t)n);
            const uintptr_t lo = regs[i][0], hi = regs[i][1];
            regs[i][0] = regs[n - 1][0];
            regs[i][1] = regs[n - 1][1];
            n--;
            size_t freed_pages = 0;
            for (uintptr_t pg = lo & ~(page - 1); pg < hi; pg += page)
                freed_pages += !touching((const uintptr_t(*)[2])regs, n, pg);
            pm__range out;
            CHECK(pm__ranges_retire(set, lo, PM__RANGE_REGISTERED, &out) == PM__RETIRED);
            size_t freed = pm__ranges_withdraw_pages(set, lo, page);
            CHECK(freed == freed_pages * page);
            taken -= freed;
        }
        size_t touched = 0;
        for (uintptr_t pg = arena; pg < arena + arena_pages * page; pg += page)
            touched += touching((const uintptr_t(*)[2])regs, n, pg) > 0;
        CHECK(taken == touched * page);
    }
    while (n > 0) {
        pm__range out;
        CHECK(pm__ranges_retire(set, regs[n - 1][0], PM__RANGE_REGISTERED, &out) == PM__RETIRED);
        taken -= pm__ranges_withdraw_pages(set, regs[--n][0], page);
    }
    CHECK(taken == 0);
    CHECK(pm__ranges_count(set) == 0);
    /* A refused take claims nothing. */
    pm__range r = {.base = arena + 8 * page + 1, .size = 1, .pin_base = arena + 8 * page + 1,
                   .pin_len = 1, .kind = PM__RANGE_REGISTERED};
    pm__range conflict = {.kind = 99};
    CHECK(!pm__ranges_claim_pages(set, &r, page, refuse, NULL, &conflict));
    CHECK(conflict.kind == 0);
    CHECK(pm__ranges_claim_pages(set, &r, page, take_into, &taken, &conflict));
    CHECK(taken == page);
    CHECK(pm__ranges_withdraw_pages(set, r.pin_base, page) == page);
    CHECK(pm__ranges_validate(set, NULL));
}

/* An allocation's pages past its bytes: found as slack, retired as slack;
 * a conflict names the first range whose bytes a claim overlaps, else the
 * first whose extent it does. */
static void slack_and_conflicts(pm__ranges *set)
{
    const uintptr_t x = arena + 64 * page;
    pm__range alloc = {.base = x, .size = 100, .pin_base = x, .pin_len = 2 * page,
                       .kind = PM__RANGE_ALLOC};
    pm__range reg = {.base = x + 3 * page + 10, .size = 10, .pin_base = x + 3 * page + 10,
                     .pin_len = 10, .kind = PM__RANGE_REGISTERED};
    pm__range conflict;
    REQUIRE(pm__ranges_claim(set, &alloc, &conflict));
    pm__ranges_publish(set, &alloc);
    REQUIRE(pm__ranges_claim(set, &reg, &conflict));
    pm__ranges_publish(set, &reg);
    pm__range out;
    CHECK(pm__ranges_locate(set, x + 99, &out) == PM__PLACE_BYTES && out.base == x);
    CHECK(pm__ranges_locate(set, x + 100, &out) == PM__PLACE_SLACK && out.base == x);
    CHECK(pm__ranges_locate(set, x + 2 * page - 1, &out) == PM__PLACE_SLACK);
    CHECK(pm__ranges_locate(set, x + 2 * page, &out) == PM__PLACE_NONE);
    CHECK(pm__ranges_locate(set, x + 3 * page + 9, &out) == PM__PLACE_NONE);
    CHECK(pm__ranges_locate(set, x + 3 * page + 19, &out) == PM__PLACE_BYTES);
    CHECK(!pm__ranges_find(set, x + 100, &out));
    CHECK(pm__ranges_find_extent(set, x + 100, &out));
    CHECK(pm__ranges_retire(set, x + 100, PM__RANGE_REGISTERED, &out) == PM__RETIRE_SLACK);
    CHECK(pm__ranges_retire(set, x + 50, PM__RANGE_ALLOC, &out) == PM__RETIRE_MISMATCH);
    CHECK(pm__ranges_retire(set, x + 3 * page + 11, PM__RANGE_REGISTERED, &out) ==
          PM__RETIRE_MISMATCH);
    const struct {
        uintptr_t lo, len, named;
    } claims[] = {
        {x + 200, 1, x},                       /* the slack alone */
        {x + 50, 1000, x},                     /* the bytes and the slack */
        {x + page, 2 * page + 15, x + 3 * page + 10}, /* slack, a gap, then a registration */
        {x + 3 * page, page, x + 3 * page + 10},
    };
    for (size_t i = 0; i < sizeof claims / sizeof claims[0]; i++) {
        pm__range r = {.base = claims[i].lo, .size = claims[i].len, .pin_base = claims[i].lo,
                       .pin_len = claims[i].len, .kind = PM__RANGE_REGISTERED};
        conflict.kind = 0;
        CHECK(!pm__ranges_claim(set, &r, &conflict));
        CHECK(conflict.base == claims[i].named);
    }
    pm__range beside = {.base = x + 3 * page + 20, .size = 1, .pin_base = x + 3 * page + 20,
                        .pin_len = 1, .kind = PM__RANGE_REGISTERED};
    size_t taken = 0;
    CHECK(pm__ranges_claim_pages(set, &beside, page, take_into, &taken, &conflict));
    CHECK(taken == 0); /* the page is the registration's already */
    CHECK(pm__ranges_withdraw_pages(set, beside.pin_base, page) == 0);
    CHECK(pm__ranges_retire(set, x, PM__RANGE_ALLOC, &out) == PM__RETIRED);
    pm__ranges_withdraw(set, x);
    CHECK(pm__ranges_retire(set, reg.base, PM__RANGE_REGISTERED, &out) == PM__RETIRED);
    CHECK(pm__ranges_withdraw_pages(set, reg.base, page) == page);
    CHECK(pm__ranges_count(set) == 0);
    CHECK(pm__ranges_validate(set, NULL));
}

/* The gap around an address reaches past pending claims, which queries do
 * not see, to the published extents on either side. */
static void gaps_past_pending(pm__ranges *set)
{
    const uintptr_t x = arena + 96 * page;
    uintptr_t lo = 1, hi = 1;
    pm__range out;
    CHECK(!pm__ranges_extent_or_gap(set, x, &out, &lo, &hi));
    CHECK(lo == 0 && hi == UINTPTR_MAX);
    pm__range a = {.base = x, .size = page, .pin_base = x, .pin_len = page,
                   .kind = PM__RANGE_ALLOC};
    pm__range pending = {.base = x + 2 * page, .size = page, .pin_base = x + 2 * page,
                         .pin_len = page, .kind = PM__RANGE_ALLOC};
    pm__range c = {.base = x + 4 * page, .size = page, .pin_base = x + 4 * page,
                   .pin_len = page, .kind = PM__RANGE_ALLOC};
    pm__range conflict;
    REQUIRE(pm__ranges_claim(set, &a, &conflict));
    pm__ranges_publish(set, &a);
    REQUIRE(pm__ranges_claim(set, &c, &conflict));
    pm__ranges_publish(set, &c);
    REQUIRE(pm__ranges_claim(set, &pending, &conflict));
    const uintptr_t probes[] = {x + page, x + 2 * page, x + 3 * page + 5, x + 4 * page - 1};
    for (size_t k = 0; k < sizeof probes / sizeof *probes; k++) {
        CHECK(!pm__ranges_extent_or_gap(set, probes[k], &out, &lo, &hi));
        CHECK(lo == x + page && hi == x + 4 * page);
    }
    CHECK(pm__ranges_extent_or_gap(set, x + 4 * page, &out, &lo, &hi));
    CHECK(out.pin_base == c.pin_base);
    CHECK(!pm__ranges_extent_or_gap(set, x - 1, &out, &lo, &hi));
    CHECK(lo == 0 && hi == x);
    CHECK(!pm__ranges_extent_or_gap(set, x + 5 * page, &out, &lo, &hi));
    CHECK(lo == x + 5 * page && hi == UINTPTR_MAX);
    pm__ranges_withdraw(set, pending.pin_base);
    const pm__range *done[] = {&a, &c};
    for (size_t k = 0; k < 2; k++) {
        CHECK(pm__ranges_retire(set, done[k]->base, PM__RANGE_ALLOC, &out) == PM__RETIRED);
        pm__ranges_withdraw(set, done[k]->pin_base);
    }
    CHECK(pm__ranges_count(set) == 0);
}

int main(void)
{
    static model_slot model[slots];
    pm__ranges *set = pm__ranges_create();
    REQUIRE_OR(set != NULL, check_finish("ranges"));
    wrapping_claims(set);
    shared_pages(set);
    slack_and_conflicts(set);
    gaps_past_pending(set);
    size_t live = 0;
    for (int step = 0; step < steps; step++) {
        size_t i = next() % slots;
        /* Slot i owns pages [4i, 4i + 4); a range takes 1 to 4 of them. */
        uintptr_t slot_base = arena + i * 4 * page;
        unsigned op = next() % 4;
        if (op == 0 && model[i].state == 0) {
            size_t pages = 1 + next() % 4;
            pm__range r = {.pin_base = slot_base, .pin_len = pages * page,
                           .base = slot_base + next() % 100, .kind = PM__RANGE_REGISTERED};
            r.size = pages * page - (r.base - slot_base) - next() % 100;
            pm__range conflict;
            CHECK(pm__ranges_claim(set, &r, &conflict));
            pm__ranges_publish(set, &r);
            model[i] = (model_slot){1, r};
            live++;
        } else if (op == 1 && model[i].state == 1) {
            pm__range out;
            CHECK(pm__ranges_retire(set, model[i].r.base + 1, PM__RANGE_REGISTERED, &out) ==
                  PM__RETIRE_MISMATCH);
            CHECK(pm__ranges_retire(set, model[i].r.base, PM__RANGE_ALLOC, &out) ==
                  PM__RETIRE_MISMATCH);
            CHECK(pm__ranges_retire(set, model[i].r.base, PM__RANGE_REGISTERED, &out) ==
                  PM__RETIRED);
            /* Retired but not withdrawn: the extent is still claimed. */
            pm__range conflict;
            CHECK(!pm__ranges_claim(set, &model[i].r, &conflict));
            pm__ranges_withdraw(set, model[i].r.pin_base);
            model[i].state = 0;
            live--;
        } else if (op == 2 && model[i].state == 1) {
            /* An overlapping claim always fails. */
            pm__range r = {.pin_base = slot_base + page * (next() % 4), .pin_len = page,
                           .kind = PM__RANGE_ALLOC};
            r.base = r.pin_base;
            r.size = 1;
            pm__range conflict;
            bool overlaps = r.pin_base < model[i].r.pin_base + model[i].r.pin_len;
            bool claimed = pm__ranges_claim(set, &r, &conflict);
            CHECK(claimed == !overlaps);
            if (claimed)
                pm__ranges_withdraw(set, r.pin_base);
        } else {
            uintptr_t addr = slot_base + next() % (4 * page);
            pm__range out;
            bool hit = pm__ranges_find(set, addr, &out);
            bool expect = model[i].state == 1 && addr >= model[i].r.base &&
                          addr < model[i].r.base + model[i].r.size;
            CHECK(hit == expect);
            if (hit)
                CHECK(out.base == model[i].r.base && out.size == model[i].r.size);
            /* The extent at addr, else the next one: slots lie in address order. */
            size_t want = i;
            bool at = model[i].state == 1 && addr >= model[i].r.pin_base &&
                      addr < model[i].r.pin_base + model[i].r.pin_len;
            if (!at) {
                if (model[i].state != 1 || addr >= model[i].r.pin_base)
                    want++;
                while (want < slots && model[want].state != 1)
                    want++;
            }
            pm__extent_found found = pm__ranges_extent_at_or_after(set, addr, &out);
            CHECK(found == (at ? PM__EXTENT_AT : want < slots ? PM__EXTENT_AFTER : PM__EXTENT_NONE));
            if (found != PM__EXTENT_NONE && want < slots)
                CHECK(out.pin_base == model[want].r.pin_base);
            /* Or the gap around addr, from the extent below to the next. */
            uintptr_t gap_lo = 1, gap_hi = 1;
            CHECK(pm__ranges_extent_or_gap(set, addr, &out, &gap_lo, &gap_hi) == at);
            if (at) {
                CHECK(out.pin_base == model[i].r.pin_base);
            } else {
                uintptr_t want_lo = 0;
                for (size_t k = model[i].state == 1 ? i + 1 : i; k-- > 0;)
                    if (model[k].state == 1) {
                        want_lo = model[k].r.pin_base + model[k].r.pin_len;
                        break;
                    }
                CHECK(gap_lo == want_lo);
                CHECK(gap_hi == (want < slots ? model[want].r.pin_base : UINTPTR_MAX));
            }
        }
        if (step % 10000 == 0) {
            const char *why = NULL;
            CHECK(pm__ranges_validate(set, &why));
            if (why)
                fprintf(stderr, "invariant broken: %s\n", why);
            CHECK(pm__ranges_count(set) == live);
        }
    }
    CHECK(pm__ranges_validate(set, NULL));
    pm__ranges_destroy(set);
    return check_finish("ranges");
}
