/* Strided pieces (transposed, permuted, sliced, broadcast views saved as they are) read through
 * ckpt_plan + ckpt_read_segments, compared byte for byte with an element-by-element reference
 * computed here from the file bytes: random layouts of 1-, 2-, 4- and 8-byte elements, random
 * ranges with and without scratch memory, tensors larger than one cached band, split pieces, and
 * four threads reading at once (they share the band cache). */
#include "../../core/model/catalog.h"
#include "../../core/read/segread.h"
#include "tap.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

enum { FILE_SIZE = 40 << 20, MAXD = 4 };

static unsigned char *file_bytes;
static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

typedef struct layout {
    ckpt_dtype dtype;
    unsigned esz;
    uint32_t nd;
    uint64_t shape[MAXD], strides[MAXD], file_offset;
    int split; /* 0: one piece; else two pieces split on dim 0, the second at its own offset */
    uint64_t second_offset;
} layout;

/* The tensor's logical bytes, element by element from the file. */
static void reference(const layout *l, unsigned char *out) {
    uint64_t numel = 1;
    for (uint32_t d = 0; d < l->nd; d++) numel *= l->shape[d];
    uint64_t half = l->shape[0] / 2;
    for (uint64_t e = 0; e < numel; e++) {
        uint64_t idx[MAXD], rest = e, el = 0;
        for (uint32_t d = l->nd; d-- > 0;) {
            idx[d] = rest % l->shape[d];
            rest /= l->shape[d];
        }
        uint64_t base = l->file_offset;
        if (l->split && idx[0] >= half) {
            idx[0] -= half;
            base = l->second_offset;
        }
        for (uint32_t d = 0; d < l->nd; d++) el += idx[d] * l->strides[d];
        memcpy(out + e * l->esz, file_bytes + base + el * l->esz, l->esz);
    }
}

static uint64_t extent(const layout *l, const uint64_t *shape) {
    uint64_t x = 1;
    for (uint32_t d = 0; d < l->nd; d++) x += (shape[d] - 1) * l->strides[d];
    return x * l->esz;
}

/* A permuted (and sometimes sliced or broadcast) view of a row-major storage. */
static void random_layout(layout *l) {
    static const ckpt_dtype types[] = {CKPT_U8, CKPT_BF16, CKPT_F32, CKPT_F64};
    static const unsigned sizes[] = {1, 2, 4, 8};
    for (;;) {
        int t = (int)(next() % 4);
        l->dtype = types[t];
        l->esz = sizes[t];
        l->nd = 1 + (uint32_t)(next() % MAXD);
        uint64_t numel = 1;
        for (uint32_t d = 0; d < l->nd; d++) {
            l->shape[d] = 1 + next() % (l->nd == 1 ? 5000 : l->nd == 2 ? 700 : 40);
            numel *= l->shape[d];
        }
        uint32_t perm[MAXD];
        for (uint32_t d = 0; d < l->nd; d++) perm[d] = d;
        for (uint32_t d = l->nd; d > 1; d--) {
            uint32_t j = (uint32_t)(next() % d), x = perm[d - 1];
            perm[d - 1] = perm[j];
            perm[j] = x;
        }
        uint64_t acc = 1 + next() % 3; /* > 1: every other element, a slice */
        for (uint32_t k = l->nd; k-- > 0;) {
            uint32_t d = perm[k];
            l->strides[d] = acc;
            acc *= l->shape[d] + next() % 3;
        }
        if (next() % 8 == 0) l->strides[next() % l->nd] = 0; /* broadcast */
        if (l->nd == 1 && l->strides[0] == 1) l->strides[0] = 3;
        l->split = l->shape[0] >= 2 && next() % 4 == 0;
        uint64_t sub[MAXD];
        memcpy(sub, l->shape, sizeof sub);
        if (l->split) sub[0] = l->shape[0] - l->shape[0] / 2;
        uint64_t x = extent(l, sub);
        if (numel * l->esz > (4u << 20) || 2 * x > FILE_SIZE) continue;
        l->file_offset = next() % (FILE_SIZE / 2 - x + 1);
        l->second_offset = FILE_SIZE / 2 + next() % (FILE_SIZE / 2 - x + 1);
        return;
    }
}

static const ckpt_tensor *add(ckpt_catalog *cat, const layout *l, const char *name) {
    size_t ti;
    ckpt_err err;
    if (catalog_add_tensor(cat, name, strlen(name), l->dtype, l->nd, l->shape, &ti, &err))
        return NULL;
    if (!l->split)
        return catalog_add_piece(cat, ti, 0, l->file_offset, NULL, NULL, l->strides, &err)
                   ? NULL
                   : cat->tensors + ti;
    uint64_t half = l->shape[0] / 2, off0[MAXD] = {0}, off1[MAXD] = {0}, sz0[MAXD], sz1[MAXD];
    memcpy(sz0, l->shape, sizeof sz0);
    memcpy(sz1, l->shape, sizeof sz1);
    sz0[0] = half;
    sz1[0] = l->shape[0] - half;
    off1[0] = half;
    if (catalog_add_piece(cat, ti, 0, l->file_offset, off0, sz0, l->strides, &err) ||
        catalog_add_piece(cat, ti, 0, l->second_offset, off1, sz1, l->strides, &err))
        return NULL;
    return cat->tensors + ti;
}

/* Bytes [off, off+len) of t through the planner and the segment reader. */
static int read_range(const ckpt_catalog *cat, const ckpt_tensor *t, uint64_t off, uint64_t len,
                      unsigned char *dst, char *scratch) {
    while (len) {
        ckpt_segment seg[16];
        uint64_t done;
        size_t n = ckpt_plan(t, off, len, seg, 16, &done);
        if (!n || !done) return -1;
        int e = ckpt_read_segments(cat, seg, n, (char *)dst, scratch);
        if (e) return e;
        off += done;
        len -= done;
        dst += done;
    }
    return 0;
}

typedef struct job {
    const ckpt_catalog *cat;
    const ckpt_tensor *const *t;
    unsigned char *const *want;
    int ntensors;
    uint64_t seed;
    int bad;
} job;

static void *reader(void *arg) {
    job *j = arg;
    char *scratch = malloc(SEGREAD_SCRATCH);
    unsigned char *got = malloc(1 << 20);
    uint64_t r = j->seed;
    for (int i = 0; i < 150 && scratch && got; i++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        const ckpt_tensor *t = j->t[r % (uint64_t)j->ntensors];
        uint64_t off = (r >> 8) % t->nbytes, len = 1 + (r >> 32) % (1 << 20);
        if (len > t->nbytes - off) len = t->nbytes - off;
        if (read_range(j->cat, t, off, len, got, i % 3 ? scratch : NULL) ||
            memcmp(got, j->want[r % (uint64_t)j->ntensors] + off, len))
            j->bad++;
    }
    free(scratch);
    free(got);
    return NULL;
}

int main(void) {
    char path[] = "/tmp/ckpt-strided.XXXXXX";
    int fd = mkstemp(path);
    file_bytes = malloc(FILE_SIZE);
    if (fd < 0 || !file_bytes) return 1;
    for (size_t i = 0; i < FILE_SIZE; i += 8) {
        uint64_t v = next();
        memcpy(file_bytes + i, &v, 8);
    }
    if (write(fd, file_bytes, FILE_SIZE) != FILE_SIZE) return 1;
    close(fd);

    enum { RANDOM = 40, BIG = 3 };
    static layout ls[RANDOM + BIG];
    for (int i = 0; i < RANDOM; i++) random_layout(&ls[i]);
    /* Larger than one band (16 MiB), so reads cross bands and bands are evicted. */
    ls[RANDOM] = (layout){.dtype = CKPT_BF16,
                          .esz = 2,
                          .nd = 2,
                          .shape = {3000, 3000},
                          .strides = {1, 3000},
                          .file_offset = 4096};
    ls[RANDOM + 1] = (layout){.dtype = CKPT_F32,
                              .esz = 4,
                              .nd = 3,
                              .shape = {3, 1100, 1300},
                              .strides = {1, 3, 3 * 1100},
                              .file_offset = 8};
    ls[RANDOM + 2] = (layout){.dtype = CKPT_F32,
                              .esz = 4,
                              .nd = 2,
                              .shape = {2048, 2048},
                              .strides = {1, 2048},
                              .file_offset = 20 << 20};

    ckpt_catalog *cat = catalog_new("/unit", "unit");
    ckpt_err err;
    uint32_t src;
    ok(catalog_add_source(cat, path, "f", &src, &err) == 0, "source opened");
    for (int i = 0; i < RANDOM + BIG; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%03d", i);
        if (!add(cat, &ls[i], name)) {
            printf("Bail out! adding %s failed\n", name);
            return 1;
        }
    }
    ok(catalog_finish(cat, &err) == 0, "catalog of %d strided tensors finished", RANDOM + BIG);

    const ckpt_tensor *tensors[RANDOM + BIG];
    unsigned char *want[RANDOM + BIG];
    int strided = 0;
    for (int i = 0; i < RANDOM + BIG; i++) {
        tensors[i] = &cat->tensors[i]; /* names sort as they were added */
        want[i] = malloc(tensors[i]->nbytes ? tensors[i]->nbytes : 1);
        reference(&ls[i], want[i]);
        ckpt_segment seg[1];
        uint64_t done;
        if (tensors[i]->nbytes && ckpt_plan(tensors[i], 0, tensors[i]->nbytes, seg, 1, &done) &&
            seg[0].kind == CKPT_SEG_STRIDED)
            strided++;
    }
    ok(strided >= RANDOM / 2, "%d of %d tensors plan as strided segments", strided, RANDOM + BIG);

    char *scratch = malloc(SEGREAD_SCRATCH);
    unsigned char *got = malloc(24 << 20);
    int whole_bad = 0, range_bad = 0;
    for (int i = 0; i < RANDOM + BIG; i++) {
        const ckpt_tensor *t = tensors[i];
        memset(got, 0xA5, t->nbytes);
        if (read_range(cat, t, 0, t->nbytes, got, i % 2 ? scratch : NULL) ||
            memcmp(got, want[i], t->nbytes)) {
            if (!whole_bad++) printf("# whole read of %s differs\n", t->name);
        }
        for (int k = 0; k < 20 && t->nbytes; k++) {
            uint64_t off = next() % t->nbytes, len = 1 + next() % (t->nbytes - off);
            if (read_range(cat, t, off, len, got, k % 2 ? scratch : NULL) ||
                memcmp(got, want[i] + off, len)) {
                if (!range_bad++)
                    printf("# %s bytes %llu+%llu differ\n", t->name, (unsigned long long)off,
                           (unsigned long long)len);
            }
        }
    }
    ok(whole_bad == 0, "whole tensors equal the reference (%d differ)", whole_bad);
    ok(range_bad == 0, "random ranges equal the reference (%d differ)", range_bad);

    /* From here on bands are filled by this thread and the fill workers together. */
    ckpt_read_workers_allow();
    int shared_bad = 0;
    for (int i = RANDOM; i < RANDOM + BIG; i++) {
        const ckpt_tensor *t = tensors[i];
        memset(got, 0xA5, t->nbytes);
        if (read_range(cat, t, 0, t->nbytes, got, scratch) || memcmp(got, want[i], t->nbytes))
            shared_bad++;
    }
    ok(shared_bad == 0, "tensors larger than a band, filled with workers, equal the reference");

    pthread_t th[4];
    job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){.cat = cat,
                        .t = tensors + RANDOM - 2,
                        .want = want + RANDOM - 2,
                        .ntensors = BIG + 2,
                        .seed = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)};
        pthread_create(&th[i], NULL, reader, &jobs[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad += jobs[i].bad;
    }
    ok(bad == 0, "4 threads x 150 random reads of 5 tensors (3 larger than a band) (%d bad)", bad);

    for (int i = 0; i < RANDOM + BIG; i++) free(want[i]);
    free(scratch);
    free(got);
    ckpt_close(cat);
    free(file_bytes);
    unlink(path);
    return tap_done();
}
