/* Whether a large allocation from a fresh pool pins as fast as a host
 * allocation of the same size: pm_mem_alloc_from_pool on a new pool against
 * pm_mem_host_alloc, each given back before the next, alternating, median of
 * the rounds, plus how much of the pool's time went to committing its chunk
 * and what it reserved for the request.
 * Unlike the other probes it measures pinmem itself, through its public API.
 * gcc -O2 -Iinclude bench/probe/pool_cold.c -Lbuild-test -lpinmem -o probe_pool_cold
 * LD_LIBRARY_PATH=build-test ./probe_pool_cold [MiB] [rounds] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_probe.h"

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1024;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    size_t bytes = mib << 20;
    if (rounds < 1 || rounds > 64 || bytes == 0) {
        fprintf(stderr, "usage: %s [MiB] [rounds 1-64]\n", argv[0]);
        return 2;
    }
    double host[64], pool[64], pool_total[64], pin[64];
    unsigned long long reserved = 0;
    for (int i = 0; i < rounds; i++) {
        void *p = NULL;
        double t0 = now_ms();
        pm_result r = pm_mem_host_alloc(&p, bytes, 0);
        host[i] = now_ms() - t0;
        if (r != PM_SUCCESS)
            fail("pm_mem_host_alloc", r);
        if ((r = pm_mem_free_host(p)) != PM_SUCCESS)
            fail("pm_mem_free_host", r);

        pm_mem_pool_props props;
        memset(&props, 0, sizeof props);
        props.location.type = PM_MEM_LOCATION_TYPE_HOST;
        pm_mem_pool_t pl;
        double t1 = now_ms();
        if ((r = pm_mem_pool_create(&pl, &props)) != PM_SUCCESS)
            fail("pm_mem_pool_create", r);
        double t2 = now_ms();
        r = pm_mem_alloc_from_pool(&p, bytes, pl);
        pool[i] = now_ms() - t2;
        pool_total[i] = now_ms() - t1;
        if (r != PM_SUCCESS)
            fail("pm_mem_alloc_from_pool", r);
        pm_mem_pool_get_attribute(pl, PM_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
        pm_pool_stats st;
        memset(&st, 0, sizeof st);
        st.struct_size = sizeof st;
        pin[i] = pm_mem_pool_get_stats(pl, &st) == PM_SUCCESS ? st.pin_ns / 1e6 : -1;
        if ((r = pm_mem_free(p)) != PM_SUCCESS)
            fail("pm_mem_free", r);
        if ((r = pm_mem_pool_destroy(pl)) != PM_SUCCESS)
            fail("pm_mem_pool_destroy", r);
    }
    qsort(host, rounds, sizeof host[0], by_value);
    qsort(pool, rounds, sizeof pool[0], by_value);
    qsort(pool_total, rounds, sizeof pool_total[0], by_value);
    qsort(pin, rounds, sizeof pin[0], by_value);
    printf("%zu MiB cold, median of %d (backend %s)\n", mib, rounds, pm_backend_name());
    printf("  pm_mem_host_alloc                 %9.2f ms\n", host[rounds / 2]);
    printf("  pm_mem_alloc_from_pool (fresh)    %9.2f ms (with the pool's creation %.2f ms)\n",
           pool[rounds / 2], pool_total[rounds / 2]);
    printf("  of which the chunk's commit       %9.2f ms (the pool's pin_ns)\n", pin[rounds / 2]);
    printf("  pool reserved for the request     %9.2f MiB\n", reserved / 1048576.0);
    return 0;
}
