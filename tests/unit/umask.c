/* ckpt_umask reads the umask without changing it: while one thread asks for it over and over,
 * another thread watching the process's umask (as the kernel reports it) never sees anything
 * but the value set. Reading it by umask(0) + umask(old) leaves a window in which a staging
 * mount's other threads would create files with mode 0666. */
#include "tap.h"
#include "write/writer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/stat.h>

static atomic_bool stop;

static void *ask(void *arg) {
    unsigned long *wrong = arg;
    while (!atomic_load(&stop))
        if (ckpt_umask() != 027) (*wrong)++;
    return NULL;
}

/* The umask as /proc/self/status shows it, or -1. */
static int kernel_umask(void) {
    FILE *f = fopen("/proc/self/status", "re");
    if (!f) return -1;
    char line[128];
    unsigned int v;
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f))
        if (sscanf(line, "Umask: %o", &v) == 1) found = (int)v;
    fclose(f);
    return found;
}

int main(void) {
    umask(027);
    is_u64(ckpt_umask(), 027, "ckpt_umask gives the umask that is set (027)");
    umask(0);
    is_u64(ckpt_umask(), 0, "and 0 when 0 is set");
    umask(027);

    unsigned long wrong = 0, seen_other = 0, looks = 0;
    pthread_t t;
    pthread_create(&t, NULL, ask, &wrong);
    for (; looks < 20000; looks++) {
        int m = kernel_umask();
        if (m >= 0 && m != 027) seen_other++;
    }
    atomic_store(&stop, true);
    pthread_join(t, NULL);
    is_u64(wrong, 0, "the asking thread always got 027");
    is_u64(seen_other, 0,
           "%lu looks at the umask from another thread while it was read: never "
           "anything but 027",
           looks);
    return tap_done();
}
