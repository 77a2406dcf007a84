/* Locking the pages of registrations on the POSIX backend (posix_pages.c).
 * Registrations never share a byte but may share a page, as the driver's
 * do, and mlock keeps no count: munlock unlocks a page whoever else needs
 * it. A page a registration covers only in part is therefore counted, and
 * unlocked when its count falls to zero; the pages a registration covers
 * whole are its own. */
#ifndef PINMEM_POSIX_PAGES_H
#define PINMEM_POSIX_PAGES_H

#include <stddef.h>
#include <stdint.h>

/* Locks the pages [lo, hi) that [p, p + bytesize) touches. Returns 0, an
 * errno from mlock (nothing of the registration is then locked, and nothing
 * another registration locked is unlocked), or -1 when the count cannot
 * grow (out of memory). */
int pm__posix_lock_registration(void *p, size_t bytesize, uintptr_t lo, uintptr_t hi);
/* Unlocks what pm__posix_lock_registration locked for [p, p + bytesize):
 * its own pages, and those it covers in part that no other registration
 * still counts on. */
void pm__posix_unlock_registration(void *p, size_t bytesize, uintptr_t lo, uintptr_t hi);

#endif
