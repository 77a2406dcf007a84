/* 16 threads allocating, registering, querying and freeing at random for a
 * few seconds (PINMEM_TEST_SECONDS). Each thread keeps a model of what it
 * owns and checks every answer against it; at the end the registry must hold
 * exactly what the models hold, with its invariants intact. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "instance.h"

enum { n_threads = 16, slots = 8, reg_pages = 4 };

typedef struct owned {
    int kind; /* 0 none, 1 allocation, 2 registration */
    uint8_t *p;
    size_t size;
    unsigned flags;
} owned;

typedef struct worker {
    uint64_t rng;
    owned slot[slots];
    uint8_t *reg_area; /* slots * reg_pages pages this thread registers in */
    long ops;
} worker;

static double deadline;
static size_t page;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t next(worker *w) { return xorshift64(&w->rng); }

/* A check on a worker thread, with the detail of its last failed call
 * (counted and printed as CHECK does, up to its limit). */
#define WCHECK(w, cond)                                                              \
    do {                                                                             \
        (void)(w);                                                                   \
        if (!(cond) && check_failed_())                                              \
            fprintf(stderr, "%s:%d: %s (%s)\n", __FILE__, __LINE__, #cond,           \
                    pm_last_error_detail());                                         \
    } while (0)

static void query(worker *w, owned *o)
{
    size_t off = (size_t)(next(w) % o->size);
    unsigned f = 0;
    pm_deviceptr d = 0, base = 0;
    size_t size = 0;
    WCHECK(w, pm_mem_host_get_flags(&f, o->p + off) == PM_SUCCESS && f == o->flags);
    WCHECK(w, pm_mem_host_get_device_pointer(&d, o->p + off, 0) == PM_SUCCESS);
    WCHECK(w, pm_mem_get_address_range(&base, &size, (pm_deviceptr)(uintptr_t)(o->p + off)) ==
                  PM_SUCCESS &&
              base == (uintptr_t)o->p && size == o->size);
}

static void step(worker *w)
{
    size_t i = (size_t)(next(w) % slots);
    owned *o = &w->slot[i];
    switch (next(w) % 4) {
    case 0: /* create */
        if (o->kind)
            break;
        if (next(w) % 2) {
            unsigned flags = (unsigned)(next(w) % 8);
            size_t size = 1 + (size_t)(next(w) % (4 * page));
            void *p = NULL;
            pm_result r = pm_mem_host_alloc(&p, size, flags);
            WCHECK(w, r == PM_SUCCESS);
            if (r == PM_SUCCESS)
                *o = (owned){1, p, size, flags | PM_MEMHOSTALLOC_DEVICEMAP};
        } else {
            uint8_t *area = w->reg_area + i * reg_pages * page;
            size_t off = (size_t)(next(w) % 200), size = 1 + (size_t)(next(w) % (3 * page));
            unsigned flags = (unsigned)(next(w) % 4);
            pm_result r = pm_mem_host_register(area + off, size, flags);
            WCHECK(w, r == PM_SUCCESS);
            if (r == PM_SUCCESS) /* the model holds only what was registered */
                *o = (owned){2, area + off, size, (flags & 1) | PM_MEMHOSTREGISTER_DEVICEMAP};
        }
        break;
    case 1: /* destroy, after a wrong attempt that must change nothing */
        if (o->kind == 1) {
            if (o->size > 1)
                WCHECK(w, pm_mem_free_host(o->p + 1) == PM_ERROR_INVALID_VALUE);
            WCHECK(w, pm_mem_host_unregister(o->p) == PM_ERROR_INVALID_VALUE);
            WCHECK(w, pm_mem_free_host(o->p) == PM_SUCCESS);
            o->kind = 0;
        } else if (o->kind == 2) {
            WCHECK(w, pm_mem_free_host(o->p) == PM_ERROR_INVALID_VALUE);
            WCHECK(w, pm_mem_host_unregister(o->p) == PM_SUCCESS);
            o->kind = 0;
        }
        break;
    default:
        if (o->kind)
            query(w, o);
        break;
    }
    w->ops++;
}

static void *run(void *arg)
{
    worker *w = arg;
    while (now() < deadline)
        for (int k = 0; k < 64; k++)
            step(w);
    return NULL;
}

/* Two threads setting the pinned budget at once: the value pm_get_setting
 * reports must be the one in effect (pm_get_pinned_budget). */
static pthread_barrier_t budget_start;

static void *set_budget(void *arg)
{
    pthread_barrier_wait(&budget_start);
    pm_set_pinned_budget((unsigned long long)(uintptr_t)arg);
    return NULL;
}

static void budget_setters(void)
{
    int mismatches = 0;
    for (int round = 0; round < 5000 && !mismatches; round++) {
        pthread_t a, b;
        pthread_barrier_init(&budget_start, NULL, 2);
        pthread_create(&a, NULL, set_budget, (void *)(uintptr_t)(1u << 20));
        pthread_create(&b, NULL, set_budget, (void *)(uintptr_t)(2u << 20));
        pthread_join(a, NULL);
        pthread_join(b, NULL);
        pthread_barrier_destroy(&budget_start);
        unsigned long long cap = 0;
        CHECK_RESULT(pm_get_pinned_budget(&cap), PM_SUCCESS);
        pm_setting s = {.struct_size = sizeof s};
        for (unsigned i = 0; pm_get_setting(i, &s) == PM_SUCCESS; i++, s.struct_size = sizeof s)
            if (strcmp(s.name, "PINMEM_PINNED_BUDGET") == 0)
                break;
        mismatches += strcmp(s.value, cap == (1u << 20) ? "1M" : "2M") != 0;
    }
    CHECK(mismatches == 0);
    CHECK_RESULT(pm_set_pinned_budget(0), PM_SUCCESS);
}

static void count_range(const pm__range *r, void *ctx)
{
    (void)r;
    (*(size_t *)ctx)++;
}

int main(void)
{
    CHECK_RESULT(pm_init(0), PM_SUCCESS);
    page = (size_t)sysconf(_SC_PAGESIZE);
    const char *secs = getenv("PINMEM_TEST_SECONDS");
    deadline = now() + (secs ? atof(secs) : 3.0);
    static worker workers[n_threads];
    pthread_t tids[n_threads];
    for (int t = 0; t < n_threads; t++) {
        workers[t].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1);
        workers[t].reg_area = mmap(NULL, slots * reg_pages * page, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (workers[t].reg_area == MAP_FAILED ||
            pthread_create(&tids[t], NULL, run, &workers[t]) != 0) {
            CHECK(!"a worker could not be set up");
            return check_finish("threads"); /* the threads started end at the deadline */
        }
    }
    long ops = 0;
    size_t modelled = 0;
    for (int t = 0; t < n_threads; t++) {
        pthread_join(tids[t], NULL);
        ops += workers[t].ops;
        for (int i = 0; i < slots; i++)
            modelled += workers[t].slot[i].kind != 0;
    }
    pm_result r;
    pm__instance *inst = pm__instance_get(&r);
    size_t walked = 0;
    pm__ranges_foreach(inst->ranges, count_range, &walked);
    const char *why = NULL;
    CHECK(pm__ranges_validate(inst->ranges, &why));
    CHECK(walked == modelled);
    CHECK(pm__ranges_count(inst->ranges) == modelled);
    printf("%ld operations on %d threads; %zu ranges live at the end\n", ops, n_threads, modelled);
    for (int t = 0; t < n_threads; t++) {
        for (int i = 0; i < slots; i++) {
            owned *o = &workers[t].slot[i];
            if (o->kind == 1)
                CHECK_RESULT(pm_mem_free_host(o->p), PM_SUCCESS);
            else if (o->kind == 2)
                CHECK_RESULT(pm_mem_host_unregister(o->p), PM_SUCCESS);
        }
        munmap(workers[t].reg_area, slots * reg_pages * page);
    }
    CHECK(pm__ranges_count(inst->ranges) == 0);
    budget_setters();
    return check_finish("threads");
}
