/* What the preload loads, and when, and what it says (run by run.sh):
 *   load      nothing of pinmem is in the process before the first runtime
 *             call; after a call pinmem serves, the libpinmem.so beside the
 *             preload is (with PINMEM_PRELOAD=off, still nothing)
 *   fallback  with PINMEM_PINNED_BUDGET=2M, a 4 MiB allocation pinmem cannot
 *             pin is the runtime's, and smaller ones are pinmem's again
 *   stats     a few calls, for PINMEM_STATS=1 to print at exit
 *   runtimes  a plugin of another runtime (libcudart.so.12, loaded with
 *             RTLD_LOCAL) and this program each reach their own runtime:
 *             its errors, its last error, its calls (with PINMEM_PRELOAD
 *             off or not; without the preload too) */
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
cudaError_t cudaGetLastError(void);
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

typedef struct plugin {
    cudaError_t (*malloc_host)(void **, size_t);
    cudaError_t (*free_host)(void *);
    cudaError_t (*get_last_error)(void);
    int (*fake_calls)(const char *);
} plugin;

static bool load_plugin(plugin *pl)
{
    void *h = dlopen(PM_RUNTIMES_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return false;
    }
    pl->malloc_host = (cudaError_t(*)(void **, size_t))dlsym(h, "plugin_malloc_host");
    pl->free_host = (cudaError_t(*)(void *))dlsym(h, "plugin_free_host");
    pl->get_last_error = (cudaError_t(*)(void))dlsym(h, "plugin_get_last_error");
    pl->fake_calls = (int (*)(const char *))dlsym(h, "plugin_fake_calls");
    return pl->malloc_host && pl->free_host && pl->get_last_error && pl->fake_calls;
}

static int runtimes(void)
{
    const char *mode = getenv("PINMEM_PRELOAD");
    Dl_info where;
    void *any = dlsym(RTLD_DEFAULT, "cudaFreeHost");
    const bool served = any && dladdr(any, &where) && strstr(where.dli_fname, "pinmem_preload") &&
                        !(mode && (strcmp(mode, "off") == 0 || strcmp(mode, "copy") == 0));
    plugin pl;
    REQUIRE_OR(load_plugin(&pl), 1);
    char ordinary[64];
    /* The plugin's error is its runtime's, and so is its last error. */
    CHECK(pl.free_host(ordinary) == cudaErrorInvalidValue);
    CHECK(pl.fake_calls("cudaFreeHost") == 1 && fake_calls("cudaFreeHost") == 0);
    CHECK(pl.get_last_error() == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaSuccess);
    /* And the program's is its own. */
    CHECK(cudaFreeHost(ordinary) == cudaErrorInvalidValue);
    CHECK(fake_calls("cudaFreeHost") == 1 && pl.fake_calls("cudaFreeHost") == 1);
    CHECK(pl.get_last_error() == cudaSuccess);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    /* Pinning for the plugin is pinmem's, as for the program. */
    void *p = NULL;
    REQUIRE_OR(pl.malloc_host(&p, 1 << 20) == cudaSuccess, 1);
    CHECK(pl.fake_calls("cudaMallocHost") == !served && pinmem_knows(p) == served);
    CHECK(pl.free_host(p) == cudaSuccess);
    CHECK(pl.fake_calls("cudaFreeHost") == 1 + !served);
    /* A lookup without a version reaches the runtime first found: the
     * program's. */
    CHECK(((cudaError_t(*)(void *))any)(ordinary) == cudaErrorInvalidValue);
    CHECK(fake_calls("cudaFreeHost") == 2 && pl.fake_calls("cudaFreeHost") == 1 + !served);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue && pl.get_last_error() == cudaSuccess);
    return check_finish("test_preload_loader runtimes");
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
    if (strcmp(what, "runtimes") == 0)
        return runtimes();
    fprintf(stderr, "usage: test_preload_loader load|fallback|stats|runtimes\n");
    return 2;
}
