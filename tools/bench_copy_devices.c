/* Copies to and from every device, each alone and all at once: pinmem bench
 * copy --devices all (or a list of ordinals, "0,1"). Each device is served by
 * a thread of its own that has no context, so each copy runs in the primary
 * context of the device whose memory it touches. A thread copies pageable
 * memory through pinmem and, for the ceiling, page-locked memory (a single
 * DMA, the driver's own copy); each copy is timed until its bytes have
 * landed. All at once, the sum is the bytes of every device over the time
 * until the last one is done. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

enum { MAX_DEVICES = 64, REPS = 7 };

typedef enum { PINNED_TO, PAGEABLE_TO, PINNED_FROM, PAGEABLE_FROM, KINDS } copy_kind;

static const char *const kind_names[KINDS] = {
    "page-locked -> device", "pageable -> device (pinmem)", "device -> page-locked",
    "device -> pageable (pinmem)"};

typedef struct device_side {
    int ordinal;
    uint8_t *pageable, *pinned;
    pm_deviceptr dev;
    size_t n;
    copy_kind kind;
    pthread_barrier_t *start, *end; /* all at once; NULL alone */
    double ns[REPS];
    bool failed;
} device_side;

/* One copy, until its bytes are where they go: a synchronous copy to the
 * device may return once its source is read, and the small copy back behind
 * it on the same stream returns only after it. */
static pm_result one_copy(device_side *d)
{
    uint8_t *host = d->kind == PINNED_TO || d->kind == PINNED_FROM ? d->pinned : d->pageable;
    if (d->kind == PINNED_FROM || d->kind == PAGEABLE_FROM)
        return pm_memcpy_dtoh(host, d->dev, d->n);
    pm_result r = pm_memcpy_htod(d->dev, host, d->n);
    uint32_t landed;
    return r == PM_SUCCESS ? pm_memcpy_dtoh(&landed, d->dev, sizeof landed) : r;
}

static void *run_side(void *arg)
{
    device_side *d = arg;
    d->failed = one_copy(d) != PM_SUCCESS; /* warm */
    for (int k = 0; k < REPS; k++) {
        if (d->start)
            pthread_barrier_wait(d->start);
        double t0 = now_ns();
        d->failed |= one_copy(d) != PM_SUCCESS;
        d->ns[k] = now_ns() - t0;
        if (d->end)
            pthread_barrier_wait(d->end);
    }
    return NULL;
}

static double gbs(size_t n, double ns) { return ns > 0 ? (double)n / ns : 0; }

/* Each device alone, one after another, then all at once; prints a row and
 * returns whether a copy failed. */
static bool measure(device_side *sides, int count, copy_kind kind)
{
    double alone[MAX_DEVICES], together[MAX_DEVICES], sum_ns[REPS] = {0};
    bool failed = false;
    for (int i = 0; i < count; i++) {
        sides[i].kind = kind;
        sides[i].start = sides[i].end = NULL;
        pthread_t t;
        if (pthread_create(&t, NULL, run_side, &sides[i]) != 0)
            return true;
        pthread_join(t, NULL);
        failed |= sides[i].failed;
        alone[i] = gbs(sides[i].n, median(sides[i].ns, REPS));
    }
    pthread_barrier_t start, end;
    pthread_barrier_init(&start, NULL, (unsigned)count);
    pthread_barrier_init(&end, NULL, (unsigned)count);
    pthread_t threads[MAX_DEVICES];
    int started = 0;
    for (int i = 0; i < count; i++) {
        sides[i].start = &start;
        sides[i].end = &end;
        if (pthread_create(&threads[i], NULL, run_side, &sides[i]) != 0)
            break;
        started++;
    }
    if (started < count) { /* the others would wait at the barrier forever */
        fprintf(stderr, "pinmem bench copy --devices: cannot start a thread per device\n");
        exit(1);
    }
    for (int i = 0; i < count; i++) {
        pthread_join(threads[i], NULL);
        failed |= sides[i].failed;
        together[i] = gbs(sides[i].n, median(sides[i].ns, REPS));
    }
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&end);
    size_t all_bytes = 0;
    for (int i = 0; i < count; i++)
        all_bytes += sides[i].n;
    for (int k = 0; k < REPS; k++)
        for (int i = 0; i < count; i++)
            if (sides[i].ns[k] > sum_ns[k])
                sum_ns[k] = sides[i].ns[k];
    const double sum = gbs(all_bytes, median(sum_ns, REPS));
    printf("  %-28s", kind_names[kind]);
    for (int i = 0; i < count; i++)
        printf(" %6.1f", alone[i]);
    printf("  |");
    for (int i = 0; i < count; i++)
        printf(" %6.1f", together[i]);
    printf("  | %6.1f  %4.2fx%s\n", sum, alone[0] > 0 ? sum / alone[0] : 0,
           failed ? "  (a copy FAILED)" : "");
    return failed;
}

/* The ordinals "all" or a comma list names, checked against the count. */
static int parse_devices(const char *list, int total, int *ordinals)
{
    if (strcmp(list, "all") == 0) {
        for (int i = 0; i < total && i < MAX_DEVICES; i++)
            ordinals[i] = i;
        return total < MAX_DEVICES ? total : MAX_DEVICES;
    }
    int count = 0;
    for (const char *p = list;; p++) {
        char *end;
        long v = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : -1;
        if (v < 0 || v >= total || count == MAX_DEVICES || (*end && *end != ','))
            return -1;
        for (int i = 0; i < count; i++)
            if (ordinals[i] == v)
                return -1; /* each device once */
        ordinals[count++] = (int)v;
        if (!*end)
            return count;
        p = end;
    }
}

static void close_sides(device_side *sides, int count)
{
    for (int i = 0; i < count; i++) {
        free(sides[i].pageable);
        pm_mem_free_host(sides[i].pinned);
        pm_device_free(sides[i].dev);
    }
}

int bench_copy_devices(bool quick, const char *list)
{
    int total = 0;
    if (pm_device_count(&total) != PM_SUCCESS) {
        fprintf(stderr, "pinmem bench copy --devices: %s\n", pm_last_error_detail());
        return 1;
    }
    int ordinals[MAX_DEVICES];
    const int count = parse_devices(list, total, ordinals);
    if (count <= 0) {
        fprintf(stderr,
                "pinmem bench copy --devices %s: give 'all' or ordinals below %d, comma "
                "separated, each once\n",
                list, total);
        return 2;
    }
    const size_t n = quick ? (size_t)16 << 20 : (size_t)256 << 20;
    device_side sides[MAX_DEVICES];
    memset(sides, 0, sizeof sides);
    for (int i = 0; i < count; i++) {
        device_side *d = &sides[i];
        d->ordinal = ordinals[i];
        d->n = n;
        d->pageable = malloc(n);
        if (d->pageable && pm_mem_host_alloc((void **)&d->pinned, n, 0) != PM_SUCCESS) {
            /* An ordinary user may pin less: the ceiling is then not measured. */
            printf("(no page-locked ceiling for device %d: %s)\n", ordinals[i],
                   pm_last_error_detail());
            d->pinned = NULL;
        }
        if (!d->pageable || pm_device_alloc_on(&d->dev, n, d->ordinal) != PM_SUCCESS) {
            fprintf(stderr, "pinmem bench copy --devices: %zu MiB for device %d: %s\n", n >> 20,
                    d->ordinal, d->pageable ? pm_last_error_detail() : "out of memory");
            close_sides(sides, i + 1);
            return 1;
        }
        memset(d->pageable, 0x5a + i, n); /* faulted in, as a program's data is */
        if (d->pinned)
            memset(d->pinned, 0xa5 - i, n);
    }
    char size[32];
    printf("copies of %s to and from %d device%s, each alone, then all at once "
           "(GB/s; %d copies a figure, median)\n",
           human_size(n, size, sizeof size), count, count == 1 ? "" : "s", REPS);
    printf("  %-28s", "device");
    for (int i = 0; i < count; i++)
        printf(" %6d", sides[i].ordinal);
    printf("  |");
    for (int i = 0; i < count; i++)
        printf(" %6d", sides[i].ordinal);
    printf("  |    sum  / one alone\n");
    bool failed = false, ceiling = true;
    for (int i = 0; i < count; i++)
        ceiling &= sides[i].pinned != NULL;
    for (int k = 0; k < KINDS; k++)
        if (ceiling || k == PAGEABLE_TO || k == PAGEABLE_FROM)
            failed |= measure(sides, count, (copy_kind)k);
    printf("  (pinmem's share of the page-locked ceiling is each pageable row over the page-locked "
           "row above it)\n");
    close_sides(sides, count);
    return failed ? 1 : 0;
}
