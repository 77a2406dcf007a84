/* pinmem's calls are not cancellation points (pinmem.h, "Threads"). A caller
 * cancelled inside one would leave a lock held or a step half made, so each
 * call that may wait, read a file or call the driver turns the caller's
 * cancellation off until it returns; a request that came meanwhile acts at
 * the caller's next cancellation point. */
#ifndef PINMEM_NO_CANCEL_H
#define PINMEM_NO_CANCEL_H

#include <pthread.h>

static inline int pm__cancel_off(void)
{
    int old = PTHREAD_CANCEL_ENABLE;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    return old;
}

static inline void pm__cancel_restore(const int *old)
{
    int ignored;
    pthread_setcancelstate(*old, &ignored);
}

/* The first statement of such a call: every path out of it restores the
 * caller's state. */
#define PM__NO_CANCEL                                                                  \
    const int pm__cancel_state_ __attribute__((cleanup(pm__cancel_restore), unused)) = \
        pm__cancel_off()

#endif
