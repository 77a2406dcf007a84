/* A program that loads libpinmem with dlopen, leaves one of pinmem's threads
 * running the program's own code (a host function on a stream), and closes
 * the library: the library stays loaded (it is linked with -z nodelete), so
 * that thread, and every other of pinmem's, returns into mapped code. */
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

#include "check.h"

static int gate[2];

static void wait_at_gate(void *arg)
{
    (void)arg;
    char c;
    while (read(gate[0], &c, 1) < 0)
        ;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_dlclose PATH-TO-LIBPINMEM\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    pm_result (*init)(unsigned) = (pm_result(*)(unsigned))dlsym(lib, "pm_init");
    pm_result (*stream_create)(pm_stream_t *) =
        (pm_result(*)(pm_stream_t *))dlsym(lib, "pm_stream_create");
    pm_result (*launch)(pm_stream_t, void (*)(void *), void *) =
        (pm_result(*)(pm_stream_t, void (*)(void *), void *))dlsym(lib, "pm_stream_launch_host_func");
    if (!init || !stream_create || !launch || pipe(gate) != 0) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    pm_stream_t s = NULL;
    if (init(0) != PM_SUCCESS || stream_create(&s) != PM_SUCCESS ||
        launch(s, wait_at_gate, NULL) != PM_SUCCESS) {
        fprintf(stderr, "pinmem refused to start\n");
        return 1;
    }
    CHECK(dlclose(lib) == 0);
    CHECK(dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD) != NULL); /* still loaded */
    CHECK(write(gate[1], "x", 1) == 1); /* the stream's thread goes back into pinmem */
    usleep(200 * 1000);
    return check_finish("dlclose");
}
