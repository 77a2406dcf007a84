/* pinmem: show what the library sees on this machine, and measure it. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "pinmem.h"

static int usage(FILE *to)
{
    fprintf(to, "usage: pinmem info\n"
                "       pinmem bench [--quick]            host alloc/free against the backend's own\n"
                "       pinmem bench host [--quick]       the same\n"
                "       pinmem bench registry [--quick]   range lookups with up to 1,000,000 live ranges\n"
                "       pinmem bench pool [--quick]       pool pairs, threads, copy speed, footprint\n"
                "       pinmem bench footprint            pool reserved/used in steady states only\n"
                "       pinmem bench copy [--quick]       copies from and to pageable and pinned memory\n"
                "       pinmem bench staging [--quick]    where a staged copy's time goes\n"
                "       pinmem bench all [--quick]        all of the above\n"
                "       (bench also takes --plot FILE.png: copy bandwidth against size)\n"
                "       pinmem version\n");
    return to == stderr ? 2 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage(stderr);
    const char *cmd = argv[1];
    if (strcmp(cmd, "info") == 0)
        return cmd_info();
    if (strcmp(cmd, "version") == 0) {
        printf("pinmem %s\n", pm_version_string());
        return 0;
    }
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0)
        return usage(stdout);
    if (strcmp(cmd, "bench") != 0)
        return usage(stderr);

    const char *what = "host";
    bool quick = false;
    const char *plot = NULL;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (strcmp(argv[i], "--plot") == 0 && i + 1 < argc)
            plot = argv[++i];
        else if (argv[i][0] != '-')
            what = argv[i];
        else
            return usage(stderr);
    }
    if (strcmp(what, "host") == 0) {
        int rc = bench_host(quick);
        /* The quick run is the README's main job: show the registry too. */
        return rc ? rc : quick ? bench_registry(true) : 0;
    }
    if (strcmp(what, "registry") == 0)
        return bench_registry(quick);
    if (strcmp(what, "pool") == 0)
        return bench_pool(quick);
    if (strcmp(what, "footprint") == 0)
        return bench_footprint();
    if (strcmp(what, "copy") == 0)
        return bench_copy(quick, plot);
    if (strcmp(what, "staging") == 0)
        return bench_staging(quick);
    if (strcmp(what, "all") == 0) {
        int rc = bench_host(quick);
        rc = rc ? rc : bench_registry(quick);
        rc = rc ? rc : bench_pool(quick);
        rc = rc ? rc : bench_copy(quick, plot);
        return rc ? rc : bench_staging(quick);
    }
    return usage(stderr);
}
