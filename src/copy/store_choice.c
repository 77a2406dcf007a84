/* The choice between plain and demoting stores for large host-to-device
 * copies (store_choice.h says why it is learnt). */
#include "store_choice.h"

unsigned pm__store_class_of(size_t bytes) { return bytes < ((size_t)256 << 20) ? 0 : 1; }

static unsigned better(const pm__store_class *cl)
{
    return cl->gbps[PM__STORE_DEMOTING] > cl->gbps[PM__STORE_PLAIN] ? PM__STORE_DEMOTING
                                                                     : PM__STORE_PLAIN;
}

unsigned pm__store_choose(pm__store_choice *sc, unsigned c, bool timed)
{
    pm__store_class *cl = &sc->classes[c];
    const unsigned plain = cl->samples[PM__STORE_PLAIN], demoting = cl->samples[PM__STORE_DEMOTING];
    if (!timed) /* nothing to learn from it: the best known, plain until then */
        return plain > 1 && demoting > 1 ? better(cl) : PM__STORE_PLAIN;
    if (plain < PM__STORE_FIRST_TRIALS || demoting < PM__STORE_FIRST_TRIALS)
        return demoting < plain ? PM__STORE_DEMOTING : PM__STORE_PLAIN; /* in turn */
    unsigned best = better(cl);
    if (++cl->since_explore >= PM__STORE_EXPLORE_EVERY) {
        cl->since_explore = 0;
        return best ^ 1u;
    }
    return best;
}

void pm__store_report(pm__store_choice *sc, unsigned c, unsigned kind, double gbps)
{
    pm__store_class *cl = &sc->classes[c];
    /* A quarter for each new copy: single copies vary widely on a busy
     * host, and a host that changes still shows within a few copies. */
    if (cl->samples[kind] == 1)
        cl->gbps[kind] = gbps;
    else if (cl->samples[kind] > 1)
        cl->gbps[kind] = 0.75 * cl->gbps[kind] + 0.25 * gbps;
    cl->samples[kind]++; /* the first only warmed up */
}
