/* What back-to-back pageable copies cost a process whose CPUs are limited
 * (a cgroup quota, taskset): their rate, the CPUs they keep busy, and how
 * late another thread of the program wakes from 1 ms sleeps meanwhile (a
 * quota spent early in its period stalls every thread until the next).
 * Set the workers with PINMEM_COPY_WORKERS to compare counts. It measures
 * pinmem itself, through its public API.
 * gcc -O2 -Iinclude bench/probe/sustained_copy.c -Lbuild-test -lpinmem -lpthread -o probe_sustained_copy
 * LD_LIBRARY_PATH=build-test ./probe_sustained_copy [seconds] [MiB] [htod|dtoh] */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/resource.h>

#include "api_probe.h"

enum { max_wakes = 100000 };

static atomic_int stop;
static double late_ms[max_wakes];
static int wakes;

/* The program's other thread: sleeps 1 ms at a time, noting how late it woke. */
static void *sleeper(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop) && wakes < max_wakes) {
        double t0 = now_ms();
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        late_ms[wakes++] = now_ms() - t0 - 1.0;
    }
    return NULL;
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
}

int main(int argc, char **argv)
{
    const double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    const size_t bytes = (argc > 2 ? strtoul(argv[2], NULL, 10) : 256) << 20;
    const int to_device = argc > 3 ? strcmp(argv[3], "dtoh") != 0 : 1;
    if (seconds <= 0 || seconds > 60 || bytes == 0) {
        fprintf(stderr, "usage: %s [seconds] [MiB] [htod|dtoh]\n", argv[0]);
        return 2;
    }
    pm_result r;
    if ((r = pm_init(0)) != PM_SUCCESS)
        fail("pm_init", r);
    unsigned char *host = malloc(bytes);
    pm_deviceptr dev = 0;
    if (!host)
        return 1;
    memset(host, 1, bytes);
    if ((r = pm_device_alloc(&dev, bytes)) != PM_SUCCESS)
        fail("pm_device_alloc", r);
    /* a first copy starts the workers and pins the ring */
    if ((r = pm_memcpy_htod(dev, host, bytes)) != PM_SUCCESS)
        fail("pm_memcpy_htod", r);
    pm_copy_config c = {.struct_size = sizeof c};
    pm_copy_get_config(&c);

    pthread_t t;
    pthread_create(&t, NULL, sleeper, NULL);
    double cpu0 = cpu_seconds(), t0 = now_ms(), t1 = t0;
    size_t copies = 0;
    while (t1 - t0 < seconds * 1e3) {
        r = to_device ? pm_memcpy_htod(dev, host, bytes) : pm_memcpy_dtoh(host, dev, bytes);
        if (r != PM_SUCCESS)
            fail("copy", r);
        copies++;
        t1 = now_ms();
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    double cpus = (cpu_seconds() - cpu0) / ((t1 - t0) / 1e3);
    pm_copy_stats st = {.struct_size = sizeof st};
    pm_copy_get_stats(&st);
    const double all = (double)(st.staged_bytes + st.direct_bytes + st.driver_bytes);
    qsort(late_ms, (size_t)wakes, sizeof *late_ms, by_value);
    printf("%s, %u workers, %.0f%% of bytes staged: %.1f GB/s, %.1f CPUs busy; the other "
           "thread woke late by %.2f ms at the median, %.2f at p99, %.2f at most (%d wakes)\n",
           to_device ? "to the device" : "from the device", c.workers,
           all > 0 ? 100.0 * (double)st.staged_bytes / all : 0,
           (double)copies * (double)bytes / ((t1 - t0) / 1e3) / 1e9, cpus,
           wakes ? late_ms[wakes / 2] : 0, wakes ? late_ms[wakes * 99 / 100] : 0,
           wakes ? late_ms[wakes - 1] : 0, wakes);
    pm_device_free(dev);
    free(host);
    return 0;
}
