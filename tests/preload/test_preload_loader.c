/* What the preload loads, and when, and what it says (run by run.sh):
 *   load      nothing of pinmem is in the process before the first runtime
 *             call; after a call pinmem serves, the libpinmem.so beside the
 *             preload is (with PINMEM_PRELOAD=off, still nothing)
 *   fallback  with PINMEM_PINNED_BUDGET=2M, a 4 MiB allocation pinmem cannot
 *             pin is the runtime's, and smaller ones are pinmem's again
 *   stats     a few calls, for PINMEM_STATS=1 to print at exit */
#include <dlfcn.h>
#include <stdbool.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cudart.h"
#include "pm_dyn.h"

cudaError_t cudaMallocHost(void **, size_t);
cudaError_t cudaFreeHost(void *);
cudaError_t cudaHostGetFlags(unsigned *, void *);
int fake_calls(const char *name);

/* The directory of the mapped file whose name contains what, or "". */
static void mapped_dir(const char *what, char *dir, size_t cap)
{
    char line[PATH_MAX + 128];
    FILE *maps = fopen("/proc/self/maps", "r");
    dir[0] = '\0';
    while (maps && fgets(line, sizeof line, maps)) {
        char *path = strchr(line, '/');
        if (!path || !strstr(path, what))
            continue;
        path[strcspn(path, "\n")] = '\0';
        char *slash = strrchr(path, '/');
        *slash = '\0';
        snprintf(dir, cap, "%s", path);
        break;
    }
    if (maps)
        fclose(maps);
}

static int load(void)
{
    const char *mode = getenv("PINMEM_PRELOAD");
    bool off = mode && (strcmp(mode, "off") == 0 || strcmp(mode, "copy") == 0);
    char pinmem_dir[PATH_MAX], preload_dir[PATH_MAX];
    mapped_dir("libpinmem.so", pinmem_dir, sizeof pinmem_dir);
    CHECK(pinmem_dir[0] == '\0');
    void *p = NULL;
    REQUIRE_OR(cudaMallocHost(&p, 64 << 10) == cudaSuccess, 1);
    mapped_dir("libpinmem.so", pinmem_dir, sizeof pinmem_dir);
    mapped_dir("libpinmem_preload.so", preload_dir, sizeof preload_dir);
    if (off) {
        CHECK(pinmem_dir[0] == '\0');
        CHECK(fake_calls("cudaMallocHost") == 1);
    } else {
        CHECK(pinmem_dir[0] != '\0' && strcmp(pinmem_dir, preload_dir) == 0);
        CHECK(fake_calls("cudaMallocHost") == 0);
    }
    CHECK(cudaFreeHost(p) == cudaSuccess);
    return check_finish("test_preload_loader load");
}

static bool pinmem_knows(void *p)
{
    unsigned flags;
    return pmd()->pm_mem_host_get_flags(&flags, p) == PM_SUCCESS;
}

static int fallback(void)
{
    void *big = NULL, *big2 = NULL, *small = NULL;
    REQUIRE_OR(cudaMallocHost(&big, 4 << 20) == cudaSuccess, 1);
    CHECK(fake_calls("cudaMallocHost") == 1 && !pinmem_knows(big));
    REQUIRE_OR(cudaMallocHost(&big2, 4 << 20) == cudaSuccess, 1);
    CHECK(fake_calls("cudaMallocHost") == 2);
    REQUIRE_OR(cudaMallocHost(&small, 64 << 10) == cudaSuccess, 1);
    CHECK(fake_calls("cudaMallocHost") == 2 && pinmem_knows(small));
    unsigned flags = 0;
    CHECK(cudaHostGetFlags(&flags, big) == cudaSuccess && flags == cudaHostAllocMapped);
    CHECK(cudaFreeHost(big) == cudaSuccess);
    CHECK(cudaFreeHost(big2) == cudaSuccess);
    CHECK(cudaFreeHost(small) == cudaSuccess);
    CHECK(fake_calls("cudaFreeHost") == 2);
    return check_finish("test_preload_loader fallback");
}

static int stats(void)
{
    void *p = NULL;
    for (int i = 0; i < 3; i++) {
        REQUIRE_OR(cudaMallocHost(&p, 3 << 20) == cudaSuccess, 1);
        CHECK(cudaFreeHost(p) == cudaSuccess);
    }
    CHECK(cudaFreeHost(&p) == cudaErrorInvalidValue);
    return check_finish("test_preload_loader stats");
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "";
    if (strcmp(what, "load") == 0)
        return load();
    if (strcmp(what, "fallback") == 0)
        return fallback();
    if (strcmp(what, "stats") == 0)
        return stats();
    fprintf(stderr, "usage: test_preload_loader load|fallback|stats\n");
    return 2;
}
