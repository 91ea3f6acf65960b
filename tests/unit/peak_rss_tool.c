/* peak_rss_tool OUTFILE PROG [ARG...]: runs PROG and writes its peak RSS in KiB (ru_maxrss)
 * to OUTFILE; exits with PROG's status (128 + N for a signal).
 *
 * Why not wait4() from the test itself: a child forked from a Python test process inherits
 * its resident pages, and Linux keeps that high-water mark across exec, so a test that holds
 * 90 MiB of fixtures measures 90 MiB for any command. This process is small when it forks. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s OUTFILE PROG [ARG...]\n", argv[0]);
        return 2;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("peak_rss_tool: fork");
        return 2;
    }
    if (pid == 0) {
        execvp(argv[2], argv + 2);
        fprintf(stderr, "peak_rss_tool: %s: %s\n", argv[2], strerror(errno));
        _exit(127);
    }
    int status;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0)
        if (errno != EINTR) {
            perror("peak_rss_tool: wait4");
            return 2;
        }
    FILE *f = fopen(argv[1], "w");
    if (!f || fprintf(f, "%ld\n", ru.ru_maxrss) < 0 || fclose(f) != 0) {
        fprintf(stderr, "peak_rss_tool: %s: %s\n", argv[1], strerror(errno));
        return 2;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
