/* Markers of contexts pinmem does not hold are flags in pinned memory, not
 * events. An event dies with its context, which the user may destroy while
 * a marker of it still waits (a pool's pending free, a staging buffer), and
 * the driver then fails or crashes on it. A flag is a 32-bit word the
 * stream writes (cuStreamWriteValue32) behind the marker's work; since
 * cuCtxDestroy lets queued work finish first (docs/driver-behavior.md), the
 * value always arrives. Each word's values only grow, so a wait queued for
 * an older value (cuStreamWaitValue32, "at least") still passes once the
 * word is reused, and a word is reused only once its last value has
 * arrived, so no late write can take a newer marker's value back. */
#include "cuda_flags.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "../errors.h"
#include "cuda_places.h"

enum { WORDS_PER_PAGE = 1024 }; /* a 4 KiB page of words */

typedef struct flag_page {
    struct flag_page *next;
    _Atomic uint32_t *words; /* pinned in home, mapped for every context */
    CUdeviceptr dev;
    uint32_t issued[WORDS_PER_PAGE]; /* the last value each word was given */
} flag_page;

/* A word: its page and index. */
typedef struct word_ref {
    flag_page *page;
    unsigned index;
} word_ref;

/* Process-wide (part of the lazily created instance), under lock: */
static const pm__cuda_api *cu;
static CUcontext home;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static flag_page *pages;
static word_ref *spare; /* words whose last value has arrived, or never used */
static size_t n_spare, cap_spare;
static word_ref *draining; /* released, spare again once their last value has arrived */
static size_t n_draining, cap_draining;
static size_t n_words; /* on every page: each list has room for them all */

void pm__cuda_flags_open(const pm__cuda_api *api, CUcontext in_use)
{
    cu = api;
    home = in_use;
}

bool pm__cuda_flags_for(CUcontext ctx)
{
    return cu->stream_write_value32 && cu->stream_wait_value32 && !pm__cuda_context_held(ctx);
}

static _Atomic uint32_t *word_of(word_ref w) { return &w.page->words[w.index]; }

/* Whether the word holds value or a later one (values wrap around). */
static bool arrived(const _Atomic uint32_t *word, uint32_t value)
{
    return (int32_t)(atomic_load_explicit(word, memory_order_acquire) - value) >= 0;
}

/* Room in *list for more entries. */
static bool reserve(word_ref **list, size_t n, size_t *cap, size_t more)
{
    if (n + more <= *cap)
        return true;
    size_t grown = *cap ? *cap : 64;
    while (grown < n + more)
        grown *= 2;
    word_ref *bigger = realloc(*list, grown * sizeof *bigger);
    if (!bigger)
        return false;
    *list = bigger;
    *cap = grown;
    return true;
}

/* lock held: a new page of words, all spare; false where none could be had. */
static bool add_page_locked(void)
{
    flag_page *page = calloc(1, sizeof *page);
    if (!page || !reserve(&spare, n_words, &cap_spare, WORDS_PER_PAGE) ||
        !reserve(&draining, n_words, &cap_draining, WORDS_PER_PAGE)) {
        free(page);
        return false;
    }
    pm__place place = {.context = home};
    pm__place_scope scope;
    void *p = NULL;
    if (pm__cuda_place_enter(&place, &scope) != PM_SUCCESS) {
        free(page);
        return false;
    }
    bool ok = cu->mem_host_alloc(&p, WORDS_PER_PAGE * sizeof(uint32_t),
                                 CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP) ==
              CUDA_SUCCESS;
    ok = ok && cu->mem_host_get_device_pointer(&page->dev, p, 0) == CUDA_SUCCESS;
    if (!ok && p)
        cu->mem_free_host(p);
    pm__cuda_place_leave(&scope);
    if (!ok) {
        free(page);
        return false;
    }
    page->words = p;
    for (unsigned i = 0; i < WORDS_PER_PAGE; i++)
        atomic_init(&page->words[i], 0);
    for (unsigned i = WORDS_PER_PAGE; i-- > 0;)
        spare[n_spare++] = (word_ref){page, i};
    n_words += WORDS_PER_PAGE;
    page->next = pages;
    pages = page;
    return true;
}

/* lock held: a spare word, from the drained ones first. */
static bool take_locked(word_ref *out)
{
    for (size_t i = 0; i < n_draining;) { /* spare has room for every word */
        word_ref w = draining[i];
        if (arrived(word_of(w), w.page->issued[w.index])) {
            spare[n_spare++] = w;
            draining[i] = draining[--n_draining];
        } else {
            i++;
        }
    }
    if (n_spare == 0 && !add_page_locked())
        return false;
    *out = spare[--n_spare];
    return true;
}

static word_ref ref_of(const pm__marker *m)
{
    for (flag_page *p = pages;; p = p->next) {
        _Atomic uint32_t *word = m->handle;
        if (word >= p->words && word < p->words + WORDS_PER_PAGE)
            return (word_ref){p, (unsigned)(word - p->words)};
    }
}

pm_result pm__cuda_flag_record(CUstream s, CUcontext ctx, pm__marker *out)
{
    word_ref w;
    pthread_mutex_lock(&lock);
    const bool got = take_locked(&w);
    const uint32_t value = got ? ++w.page->issued[w.index] : 0;
    pthread_mutex_unlock(&lock);
    if (!got)
        return pm__fail(PM_ERROR_OUT_OF_MEMORY, "a marker's flag: no pinned memory for it");
    const CUresult rc =
        cu->stream_write_value32(s, w.page->dev + w.index * sizeof(uint32_t), value,
                                 CU_STREAM_WRITE_VALUE_DEFAULT);
    *out = (pm__marker){.handle = (void *)word_of(w), .seq = value, .context = ctx, .flag = true};
    if (rc != CUDA_SUCCESS) {
        pm__cuda_flag_release(out); /* its value never comes, so it is never reused */
        return pm__cuda_fail(rc, "cuStreamWriteValue32");
    }
    return PM_SUCCESS;
}

bool pm__cuda_flag_done(const pm__marker *m) { return arrived(m->handle, (uint32_t)m->seq); }

pm_result pm__cuda_flag_wait(CUstream s, const pm__marker *m)
{
    pthread_mutex_lock(&lock);
    const word_ref w = ref_of(m);
    pthread_mutex_unlock(&lock);
    /* As the event path (cuStreamWaitEvent): the legacy and per-thread
     * handles need a current context, pinmem's where the thread has none. */
    pm__place_scope scope;
    pm_result r = pm__cuda_home_enter(&scope);
    if (r != PM_SUCCESS)
        return r;
    const CUresult rc =
        cu->stream_wait_value32(s, w.page->dev + w.index * sizeof(uint32_t), (uint32_t)m->seq,
                                CU_STREAM_WAIT_VALUE_GEQ);
    pm__cuda_place_leave(&scope);
    return rc == CUDA_SUCCESS ? PM_SUCCESS : pm__cuda_fail(rc, "cuStreamWaitValue32");
}

/* A flag behind work that met a sticky error never comes. Such an error
 * stops every context of the device, pinmem's own among them, which lives
 * as long as the process and is asked rather than the marker's: the user
 * may destroy theirs meanwhile, and a destroyed context's handle still
 * pushes, crashing the next call (bench/probe/sticky_context.c). */
static CUresult sticky_error(void)
{
    pm__place_scope scope;
    if (pm__cuda_own_enter(&scope) != PM_SUCCESS)
        return CUDA_SUCCESS; /* asked again at the next check */
    const CUresult rc = cu->stream_query(CU_STREAM_LEGACY);
    pm__cuda_place_leave(&scope);
    return rc == CUDA_ERROR_NOT_READY ? CUDA_SUCCESS : rc;
}

/* After a sticky error the driver's event query fails even for work done
 * before it (docs/driver-behavior.md), so the device is asked first. */
pm_result pm__cuda_flag_query(const pm__marker *m)
{
    const CUresult rc = sticky_error();
    if (rc != CUDA_SUCCESS)
        return pm__cuda_fail(rc, "querying a flag after the device's work stopped: cuStreamQuery");
    return pm__cuda_flag_done(m) ? PM_SUCCESS : PM_ERROR_NOT_READY;
}

pm_result pm__cuda_flag_synchronize(const pm__marker *m)
{
    enum { SPINS = 4096, NAPS_PER_CHECK = 50 }; /* a check about every millisecond */
    const struct timespec nap = {.tv_nsec = 20000};
    for (unsigned k = 0; !pm__cuda_flag_done(m); k++) {
        if (k < SPINS)
            continue;
        if ((k - SPINS) % NAPS_PER_CHECK == 0) {
            const CUresult rc = sticky_error();
            if (rc != CUDA_SUCCESS && !pm__cuda_flag_done(m))
                return pm__cuda_fail(rc, "waiting for a flag whose work stopped: cuStreamQuery");
        }
        nanosleep(&nap, NULL);
    }
    return PM_SUCCESS;
}

void pm__cuda_flag_release(pm__marker *m)
{
    if (!m->handle)
        return;
    pthread_mutex_lock(&lock);
    draining[n_draining++] = ref_of(m); /* it has room for every word */
    pthread_mutex_unlock(&lock);
    m->handle = NULL;
}
