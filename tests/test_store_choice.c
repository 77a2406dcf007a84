/* The choice between plain and demoting stores alone: each kind is timed in
 * turn first (its first copy a warm-up only), then the faster one wins, the slower is tried again every so
 * often, a change of host turns the choice round, and the size classes learn
 * apart. */
#include <string.h>

#include "check.h"
#include "copy/store_choice.h"

enum { PLAIN = PM__STORE_PLAIN, DEMOTING = PM__STORE_DEMOTING };

static void first_trials(void)
{
    pm__store_choice sc;
    memset(&sc, 0, sizeof sc);
    CHECK(pm__store_choose(&sc, 0, false) == PLAIN); /* nothing known: plain */
    for (int i = 0; i < PM__STORE_FIRST_TRIALS; i++) {
        CHECK(pm__store_choose(&sc, 0, true) == PLAIN);
        pm__store_report(&sc, 0, PLAIN, i == 0 ? 1.0 : 40.0); /* the first warms up */
        if (i < 2) /* no kind known beyond its warm-up copy */
            CHECK(pm__store_choose(&sc, 0, false) == PLAIN);
        CHECK(pm__store_choose(&sc, 0, true) == DEMOTING);
        pm__store_report(&sc, 0, DEMOTING, i == 0 ? 99.0 : 45.0);
    }
    CHECK(sc.classes[0].samples[PLAIN] == PM__STORE_FIRST_TRIALS);
    CHECK(sc.classes[0].samples[DEMOTING] == PM__STORE_FIRST_TRIALS);
    CHECK(sc.classes[0].gbps[PLAIN] == 40.0 && sc.classes[0].gbps[DEMOTING] == 45.0);
    CHECK(pm__store_choose(&sc, 0, false) == DEMOTING);
    CHECK(pm__store_choose(&sc, 1, false) == PLAIN); /* the other class knows nothing */
    CHECK(sc.classes[1].samples[PLAIN] == 0 && sc.classes[1].samples[DEMOTING] == 0);
}

static void exploring_and_turning(void)
{
    pm__store_choice sc;
    memset(&sc, 0, sizeof sc);
    for (int i = 0; i < PM__STORE_FIRST_TRIALS; i++) {
        pm__store_report(&sc, 1, PLAIN, 48.0);
        pm__store_report(&sc, 1, DEMOTING, 51.0);
    }
    CHECK(sc.classes[1].gbps[PLAIN] == 48.0 && sc.classes[1].gbps[DEMOTING] == 51.0);
    /* The faster kind, and the slower once every PM__STORE_EXPLORE_EVERY. */
    int plain = 0, demoting = 0;
    for (int i = 0; i < 4 * PM__STORE_EXPLORE_EVERY; i++) {
        if (pm__store_choose(&sc, 1, true) == PLAIN)
            plain++;
        else
            demoting++;
    }
    CHECK(plain == 4);
    CHECK(demoting == 4 * PM__STORE_EXPLORE_EVERY - 4);
    /* Untimed copies never explore. */
    for (int i = 0; i < 4 * PM__STORE_EXPLORE_EVERY; i++)
        CHECK(pm__store_choose(&sc, 1, false) == DEMOTING);
    /* The host gets busy: demoting copies slow down, and within a few of
     * them the choice turns to plain. */
    int reports = 0;
    while (pm__store_choose(&sc, 1, false) == DEMOTING && reports < 20) {
        pm__store_report(&sc, 1, DEMOTING, 30.0);
        reports++;
    }
    CHECK(reports >= 1 && reports <= 4);
    CHECK(pm__store_choose(&sc, 1, false) == PLAIN);
    /* An explored demoting copy that is fast again turns it back. */
    pm__store_report(&sc, 1, DEMOTING, 80.0);
    CHECK(pm__store_choose(&sc, 1, false) == DEMOTING);
}

static void size_classes(void)
{
    CHECK(pm__store_class_of((size_t)64 << 20) == 0);
    CHECK(pm__store_class_of(((size_t)256 << 20) - 1) == 0);
    CHECK(pm__store_class_of((size_t)256 << 20) == 1);
    CHECK(pm__store_class_of((size_t)8 << 30) == 1);
}

int main(void)
{
    first_trials();
    exploring_and_turning();
    size_classes();
    return check_finish("store_choice");
}
