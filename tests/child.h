/* A test case run in a child process, so that a hang or a crash fails that
 * case instead of stalling or ending the whole test. */
#ifndef PINMEM_TEST_CHILD_H
#define PINMEM_TEST_CHILD_H

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

/* Runs body(arg) in a child that a watchdog ends after watchdog_s seconds,
 * counting its own checks. 0 when the child passed; a hang shows as SIGALRM. */
static inline int in_child(int (*body)(void *), void *arg, unsigned watchdog_s)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(watchdog_s);
        check_failures = 0;
        int rc = body(arg);
        fflush(stdout);
        _exit(rc);
    }
    if (pid < 0)
        return -1;
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) {
        fprintf(stderr, "child ended by signal %d%s\n", WTERMSIG(status),
                WTERMSIG(status) == SIGALRM ? " (it hung)" : "");
        return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#endif
