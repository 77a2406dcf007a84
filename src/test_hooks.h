/* Fault injection for the tests, one style everywhere: a countdown set to k
 * makes the k-th pass through its point fail (0: never). One point names a
 * stream instead (pm__fault_capturing_stream).
 *
 * The points exist only in test builds: CMake compiles a second copy of the
 * library with PINMEM_TEST_HOOKS for the tests to link. In the shipped
 * library PM__TEST_FAULT and PM__TEST_CAPTURING are the constant false and
 * the points do not exist. */
#ifndef PINMEM_TEST_HOOKS_H
#define PINMEM_TEST_HOOKS_H

#include <stdatomic.h>
#include <stdbool.h>

typedef _Atomic int pm__countdown;

#ifdef PINMEM_TEST_HOOKS
extern pm__countdown pm__fault_backend_copy; /* a copy call of the copy engine's to the backend */
extern pm__countdown pm__fault_stage_pin;    /* pinning a staging buffer */
extern pm__countdown pm__fault_thread_start; /* starting a thread of the library's own */
extern pm__countdown pm__fault_marker_wait;  /* the staging engine's wait for a buffer's DMA */
extern pm__countdown pm__fault_block_copy;   /* a launch of block copies (the batch kernel) */
extern pm__countdown pm__fault_flag_write;   /* the staging engine's flag behind a buffer's work */
extern pm__countdown pm__fault_lane;         /* a lane's entry or its exit's wait */
extern pm__countdown pm__fault_maps_query;   /* a mapping query (answered as before Linux 6.11) */
extern pm__countdown pm__fault_maps_text;    /* opening /proc/self/maps to read its text */
/* Counts countdown down; true on the pass that takes it from 1 to 0. */
bool pm__countdown_fires(pm__countdown *countdown);
#define PM__TEST_FAULT(countdown) pm__countdown_fires(&(countdown))
/* A stream the posix backend says is capturing a graph (NULL: none), so that
 * the rules for captures can be tested where nothing captures. */
extern void *_Atomic pm__fault_capturing_stream;
#define PM__TEST_CAPTURING(s) ((s) != NULL && atomic_load(&pm__fault_capturing_stream) == (s))
/* While set, the posix backend answers as the driver does while another
 * thread captures a graph in global mode: a wait on a thread whose capture
 * mode is not relaxed is refused. Each thread's mode is its own, as the
 * driver keeps it. */
extern atomic_bool pm__fault_global_capture;
extern _Thread_local int pm__test_thread_relaxed;
/* While set, the posix backend's places do not last (place_lasts), as a
 * context the user made on cuda, so that what is made there is not kept. */
extern atomic_bool pm__fault_places_pass;
#define PM__TEST_PLACES_PASS() atomic_load(&pm__fault_places_pass)
/* While set, the staging engine finds every lane it keeps taken, as beside
 * 16 copies on lanes: a copy that wants one makes a one-off lane. */
extern atomic_bool pm__fault_lanes_taken;
#define PM__TEST_LANES_TAKEN() atomic_load(&pm__fault_lanes_taken)
/* While set, the staging engine takes a copy's engine from its device
 * memory's address (the parity of its 2 MiB unit), as if half the memory were
 * a second device's, so that copies run on two engines at once where there
 * is one device. */
extern atomic_bool pm__fault_engines_split;
#define PM__TEST_ENGINES_SPLIT() atomic_load(&pm__fault_engines_split)
/* While set, a staging engine binds its ring to its device's nearest NUMA
 * node even where the machine has one node, so that the binding is tested
 * where there is nothing to choose. */
extern atomic_bool pm__fault_ring_on_node;
#define PM__TEST_RING_ON_NODE() atomic_load(&pm__fault_ring_on_node)
/* While set, the kernel refuses memory policies (mbind answers EPERM, as
 * under a container's default seccomp profile) and pages meant for a node
 * are placed by its threads' touch even where the machine has one node. */
extern atomic_bool pm__fault_policies_refused;
#define PM__TEST_POLICIES_REFUSED() atomic_load(&pm__fault_policies_refused)
/* Where set, pm_mem_pool_destroy calls it while the pool is both listed as
 * destroyed and still in the live set, so that statistics read there show
 * whether such a pool is counted once. */
extern void (*_Atomic pm__test_destroy_midway)(void);
/* Calls the function a hook holds, where one is set. */
#define PM__TEST_RUN_HOOK(hook)                                                          \
    do {                                                                                 \
        void (*hook_)(void) = atomic_load(&(hook));                                      \
        if (hook_)                                                                       \
            hook_();                                                                     \
    } while (0)
#define PM__TEST_DESTROY_MIDWAY() PM__TEST_RUN_HOOK(pm__test_destroy_midway)
/* Where set, pm_event_record calls it between taking the stream's order and
 * recording the marker, so that work another thread queues on the stream in
 * between can be placed there. */
extern void (*_Atomic pm__test_record_midway)(void);
#define PM__TEST_RECORD_MIDWAY() PM__TEST_RUN_HOOK(pm__test_record_midway)
/* Where set, initialisation calls it once it has begun (a fork from then on
 * must leave the child refusing), so that a fork can be placed there. */
extern void (*_Atomic pm__test_init_midway)(void);
#define PM__TEST_INIT_MIDWAY() PM__TEST_RUN_HOOK(pm__test_init_midway)
/* Where set, the pools' reaper calls it while it holds its lock, so that a
 * fork can be placed there. */
extern void (*_Atomic pm__test_reap_midway)(void);
#define PM__TEST_REAP_MIDWAY() PM__TEST_RUN_HOOK(pm__test_reap_midway)
#define PM__TEST_WAIT_REFUSED() \
    (atomic_load(&pm__fault_global_capture) && !pm__test_thread_relaxed)
/* Relaxes the calling thread's mode in the model; the mode it had. */
int pm__test_relax_thread(void);
#define PM__TEST_RELAX_THREAD() pm__test_relax_thread()
#define PM__TEST_RESTORE_THREAD(saved) ((void)(pm__test_thread_relaxed = (saved)))
#else
#define PM__TEST_FAULT(countdown) false
#define PM__TEST_CAPTURING(s) false
#define PM__TEST_WAIT_REFUSED() false
#define PM__TEST_PLACES_PASS() false
#define PM__TEST_LANES_TAKEN() false
#define PM__TEST_ENGINES_SPLIT() false
#define PM__TEST_RING_ON_NODE() false
#define PM__TEST_POLICIES_REFUSED() false
#define PM__TEST_DESTROY_MIDWAY() ((void)0)
#define PM__TEST_RECORD_MIDWAY() ((void)0)
#define PM__TEST_INIT_MIDWAY() ((void)0)
#define PM__TEST_REAP_MIDWAY() ((void)0)
#define PM__TEST_RELAX_THREAD() 0
#define PM__TEST_RESTORE_THREAD(saved) ((void)(saved))
#endif

#endif
