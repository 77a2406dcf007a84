/* pinmem: show what the library sees on this machine, and measure it.
 *
 * Help goes to stdout with status 0; a word the command does not know is
 * named on stderr, with the usage, and the status is 2. */
#include <errno.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench_copy.h"
#include "commands.h"
#include "preload_path.h"

static const char usage_text[] =
    "usage: pinmem <command> [options]\n"
    "\n"
    "commands:\n"
    "  info          what pinmem sees on this machine: backend, driver, device, limits\n"
    "  bench         measure pinmem beside the driver (see pinmem bench --help)\n"
    "  preload-path  where libpinmem_preload.so is, for LD_PRELOAD (unmodified programs)\n"
    "  version       print the version (also --version)\n"
    "  help          print this text (also -h, --help)\n";

static const char bench_usage_text[] =
    "usage: pinmem bench [NAME] [--quick] [--plot FILE.png] [--devices all|0,1,...]\n"
    "\n"
    "Measures pinmem and, in the same run, what it replaces: the CUDA driver's own calls on\n"
    "the cuda backend; on the posix backend the system's plain ways (mmap + mlock, glibc\n"
    "malloc, memcpy into simulated device memory).\n"
    "\n"
    "benchmarks (NAME):\n"
    "  host        cold pinned allocation and free (the default; with --quick, registry too)\n"
    "  registry    queries among up to 1,000,000 live registrations\n"
    "  pool        pool pairs on one thread and on 16, copy speed, first allocation, footprint\n"
    "  footprint   the pool footprint alone (takes no --quick)\n"
    "  copy        copies from and to pageable and pinned memory, 4 KiB to 1 GiB\n"
    "  staging     where a staged copy's time goes\n"
    "  all         host, registry, pool, copy and staging\n"
    "\n"
    "options:\n"
    "  --quick           fewer sizes and repetitions (copies up to 64 MiB)\n"
    "  --plot FILE.png   copy and all only: draw copy bandwidth against size (gnuplot)\n"
    "  --devices LIST    copy only: instead of its sections, copies to and from each device\n"
    "                    of LIST (all, or ordinals), each alone and all at once\n"
    "  -h, --help        print this text\n";

static int run_host(bool quick, const char *plot)
{
    (void)plot;
    int rc = bench_host(quick);
    /* The quick run is the main job's: show the registry too. */
    return rc ? rc : quick ? bench_registry(true) : 0;
}
static int run_registry(bool quick, const char *plot)
{
    (void)plot;
    return bench_registry(quick);
}
static int run_pool(bool quick, const char *plot)
{
    (void)plot;
    return bench_pool(quick);
}
static int run_footprint(bool quick, const char *plot)
{
    (void)quick;
    (void)plot;
    return bench_footprint();
}
static int run_copy(bool quick, const char *plot) { return bench_copy(quick, plot); }
static int run_staging(bool quick, const char *plot)
{
    (void)plot;
    return bench_staging(quick);
}
static int run_all(bool quick, const char *plot)
{
    int rc = bench_host(quick);
    rc = rc ? rc : bench_registry(quick);
    rc = rc ? rc : bench_pool(quick);
    rc = rc ? rc : bench_copy(quick, plot);
    return rc ? rc : bench_staging(quick);
}

typedef struct benchmark {
    const char *name;
    int (*run)(bool quick, const char *plot);
    bool takes_quick, takes_plot;
} benchmark;

static const benchmark benchmarks[] = {
    {"host", run_host, true, false},       {"registry", run_registry, true, false},
    {"pool", run_pool, true, false},       {"footprint", run_footprint, false, false},
    {"copy", run_copy, true, true},        {"staging", run_staging, true, false},
    {"all", run_all, true, true},
};

/* Names what is wrong on stderr, then the usage; the status for it. */
static int refuse(const char *usage, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(const char *usage, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n\n%s", usage);
    return 2;
}

static bool is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

static int bench(int argc, char **argv)
{
    const benchmark *what = NULL;
    bool quick = false;
    const char *plot = NULL, *devices = NULL;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (is_help(arg)) {
            fputs(bench_usage_text, stdout);
            return 0;
        }
        if (strcmp(arg, "--quick") == 0) {
            quick = true;
        } else if (strcmp(arg, "--plot") == 0 || strncmp(arg, "--plot=", 7) == 0) {
            plot = arg[6] == '=' ? arg + 7 : i + 1 < argc ? argv[++i] : "";
            if (!plot[0] || plot[0] == '-')
                return refuse(bench_usage_text, "pinmem bench: --plot needs a file name (FILE.png)");
            /* The name goes into gnuplot's quoted strings. */
            if (strpbrk(plot, "'\"\\\n"))
                return refuse(bench_usage_text,
                              "pinmem bench: --plot %s: the name may not hold quotes, "
                              "backslashes or newlines",
                              plot);
        } else if (strcmp(arg, "--devices") == 0 || strncmp(arg, "--devices=", 10) == 0) {
            devices = arg[9] == '=' ? arg + 10 : i + 1 < argc ? argv[++i] : "";
            if (!devices[0] || devices[0] == '-')
                return refuse(bench_usage_text,
                              "pinmem bench: --devices needs 'all' or device ordinals (0,1)");
        } else if (arg[0] == '-') {
            return refuse(bench_usage_text, "pinmem bench: unknown option '%s'", arg);
        } else {
            const benchmark *found = NULL;
            for (size_t k = 0; k < sizeof benchmarks / sizeof benchmarks[0]; k++)
                if (strcmp(arg, benchmarks[k].name) == 0)
                    found = &benchmarks[k];
            if (!found)
                return refuse(bench_usage_text, "pinmem bench: unknown benchmark '%s'", arg);
            if (what)
                return refuse(bench_usage_text,
                              "pinmem bench: one benchmark at a time, not '%s' and '%s'",
                              what->name, arg);
            what = found;
        }
    }
    if (!what)
        what = &benchmarks[0];
    if (plot && !what->takes_plot)
        return refuse(bench_usage_text,
                      "pinmem bench: --plot draws copy bandwidth, which 'bench %s' does not "
                      "measure: only 'copy' and 'all' take it",
                      what->name);
    if (plot && strlen(plot) > PLOT_NAME_MAX)
        return refuse(bench_usage_text, "pinmem bench: --plot: the name is longer than %d bytes",
                      (int)PLOT_NAME_MAX);
    char dir[PLOT_NAME_MAX + 1];
    snprintf(dir, sizeof dir, "%s", plot ? plot : ".");
    const char *where = dirname(dir); /* "." for a bare name, which dir does not say */
    if (plot && access(where, W_OK) != 0) /* before a run, not after it */
        return refuse(bench_usage_text, "pinmem bench: --plot %s: cannot write in %s: %s", plot,
                      where, strerror(errno));
    if (quick && !what->takes_quick)
        return refuse(bench_usage_text, "pinmem bench: 'bench %s' has no --quick form", what->name);
    if (devices && (strcmp(what->name, "copy") != 0 || plot))
        return refuse(bench_usage_text,
                      "pinmem bench: --devices goes with 'bench copy' alone, without --plot");
    if (devices)
        return bench_copy_devices(quick, devices);
    return what->run(quick, plot);
}

/* Commands that take nothing but --help. */
static int no_arguments(const char *cmd, int argc, char **argv, int (*run)(void))
{
    for (int i = 0; i < argc; i++) {
        if (is_help(argv[i])) {
            fputs(usage_text, stdout);
            return 0;
        }
        return refuse(usage_text, "pinmem %s: unexpected argument '%s'", cmd, argv[i]);
    }
    return run();
}

static int print_version(void)
{
    printf("pinmem %s\n", pm_version_string());
    return 0;
}

static int run_command(int argc, char **argv)
{
    if (argc < 2)
        return refuse(usage_text, "pinmem: no command given");
    const char *cmd = argv[1];
    if (strcmp(cmd, "info") == 0)
        return no_arguments(cmd, argc - 2, argv + 2, cmd_info);
    if (strcmp(cmd, "bench") == 0)
        return bench(argc - 2, argv + 2);
    if (strcmp(cmd, "preload-path") == 0)
        return no_arguments(cmd, argc - 2, argv + 2, print_preload_path);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0)
        return no_arguments("version", argc - 2, argv + 2, print_version);
    if (strcmp(cmd, "help") == 0 || is_help(cmd)) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (cmd[0] == '-')
        return refuse(usage_text, "pinmem: unknown option '%s'", cmd);
    return refuse(usage_text, "pinmem: unknown command '%s'", cmd);
}

/* Output that could not be written (a full disk, a closed pipe) fails the
 * command: LD_PRELOAD=$(pinmem preload-path) must not take half a path. */
int main(int argc, char **argv)
{
    int rc = run_command(argc, argv);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "pinmem: writing the output failed: %s\n", strerror(errno));
        return rc ? rc : 1;
    }
    return rc;
}
