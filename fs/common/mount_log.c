#include "mount_log.h"
#include "message.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

static int log_fd = -1;
static bool detached;

int mount_log_file(const char *path) {
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0600);
    if (fd < 0) return -errno; /* errno stays set for the caller's message */
    log_fd = fd;
    return 0;
}

void mount_log_detached(void) {
    detached = true;
    if (log_fd < 0) openlog("ckptfs", LOG_PID, LOG_DAEMON);
}

void mount_log(const char *fmt, ...) {
    char raw[1200], msg[sizeof raw * 3];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    /* A path may hold a newline or an escape sequence: shown as msg_error shows it, so it can
     * neither forge a log line nor drive a terminal that reads the log. */
    msg_sanitize(msg, sizeof msg, raw,
                 len < 0                    ? 0
                 : (size_t)len < sizeof raw ? (size_t)len
                                            : sizeof raw - 1);
    if (log_fd >= 0) {
        /* one write(2) a line: lines of threads logging at once do not interleave */
        char line[sizeof msg + 100], when[40];
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S%z", &tm);
        int n = snprintf(line, sizeof line, "%s ckptfs[%ld]: %s\n", when, (long)getpid(), msg);
        if (n > 0) {
            ssize_t w = write(log_fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
            (void)w; /* nowhere left to say it failed */
        }
    } else if (detached) {
        syslog(LOG_WARNING, "%s", msg);
    } else {
        fprintf(stderr, "ckptfs: %s\n", msg);
    }
}
