#include "blockcache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { NBUCKETS = 1 << 14, MAX_WORKERS = 64, QUEUE_MAX = 256 };
enum { FETCHING, READY, FAILED };

typedef struct entry {
    uint64_t id, index;
    size_t len;
    char *data;
    int state, refs, rc;
    bool in_table;
    bool unread; /* prefetched and not read yet: evicted after blocks read (see evict) */
    bool passed; /* a sequential reader has moved past it: on the passed list (see evict) */
    char *msg;   /* why the fetch failed (FAILED) */
    struct entry *hnext;
    struct entry *older, *newer; /* LRU list of READY entries */
} entry;

typedef struct job {
    bc_source src;
    entry *e;
} job;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER; /* a fetch finished */
static pthread_cond_t work_cond = PTHREAD_COND_INITIALIZER; /* a job was queued / stop */
static pthread_cond_t idle_cond = PTHREAD_COND_INITIALIZER; /* the queue drained */
static entry *table[NBUCKETS];
/* READY entries in the table, least recently used first: the passed ones on their own list in
 * the order they were passed, the others on the LRU list. */
typedef struct list {
    entry *oldest, *newest;
} list;
static list lru, passed;
static uint64_t ram_bytes, ram_blocks;
static uint64_t passed_bytes; /* of the blocks on the passed list */
static uint64_t unread_bytes; /* of READY blocks in the table prefetched and not read yet */
static bc_config cfg = {.ram_cap = 256u << 20, .workers = 4};
static char *disk_dir;
static uint64_t disk_used;
static job queue[QUEUE_MAX];
static size_t q_head, q_len, busy;
static pthread_t threads[MAX_WORKERS];
static unsigned nthreads;
static pid_t threads_pid;
static bool stopping;
static bc_stats st;

static size_t bucket(uint64_t id, uint64_t index) {
    uint64_t h = (id * 0x9E3779B97F4A7C15ull) ^ (index * 0xC2B2AE3D27D4EB4Full);
    return (size_t)((h ^ (h >> 29)) & (NBUCKETS - 1));
}

static entry *find(uint64_t id, uint64_t index) {
    for (entry *e = table[bucket(id, index)]; e; e = e->hnext)
        if (e->id == id && e->index == index) return e;
    return NULL;
}

static void unlink_table(entry *e) {
    if (!e->in_table) return;
    entry **pp = &table[bucket(e->id, e->index)];
    while (*pp && *pp != e) pp = &(*pp)->hnext;
    if (*pp) *pp = e->hnext;
    e->in_table = false;
}

static void lru_remove(entry *e) {
    if (e->state != READY) return;
    list *l = e->passed ? &passed : &lru;
    if (e->older)
        e->older->newer = e->newer;
    else if (l->oldest == e)
        l->oldest = e->newer;
    if (e->newer)
        e->newer->older = e->older;
    else if (l->newest == e)
        l->newest = e->older;
    e->older = e->newer = NULL;
}

static void lru_push(entry *e) {
    list *l = e->passed ? &passed : &lru;
    e->older = l->newest;
    e->newer = NULL;
    if (l->newest) l->newest->newer = e;
    l->newest = e;
    if (!l->oldest) l->oldest = e;
}

/* Block buffers. A block of 2 MiB or more is its own mapping, aligned to and a multiple of
 * 2 MiB and marked for transparent huge pages: filling a fresh one then costs a page fault per
 * 2 MiB instead of per 4 KiB (the faults were a tenth of a sequential read's CPU time), and the
 * kernel's FUSE copy out of it walks fewer page-table entries. Freed buffers are kept for the
 * next fetch (SPARE_MAX of them): a reused buffer costs no fault at all. */
enum { SPARE_MAX = 8, HUGE = 2u << 20 };
static pthread_mutex_t spare_lock = PTHREAD_MUTEX_INITIALIZER;
static char *spare[SPARE_MAX];
static size_t spare_len[SPARE_MAX], nspare;

static bool is_mapped(size_t len) {
    return len >= HUGE;
}

/* What a buffer for len bytes really holds: buffers of equal capacity are interchangeable. */
static size_t capacity(size_t len) {
    return is_mapped(len) ? (len + HUGE - 1) / HUGE * HUGE : len ? len : 1;
}

static char *map_huge(size_t cap) {
    size_t span = cap + HUGE;
    char *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    char *a = (char *)(((uintptr_t)p + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (a > p) munmap(p, (size_t)(a - p));
    if (a + cap < p + span) munmap(a + cap, (size_t)(p + span - (a + cap)));
#ifdef MADV_HUGEPAGE
    madvise(a, cap, MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages as before */
#endif
    return a;
}

static char *buf_get(size_t len) {
    size_t cap = capacity(len);
    pthread_mutex_lock(&spare_lock);
    for (size_t i = 0; i < nspare; i++)
        if (spare_len[i] == cap) {
            char *b = spare[i];
            spare[i] = spare[--nspare];
            spare_len[i] = spare_len[nspare];
            pthread_mutex_unlock(&spare_lock);
            return b;
        }
    pthread_mutex_unlock(&spare_lock);
    return is_mapped(len) ? map_huge(cap) : malloc(cap);
}

static void buf_put(char *b, size_t len) {
    if (!b) return;
    size_t cap = capacity(len);
    if (cap >= (256u << 10)) {
        pthread_mutex_lock(&spare_lock);
        if (nspare < SPARE_MAX) {
            spare[nspare] = b;
            spare_len[nspare++] = cap;
            b = NULL;
        }
        pthread_mutex_unlock(&spare_lock);
    }
    if (!b) return;
    if (is_mapped(len))
        munmap(b, cap);
    else
        free(b);
}

static void entry_free(entry *e) {
    buf_put(e->data, e->len);
    free(e->msg);
    free(e);
}

/* Takes a READY entry nobody is copying from off the lists and the table and frees it. */
static void drop(entry *e) {
    lru_remove(e);
    unlink_table(e);
    ram_bytes -= e->len;
    ram_blocks--;
    if (e->unread) unread_bytes -= e->len;
    if (e->passed) passed_bytes -= e->len;
    entry_free(e);
}

/* What the cache keeps of blocks sequential readers have moved past: two blocks of the default
 * cache, for a second reader close behind the first. The kernel's page cache holds what they
 * read; keeping all of it here too grew the daemon to the cap with fresh pages, and fresh pages
 * are dear (zeroing the 60 MiB a sequential read still took with an eighth of the cache kept
 * was a tenth of its CPU time in a VM), so the buffers of the blocks dropped serve the next
 * fetches instead. */
static uint64_t passed_keep(void) {
    return cfg.ram_cap / 32;
}

/* Drops blocks nobody is copying from: passed blocks over passed_keep(), then, until RAM is
 * under the cap, passed blocks first (oldest first), then least recently used blocks read
 * already, then prefetched ones nobody has read yet (dropping those first would have two
 * streams, each with its window in flight, throw away each other's next blocks and fetch them
 * again). Unread blocks over half the cache are the oldest of them first: prefetches of readers
 * that stopped must not crowd out what is being read. */
static void evict(void) {
    for (entry *e = passed.oldest, *next; e; e = next) {
        next = e->newer;
        if (passed_bytes <= passed_keep() && ram_bytes <= cfg.ram_cap) break;
        if (e->refs == 0) drop(e);
    }
    for (int pass = 0; pass < 2 && ram_bytes > cfg.ram_cap; pass++) {
        entry *e = lru.oldest;
        while (ram_bytes > cfg.ram_cap && e) {
            entry *next = e->newer;
            if (e->refs == 0 && (pass == 1 || !e->unread || unread_bytes > cfg.ram_cap / 2))
                drop(e);
            e = next;
        }
    }
}

static entry *insert_fetching(uint64_t id, uint64_t index, size_t len) {
    entry *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->id = id;
    e->index = index;
    e->len = len;
    e->state = FETCHING;
    e->in_table = true;
    size_t b = bucket(id, index);
    e->hnext = table[b];
    table[b] = e;
    return e;
}

/* ---- disk cache: DIR/KEY/INDEX files, written whole and renamed into place ---- */

static bool disk_path(char *out, size_t cap, const bc_source *src, uint64_t index, bool dir_only) {
    if (!disk_dir || !src->disk_key) return false;
    int n = dir_only ? snprintf(out, cap, "%s/%s", disk_dir, src->disk_key)
                     : snprintf(out, cap, "%s/%s/%llu", disk_dir, src->disk_key,
                                (unsigned long long)index);
    return n > 0 && (size_t)n < cap;
}

static bool disk_load(const bc_source *src, uint64_t index, void *buf, size_t len) {
    char path[4096];
    if (!disk_path(path, sizeof path, src, index, false)) return false;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat sb;
    bool ok = fstat(fd, &sb) == 0 && (uint64_t)sb.st_size == len;
    size_t got = 0;
    while (ok && got < len) {
        ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)got);
        if (r <= 0)
            ok = false;
        else
            got += (size_t)r;
    }
    close(fd);
    return ok;
}

static uint64_t scan_dir_bytes(const char *dir, int depth) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t total = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char p[4096];
        struct stat sb;
        if (snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= (int)sizeof p) continue;
        if (lstat(p, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode) && depth > 0)
            total += scan_dir_bytes(p, depth - 1);
        else if (S_ISREG(sb.st_mode))
            total += (uint64_t)sb.st_size;
    }
    closedir(d);
    return total;
}

typedef struct old_file {
    char path[4096];
    time_t when;
    uint64_t size;
} old_file;

static int by_age(const void *a, const void *b) {
    const old_file *x = a, *y = b;
    return (x->when > y->when) - (x->when < y->when);
}

/* Over the cap: the least recently used files go until 90% of it is used. */
static void disk_trim(void) {
    DIR *d = opendir(disk_dir);
    if (!d) return;
    old_file *files = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char sub[4096];
        if (snprintf(sub, sizeof sub, "%s/%s", disk_dir, de->d_name) >= (int)sizeof sub) continue;
        DIR *s = opendir(sub);
        if (!s) continue;
        struct dirent *fe;
        while ((fe = readdir(s))) {
            if (fe->d_name[0] == '.') continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                old_file *p = realloc(files, cap * sizeof *p);
                if (!p) break;
                files = p;
            }
            if (n == cap) break;
            struct stat sb;
            old_file *f = &files[n];
            if (snprintf(f->path, sizeof f->path, "%s/%s", sub, fe->d_name) >=
                    (int)sizeof f->path ||
                stat(f->path, &sb) != 0)
                continue;
            f->when = sb.st_atime > sb.st_mtime ? sb.st_atime : sb.st_mtime;
            f->size = (uint64_t)sb.st_size;
            n++;
        }
        closedir(s);
    }
    closedir(d);
    if (n) qsort(files, n, sizeof *files, by_age);
    uint64_t goal = cfg.disk_cap / 10 * 9;
    for (size_t i = 0; i < n && disk_used > goal; i++)
        if (unlink(files[i].path) == 0)
            disk_used -= files[i].size < disk_used ? files[i].size : disk_used;
    free(files);
}

static void disk_store(const bc_source *src, uint64_t index, const void *buf, size_t len) {
    char dir[4096], path[4096], tmp[4200];
    if (!disk_path(dir, sizeof dir, src, index, true) ||
        !disk_path(path, sizeof path, src, index, false))
        return;
    if (len > cfg.disk_cap) return;
    mkdir(dir, 0700);
    snprintf(tmp, sizeof tmp, "%s.tmp%ld.%lu", path, (long)getpid(), (unsigned long)pthread_self());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return;
    size_t put = 0;
    while (put < len) {
        ssize_t w = write(fd, (const char *)buf + put, len - put);
        if (w <= 0) break;
        put += (size_t)w;
    }
    bool ok = put == len && close(fd) == 0;
    if (!ok || rename(tmp, path) != 0) {
        if (put != len) close(fd);
        unlink(tmp);
        return;
    }
    pthread_mutex_lock(&lock);
    st.disk_writes++;
    disk_used += len;
    bool trim = disk_used > cfg.disk_cap;
    pthread_mutex_unlock(&lock);
    if (trim) {
        /* One trimmer at a time; the others carry on (a little over the cap for a moment). */
        static pthread_mutex_t trim_lock = PTHREAD_MUTEX_INITIALIZER;
        if (pthread_mutex_trylock(&trim_lock) == 0) {
            disk_trim();
            pthread_mutex_unlock(&trim_lock);
        }
    }
}

/* ---- fetching ---- */

/* Fills the FETCHING entry e (not under the lock) and publishes the result (under it). */
static void fill(const bc_source *src, entry *e) {
    char msg[512] = "";
    int rc = 0;
    char *data = buf_get(e->len);
    bool from_disk = false;
    if (!data) {
        rc = -ENOMEM;
        snprintf(msg, sizeof msg, "out of memory for a %zu-byte block", e->len);
    } else if (disk_load(src, e->index, data, e->len)) {
        from_disk = true;
    } else {
        rc = src->fetch(src->ctx, e->index, data, e->len, msg, sizeof msg);
        if (rc == 0) disk_store(src, e->index, data, e->len);
    }
    pthread_mutex_lock(&lock);
    if (rc == 0) {
        e->data = data;
        e->state = READY;
        if (from_disk)
            st.disk_hits++;
        else {
            st.block_fetches++;
            st.fetch_bytes += e->len;
        }
        if (e->in_table) {
            lru_push(e);
            ram_bytes += e->len;
            ram_blocks++;
            if (e->unread) unread_bytes += e->len;
        }
    } else {
        buf_put(data, e->len);
        e->state = FAILED;
        e->rc = rc;
        e->msg = strdup(msg);
        unlink_table(e); /* the next reader tries again */
    }
    pthread_cond_broadcast(&done_cond);
    pthread_mutex_unlock(&lock);
}

/* Called with the lock held; drops one reference and frees what nothing holds any more. */
static void unref(entry *e) {
    if (--e->refs > 0) return;
    if (e->state == FAILED || !e->in_table) {
        lru_remove(e);
        if (e->state == READY && !e->in_table) {
            /* forgotten while in use: it was already taken off the RAM count */
        }
        entry_free(e);
        return;
    }
    evict();
}

/* The READY entry of block index with a reference taken (fetched here unless cached or on its
 * way), or NULL with msg filled and *rc set. Called and returns with the lock held. */
static entry *acquire(const bc_source *src, uint64_t index, size_t block_len, int *rc, char *msg,
                      size_t cap) {
    entry *e = find(src->id, index);
    if (e && e->unread && e->state == READY) unread_bytes -= e->len; /* in the table: found */
    if (e) e->unread = false;
    if (e && e->state == READY) {
        st.hits++;
        lru_remove(e);
        if (e->passed) passed_bytes -= e->len;
        e->passed = false; /* read again: by another reader, or out of order */
        lru_push(e);
    } else if (e) {
        st.waits++;
    } else {
        st.misses++;
        e = insert_fetching(src->id, index, block_len);
        if (!e) {
            snprintf(msg, cap, "out of memory");
            *rc = -ENOMEM;
            return NULL;
        }
        e->refs++;
        pthread_mutex_unlock(&lock);
        fill(src, e);
        pthread_mutex_lock(&lock);
        e->refs--;
    }
    e->refs++;
    while (e->state == FETCHING) pthread_cond_wait(&done_cond, &lock);
    if (e->state == READY) return e;
    *rc = e->rc;
    snprintf(msg, cap, "%s", e->msg ? e->msg : "fetch failed");
    unref(e);
    return NULL;
}

int bc_read(const bc_source *src, uint64_t index, size_t block_len, size_t at, void *out, size_t n,
            char *msg, size_t cap) {
    if (at > block_len || n > block_len - at) {
        snprintf(msg, cap, "read of %zu bytes at %zu past a %zu-byte block", n, at, block_len);
        return -EINVAL;
    }
    int rc = 0;
    pthread_mutex_lock(&lock);
    entry *e = acquire(src, index, block_len, &rc, msg, cap);
    if (e) {
        pthread_mutex_unlock(&lock);
        memcpy(out, e->data + at, n);
        pthread_mutex_lock(&lock);
        unref(e);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int bc_pin(const bc_source *src, uint64_t index, size_t block_len, const char **data, void **hold,
           char *msg, size_t cap) {
    int rc = 0;
    pthread_mutex_lock(&lock);
    entry *e = acquire(src, index, block_len, &rc, msg, cap);
    pthread_mutex_unlock(&lock);
    *data = e ? e->data : NULL;
    *hold = e;
    return rc;
}

void bc_unpin(void *hold) {
    if (!hold) return;
    pthread_mutex_lock(&lock);
    unref(hold);
    pthread_mutex_unlock(&lock);
}

void bc_insert(const bc_source *src, uint64_t index, const void *data, size_t len) {
    char *copy = buf_get(len);
    if (!copy) return;
    memcpy(copy, data, len);
    pthread_mutex_lock(&lock);
    if (find(src->id, index)) {
        pthread_mutex_unlock(&lock);
        buf_put(copy, len);
        return;
    }
    entry *e = insert_fetching(src->id, index, len);
    if (e) {
        e->data = copy;
        e->state = READY;
        lru_push(e);
        ram_bytes += len;
        ram_blocks++;
        evict();
    } else {
        buf_put(copy, len);
    }
    pthread_mutex_unlock(&lock);
}

void bc_passed(const bc_source *src, uint64_t index) {
    pthread_mutex_lock(&lock);
    entry *e = find(src->id, index);
    if (e && e->state == READY && !e->passed) {
        lru_remove(e);
        e->passed = true;
        passed_bytes += e->len;
        lru_push(e);
        evict();
    }
    pthread_mutex_unlock(&lock);
}

static void *worker(void *arg) {
    (void)arg;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (!q_len && !stopping) pthread_cond_wait(&work_cond, &lock);
        if (!q_len && stopping) break;
        job j = queue[q_head];
        q_head = (q_head + 1) % QUEUE_MAX;
        q_len--;
        busy++;
        pthread_mutex_unlock(&lock);
        fill(&j.src, j.e);
        if (j.src.release) j.src.release(j.src.ctx);
        pthread_mutex_lock(&lock);
        unref(j.e);
        busy--;
        if (!q_len && !busy) pthread_cond_broadcast(&idle_cond);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* With the lock held. Threads of a parent process do not exist after fork: start anew. */
static void start_workers(void) {
    if (nthreads && threads_pid == getpid()) return;
    nthreads = 0;
    busy = 0;
    stopping = false;
    threads_pid = getpid();
    unsigned want = cfg.workers ? cfg.workers : 1;
    if (want > MAX_WORKERS) want = MAX_WORKERS;
    for (unsigned i = 0; i < want; i++)
        if (pthread_create(&threads[nthreads], NULL, worker, NULL) == 0) nthreads++;
}

void bc_prefetch(const bc_source *src, uint64_t index, size_t block_len) {
    if (cfg.workers == 0) return;
    pthread_mutex_lock(&lock);
    if (find(src->id, index) || q_len == QUEUE_MAX) {
        pthread_mutex_unlock(&lock);
        return;
    }
    start_workers();
    entry *e = nthreads ? insert_fetching(src->id, index, block_len) : NULL;
    if (!e) {
        pthread_mutex_unlock(&lock);
        return;
    }
    e->refs++;
    e->unread = true;
    st.prefetches++;
    if (src->hold) src->hold(src->ctx);
    queue[(q_head + q_len) % QUEUE_MAX] = (job){*src, e};
    q_len++;
    pthread_cond_signal(&work_cond);
    pthread_mutex_unlock(&lock);
}

void bc_quiesce(void) {
    pthread_mutex_lock(&lock);
    if (!nthreads || threads_pid != getpid()) {
        nthreads = 0;
        pthread_mutex_unlock(&lock);
        return;
    }
    stopping = true;
    pthread_cond_broadcast(&work_cond);
    unsigned n = nthreads;
    nthreads = 0;
    pthread_mutex_unlock(&lock);
    for (unsigned i = 0; i < n; i++) pthread_join(threads[i], NULL);
    pthread_mutex_lock(&lock);
    stopping = false;
    pthread_mutex_unlock(&lock);
}

void bc_forget(uint64_t id) {
    pthread_mutex_lock(&lock);
    for (size_t b = 0; b < NBUCKETS; b++) {
        entry **pp = &table[b];
        while (*pp) {
            entry *e = *pp;
            if (e->id != id || e->state != READY) {
                pp = &e->hnext;
                continue;
            }
            *pp = e->hnext;
            e->in_table = false;
            lru_remove(e);
            ram_bytes -= e->len;
            ram_blocks--;
            if (e->unread) unread_bytes -= e->len;
            if (e->passed) passed_bytes -= e->len;
            e->unread = e->passed = false;
            if (e->refs == 0) entry_free(e);
        }
    }
    pthread_mutex_unlock(&lock);
}

int bc_configure(const bc_config *c) {
    pthread_mutex_lock(&lock);
    cfg = *c;
    if (!cfg.ram_cap) cfg.ram_cap = 256u << 20;
    free(disk_dir);
    disk_dir = NULL;
    int rc = 0;
    if (c->disk_dir) {
        if (mkdir(c->disk_dir, 0700) != 0 && errno != EEXIST)
            rc = -errno;
        else if (!(disk_dir = strdup(c->disk_dir)))
            rc = -ENOMEM;
        if (!cfg.disk_cap) cfg.disk_cap = 10ull << 30;
    }
    cfg.disk_dir = NULL;
    pthread_mutex_unlock(&lock);
    if (disk_dir) disk_used = scan_dir_bytes(disk_dir, 1);
    return rc;
}

void bc_get_stats(bc_stats *out) {
    pthread_mutex_lock(&lock);
    *out = st;
    out->ram_bytes = ram_bytes;
    out->ram_blocks = ram_blocks;
    out->ram_cap = cfg.ram_cap;
    pthread_mutex_unlock(&lock);
}
