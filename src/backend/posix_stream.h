/* The POSIX backend's streams (posix_stream.c). */
#ifndef PINMEM_POSIX_STREAM_H
#define PINMEM_POSIX_STREAM_H

#include "backend.h"

pm_result pm__posix_stream_create(pm_stream_t *out);
pm_result pm__posix_stream_check(pm_stream_t s);
pm_result pm__posix_stream_destroy(pm_stream_t s);
/* backend.h's stream_release: the stream's thread ends itself once its
 * queue is empty. */
pm_result pm__posix_stream_release(pm_stream_t s);
pm_result pm__posix_stream_synchronize(pm_stream_t s);
/* Waits for the work queued so far on every stream, as the driver's frees
 * wait for the device (backend.h's free_wait). */
void pm__posix_streams_drain(void);
pm_result pm__posix_stream_id(pm_stream_t s, unsigned long long *id);
pm_result pm__posix_stream_launch_host_func(pm_stream_t s, void (*fn)(void *), void *arg);
/* backend.h's stream_write_flag: the stream's thread stores the value. */
pm_result pm__posix_stream_write_flag(pm_stream_t s, pm_deviceptr flag, uint32_t value);
pm_result pm__posix_marker_record(pm_stream_t s, pm__marker *out);
bool pm__posix_marker_done(const pm__marker *m);
pm_result pm__posix_marker_wait(pm_stream_t s, const pm__marker *m);
void pm__posix_marker_release(pm__marker *m);
pm_result pm__posix_marker_synchronize(const pm__marker *m);
pm_result pm__posix_marker_rerecord(pm_stream_t s, pm__marker *m);

#endif
