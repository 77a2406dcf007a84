/* What the rest of pinmem asks of the pools. */
#ifndef PINMEM_POOL_H
#define PINMEM_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "pinmem.h"

/* The live pool allocation holding addr: its start and requested size. */
bool pm__pool_find(uintptr_t addr, uintptr_t *base, size_t *size);
/* The chunk ops the pool chunk holding addr was pinned with; NULL when
 * addr is in no pool chunk. */
const pm__chunk_ops *pm__pool_chunk_ops_at(uintptr_t addr);
/* After a stream synchronized: hand its frees back, release above thresholds. */
void pm__pools_after_sync(pm_stream_t s);
/* Before an event is recorded on s: blocks freed on s so far go to their
 * pools' pending batches, so that the event follows them (stream_order.h).
 * This and the next do nothing inside a host function. */
void pm__pools_flush_stream(pm_stream_t s);
/* Every pool's blocks freed on s and still in threads' caches join their
 * pools, their marker recorded now, before work that may wait for another
 * stream is queued on s: a reuse of them must not wait for that work. */
void pm__pools_flush_frees_on(pm_stream_t s);

#endif
