/* The rule an open checks, for every front end: ckpt_source_current is true only while the
 * source's path names the file the catalog read with its size, modification and change time
 * (a rewrite in place with the old mtime put back, a chmod, a replacement, a removal all make it
 * false); ckpt_source_same_file, the mount's rule for a view file that spans many sources, is
 * false only for a file replaced under its name or removed. Each case opens a fresh catalog of
 * a small safetensors file written here. */
#include "tap.h"
#include "ckpt.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char dir[] = "/tmp/ckpt-source-current.XXXXXX";
static char path[64];

/* One F32 tensor "w" of 4 elements, filled with fill. */
static void write_model(const char *to, unsigned char fill) {
    const char head[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}   ";
    unsigned long long n = sizeof head - 1; /* padded to a multiple of 8 */
    unsigned char data[16];
    memset(data, fill, sizeof data);
    FILE *f = fopen(to, "wb");
    if (!f) return;
    fwrite(&n, 8, 1, f); /* little-endian host */
    fwrite(head, 1, n, f);
    fwrite(data, 1, sizeof data, f);
    fclose(f);
}

/* A write lands in another clock tick than the catalog's open, as a user's would. */
static void next_tick(void) {
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
}

static ckpt_catalog *open_fresh(void) {
    write_model(path, 1);
    ckpt_catalog *cat = NULL;
    ckpt_err err;
    if (ckpt_open(path, NULL, &cat, &err) != 0) {
        printf("# ckpt_open %s: %s\n", path, err.msg);
        return NULL;
    }
    return cat;
}

static void expect(const char *what, void (*change)(void), bool current, bool same) {
    ckpt_catalog *cat = open_fresh();
    ok(cat && cat->nsources == 1, "%s: a catalog of one source", what);
    if (!cat) return;
    const ckpt_source *s = &cat->sources[0];
    if (change) {
        next_tick();
        change();
    }
    ok(ckpt_source_current(s) == current, "%s: ckpt_source_current is %s", what,
       current ? "true" : "false");
    ok(ckpt_source_same_file(s) == same, "%s: ckpt_source_same_file is %s", what,
       same ? "true" : "false");
    ckpt_close(cat);
}

static void in_place_old_mtime(void) { /* cp -p, touch -r: same size and mtime, ctime moves */
    struct stat was;
    stat(path, &was);
    int fd = open(path, O_WRONLY);
    if (fd < 0) return;
    unsigned char other[16];
    memset(other, 2, sizeof other);
    if (pwrite(fd, other, sizeof other, was.st_size - (off_t)sizeof other) != sizeof other)
        printf("# pwrite failed\n");
    close(fd);
    struct timespec times[2] = {was.st_atim, was.st_mtim};
    utimensat(AT_FDCWD, path, times, 0);
}

static void chmod_it(void) {
    chmod(path, 0600);
}

static void replace_it(void) { /* same bytes, another file: what rename(2) over it does */
    char tmp[80];
    snprintf(tmp, sizeof tmp, "%s/new", dir);
    write_model(tmp, 1);
    rename(tmp, path);
}

static void remove_it(void) {
    unlink(path);
}

int main(void) {
    if (!mkdtemp(dir)) {
        ok(0, "mkdtemp");
        return tap_done();
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    expect("unchanged", NULL, true, true);
    expect("rewritten in place, old mtime put back", in_place_old_mtime, false, true);
    expect("chmod", chmod_it, false, true);
    expect("replaced by rename", replace_it, false, false);
    expect("removed", remove_it, false, false);
    unlink(path);
    rmdir(dir);
    return tap_done();
}
