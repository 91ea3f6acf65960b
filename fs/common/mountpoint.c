#include "mountpoint.h"
#include "message.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>

/* prog is "ckptfs" or "ckptfs stage": the command for msg_error. */
static const char *cmd_of(const char *prog) {
    return strncmp(prog, "ckptfs ", 7) == 0 ? prog + 7 : NULL;
}

bool path_is_under(const char *path, const char *dir) {
    size_t n = strlen(dir);
    if (strcmp(dir, "/") == 0) return true;
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* /proc/self/mountinfo writes space, tab, newline and backslash as \ooo. */
static void unescape_field(char *s) {
    char *out = s;
    for (; *s; s++) {
        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
            s[3] >= '0' && s[3] <= '7') {
            *out++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
            s += 3;
        } else {
            *out++ = *s;
        }
    }
    *out = '\0';
}

bool mount_at(const char *mnt, char *type, size_t cap, char *source, size_t source_cap) {
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f) return false;
    char line[8192];
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        char point[PATH_MAX], fstype[128], src[PATH_MAX] = "";
        /* id parent major:minor root POINT options [optional...] - TYPE source super */
        if (sscanf(line, "%*s %*s %*s %*s %4095s", point) != 1) continue;
        const char *dash = strstr(line, " - ");
        if (!dash || sscanf(dash + 3, "%127s %4095s", fstype, src) < 1) continue;
        unescape_field(point);
        if (strcmp(point, mnt) != 0) continue;
        unescape_field(src);
        snprintf(type, cap, "%s", fstype);
        if (source) snprintf(source, source_cap, "%s", src);
        found = true; /* keep going: the last one listed is on top */
    }
    fclose(f);
    return found;
}

static bool mount_type_at(const char *mnt, char *type, size_t cap) {
    return mount_at(mnt, type, cap, NULL, 0);
}

bool mountpoint_usable(const char *prog, const char *mnt) {
    /* The kernel answers stat of a dead FUSE mount's root from its attribute cache (for the
     * mount's timeout); statfs always asks the file system, so it is what notices. */
    struct stat st;
    struct statfs sf;
    if (stat(mnt, &st) == 0 && statfs(mnt, &sf) == 0) {
        if (!S_ISDIR(st.st_mode)) {
            msg_error(cmd_of(prog), "mount point %s: not a directory", mnt);
            return false;
        }
        /* A live mount there: a second one on top would hide it until the next unmount, and
         * an unmount would then take off the wrong one. */
        char type[128], source[PATH_MAX];
        if (mount_at(mnt, type, sizeof type, source, sizeof source)) {
            msg_error(cmd_of(prog),
                      "mount point %s: %s (%s) is mounted there; unmount it first "
                      "(ckptfs umount %s, or fusermount3 -u / umount) or choose another "
                      "directory",
                      mnt, source, type, mnt);
            return false;
        }
        return true;
    }
    int e = errno;
    char type[128];
    if ((e == ENOTCONN || e == ECONNABORTED) && mount_type_at(mnt, type, sizeof type)) {
        bool ours = strcmp(type, "fuse.ckptfs") == 0;
        msg_error(cmd_of(prog),
                  "mount point %s: %s mount whose daemon has ended (killed?) is still there, "
                  "and every access to it fails (\"%s\"); mounting on top would hide it until the "
                  "next unmount. Clear it with: fusermount3 -u %s  (if that says busy: "
                  "fusermount3 -u -z %s), then mount again",
                  mnt, ours ? "a ckptfs" : type, strerror(e), mnt, mnt);
        return false;
    }
    msg_error(cmd_of(prog), "mount point %s: %s", mnt, strerror(e));
    return false;
}

static bool apart(const char *prog, const char *mnt, const char *what, const char *path) {
    char real[PATH_MAX];
    if (!realpath(path, real)) return true; /* the open reports it */
    const char *why = NULL;
    if (strcmp(real, mnt) == 0)
        why = "is the mount point itself";
    else if (path_is_under(real, mnt))
        why = "is inside the mount point";
    else if (path_is_under(mnt, real))
        why = "contains the mount point";
    if (!why) return true;
    msg_error(cmd_of(prog),
              "%s %s %s %s: the mount would hide the files it reads from (reads would fail, "
              "or with -s hang); choose a mount point outside the source",
              what, path, why, mnt);
    return false;
}

bool mountpoint_apart(const char *prog, const char *mnt, const char *source,
                      const ckpt_catalog *cat) {
    if (!apart(prog, mnt, "the source", source)) return false;
    for (uint32_t i = 0; cat && i < cat->nsources; i++)
        if (!apart(prog, mnt, "the source file", cat->sources[i].path)) return false;
    return true;
}
