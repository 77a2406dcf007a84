/* The life of a pool: the module's one-time setup and the hooks it adds
 * to the instance, creation, the default pool, and destruction. A destroyed
 * pool ends once its last allocation is freed (retire.c). */
#include <stdio.h>
#include <stdlib.h>

#include "../errors.h"
#include "../host_func.h"
#include "../instance.h"
#include "../no_cancel.h"
#include "../test_hooks.h"
#include "fast.h"

/* Made under a lock rather than once, so that a creation that ran out of
 * memory is tried again by the next call instead of failing for good. */
static pthread_mutex_t default_lock = PTHREAD_MUTEX_INITIALIZER;
static pm__pool *_Atomic default_pool;

/* In a forked child, on its one thread: the fast paths stop trusting what
 * this thread remembers, so every pool call takes the general way, which
 * refuses. Lock-free: the parent's other threads may have held any lock. */
static void after_fork_in_child(void)
{
    atomic_fetch_add(&pm__pools_epoch, 1);
    for (unsigned i = 0; i < PM__MAX_CACHED_POOLS; i++)
        pm__thread_caches[i] = NULL;
}

static void print_stats(void);

/* The pools' part of the instance, set up as the first pool is made (no
 * pool call reaches a size class or a thread cache before that). */
static pm__instance_hooks hooks = {.after_fork_in_child = after_fork_in_child,
                                   .print_stats = print_stats};
static pthread_once_t module_once = PTHREAD_ONCE_INIT;

static void module_init(void)
{
    pm__classes_init();
    pm__ownership_prepare();
    pm__instance_add_hooks(&hooks);
}

/* The least a chunk of ops commits at once. */
static size_t least_commit(const pm__chunk_ops *ops)
{
    return ops->granule_min > PM__POOL_PAGE ? ops->granule_min : PM__POOL_PAGE;
}

/* The ways the pool pins chunks (pm__pages_chunk_ops). The default release
 * threshold keeps everything, so its chunks are pinned the fastest way; any
 * other asks for memory to go back, so its chunks are pinned in pieces that
 * go back one by one without waiting for the device (backend.h). A max_size
 * below the least those pieces can be takes the other way. */
static void choose_chunk_ops(pm__pool *pool)
{
    const pm__chunk_ops *keep = &pool->backend->pool_keep;
    const pm__chunk_ops *give_back = &pool->backend->pool_give_back;
    size_t max_size = pool->props.max_size, k = least_commit(keep), g = least_commit(give_back);
    pool->keep_ops = max_size && k > max_size && g < k ? give_back : keep;
    pool->give_back_ops = max_size && g > max_size && k < g ? keep : give_back;
}

static pm_result check_props(const pm_mem_pool_props *props, int *numa_node)
{
    if (!props)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_pool_create: props is NULL");
    for (size_t i = 0; i < sizeof props->reserved; i++)
        if (props->reserved[i])
            return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_pool_create: reserved bytes must be 0");
    if (props->handle_types != 0)
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_pool_create: handle_types must be 0: host pools are not shareable");
    switch (props->location.type) {
    case PM_MEM_LOCATION_TYPE_HOST:
        *numa_node = -1;
        return PM_SUCCESS;
    case PM_MEM_LOCATION_TYPE_HOST_NUMA:
        if (!pm__numa_node_exists(props->location.id))
            return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_pool_create: NUMA node %d does not exist",
                            props->location.id);
        *numa_node = props->location.id;
        return PM_SUCCESS;
    case PM_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        return pm__fail(PM_ERROR_INVALID_VALUE,
                        "pm_mem_pool_create: HOST_NUMA_CURRENT is not a pool location");
    default:
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_pool_create: location type %d is not HOST "
                        "or HOST_NUMA", (int)props->location.type);
    }
}

static pm_result create(pm__instance *inst, pm__pool **out, const pm_mem_pool_props *props,
                        bool is_default)
{
    pthread_once(&module_once, module_init);
    int numa_node = -1;
    pm_result r = check_props(props, &numa_node);
    if (r != PM_SUCCESS)
        return r;
    pm__pool *pool = calloc(1, sizeof *pool);
    if (!pool || pthread_mutex_init(&pool->lock, NULL) != 0) {
        free(pool);
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "pm_mem_pool_create: out of memory");
    }
    pool->backend = &inst->backend;
    pool->ranges = inst->ranges;
    pool->props = *props;
    choose_chunk_ops(pool);
    pool->numa_node = numa_node;
    pool->is_default = is_default;
    pool->release_threshold = PM_MEMPOOL_DEFAULT_RELEASE_THRESHOLD;
    pool->reuse_follow_event_deps = pool->reuse_opportunistic = pool->reuse_internal_deps = 1;
    if (!pm__pools_add(pool)) {
        pthread_mutex_destroy(&pool->lock);
        free(pool);
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "pm_mem_pool_create: out of memory");
    }
    *out = pool;
    return PM_SUCCESS;
}

pm_result pm_mem_pool_create(pm_mem_pool_t *pool, const pm_mem_pool_props *props)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_pool_create");
    PM__INSTANCE_OR_RETURN(inst);
    if (!pool)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_pool_create: pool is NULL");
    pm__retire_poll(false);
    pm__pool *p = NULL;
    pm_result r = create(inst, &p, props, false);
    if (r == PM_SUCCESS)
        *pool = (pm_mem_pool_t)p;
    return r;
}

pm_result pm_mem_get_default_pool(pm_mem_pool_t *pool)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_get_default_pool");
    PM__INSTANCE_OR_RETURN(inst);
    if (!pool)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_get_default_pool: pool is NULL");
    pm__pool *made = atomic_load_explicit(&default_pool, memory_order_acquire);
    if (!made) {
        pm_mem_pool_props props = {.location = {PM_MEM_LOCATION_TYPE_HOST, 0}};
        pm_result r = PM_SUCCESS;
        pthread_mutex_lock(&default_lock);
        made = atomic_load_explicit(&default_pool, memory_order_relaxed);
        if (!made && (r = create(inst, &made, &props, true)) == PM_SUCCESS)
            atomic_store_explicit(&default_pool, made, memory_order_release);
        pthread_mutex_unlock(&default_lock);
        if (r != PM_SUCCESS)
            return pm__fail(r, "the default pool could not be created");
    }
    *pool = (pm_mem_pool_t)made;
    return PM_SUCCESS;
}

pm_result pm_mem_pool_destroy(pm_mem_pool_t handle)
{
    PM__NO_CANCEL;
    PM__REFUSED_IN_HOST_FUNC("pm_mem_pool_destroy");
    pm__pool *pool = NULL;
    pm_result r = pm__pool_of_handle(handle, &pool);
    if (r != PM_SUCCESS)
        return r;
    if (pool->is_default)
        return pm__fail(PM_ERROR_INVALID_VALUE, "pm_mem_pool_destroy: the default pool lives on");
    /* Until every thread cache is flushed, live counts only part of the
     * blocks in use: no free may finish the pool before then. The flag also
     * lets one destroy through when two race. */
    pthread_mutex_lock(&pool->lock);
    const bool first = !pool->destroyed;
    pool->destroyed = pool->destroying = true;
    pthread_mutex_unlock(&pool->lock);
    if (!first)
        return pm__fail(PM_ERROR_INVALID_VALUE, "%p is not a live memory pool", (void *)pool);
    /* Memory in use stays until its last free, which finishes the pool;
     * meanwhile statistics still count it. Listed before it leaves the live
     * set, so that statistics of all pools always find it in one or both. */
    pm__retire_list(pool);
    PM__TEST_DESTROY_MIDWAY();
    pm__pools_remove(pool);
    pm__caches_flush_pool(pool, true);
    pthread_mutex_lock(&pool->lock);
    pool->destroying = false;
    bool finish = pm__retire_claim(pool);
    pthread_mutex_unlock(&pool->lock);
    if (finish)
        pm__retire_finish(pool);
    pm__retire_poll(false);
    return PM_SUCCESS;
}

/* PINMEM_STATS=1, at exit. */
static void print_stats(void)
{
    char json[768];
    if (pm_mem_pool_stats_json(NULL, json, sizeof json, NULL) == PM_SUCCESS)
        fprintf(stderr, "pinmem pools: %s\n", json);
}
