/* Copies: pinmem's pm_memcpy_* against the driver's own copy (cuMemcpyHtoD /
 * DtoH; on posix a memcpy into simulated device memory) on the same
 * buffers, sizes 4 KiB to 1 GiB, side by side and interleaved; from
 * page-locked memory; and repeated copies of one large pageable buffer with
 * the registration cache warm. --plot draws bandwidth against size with
 * gnuplot. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

typedef pm_result (*copy_fn)(const baseline *bl, pm_deviceptr d, uint8_t *h, size_t n);

/* A synchronous copy from pageable memory may return once the source is
 * staged, before its last DMA lands (the driver's always may, and pinmem's
 * small ones go the driver's way): each host-to-device copy, pinmem's and
 * the driver's alike, is timed until its bytes are on the device, so that no
 * copy timed waits for the previous one's tail. */
static pm_result driver_htod(const baseline *bl, pm_deviceptr d, uint8_t *h, size_t n)
{
    pm_result r = bl->copy_htod(d, h, n);
    return r == PM_SUCCESS ? bl->synchronize() : r;
}
static pm_result driver_dtoh(const baseline *bl, pm_deviceptr d, uint8_t *h, size_t n)
{
    return bl->copy_dtoh(h, d, n);
}
static pm_result pinmem_htod(const baseline *bl, pm_deviceptr d, uint8_t *h, size_t n)
{
    pm_result r = pm_memcpy_htod(d, h, n);
    return r == PM_SUCCESS ? bl->synchronize() : r;
}
static pm_result pinmem_dtoh(const baseline *bl, pm_deviceptr d, uint8_t *h, size_t n)
{
    (void)bl;
    return pm_memcpy_dtoh(h, d, n);
}

static int reps_for(size_t n) { return n <= (1u << 20) ? 200 : n <= (64u << 20) ? 20 : 5; }

/* Median nanoseconds of each of two ways, run in turn so drift hits both,
 * and each first in every other round, so that neither always follows the
 * other (what the one before leaves behind, in the caches or the driver,
 * weighs on short copies). */
static void time_pair(const baseline *b, copy_fn f1, copy_fn f2, pm_deviceptr d, uint8_t *h,
                      size_t n, double *t1, double *t2, bool *failed)
{
    int reps = reps_for(n);
    double *a = malloc(sizeof *a * (size_t)reps), *c = malloc(sizeof *c * (size_t)reps);
    *failed |= f1(b, d, h, n) != PM_SUCCESS || f2(b, d, h, n) != PM_SUCCESS; /* warm */
    for (int k = 0; k < reps; k++) {
        copy_fn first = k % 2 ? f2 : f1, second = k % 2 ? f1 : f2;
        double t0 = now_ns();
        *failed |= first(b, d, h, n) != PM_SUCCESS;
        double t_mid = now_ns();
        *failed |= second(b, d, h, n) != PM_SUCCESS;
        double t_end = now_ns();
        a[k] = k % 2 ? t_end - t_mid : t_mid - t0;
        c[k] = k % 2 ? t_mid - t0 : t_end - t_mid;
    }
    *t1 = median(a, (size_t)reps);
    *t2 = median(c, (size_t)reps);
    free(a);
    free(c);
}

static void set_cache(bool on, size_t direct_max)
{
    pm_copy_config c = {.struct_size = sizeof c};
    pm_copy_get_config(&c);
    c.registration_cache = on;
    c.direct_max = direct_max;
    pm_copy_set_config(&c);
}

static double gbps(size_t n, double ns) { return ns > 0 ? (double)n / ns : 0; }

/* Writes FILE.dat and FILE.gp beside FILE and runs gnuplot on them; where
 * gnuplot is missing (the GPU machine), the two stay to be drawn elsewhere.
 * The sizes on the x axis read in KiB, MiB and GiB, and the legend sits
 * below the plot, where it covers no curve. */
static void plot(const char *file, const char *subtitle, const char *rows, size_t max)
{
    char path[1024];
    snprintf(path, sizeof path, "%s.dat", file);
    FILE *f = fopen(path, "w");
    if (!f) {
        printf("plot: cannot write %s\n", path);
        return;
    }
    fputs("# bytes, GB/s: pinmem htod, driver htod, pinmem dtoh, driver dtoh, pinned driver htod\n", f);
    fputs(rows, f);
    fclose(f);
    const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    snprintf(path, sizeof path, "%s.gp", file);
    f = fopen(path, "w");
    if (!f)
        return;
    fprintf(f,
            "set terminal pngcairo size 1000,680\n"
            "set output '%s'\n"
            "set title \"Copy bandwidth against size, from and to pageable host memory\\n%s\" "
            "noenhanced\n"
            "set logscale x 2\n"
            "set xtics (",
            base, subtitle);
    for (size_t n = 4096; n <= max; n *= 4) {
        char sz[32];
        fprintf(f, "%s\"%s\" %zu", n > 4096 ? ", " : "", human_size(n, sz, sizeof sz), n);
    }
    fprintf(f,
            ")\n"
            "set xrange [3072:%zu]\n"
            "set yrange [0:*]\n"
            "set xlabel 'bytes per copy'\n"
            "set ylabel 'GB/s'\n"
            "set key below center vertical maxrows 3 Left reverse width 4 noenhanced\n"
            "set grid\n"
            "plot '%s.dat' using 1:2 with linespoints lw 2 lc rgb '#1f5fbf' pt 7 "
            "title 'pinmem, host to device', "
            "'' using 1:4 with linespoints lw 2 lc rgb '#c0392b' pt 5 "
            "title 'pinmem, device to host', "
            "'' using 1:6 with lines dt 3 lw 2 lc rgb '#555555' "
            "title 'driver, host to device, from pinned memory', "
            "'' using 1:3 with linespoints dt 2 lw 2 lc rgb '#1f5fbf' pt 6 "
            "title 'driver, host to device', "
            "'' using 1:5 with linespoints dt 2 lw 2 lc rgb '#c0392b' pt 4 "
            "title 'driver, device to host'\n",
            max + max / 3, base);
    fclose(f);
    char cmd[2300];
    snprintf(cmd, sizeof cmd, "cd \"$(dirname '%s')\" && gnuplot '%s.gp' 2>&1", file, base);
    int rc = system(cmd);
    printf(rc == 0 ? "plot: wrote %s\n"
                   : "plot: gnuplot is missing or failed; %s.dat and %s.gp are there to draw it\n",
           file, file);
}

int bench_copy(bool quick, const char *plot_file)
{
    copy_buffers cb;
    if (!copy_buffers_open(&cb, "bench copy", quick))
        return 1;
    const baseline *b = cb.bl;
    const size_t max = cb.max;
    uint8_t *pageable = cb.pageable, *pinned = cb.pinned;
    pm_deviceptr dev = cb.dev;
    pm_copy_config cfg = {.struct_size = sizeof cfg};
    pm_copy_get_config(&cfg);
    pm_capabilities caps = {.struct_size = sizeof caps};
    pm_get_capabilities(&caps);
    printf("copies, median (backend %s: %u workers, %u of them to the device, %u buffers of %zu "
           "KiB, %zu KiB slices; driver's own path up to %zu KiB; driver: %s)\n",
           caps.backend, cfg.workers, cfg.htod_workers, cfg.buffers, cfg.chunk_bytes >> 10,
           cfg.slice_bytes >> 10, cfg.direct_max >> 10, b->copy_name);
    if (b->meaning)
        printf("(%s)\n", b->meaning);
    printf("%-9s | %-33s | %-33s | %-33s | %s\n", "", "pageable -> device", "device -> pageable",
           "pinned -> device", "staged only, -> device");
    printf("%-9s | %7s %7s %17s | %7s %7s %17s | %7s %7s %17s | %s\n", "size", "pinmem", "driver",
           "x driver", "pinmem", "driver", "x driver", "pinmem", "driver", "% of driver",
           "time / driver");
    printf("%-9s | %7s %7s %17s | %7s %7s %17s | %7s %7s %17s | %s\n", "", "GB/s", "GB/s",
           "higher is better", "GB/s", "GB/s", "higher is better", "GB/s", "GB/s",
           "higher is better", "lower is better");
    char rows[4096] = "", demoting[512] = "";
    bool failed = false;
    for (size_t n = 4096; n <= max; n *= 4) {
        double ph, dh, pd, dd, pp, dp, sh, dh2;
        pm_copy_stats before = {.struct_size = sizeof before}, after = before;
        pm_copy_get_stats(&before);
        time_pair(b, pinmem_htod, driver_htod, dev, pageable, n, &ph, &dh, &failed);
        pm_copy_get_stats(&after);
        unsigned long long staged = after.staged_bytes - before.staged_bytes;
        char sz[32];
        if (staged && n >= ((size_t)64 << 20)) {
            size_t used = strlen(demoting);
            snprintf(demoting + used, sizeof demoting - used, "%s%s %.0f%%", used ? ", " : "",
                     human_size(n, sz, sizeof sz),
                     100.0 * (double)(after.demoted_bytes - before.demoted_bytes) / (double)staged);
        }
        time_pair(b, pinmem_dtoh, driver_dtoh, dev, pageable, n, &pd, &dd, &failed);
        time_pair(b, pinmem_htod, driver_htod, dev, pinned, n, &pp, &dp, &failed);
        set_cache(false, (size_t)-1); /* everything through the staging ring */
        time_pair(b, pinmem_htod, driver_htod, dev, pageable, n, &sh, &dh2, &failed);
        set_cache(false, cfg.direct_max);
        printf("%-9s | %7.1f %7.1f %16.2fx | %7.1f %7.1f %16.2fx | %7.1f %7.1f %16.1f%% | %.2fx\n",
               human_size(n, sz, sizeof sz), gbps(n, ph), gbps(n, dh), dh / ph, gbps(n, pd),
               gbps(n, dd), dd / pd, gbps(n, pp), gbps(n, dp), 100 * dp / pp, sh / dh2);
        size_t used = strlen(rows);
        snprintf(rows + used, sizeof rows - used, "%zu %.3f %.3f %.3f %.3f %.3f\n", n, gbps(n, ph),
                 gbps(n, dh), gbps(n, pd), gbps(n, dd), gbps(n, dp));
    }
    pm_copy_stats now = {.struct_size = sizeof now};
    pm_copy_get_stats(&now);
    printf("(x driver: the driver's time over pinmem's; %% of driver: pinmem's rate as a share of "
           "the driver's, 100%% is par; time / driver: pinmem's time over the driver's)\n");
    printf("(workers filling buffers for host-to-device copies at the end: %u of at most %u)\n",
           now.htod_fillers, cfg.htod_workers);
    if (demoting[0])
        printf("(pageable -> device bytes staged with demoting stores, chosen by the engine: %s)\n",
               demoting);
    /* Repeated copies of one large pageable buffer, the cache warm. */
    set_cache(true, cfg.direct_max);
    double first = now_ns();
    failed |= pm_memcpy_htod(dev, pageable, max) != PM_SUCCESS;
    first = now_ns() - first;
    double t[10];
    for (int k = 0; k < 10; k++) {
        double t0 = now_ns();
        failed |= pm_memcpy_htod(dev, pageable, max) != PM_SUCCESS;
        t[k] = now_ns() - t0;
    }
    double warm = median(t, 10);
    pm_copy_stats st = {.struct_size = sizeof st};
    pm_copy_get_stats(&st);
    char sz[32];
    printf("\nregistration cache (%s), repeated copies of one %s pageable buffer to the device: "
           "first %.1f GB/s, then %.1f GB/s (median of 10); %llu registrations, %llu hits\n",
           st.cache_listening ? "hears unmaps" : "off: no userfaultfd", human_size(max, sz, sizeof sz),
           gbps(max, first), gbps(max, warm), st.cache_registrations, st.cache_hits);
    set_cache(false, cfg.direct_max);
    if (failed)
        printf("(a copy failed: pinmem's last error: %s; the driver's: %s)\n",
               pm_last_error_detail(), baseline_detail());
    if (plot_file)
        plot(plot_file,
             b->meaning ? "posix backend: device memory simulated by host memory, memcpy as the driver"
                        : caps.device_name,
             rows, max);
    copy_buffers_close(&cb);
    return failed;
}
