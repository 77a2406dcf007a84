/* The live-handle set alone: random adds, removes and lookups against a
 * brute-force model (with handles packed close, so that probe runs wrap and
 * removals shift members back), the lookup that runs a callback for a member,
 * then threads adding and removing their own handles while others look them up. */
#include <pthread.h>
#include <stdint.h>

#include "check.h"
#include "handle_set.h"

enum { slots = 3000, steps = 300000, threads = 8, per_thread = 2000, rounds = 20 };

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) { return xorshift64(&rng); }

static void count_visit(void *h, void *arg)
{
    (void)h;
    ++*(size_t *)arg;
}

static void model_test(void)
{
    static char arena[slots];
    static bool in_model[slots];
    pm__handle_set set = PM__HANDLE_SET_INIT;
    size_t members = 0;
    unsigned long long generation = pm__handle_set_generation(&set);
    CHECK(!pm__handle_set_contains(&set, &arena[0])); /* empty, never grown */
    CHECK(!pm__handle_set_remove(&set, &arena[0]));
    CHECK(!pm__handle_set_contains(&set, NULL));
    CHECK(!pm__handle_set_add(&set, NULL));
    CHECK(set.count == 0);
    for (int step = 0; step < steps; step++) {
        /* Members come and go over the run, so the table grows, fills and empties. */
        size_t limit = 1 + (size_t)step * slots / steps;
        size_t i = next() % limit;
        unsigned op = next() % 3;
        if (op == 0) { /* adding a member again changes nothing */
            CHECK(pm__handle_set_add(&set, &arena[i]));
            members += !in_model[i];
            in_model[i] = true;
            CHECK(set.count == members);
        } else if (op == 1) {
            CHECK(pm__handle_set_remove(&set, &arena[i]) == in_model[i]);
            unsigned long long now = pm__handle_set_generation(&set);
            CHECK(in_model[i] ? now == generation + 1 : now == generation);
            generation = now;
            members -= in_model[i];
            in_model[i] = false;
        } else {
            CHECK(pm__handle_set_contains(&set, &arena[i]) == in_model[i]);
        }
        if (step % 10000 == 0) {
            for (size_t k = 0; k < slots; k++)
                CHECK(pm__handle_set_contains(&set, &arena[k]) == in_model[k]);
            size_t visited = 0;
            pm__handle_set_for_each(&set, count_visit, &visited);
            CHECK(visited == members);
        }
    }
    CHECK(set.count == members);
    CHECK(2 * set.count <= set.cap);
    free(set.slots);
}

static pm__handle_set shared = PM__HANDLE_SET_INIT;

static void *churn(void *arg)
{
    char *mine = arg; /* per_thread handles no other thread uses */
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < per_thread; k++)
            CHECK(pm__handle_set_add(&shared, &mine[k]));
        for (int k = 0; k < per_thread; k++)
            CHECK(pm__handle_set_contains(&shared, &mine[k]));
        for (int k = 0; k < per_thread; k += 2)
            CHECK(pm__handle_set_remove(&shared, &mine[k]));
        for (int k = 0; k < per_thread; k++)
            CHECK(pm__handle_set_contains(&shared, &mine[k]) == (k % 2 == 1));
        for (int k = 1; k < per_thread; k += 2)
            CHECK(pm__handle_set_remove(&shared, &mine[k]));
        CHECK(!pm__handle_set_contains(&shared, &mine[r]));
    }
    return NULL;
}

static void thread_test(void)
{
    static char handles[threads][per_thread];
    pthread_t tids[threads];
    for (int t = 0; t < threads; t++)
        CHECK(pthread_create(&tids[t], NULL, churn, handles[t]) == 0);
    for (int t = 0; t < threads; t++)
        pthread_join(tids[t], NULL);
    CHECK(shared.count == 0);
    /* Every removal moved the generation on exactly once. */
    CHECK(pm__handle_set_generation(&shared) ==
          1 + (unsigned long long)threads * rounds * per_thread);
    free(shared.slots);
}

/* contains_then runs its callback for a member only, with the handle. */
static const void *seen;
static int calls;
static void note_then(const void *h)
{
    seen = h;
    calls++;
}

static void then_test(void)
{
    static char a, b;
    pm__handle_set set = PM__HANDLE_SET_INIT;
    CHECK(!pm__handle_set_contains_then(&set, &a, note_then)); /* never grown */
    CHECK(pm__handle_set_add(&set, &a));
    CHECK(!pm__handle_set_contains_then(&set, &b, note_then));
    CHECK(!pm__handle_set_contains_then(&set, NULL, note_then));
    CHECK(calls == 0);
    CHECK(pm__handle_set_contains_then(&set, &a, note_then));
    CHECK(calls == 1 && seen == &a);
    CHECK(pm__handle_set_remove(&set, &a));
    CHECK(!pm__handle_set_contains_then(&set, &a, note_then));
    CHECK(calls == 1);
    free(set.slots);
}

int main(void)
{
    model_test();
    then_test();
    thread_test();
    printf("handle set: %s\n", check_failures ? "FAILED" : "ok");
    return check_failures ? 1 : 0;
}
