/* One set of limits for every remote listing (http index pages, S3 ListObjectsV2 pages, the
 * Hub's tree pages): what a hostile or broken server can make a listing cost, in requests,
 * bytes received and entries kept, and names added without a quadratic search for repeats. */
#ifndef CKPT_REMOTE_LISTING_H
#define CKPT_REMOTE_LISTING_H

#include "../../ckpt.h"
#include "../../util/hashmap.h"
#include "remote.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One answer (an index page, a listing page, a tree page) is at most this many bytes. */
#define REMOTE_LIST_PAGE_BYTES (64u << 20)
/* All answers of one listing together (an endless chain of pages stops here). */
#define REMOTE_LIST_BYTES (256ull << 20)
/* Pages of one listing: an endless chain of small or empty pages stops here. */
#define REMOTE_LIST_PAGES 10000u
/* Entries one listing keeps, and the bytes of their names: what stays in memory. */
#define REMOTE_LIST_ENTRIES 1000000u
#define REMOTE_LIST_NAME_BYTES (64ull << 20)

typedef struct remote_budget {
    const char *shown; /* the listing as messages name it */
    unsigned pages;
    uint64_t bytes;      /* of all answers so far */
    size_t entries;      /* kept so far */
    uint64_t name_bytes; /* of the kept names */
} remote_budget;

void remote_budget_init(remote_budget *b, const char *shown);
/* One more answer of len bytes: 0, or -EFBIG (err filled) past the page or byte limit. */
int remote_budget_page(remote_budget *b, size_t len, ckpt_err *err);
/* One more entry named with len bytes: 0, or -EFBIG (err filled) past the entry limits. */
int remote_budget_entry(remote_budget *b, size_t len, ckpt_err *err);

/* The entries of one directory level, each name once, within a budget. */
typedef struct remote_listing {
    remote_budget budget;
    remote_entry *e;
    size_t n, cap;
    hashmap seen; /* name -> index in e; keys are e[i].name */
    bool seen_ready;
} remote_listing;

void remote_listing_init(remote_listing *l, const char *shown);
/* Adds the entry unless a name of len bytes equal to it is there already (then only a
 * directory kind is carried over: "a/b" seen after "a" makes "a" a directory). 0, -ENOMEM or
 * -EFBIG, err filled. Empty names and names holding '/' or NUL are skipped. */
int remote_listing_add(remote_listing *l, const char *name, size_t len, bool dir, uint64_t size,
                       ckpt_err *err);
/* Hands the entries over (the caller frees each name and the array) and frees the rest. */
void remote_listing_take(remote_listing *l, remote_entry **out, size_t *n);
void remote_listing_free(remote_listing *l);

#endif
