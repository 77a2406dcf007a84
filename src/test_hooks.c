/* The fault points of test builds (test_hooks.h); not part of the shipped library. */
#include "test_hooks.h"

pm__countdown pm__fault_backend_copy;
pm__countdown pm__fault_stage_pin;
pm__countdown pm__fault_thread_start;
pm__countdown pm__fault_marker_wait;
pm__countdown pm__fault_block_copy;
pm__countdown pm__fault_flag_write;
pm__countdown pm__fault_lane;
pm__countdown pm__fault_maps_query;
pm__countdown pm__fault_maps_text;
void *_Atomic pm__fault_capturing_stream;
atomic_bool pm__fault_global_capture;
atomic_bool pm__fault_places_pass;
atomic_bool pm__fault_lanes_taken;
atomic_bool pm__fault_engines_split;
atomic_bool pm__fault_ring_on_node;
atomic_bool pm__fault_policies_refused;
void (*_Atomic pm__test_destroy_midway)(void);
void (*_Atomic pm__test_record_midway)(void);
void (*_Atomic pm__test_init_midway)(void);
void (*_Atomic pm__test_reap_midway)(void);
_Thread_local int pm__test_thread_relaxed;

int pm__test_relax_thread(void)
{
    int was = pm__test_thread_relaxed;
    pm__test_thread_relaxed = 1;
    return was;
}

bool pm__countdown_fires(pm__countdown *countdown)
{
    int left = atomic_load_explicit(countdown, memory_order_relaxed);
    while (left > 0)
        if (atomic_compare_exchange_weak(countdown, &left, left - 1))
            return left == 1;
    return false;
}
