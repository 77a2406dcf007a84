/* A pool of page-locked memory: blocks in nanoseconds, reused in stream order. */
#include <pinmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(pm_result r, const char *what)
{
    if (r != PM_SUCCESS) {
        fprintf(stderr, "%s: %s: %s\n", what, pm_result_name(r), pm_last_error_detail());
        exit(1);
    }
}

/* Stands for the stream's work on a block, such as a copy to the device. */
static void fill(void *block) { memset(block, 1, 64 << 10); }

int main(void)
{
    pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
    pm_mem_pool_t pool;
    pm_stream_t stream;
    check(pm_mem_pool_create(&pool, &props), "pm_mem_pool_create");
    check(pm_stream_create(&stream), "pm_stream_create");
    for (int i = 0; i < 1000; i++) {
        void *block;
        check(pm_mem_alloc_from_pool_async(&block, 64 << 10, pool, stream), "alloc");
        check(pm_stream_launch_host_func(stream, fill, block), "pm_stream_launch_host_func");
        check(pm_mem_free_async(block, stream), "pm_mem_free_async"); /* after fill */
    }
    check(pm_stream_synchronize(stream), "pm_stream_synchronize");
    pm_pool_stats stats = {.struct_size = sizeof stats};
    check(pm_mem_pool_get_stats(pool, &stats), "pm_mem_pool_get_stats");
    printf("1000 blocks of 64 KiB from %llu KiB pinned\n", stats.reserved >> 10);
    check(pm_stream_destroy(stream), "pm_stream_destroy");
    check(pm_mem_pool_destroy(pool), "pm_mem_pool_destroy");
    return 0;
}
