/* Copies: pinmem's pm_memcpy_* against the driver's own copy (cuMemcpyHtoD /
 * DtoH; on posix a memcpy into simulated device memory) on the same
 * buffers, sizes 4 KiB to 1 GiB, each direction with its pinned ceiling (the
 * driver's copy from or into page-locked memory, same run), side by side and
 * interleaved; repeated copies of one large pageable buffer with the
 * registration cache warm; both directions at once (bench_copy_both.c); and
 * batches of scattered blocks (bench_copy_batch.c). --plot draws bandwidth
 * against size and the batches with gnuplot.
 *
 * PINMEM_BENCH_COPY picks sections (default "sizes cache both batch"):
 * sizes (4 KiB to the largest), mid (256 KiB to 16 MiB only), small (4 KiB
 * to 512 KiB by doubling, where the driver's own path may win), cache, both,
 * batch, streams (pageable copies on the thread's own stream against a
 * stream of their own), own-both (both at once, each thread on its own
 * stream), and summary (a last line of key=value figures for
 * scripts that compare settings, bench/gpu-copy.sh). */
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_copy.h"

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

/* pinmem's synchronous copies to the device of 64 MiB and up try both kinds
 * of stores in turn over their first seven in each size class
 * (docs/design.md, "Demoting stores, learnt"); warmed past those, a median
 * is what a program that copies such sizes again and again gets. */
static int warm_ups_for(size_t n) { return n >= (64u << 20) ? 7 : 1; }

/* Median nanoseconds of each of two ways, run in turn so drift hits both,
 * and each first in every other round, so that neither always follows the
 * other (what the one before leaves behind, in the caches or the driver,
 * weighs on short copies). */
static void time_pair(const baseline *b, copy_fn f1, copy_fn f2, pm_deviceptr d, uint8_t *h,
                      size_t n, double *t1, double *t2, bool *failed)
{
    int reps = reps_for(n);
    double *a = malloc(sizeof *a * (size_t)reps), *c = malloc(sizeof *c * (size_t)reps);
    if (!a || !c) {
        free(a);
        free(c);
        *failed = true;
        *t1 = *t2 = 0;
        return;
    }
    for (int k = warm_ups_for(n); k > 0; k--)
        *failed |= f1(b, d, h, n) != PM_SUCCESS || f2(b, d, h, n) != PM_SUCCESS;
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

static void set_cache(bool on, size_t direct_max, size_t dtoh_direct_max)
{
    pm_copy_config c = {.struct_size = sizeof c};
    pm_copy_get_config(&c);
    c.registration_cache = on;
    c.direct_max = direct_max;
    c.dtoh_direct_max = dtoh_direct_max;
    pm_copy_set_config(&c);
}

static double gbps(size_t n, double ns) { return ns > 0 ? (double)n / ns : 0; }

const char *short_size(size_t bytes, char *buf, size_t cap)
{
    static const char units[] = "BKMGT";
    int u = 0;
    while (bytes >= 1024 && bytes % 1024 == 0 && u < 4) {
        bytes /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%zu", bytes);
    else
        snprintf(buf, cap, "%zu%c", bytes, units[u]);
    return buf;
}

void summary_add(copy_summary *s, const char *key, double value)
{
    size_t used = strlen(s->text);
    snprintf(s->text + used, sizeof s->text - used, " %s=%.3g", key, value);
}

/* Which sections PINMEM_BENCH_COPY names (all but mid, small, streams,
 * own-both and summary when unset). */
typedef struct sections {
    bool sizes, mid, small, cache, both, own_both, batch, streams, summary;
} sections;

static bool names(const char *list, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = list; (p = strstr(p, word)) != NULL; p += n)
        if ((p == list || strchr(" ,", p[-1])) && (p[n] == '\0' || strchr(" ,", p[n])))
            return true;
    return false;
}

static const char *const section_names[] = {"sizes", "mid",   "small",   "cache",  "both",
                                            "own-both", "batch", "streams", "summary"};
enum { SECTION_COUNT = sizeof section_names / sizeof section_names[0] };

/* The first word of list (words between spaces and commas) that names no
 * section, copied into out; false when every word names one. */
static bool unknown_section(const char *list, char *out, size_t cap)
{
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, " ,");
        bool found = n == 0;
        for (size_t k = 0; !found && k < SECTION_COUNT; k++)
            found = strlen(section_names[k]) == n && strncmp(p, section_names[k], n) == 0;
        if (!found) {
            snprintf(out, cap, "%.*s", (int)n, p);
            return true;
        }
        p += n + (p[n] != '\0');
    }
    return false;
}

static sections sections_asked(void)
{
    const char *v = getenv("PINMEM_BENCH_COPY");
    if (!v || v[strspn(v, " ,")] == '\0') /* unset, or no word in it: the default */
        return (sections){.sizes = true, .cache = true, .both = true, .batch = true};
    return (sections){.sizes = names(v, "sizes"), .mid = names(v, "mid"), .small = names(v, "small"),
                      .cache = names(v, "cache"), .both = names(v, "both"),
                      .own_both = names(v, "own-both"),
                      .batch = names(v, "batch"), .streams = names(v, "streams"),
                      .summary = names(v, "summary")};
}

/* One direction's figures at one size, GB/s. */
typedef struct size_row {
    size_t n;
    double pinmem, driver, pinned, pinmem_pinned, staged_over_driver;
} size_row;

enum { MAX_ROWS = 16 };

/* Measures one direction at each size, prints its table and fills rows. */
static size_t direction_table(const copy_buffers *cb, bool htod, const size_t *sizes, size_t n_sizes,
                              const pm_copy_config *cfg, size_row *rows, copy_summary *sum,
                              bool *failed)
{
    const baseline *b = cb->bl;
    copy_fn mine = htod ? pinmem_htod : pinmem_dtoh, theirs = htod ? driver_htod : driver_dtoh;
    printf("\n%s\n", htod ? "pageable -> device, and from page-locked memory (the ceiling)"
                          : "device -> pageable, and into page-locked memory (the ceiling)");
    printf("%-9s | %7s %7s %9s | %7s %11s | %16s | %s\n", "size", "pinmem", "driver", "x driver",
           "pinned", "% of pinned", "pinmem, pinned", "staged only");
    printf("%-9s | %7s %7s %9s | %7s %11s | %16s | %s\n", "", "GB/s", "GB/s", "higher", "GB/s",
           "higher", "% of driver", "time / driver");
    printf("%-9s | %7s %7s %9s | %7s %11s | %16s | %s\n", "", "", "", "is better", "", "is better",
           "higher is better", "lower is better");
    char demoting[512] = "";
    size_t count = 0;
    for (size_t i = 0; i < n_sizes && count < MAX_ROWS; i++) {
        const size_t n = sizes[i];
        double tp, td, tpp, tdp, ts, tds;
        pm_copy_stats before = {.struct_size = sizeof before}, after = before;
        pm_copy_get_stats(&before);
        time_pair(b, mine, theirs, cb->dev, cb->pageable, n, &tp, &td, failed);
        pm_copy_get_stats(&after);
        char sz[32], key[48];
        unsigned long long staged = after.staged_bytes - before.staged_bytes;
        if (htod && staged && n >= ((size_t)64 << 20)) {
            size_t used = strlen(demoting);
            snprintf(demoting + used, sizeof demoting - used, "%s%s %.0f%%", used ? ", " : "",
                     human_size(n, sz, sizeof sz),
                     100.0 * (double)(after.demoted_bytes - before.demoted_bytes) / (double)staged);
        }
        time_pair(b, mine, theirs, cb->dev, cb->pinned, n, &tpp, &tdp, failed);
        set_cache(false, (size_t)-1, (size_t)-1); /* everything through the staging ring */
        time_pair(b, mine, theirs, cb->dev, cb->pageable, n, &ts, &tds, failed);
        set_cache(false, cfg->direct_max, cfg->dtoh_direct_max);
        size_row *r = &rows[count++];
        *r = (size_row){.n = n, .pinmem = gbps(n, tp), .driver = gbps(n, td),
                        .pinned = gbps(n, tdp), .pinmem_pinned = gbps(n, tpp),
                        .staged_over_driver = tds > 0 ? ts / tds : 0};
        double share = r->pinned > 0 ? 100 * r->pinmem / r->pinned : 0;
        printf("%-9s | %7.1f %7.1f %8.2fx | %7.1f %10.1f%% | %15.1f%% | %.2fx\n",
               human_size(n, sz, sizeof sz), r->pinmem, r->driver, tp > 0 ? td / tp : 0, r->pinned,
               share, r->pinned > 0 ? 100 * r->pinmem_pinned / r->pinned : 0,
               r->staged_over_driver);
        snprintf(key, sizeof key, "%s.%s", htod ? "htod" : "dtoh", short_size(n, sz, sizeof sz));
        summary_add(sum, key, share);
        snprintf(key, sizeof key, "%s.%s.x", htod ? "htod" : "dtoh", short_size(n, sz, sizeof sz));
        summary_add(sum, key, tp > 0 ? td / tp : 0);
        snprintf(key, sizeof key, "%s.%s.staged", htod ? "htod" : "dtoh",
                 short_size(n, sz, sizeof sz));
        summary_add(sum, key, r->staged_over_driver);
    }
    if (demoting[0])
        printf("(pageable -> device bytes staged with demoting stores, chosen by the engine: %s)\n",
               demoting);
    return count;
}

/* Repeated copies of one large pageable buffer, the cache warm. */
static void cache_section(const copy_buffers *cb, const pm_copy_config *cfg, bool *failed)
{
    set_cache(true, cfg->direct_max, cfg->dtoh_direct_max);
    double first = now_ns();
    *failed |= pm_memcpy_htod(cb->dev, cb->pageable, cb->max) != PM_SUCCESS;
    first = now_ns() - first;
    double t[10];
    for (int k = 0; k < 10; k++) {
        double t0 = now_ns();
        *failed |= pm_memcpy_htod(cb->dev, cb->pageable, cb->max) != PM_SUCCESS;
        t[k] = now_ns() - t0;
    }
    double warm = median(t, 10);
    pm_copy_stats st = {.struct_size = sizeof st};
    pm_copy_get_stats(&st);
    char sz[32];
    printf("\nregistration cache (%s), repeated copies of one %s pageable buffer to the device: "
           "first %.1f GB/s, then %.1f GB/s (median of 10); %llu registrations, %llu hits\n",
           st.cache_listening ? "hears unmaps" : "off: no userfaultfd",
           human_size(cb->max, sz, sizeof sz), gbps(cb->max, first), gbps(cb->max, warm),
           st.cache_registrations, st.cache_hits);
    set_cache(false, cfg->direct_max, cfg->dtoh_direct_max);
}

/* The upper panel: bandwidth against size both ways, with the ceilings. */
static void plot_sizes(FILE *f, const char *base, const size_row *to, size_t n_rows)
{
    size_t max = to[n_rows - 1].n;
    fprintf(f,
            "set title 'Copy bandwidth against size, from and to pageable host memory'\n"
            "set logscale x 2\n"
            "set xtics (");
    for (size_t i = 0; i < n_rows; i++) {
        char sz[32];
        fprintf(f, "%s\"%s\" %zu", i ? ", " : "", human_size(to[i].n, sz, sizeof sz), to[i].n);
    }
    fprintf(f,
            ")\n"
            "set xrange [%zu:%zu]\n"
            "set yrange [0:*]\n"
            "set xlabel 'bytes per copy'\n"
            "set ylabel 'GB/s'\n"
            "set key below center vertical maxrows 3 Left reverse width 4 noenhanced\n"
            "set grid\n"
            "plot '%s.dat' index 0 using 1:2 with linespoints lw 2 lc rgb '#1f5fbf' pt 7 "
            "title 'pinmem, host to device', "
            "'' index 0 using 1:5 with linespoints lw 2 lc rgb '#c0392b' pt 5 "
            "title 'pinmem, device to host', "
            "'' index 0 using 1:4 with lines dt 3 lw 2 lc rgb '#1f5fbf' "
            "title 'driver, host to device, from pinned memory', "
            "'' index 0 using 1:7 with lines dt 3 lw 2 lc rgb '#c0392b' "
            "title 'driver, device to host, into pinned memory', "
            "'' index 0 using 1:3 with linespoints dt 2 lw 1 lc rgb '#1f5fbf' pt 6 "
            "title 'driver, host to device', "
            "'' index 0 using 1:6 with linespoints dt 2 lw 1 lc rgb '#c0392b' pt 4 "
            "title 'driver, device to host'\n",
            to[0].n * 3 / 4, max + max / 3, base);
}

/* The lower panel: the batches, a group of bars each. */
static void plot_batches(FILE *f, const char *base, int index)
{
    fprintf(f,
            "set title 'Batches of scattered blocks (pm_memcpy_batch_async)' noenhanced\n"
            "unset logscale x\n"
            "set xrange [*:*]\n"
            "set yrange [0:*]\n"
            "set xtics () norotate\n"
            "set xlabel 'blocks, to or from the device'\n"
            "set ylabel 'GB/s'\n"
            "set grid\n"
            "set style data histograms\n"
            "set style histogram clustered gap 1\n"
            "set style fill solid 0.85 border -1\n"
            "set key below center vertical maxrows 2 Left reverse width 4 noenhanced\n"
            "plot '%s.dat' index %d using 2:xtic(1) lc rgb '#1f5fbf' "
            "title 'pinmem, from or to pageable blocks', "
            "'' index %d using 3 lc rgb '#aaaaaa' title 'driver, a copy a pageable block', "
            "'' index %d using 4 lc rgb '#555555' title 'one contiguous pinned copy (ceiling)', "
            "'' index %d using 5 lc rgb '#7fb3e8' title 'pinmem, from or to pinned blocks'\n",
            base, index, index, index, index);
}

/* Runs gnuplot on script in the directory of file (whose paths the script
 * names relative to it), its messages on stdout; true when it drew. */
static bool run_gnuplot(const char *file, const char *script)
{
    char dir[PLOT_NAME_MAX + sizeof ".dat"];
    snprintf(dir, sizeof dir, "%s", file);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(STDOUT_FILENO, STDERR_FILENO);
        if (chdir(dirname(dir)) == 0)
            execlp("gnuplot", "gnuplot", script, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
}

/* Writes FILE.png.dat and FILE.png.gp beside FILE.png and runs gnuplot on
 * them; where gnuplot is missing (the GPU machine), the two stay to be drawn
 * elsewhere. Above, bandwidth against size both ways with the pinned
 * ceilings; below, the batches (each panel where its section ran). The sizes
 * on the x axis read in KiB, MiB and GiB, and the legends sit below their
 * plots, where they cover nothing. */
static void plot(const char *file, const char *subtitle, const size_row *to, const size_row *from,
                 size_t n_rows, const char *batch_rows)
{
    if (n_rows == 0 && !batch_rows[0]) {
        printf("plot: nothing to draw (neither sizes nor batches ran)\n");
        return;
    }
    char path[PLOT_NAME_MAX + sizeof ".dat"];
    snprintf(path, sizeof path, "%s.dat", file);
    FILE *f = fopen(path, "w");
    if (!f) {
        printf("plot: cannot write %s\n", path);
        return;
    }
    if (n_rows) {
        fputs("# bytes, GB/s: pinmem htod, driver htod, pinned htod, pinmem dtoh, driver dtoh, "
              "pinned dtoh\n",
              f);
        for (size_t i = 0; i < n_rows; i++)
            fprintf(f, "%zu %.3f %.3f %.3f %.3f %.3f %.3f\n", to[i].n, to[i].pinmem,
                    to[i].driver, to[i].pinned, from[i].pinmem, from[i].driver, from[i].pinned);
        fputs("\n\n", f);
    }
    if (batch_rows[0]) {
        fputs("# batches, GB/s: pinmem from pageable blocks, the driver a block, one contiguous "
              "pinned copy, pinmem from pinned blocks\n",
              f);
        fputs(batch_rows, f);
    }
    fclose(f);
    const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    snprintf(path, sizeof path, "%s.gp", file);
    f = fopen(path, "w");
    if (!f)
        return;
    int panels = (n_rows > 0) + (batch_rows[0] != 0);
    fprintf(f,
            "set terminal pngcairo size 1000,%d\n"
            "set output '%s'\n"
            "set multiplot layout %d,1 title \"%s\" noenhanced\n",
            panels * 650, base, panels, subtitle);
    if (n_rows)
        plot_sizes(f, base, to, n_rows);
    if (batch_rows[0])
        plot_batches(f, base, n_rows ? 1 : 0);
    fputs("unset multiplot\n", f);
    fclose(f);
    snprintf(path, sizeof path, "%s.gp", base);
    printf(run_gnuplot(file, path) ? "plot: wrote %s\n"
                   : "plot: gnuplot is missing or failed; %s.dat and %s.gp are there to draw it\n",
           file, file);
}

int bench_copy(bool quick, const char *plot_file)
{
    const char *asked = getenv("PINMEM_BENCH_COPY");
    char word[64];
    if (asked && unknown_section(asked, word, sizeof word)) {
        fprintf(stderr, "pinmem bench copy: PINMEM_BENCH_COPY names '%s', not one of", word);
        for (size_t k = 0; k < SECTION_COUNT; k++)
            fprintf(stderr, "%s %s", k ? "," : "", section_names[k]);
        fputc('\n', stderr);
        return 2;
    }
    const sections sec = sections_asked();
    copy_buffers cb;
    if (!copy_buffers_open(&cb, "bench copy", quick))
        return 1;
    const baseline *b = cb.bl;
    pm_copy_config cfg = {.struct_size = sizeof cfg};
    pm_copy_get_config(&cfg);
    pm_capabilities caps = {.struct_size = sizeof caps};
    pm_get_capabilities(&caps);
    char spin[32] = "none";
    if (cfg.spin_us != (unsigned)-1)
        snprintf(spin, sizeof spin, "%u us", cfg.spin_us);
    printf("copies, median (backend %s: %u workers, %u of them to the device, %u buffers of %zu "
           "KiB, %zu KiB slices, first piece %zu KiB (%zu KiB from the device), at least %u "
           "pieces, spin %s, ring %s, "
           "batches %s; driver's own path up to %zu KiB, %zu KiB from the device; driver: %s)\n",
           caps.backend, cfg.workers, cfg.htod_workers, cfg.buffers, cfg.chunk_bytes >> 10,
           cfg.slice_bytes >> 10, cfg.first_piece_bytes >> 10, cfg.dtoh_first_piece_bytes >> 10,
           cfg.pieces, spin,
           cfg.ring == PM_COPY_RING_SHARED ? "shared" : "split",
           cfg.batch == PM_COPY_BATCH_EACH     ? "a call a DMA"
           : cfg.batch == PM_COPY_BATCH_DRIVER ? "to the driver"
           : cfg.batch == PM_COPY_BATCH_KERNEL ? "by the kernel where it runs, else gathered"
                                               : "gathered",
           cfg.direct_max == (size_t)-1 ? 0 : cfg.direct_max >> 10,
           cfg.dtoh_direct_max == (size_t)-1 ? 0 : cfg.dtoh_direct_max >> 10, b->copy_name);
    if (b->meaning)
        printf("(%s)\n", b->meaning);
    copy_summary sum = {.text = "summary:"};
    bool failed = false;
    size_t sizes[MAX_ROWS], n_sizes = 0, n_rows = 0;
    if (sec.sizes)
        for (size_t n = 4096; n <= cb.max && n_sizes < MAX_ROWS; n *= 4)
            sizes[n_sizes++] = n;
    else if (sec.mid)
        for (size_t n = 256 << 10; n <= ((size_t)16 << 20) && n <= cb.max; n *= 2)
            sizes[n_sizes++] = n;
    else if (sec.small)
        for (size_t n = 4096; n <= (512 << 10) && n <= cb.max; n *= 2)
            sizes[n_sizes++] = n;
    size_row to[MAX_ROWS], from[MAX_ROWS];
    if (n_sizes) {
        n_rows = direction_table(&cb, true, sizes, n_sizes, &cfg, to, &sum, &failed);
        direction_table(&cb, false, sizes, n_sizes, &cfg, from, &sum, &failed);
        pm_copy_stats now = {.struct_size = sizeof now};
        pm_copy_get_stats(&now);
        printf("(x driver: the driver's time over pinmem's; %% of pinned: pinmem's rate from or "
               "into pageable memory as a share of the driver's from or into page-locked memory; "
               "pinmem, pinned: pinmem's rate from page-locked memory as a share of the "
               "driver's; staged only: pinmem through the staging ring at every size, its time "
               "over the driver's)\n");
        printf("(workers filling buffers for host-to-device copies at the end: %u of at most %u)\n",
               now.htod_fillers, cfg.htod_workers);
    }
    if (sec.cache)
        cache_section(&cb, &cfg, &failed);
    if (sec.both)
        failed |= bench_copy_both(&cb, quick, false, &sum);
    if (sec.own_both)
        failed |= bench_copy_both(&cb, quick, true, &sum);
    if (sec.streams)
        failed |= bench_copy_streams(&cb, quick, &sum);
    char batch_rows[2048] = "";
    if (sec.batch)
        failed |= bench_copy_batch(&cb, quick, &sum, batch_rows, sizeof batch_rows);
    if (sec.summary)
        printf("%s\n", sum.text);
    if (failed)
        printf("(a copy failed: pinmem's last error: %s; the driver's: %s)\n",
               pm_last_error_detail(), baseline_detail());
    if (plot_file)
        plot(plot_file,
             b->meaning ? "posix backend: device memory simulated by host memory, memcpy as the driver"
                        : caps.device_name,
             to, from, n_rows, batch_rows);
    copy_buffers_close(&cb);
    return failed;
}
