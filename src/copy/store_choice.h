/* Which stores a large host-to-device staged copy uses, learnt from the
 * machine. Demoting stores keep the DMA engine at full speed while threads
 * copy (memcopy.c), but cost each thread about twice the time: where the
 * threads have that time to spare the copy is faster, and where they do not
 * (a busy or slow host) it is slower. No fixed rule picks right on every
 * machine, so the engine times its synchronous copies with each kind, keeps
 * a moving average per kind and size class, copies with the faster, and
 * tries the other again now and then, as hosts change.
 *
 * Plain data, no locking: the staging engine holds its lock around every
 * call. */
#ifndef PINMEM_STORE_CHOICE_H
#define PINMEM_STORE_CHOICE_H

#include <stdbool.h>
#include <stddef.h>

enum {
    PM__STORE_PLAIN,    /* the fixed rule: streaming or cached (copy.h) */
    PM__STORE_DEMOTING, /* demoting */
    PM__STORE_CHOICES
};

/* Copies of different sizes run at different rates, so each class keeps its
 * own averages: below 256 MiB, and from there. */
enum { PM__STORE_CLASSES = 2 };

/* Each kind is timed this many times, in turn, before the averages decide,
 * and once they do, every PM__STORE_EXPLORE_EVERY-th timed copy of a class
 * uses the kind that lost. The first copy of each kind only warms up: the
 * ring's lines and the kind's filler count are not yet where the kind keeps
 * them, and a choice that counted it could settle on the slower kind. */
enum { PM__STORE_FIRST_TRIALS = 3, PM__STORE_EXPLORE_EVERY = 16 };

typedef struct pm__store_class {
    double gbps[PM__STORE_CHOICES]; /* moving average of timed copies but the first */
    unsigned samples[PM__STORE_CHOICES];
    unsigned since_explore;
} pm__store_class;

typedef struct pm__store_choice {
    pm__store_class classes[PM__STORE_CLASSES];
} pm__store_choice;

unsigned pm__store_class_of(size_t bytes);

/* The kind for a copy of class c. timed: the copy will be timed and reported
 * (only those explore; an untimed copy takes the better kind so far, plain
 * before any copy was timed). */
unsigned pm__store_choose(pm__store_choice *sc, unsigned c, bool timed);

/* A timed copy of class c with kind moved its bytes at gbps. */
void pm__store_report(pm__store_choice *sc, unsigned c, unsigned kind, double gbps);

#endif
