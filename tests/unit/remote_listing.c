/* core/io/remote's name resolution and listing limits, driven directly (the mounts in
 * 46/85-*.t reach them behind other checks: a mutant of one is shadowed by its neighbours).
 *
 * - remote_normalize: "." and ".." steps, ".." never climbing above scheme://authority, names
 *   that only start with dots kept, the output bound at its size and one byte short.
 * - the listing budget at each bound and one past: pages, one answer's bytes, all answers'
 *   bytes, entries, name bytes.
 * - remote_listing: each name once (a repeat carries a directory kind over), names with '/'
 *   or NUL and empty ones skipped. */
#include "io/remote/listing.h"
#include "io/remote/remote.h"
#include "tap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void norm(const char *in, const char *want) {
    char out[256];
    int rc = remote_normalize(in, out, sizeof out);
    ok(rc == 0 && strcmp(out, want) == 0, "normalize %s -> %s (got %s)", in, want,
       rc ? "an error" : out);
}

static void budgets(void) {
    ckpt_err err;
    remote_budget b;
    remote_budget_init(&b, "u");
    int rc = 0;
    for (unsigned i = 0; i < REMOTE_LIST_PAGES && !rc; i++) rc = remote_budget_page(&b, 0, &err);
    ok(rc == 0, "%u pages are within the budget", REMOTE_LIST_PAGES);
    ok(remote_budget_page(&b, 0, &err) == -EFBIG && strstr(err.msg, "pages"),
       "page %u is refused, naming pages (%s)", REMOTE_LIST_PAGES + 1, err.msg);

    remote_budget_init(&b, "u");
    ok(remote_budget_page(&b, REMOTE_LIST_PAGE_BYTES, &err) == 0, "one answer of 64 MiB is fine");
    remote_budget_init(&b, "u");
    ok(remote_budget_page(&b, REMOTE_LIST_PAGE_BYTES + 1, &err) == -EFBIG,
       "one answer of 64 MiB + 1 is refused");
    remote_budget_init(&b, "u");
    rc = 0;
    for (int i = 0; i < 4 && !rc; i++) rc = remote_budget_page(&b, REMOTE_LIST_PAGE_BYTES, &err);
    ok(rc == 0 && b.bytes == REMOTE_LIST_BYTES, "answers of 256 MiB in all are fine");
    ok(remote_budget_page(&b, 1, &err) == -EFBIG, "one byte more is refused");

    remote_budget_init(&b, "u");
    rc = 0;
    for (unsigned i = 0; i < REMOTE_LIST_ENTRIES && !rc; i++) rc = remote_budget_entry(&b, 1, &err);
    ok(rc == 0, "%u entries are within the budget", REMOTE_LIST_ENTRIES);
    ok(remote_budget_entry(&b, 1, &err) == -EFBIG && strstr(err.msg, "entries"),
       "entry %u is refused", REMOTE_LIST_ENTRIES + 1);
    remote_budget_init(&b, "u");
    ok(remote_budget_entry(&b, REMOTE_LIST_NAME_BYTES, &err) == 0,
       "names of 64 MiB in all are fine");
    ok(remote_budget_entry(&b, 1, &err) == -EFBIG, "one name byte more is refused");
}

static void listing(void) {
    ckpt_err err;
    remote_listing l;
    remote_listing_init(&l, "u");
    int rc = 0;
    rc |= remote_listing_add(&l, "b", 1, false, 7, &err);
    rc |= remote_listing_add(&l, "a", 1, false, 3, &err);
    rc |= remote_listing_add(&l, "b", 1, false, 9, &err); /* a repeat */
    rc |= remote_listing_add(&l, "a", 1, true, 0, &err);  /* a/ seen: a is a directory */
    rc |= remote_listing_add(&l, "", 0, false, 1, &err);
    rc |= remote_listing_add(&l, "x/y", 3, false, 1, &err);
    rc |= remote_listing_add(&l, "n\0m", 3, false, 1, &err);
    rc |= remote_listing_add(&l, "bc", 1, false, 5, &err); /* "b" again, by its length */
    remote_entry *e;
    size_t n;
    remote_listing_take(&l, &e, &n);
    ok(rc == 0 && n == 2, "two names kept of eight adds (got %zu)", n);
    ok(n == 2 && !strcmp(e[0].name, "b") && !e[0].dir && e[0].size == 7,
       "the first b is kept with its size");
    ok(n == 2 && !strcmp(e[1].name, "a") && e[1].dir, "a seen as a directory later is one");
    for (size_t i = 0; i < n; i++) free(e[i].name);
    free(e);

    /* Many distinct names and every one repeated: each kept once. */
    remote_listing_init(&l, "u");
    char name[32];
    rc = 0;
    for (int pass = 0; pass < 2 && !rc; pass++)
        for (int i = 0; i < 100000 && !rc; i++) {
            int len = snprintf(name, sizeof name, "f%06d", i);
            rc = remote_listing_add(&l, name, (size_t)len, false, 1, &err);
        }
    remote_listing_take(&l, &e, &n);
    ok(rc == 0 && n == 100000, "100000 names listed twice are kept once (%zu)", n);
    for (size_t i = 0; i < n; i++) free(e[i].name);
    free(e);
}

int main(void) {
    norm("http://h/a/../b", "http://h/b");
    norm("http://h/a/./b/", "http://h/a/b");
    norm("http://h/..", "http://h");
    norm("http://h/../../x", "http://h/x");
    norm("http://h/a/b/../../..", "http://h");
    norm("s3://bkt/p/q/..", "s3://bkt/p");
    norm("http://u:p@h:8/a/..", "http://u:p@h:8");
    norm("http://h/...", "http://h/...");
    norm("http://h/..a/.b/a..", "http://h/..a/.b/a..");
    norm("http://h//a///b", "http://h/a/b");
    char out[16];
    ok(remote_normalize("http://h/abcdef", out, 16) == 0 && !strcmp(out, "http://h/abcdef"),
       "an output of 15 bytes fits 16");
    ok(remote_normalize("http://h/abcdefg", out, 16) == -ENAMETOOLONG,
       "an output of 16 bytes does not fit 16");
    budgets();
    listing();
    return tap_done();
}
