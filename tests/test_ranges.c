/* The registry alone, against a brute-force model: random claims, publishes,
 * retires and lookups (of user bytes, and of the extent at or after an
 * address, as copies ask), with the tree's invariants checked throughout. */
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

int main(void)
{
    static model_slot model[slots];
    pm__ranges *set = pm__ranges_create();
    REQUIRE_OR(set != NULL, check_finish("ranges"));
    wrapping_claims(set);
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
