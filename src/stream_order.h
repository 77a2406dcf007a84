/* What pinmem knows of the order between streams' work, learned from events:
 * which points of other streams a stream's later work waits for. Pools use it
 * for REUSE_FOLLOW_EVENT_DEPENDENCIES: a block freed on stream A before an
 * event recorded on A may serve stream B at once, once B waits for that event.
 *
 * Points are ticks of one process-wide counter: an event takes a new tick when
 * it is recorded, and a batch of freed blocks notes the counter when it is
 * made, so "freed before the event" is "batch tick below event tick". Streams
 * are named by their backend ids, which are never reused. Part of the lazily
 * created instance; thread-safe. */
#ifndef PINMEM_STREAM_ORDER_H
#define PINMEM_STREAM_ORDER_H

#include <stdbool.h>
#include <stddef.h>

typedef struct pm__order_point {
    unsigned long long stream_id, tick; /* work of stream_id up to tick */
} pm__order_point;

/* What an event carries: the points its stream's work had reached. */
typedef struct pm__order_set {
    size_t n, cap;
    pm__order_point *points;
} pm__order_set;

/* The counter now, for a batch of freed blocks. */
unsigned long long pm__order_now(void);
/* A new tick, for an event recorded now. */
unsigned long long pm__order_next(void);
/* Replaces *out with what stream_id's work waits for, plus (stream_id, tick).
 * false when out of memory (out is then left empty: a smaller claim). */
bool pm__order_snapshot(unsigned long long stream_id, unsigned long long tick, pm__order_set *out);
/* stream_id's later work waits for everything in set. false when out of
 * memory (nothing is learned: reuse is then only missed, never wrong). */
bool pm__order_learn(unsigned long long stream_id, const pm__order_set *set);
/* Whether stream_id's work from now on waits for other_id's work up to
 * (before) tick. */
bool pm__order_follows(unsigned long long stream_id, unsigned long long other_id,
                       unsigned long long tick);
/* stream_id is gone: drop what it learned, and what others learned of it. */
void pm__order_forget(unsigned long long stream_id);
void pm__order_set_free(pm__order_set *set);
/* How many streams have learned something (what the tests count). */
size_t pm__order_known_streams(void);
/* How many points they have learned in all (what the tests count). */
size_t pm__order_known_points(void);

#endif
