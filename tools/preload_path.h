/* `pinmem preload-path`: the absolute path of libpinmem_preload.so as
 * installed beside this build's libpinmem, printed on stdout. */
#ifndef PINMEM_PRELOAD_PATH_H
#define PINMEM_PRELOAD_PATH_H

/* A process exit status: 0 when printed, 1 (said on stderr) when the library
 * is not where it is installed. */
int print_preload_path(void);

#endif
