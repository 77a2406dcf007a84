#include <stdio.h>
#include <stdlib.h>
#include "pinmem.h"
#include "pool/pool_internal.h"

static size_t mixed_size(uint64_t *rng)
{
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    bool big = (*rng >> 20) % 10 == 0;
    unsigned lo = big ? 20 : 6, span = big ? 3 : 14;
    size_t n = (size_t)1 << (lo + (*rng >> 40) % span);
    return n + (size_t)((*rng >> 8) % n);
}

static void dump(pm__pool *p, const char *when)
{
    size_t free_pages = 0, run_free = 0, run_bytes = 0, large_pages = 0;
    for (size_t i = 0; i < p->n_chunks; i++) {
        pm__chunk *c = p->chunks[i];
        free_pages += c->free_pages;
        for (size_t pg = 0; pg < c->npages;) {
            pm__span *s = c->pages[pg];
            if (s->kind == SPAN_RUN) {
                run_bytes += s->npages * PM__POOL_PAGE;
                run_free += (size_t)s->nfree * pm__class_size(s->cls);
            } else if (s->kind == SPAN_LARGE) {
                large_pages += s->npages;
            }
            pg += s->npages;
        }
    }
    printf("%s: chunks %zu reserved %.1f MiB, free pages %.1f MiB, runs %.1f MiB (free blocks in runs %.1f MiB), large %.1f MiB, used %.1f\n",
           when, p->n_chunks, p->reserved / 1048576.0, free_pages * 64 / 1024.0, run_bytes / 1048576.0,
           run_free / 1048576.0, large_pages * 64 / 1024.0, (double)atomic_load(&p->used) / 1048576.0);
}

int main(void)
{
    enum { slots = 2048, steps = 200000 };
    static void *live[slots];
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    pm_mem_pool_t pool = NULL;
    if (pm_mem_pool_create(&pool, &props)) return 1;
    pm__pool *p = (pm__pool *)pool;
    uint64_t rng = 12345;
    for (int s = 0; s < slots; s++) pm_mem_alloc_from_pool(&live[s], mixed_size(&rng), pool);
    unsigned long long last_res = p->reserved;
    printf("after fill: reserved %.0f\n", last_res/1048576.0);
    for (int i = 0; i < steps; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t s = (size_t)(rng >> 33) % slots;
        pm_mem_free(live[s]);
        live[s] = NULL;
        size_t want = mixed_size(&rng);
        size_t largest = 0, total = 0, nspans = 0;
        for (unsigned st = 0; st < PM__PAGE_SETS; st++) for (unsigned b = 0; b < PM__SPAN_BINS; b++)
            for (pm__span *sp = p->bins[st][b]; sp; sp = sp->bin_next) {
                total += sp->npages; nspans++;
                if (sp->npages > largest) largest = sp->npages;
            }
        pm_mem_alloc_from_pool(&live[s], want, pool);
        if (p->reserved != last_res) {
            printf("  want %.2f MiB, largest free %.2f MiB, free %.1f MiB in %zu spans\n", want/1048576.0, largest/16.0, total/16.0, nspans);
            uint64_t used=0; pm_mem_pool_get_attribute(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
            printf("step %d: reserved %.0f MiB used %.1f MiB\n", i, p->reserved/1048576.0, used/1048576.0);
            last_res = p->reserved;
        }
    }
    pm_pool_stats st = {.struct_size = sizeof st};
    pm_mem_pool_get_stats(pool, &st);
    dump(p, "end");
    printf("used %.1f high %.1f requested %.1f\n", st.used/1048576.0, st.used_high/1048576.0, st.requested/1048576.0);
    return 0;
}
