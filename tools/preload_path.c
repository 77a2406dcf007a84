/* Where libpinmem_preload.so lies relative to the pinmem command: in the
 * install's library directory beside bin/, or in the build tree one level
 * above tools/; else where the build was configured to install it. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "preload_path.h"

int print_preload_path(void)
{
    static const char *const relative[] = {"/../" PINMEM_PRELOAD_LIBDIR "/libpinmem_preload.so",
                                           "/../libpinmem_preload.so"};
    char exe[PATH_MAX], found[PATH_MAX], path[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
        for (size_t i = 0; i < sizeof relative / sizeof relative[0]; i++) {
            snprintf(path, sizeof path, "%s%s", exe, relative[i]);
            if (realpath(path, found)) {
                printf("%s\n", found);
                return 0;
            }
        }
    }
    if (realpath(PINMEM_PRELOAD_INSTALLED, found)) {
        printf("%s\n", found);
        return 0;
    }
    fprintf(stderr, "pinmem: libpinmem_preload.so is not beside this pinmem command, nor at %s\n",
            PINMEM_PRELOAD_INSTALLED);
    return 1;
}
