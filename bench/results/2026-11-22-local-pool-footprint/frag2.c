#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
static uint64_t used_now(pm_mem_pool_t pool){uint64_t u=0; pm_mem_pool_get_attribute(pool, PM_MEMPOOL_ATTR_USED_MEM_CURRENT,&u); return u;}
static uint64_t res_now(pm_mem_pool_t pool){uint64_t u=0; pm_mem_pool_get_attribute(pool, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,&u); return u;}

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

int main(int argc, char **argv)
{
    int mode = argc > 1 ? atoi(argv[1]) : 0;
    uint64_t seed = argc > 2 ? strtoull(argv[2],0,10) : 12345;
    enum { slots = 8192, steps = 200000 };
    static void *live[slots]; static size_t sz[slots];
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    pm_mem_pool_t pool = NULL;
    if (pm_mem_pool_create(&pool, &props)) return 1;
    uint64_t rng = seed;
    int n = 0; size_t bytes = 0; const size_t target = (size_t)900 << 20;
    if (mode == 0) { for (; n < 2048; n++) { sz[n]=mixed_size(&rng); pm_mem_alloc_from_pool(&live[n], sz[n], pool); bytes+=sz[n]; } }
    else { while (bytes < target) { sz[n]=mixed_size(&rng); pm_mem_alloc_from_pool(&live[n], sz[n], pool); bytes+=sz[n]; n++; } }
    double sum=0, worst=0; int ns=0;
    for (int i = 0; i < steps; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int s = (int)((rng >> 33) % (uint64_t)n);
        pm_mem_free(live[s]); bytes -= sz[s];
        if (mode == 0) { sz[s]=mixed_size(&rng); pm_mem_alloc_from_pool(&live[s], sz[s], pool); bytes += sz[s]; }
        else {
            live[s]=live[n-1]; sz[s]=sz[n-1]; n--;
            while (bytes < target) { sz[n]=mixed_size(&rng); pm_mem_alloc_from_pool(&live[n], sz[n], pool); bytes+=sz[n]; n++; }
        }
        if (i >= steps/2 && (i+1) % 5000 == 0) { double r=(double)res_now(pool)/used_now(pool); sum+=r; ns++; if(r>worst)worst=r; }
    }
    pm_pool_stats st = {.struct_size = sizeof st};
    pm_mem_pool_get_stats(pool, &st);
    printf("mode %d seed %llu: n %d used %.1f high %.1f reserved %.1f  res/used %.3f res/high %.3f  sampled mean %.3f worst %.3f\n",
       mode, (unsigned long long)seed, n, st.used/1048576.0, st.used_high/1048576.0, res_now(pool)/1048576.0,
       (double)res_now(pool)/st.used, (double)res_now(pool)/st.used_high, sum/ns, worst);
    dump((pm__pool*)pool,"end");
    { pm__pool *p=(pm__pool*)pool; size_t hist[20]={0}, hb[20]={0};
      for (unsigned b = 0; b < PM__SPAN_BINS; b++) for (pm__span *sp = p->bins[b]; sp; sp = sp->bin_next) { unsigned k=63-__builtin_clzll(sp->npages); hist[k]++; hb[k]+=sp->npages; }
      for (int k=0;k<12;k++) if(hist[k]) printf("  free spans of %d-%d pages: %zu, %.1f MiB\n", 1<<k, (2<<k)-1, hist[k], hb[k]/16.0);
      size_t lhist[20]={0}; for (size_t i=0;i<p->n_chunks;i++){pm__chunk*c=p->chunks[i]; for(size_t pg=0;pg<c->npages;){pm__span*s=c->pages[pg]; if(s->kind!=SPAN_FREE){unsigned k=63-__builtin_clzll(s->npages); lhist[k]++;} pg+=s->npages;}}
      for (int k=0;k<12;k++) if(lhist[k]) printf("  used spans of %d-%d pages: %zu\n", 1<<k, (2<<k)-1, lhist[k]);
    }
    return 0;
}
