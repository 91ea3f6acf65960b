/* Extent planner on hand-computed cases: every expected segment below was worked out on paper
 * from the piece layout. */
#include "model/catalog.h"
#include "tap.h"

#include <stdlib.h>
#include <unistd.h>

static char file_a[] = "/tmp/ckpt-unit-XXXXXX";
static char file_b[] = "/tmp/ckpt-unit-XXXXXX";

static void make_file(char *tmpl, size_t size) {
    int fd = mkstemp(tmpl);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) abort();
    close(fd);
}

typedef struct expect {
    uint32_t kind, source;
    uint64_t offset, length;
} expect;

static void check_plan(const ckpt_tensor *t, uint64_t off, uint64_t len, const expect *want,
                       size_t nwant, const char *what) {
    ckpt_segment seg[64];
    uint64_t done;
    size_t n = ckpt_plan(t, off, len, seg, 64, &done);
    int good = n == nwant;
    for (size_t i = 0; good && i < n; i++) {
        good = seg[i].kind == want[i].kind && seg[i].length == want[i].length;
        if (good && (seg[i].kind == CKPT_SEG_FILE || seg[i].kind == CKPT_SEG_STRIDED))
            good = seg[i].source == want[i].source && seg[i].offset == want[i].offset;
    }
    ok(good, "%s", what);
    if (!good)
        for (size_t i = 0; i < n; i++)
            printf("#   seg %zu: kind %u src %u off %llu len %llu\n", i, seg[i].kind, seg[i].source,
                   (unsigned long long)seg[i].offset, (unsigned long long)seg[i].length);
}

/* A fresh catalog with two 4 KiB files as sources 0 and 1. */
static ckpt_catalog *fresh(void) {
    ckpt_catalog *cat = catalog_new("/unit", "unit");
    uint32_t s;
    ckpt_err err;
    if (catalog_add_source(cat, file_a, "a", &s, &err) ||
        catalog_add_source(cat, file_b, "b", &s, &err))
        abort();
    return cat;
}

static const ckpt_tensor *only_tensor(ckpt_catalog *cat, int *rc, ckpt_err *err) {
    *rc = catalog_finish(cat, err);
    return *rc ? NULL : &cat->tensors[0];
}

#define F CKPT_SEG_FILE
#define H CKPT_SEG_HOLE
#define S CKPT_SEG_STRIDED
#define N(a) (sizeof(a) / sizeof *(a))

int main(void) {
    make_file(file_a, 4096);
    make_file(file_b, 4096);
    ckpt_err err;
    int rc;
    size_t ti;

    { /* one contiguous piece: the fast path maps bytes 1:1 */
        ckpt_catalog *cat = fresh();
        uint64_t shape[] = {4, 6};
        catalog_add_tensor(cat, "w", 1, CKPT_F32, 2, shape, &ti, &err);
        catalog_add_piece(cat, ti, 0, 100, NULL, NULL, NULL, &err);
        const ckpt_tensor *t = only_tensor(cat, &rc, &err);
        ok(t && !t->index && !t->incomplete, "single piece needs no index");
        expect w[] = {{F, 0, 103, 5}};
        check_plan(t, 3, 5, w, N(w), "single piece: bytes 3..8 at file offset 103");
        expect all[] = {{F, 0, 100, 96}};
        check_plan(t, 0, 1000, all, N(all), "single piece: read clamps at nbytes (96)");
        uint64_t done;
        ckpt_segment seg[1];
        is_u64(ckpt_plan(t, 96, 10, seg, 1, &done), 0, "read at EOF plans nothing");
        ckpt_close(cat);
    }
    { /* [4,6] F32 split on dim 1: cols 0-2 in file a @0, cols 3-5 in file b @100 */
        ckpt_catalog *cat = fresh();
        uint64_t shape[] = {4, 6}, off0[] = {0, 0}, off1[] = {0, 3}, sz[] = {4, 3};
        catalog_add_tensor(cat, "w", 1, CKPT_F32, 2, shape, &ti, &err);
        catalog_add_piece(cat, ti, 0, 0, off0, sz, NULL, &err);
        catalog_add_piece(cat, ti, 1, 100, off1, sz, NULL, &err);
        const ckpt_tensor *t = only_tensor(cat, &rc, &err);
        ok(t && t->index && !t->incomplete, "dim-1 split: indexed and complete");
        expect w[] = {{F, 0, 0, 12},  {F, 1, 100, 12}, {F, 0, 12, 12}, {F, 1, 112, 12},
                      {F, 0, 24, 12}, {F, 1, 124, 12}, {F, 0, 36, 12}, {F, 1, 136, 12}};
        check_plan(t, 0, 96, w, N(w), "dim-1 split: rows alternate between files");
        expect part[] = {{F, 0, 5, 7}, {F, 1, 100, 3}};
        check_plan(t, 5, 10, part, N(part), "dim-1 split: unaligned range 5..15");
        ckpt_segment seg[2];
        uint64_t done;
        size_t n = ckpt_plan(t, 0, 96, seg, 2, &done);
        ok(n == 2 && done == 24, "dim-1 split: cap of 2 segments covers 24 bytes");
        n = ckpt_plan(t, done, 96 - done, seg, 2, &done);
        ok(n == 2 && seg[0].source == 0 && seg[0].offset == 12 && done == 24,
           "dim-1 split: planning resumes where the cap stopped");
        ckpt_close(cat);
    }
    { /* [4,6] split on dim 0, both halves back to back in file a: one merged segment */
        ckpt_catalog *cat = fresh();
        uint64_t shape[] = {4, 6}, off0[] = {0, 0}, off1[] = {2, 0}, sz[] = {2, 6};
        catalog_add_tensor(cat, "w", 1, CKPT_F32, 2, shape, &ti, &err);
        catalog_add_piece(cat, ti, 0, 200, off1, sz, NULL, &err);
        catalog_add_piece(cat, ti, 0, 152, off0, sz, NULL, &err);
        const ckpt_tensor *t = only_tensor(cat, &rc, &err);
        expect w[] = {{F, 0, 152, 96}};
        check_plan(t, 0, 96, w, N(w), "dim-0 split with adjacent pieces merges into one run");
        expect mid[] = {{F, 0, 196, 8}};
        check_plan(t, 44, 8, mid, N(mid), "dim-0 split: range across the piece boundary");
        ckpt_close(cat);
    }
    { /* strided: [2,3] F32 stored column-major (strides 1,2): no element next to the next, so
       * one strided segment names the tensor's bytes (read in blocks by core/read/strided.c) */
        ckpt_catalog *cat = fresh();
        uint64_t shape[] = {2, 3}, strides[] = {1, 2};
        catalog_add_tensor(cat, "t", 1, CKPT_F32, 2, shape, &ti, &err);
        catalog_add_piece(cat, ti, 0, 0, NULL, NULL, strides, &err);
        const ckpt_tensor *t = only_tensor(cat, &rc, &err);
        expect w[] = {{S, 0, 0, 24}};
        check_plan(t, 0, 24, w, N(w), "column-major piece: one strided segment");
        expect mid[] = {{S, 0, 6, 11}};
        check_plan(t, 6, 11, mid, N(mid), "column-major piece: a range inside elements");
        ckpt_segment seg[4];
        uint64_t done;
        size_t n = ckpt_plan(t, 6, 11, seg, 4, &done);
        ok(n == 1 && seg[0].mem == t && seg[0].piece == 0 && seg[0].offset == 6 && done == 11,
           "strided segment: tensor, piece and tensor byte offset");
        ckpt_close(cat);
    }
    { /* strided rows: [3,2] I16 taking every other row of a [6,2] storage (strides 4,1) */
        ckpt_catalog *cat = fresh();
        uint64_t shape[] = {3, 2}, strides[] = {4, 1};
        catalog_add_tensor(cat, "t", 1, CKPT_I16, 2, shape, &ti, &err);
        catalog_add_piece(cat, ti, 1, 10, NULL, NULL, strides, &err);
        const ckpt_tensor *t = only_tensor(cat, &rc, &err);
        expect w[] = {{F, 1, 10, 4}, {F, 1, 18, 4}, {F, 1, 26, 4}};
        check_plan(t, 0, 12, w, N(w), "row-strided piece: one run per row");
        ckpt_close(cat);
    }
    { /* a hole: [4] F32 with only [0,2) present */
        ckpt_catalog *cat = fresh();
        uint64_t shape[] = {4}, off[] = {0}, sz[] = {2};
        catalog_add_tensor(cat, "h", 1, CKPT_F32, 1, shape, &ti, &err);
        catalog_add_piece(cat, ti, 0, 64, off, sz, NULL, &err);
        const ckpt_tensor *t = only_tensor(cat, &rc, &err);
        ok(t && t->incomplete, "missing region marks the tensor incomplete");
        expect w[] = {{F, 0, 64, 8}, {H, 0, 0, 8}};
        check_plan(t, 0, 16, w, N(w), "hole is planned as a hole segment");
        ckpt_close(cat);
    }
    { /* replicas: identical boxes, the first added wins */
        ckpt_catalog *cat = fresh();
        uint64_t shape[] = {2, 2};
        catalog_add_tensor(cat, "r", 1, CKPT_U8, 2, shape, &ti, &err);
        catalog_add_piece(cat, ti, 1, 7, NULL, NULL, NULL, &err);
        catalog_add_piece(cat, ti, 0, 9, NULL, NULL, NULL, &err);
        const ckpt_tensor *t = only_tensor(cat, &rc, &err);
        ok(t && !t->incomplete, "replicated pieces cover the tensor");
        expect w[] = {{F, 1, 7, 4}};
        check_plan(t, 0, 4, w, N(w), "replicas: the first piece is served");
        ckpt_close(cat);
    }
    { /* partial overlap is refused */
        ckpt_catalog *cat = fresh();
        uint64_t shape[] = {4}, o0[] = {0}, s0[] = {3}, o1[] = {2}, s1[] = {2};
        catalog_add_tensor(cat, "o", 1, CKPT_U8, 1, shape, &ti, &err);
        catalog_add_piece(cat, ti, 0, 0, o0, s0, NULL, &err);
        catalog_add_piece(cat, ti, 0, 8, o1, s1, NULL, &err);
        only_tensor(cat, &rc, &err);
        ok(rc != 0 && strstr(err.msg, "overlap"), "partially overlapping pieces refused: %s",
           err.msg);
        ckpt_close(cat);
        /* Boxes that differ by one element, in either order, are not replicas: the second
         * piece starting one before or after the first, or one element longer or shorter. */
        static const uint64_t boxes[][4] = {{1, 2, 0, 2}, {0, 2, 1, 2}, {0, 2, 0, 3}, {0, 3, 0, 2}};
        for (size_t i = 0; i < N(boxes); i++) {
            cat = fresh();
            uint64_t oa[] = {boxes[i][0]}, sa[] = {boxes[i][1]}, ob[] = {boxes[i][2]},
                     sb[] = {boxes[i][3]};
            catalog_add_tensor(cat, "o", 1, CKPT_U8, 1, shape, &ti, &err);
            catalog_add_piece(cat, ti, 0, 0, oa, sa, NULL, &err);
            catalog_add_piece(cat, ti, 0, 8, ob, sb, NULL, &err);
            only_tensor(cat, &rc, &err);
            ok(rc != 0 && strstr(err.msg, "overlap"),
               "pieces [%llu,+%llu) then [%llu,+%llu): overlap refused", (unsigned long long)oa[0],
               (unsigned long long)sa[0], (unsigned long long)ob[0], (unsigned long long)sb[0]);
            ckpt_close(cat);
        }
    }
    { /* 2-D grid: [4,4] U8 in four 2x2 quadrants, in four places */
        ckpt_catalog *cat = fresh();
        uint64_t shape[] = {4, 4}, sz[] = {2, 2};
        uint64_t offs[4][2] = {{0, 0}, {0, 2}, {2, 0}, {2, 2}};
        uint64_t at[4] = {0, 100, 200, 300};
        catalog_add_tensor(cat, "g", 1, CKPT_U8, 2, shape, &ti, &err);
        for (int k = 0; k < 4; k++) catalog_add_piece(cat, ti, 0, at[k], offs[k], sz, NULL, &err);
        const ckpt_tensor *t = only_tensor(cat, &rc, &err);
        expect w[] = {{F, 0, 0, 2},   {F, 0, 100, 2}, {F, 0, 2, 2},   {F, 0, 102, 2},
                      {F, 0, 200, 2}, {F, 0, 300, 2}, {F, 0, 202, 2}, {F, 0, 302, 2}};
        check_plan(t, 0, 16, w, N(w), "quadrant grid: rows cross two pieces each");
        ckpt_close(cat);
    }
    { /* 3-D split on the last dim: [2,2,4] F16, halves of dim 2 */
        ckpt_catalog *cat = fresh();
        uint64_t shape[] = {2, 2, 4}, o0[] = {0, 0, 0}, o1[] = {0, 0, 2}, sz[] = {2, 2, 2};
        catalog_add_tensor(cat, "c", 1, CKPT_F16, 3, shape, &ti, &err);
        catalog_add_piece(cat, ti, 0, 0, o0, sz, NULL, &err);
        catalog_add_piece(cat, ti, 1, 0, o1, sz, NULL, &err);
        const ckpt_tensor *t = only_tensor(cat, &rc, &err);
        expect w[] = {{F, 0, 4, 4}, {F, 1, 4, 4}, {F, 0, 8, 4}};
        check_plan(t, 8, 12, w, N(w), "3-D dim-2 split: second row onwards");
        ckpt_close(cat);
    }
    { /* 0-d scalar and a piece past the end of its file */
        ckpt_catalog *cat = fresh();
        catalog_add_tensor(cat, "s", 1, CKPT_F64, 0, NULL, &ti, &err);
        catalog_add_piece(cat, ti, 0, 4000, NULL, NULL, NULL, &err);
        const ckpt_tensor *t = only_tensor(cat, &rc, &err);
        expect w[] = {{F, 0, 4000, 8}};
        check_plan(t, 0, 8, w, N(w), "0-d scalar is one 8-byte run");
        ckpt_close(cat);
        cat = fresh();
        catalog_add_tensor(cat, "s", 1, CKPT_F64, 0, NULL, &ti, &err);
        catalog_add_piece(cat, ti, 0, 4090, NULL, NULL, NULL, &err);
        only_tensor(cat, &rc, &err);
        ok(rc != 0 && strstr(err.msg, "past the end"), "piece past EOF refused: %s", err.msg);
        ckpt_close(cat);
    }
    { /* piece outside the shape, sub-byte split, shape overflow */
        ckpt_catalog *cat = fresh();
        uint64_t shape[] = {4}, o[] = {3}, s[] = {2};
        catalog_add_tensor(cat, "x", 1, CKPT_U8, 1, shape, &ti, &err);
        catalog_add_piece(cat, ti, 0, 0, o, s, NULL, &err);
        only_tensor(cat, &rc, &err);
        ok(rc != 0 && strstr(err.msg, "outside the shape"), "piece outside shape refused");
        ckpt_close(cat);
        cat = fresh();
        uint64_t s4[] = {4}, o2[] = {2}, s2[] = {2};
        catalog_add_tensor(cat, "f4", 2, CKPT_F4, 1, s4, &ti, &err);
        catalog_add_piece(cat, ti, 0, 0, NULL, s2, NULL, &err);
        catalog_add_piece(cat, ti, 0, 1, o2, s2, NULL, &err);
        only_tensor(cat, &rc, &err);
        ok(rc != 0 && strstr(err.msg, "one contiguous piece"), "split F4 tensor refused");
        ckpt_close(cat);
        cat = fresh();
        uint64_t huge[] = {1ull << 40, 1ull << 40};
        rc = catalog_add_tensor(cat, "big", 3, CKPT_U8, 2, huge, &ti, &err);
        ok(rc != 0 && strstr(err.msg, "overflow"), "shape product overflow refused");
        ckpt_close(cat);
    }
    { /* each bound of check_piece at exactly the bound and one over: a piece may end at the
       * end of its 4096-byte file and at the end of the shape, never one past */
        static const struct {
            const char *what;
            ckpt_dtype dtype;
            uint64_t file_offset, stride0; /* stride0: row stride of a [2,2] piece, 0 = dense */
            int refused;
        } file_cases[] = {
            {"F64 scalar ending at EOF", CKPT_F64, 4088, 0, 0},
            {"F64 scalar 1 byte past EOF", CKPT_F64, 4089, 0, 1},
            {"strided [2,2] U8 (strides 4,1; 6 bytes) ending at EOF", CKPT_U8, 4090, 4, 0},
            {"strided [2,2] U8 (strides 4,1; 6 bytes) 1 byte past EOF", CKPT_U8, 4091, 4, 1},
            {"Q8_0 block (32 elements, 34 bytes) ending at EOF", CKPT_Q8_0, 4062, 0, 0},
            {"Q8_0 block (32 elements, 34 bytes) 1 byte past EOF", CKPT_Q8_0, 4063, 0, 1},
        };
        for (size_t i = 0; i < N(file_cases); i++) {
            ckpt_catalog *cat = fresh();
            bool q = file_cases[i].dtype == CKPT_Q8_0, strided = file_cases[i].stride0 != 0;
            uint64_t shape2[] = {2, 2}, shapeq[] = {32}, st[] = {file_cases[i].stride0, 1};
            uint32_t nd = q ? 1 : file_cases[i].dtype == CKPT_F64 ? 0 : 2;
            catalog_add_tensor(cat, "b", 1, file_cases[i].dtype, nd, q ? shapeq : shape2, &ti,
                               &err);
            catalog_add_piece(cat, ti, 0, file_cases[i].file_offset, NULL, NULL,
                              strided ? st : NULL, &err);
            only_tensor(cat, &rc, &err);
            if (file_cases[i].refused)
                ok(rc != 0 && strstr(err.msg, "past the end"), "%s: refused (%s)",
                   file_cases[i].what, rc ? err.msg : "accepted");
            else
                ok(rc == 0, "%s: accepted%s%s", file_cases[i].what, rc ? ": " : "",
                   rc ? err.msg : "");
            ckpt_close(cat);
        }
        /* [6] U8 in pieces [0,k) and [k,6): the second ends exactly at the shape's end; one
         * element longer lies outside it */
        for (uint64_t extra = 0; extra <= 1; extra++) {
            ckpt_catalog *cat = fresh();
            uint64_t shape[] = {6}, o0[] = {0}, s0[] = {2}, o1[] = {2}, s1[] = {4 + extra};
            catalog_add_tensor(cat, "e", 1, CKPT_U8, 1, shape, &ti, &err);
            catalog_add_piece(cat, ti, 0, 0, o0, s0, NULL, &err);
            catalog_add_piece(cat, ti, 1, 0, o1, s1, NULL, &err);
            const ckpt_tensor *t = only_tensor(cat, &rc, &err);
            if (extra)
                ok(rc != 0 && strstr(err.msg, "outside the shape"),
                   "piece [2,7) of a [6] tensor: outside the shape (%s)",
                   rc ? err.msg : "accepted");
            else
                ok(t && !t->incomplete, "pieces [0,2) and [2,6) of a [6] tensor: complete");
            ckpt_close(cat);
        }
    }
    { /* ckpt_plan's bounds: the last byte, the first byte past the end, and a length that
       * ends exactly at, one under and one over nbytes (fast path and indexed path) */
        for (int indexed = 0; indexed <= 1; indexed++) {
            ckpt_catalog *cat = fresh();
            uint64_t shape[] = {8}, o0[] = {0}, s0[] = {4}, o1[] = {4}, s1[] = {4};
            catalog_add_tensor(cat, "r", 1, CKPT_U8, 1, shape, &ti, &err);
            if (indexed) {
                catalog_add_piece(cat, ti, 0, 100, o0, s0, NULL, &err);
                catalog_add_piece(cat, ti, 1, 200, o1, s1, NULL, &err);
            } else {
                catalog_add_piece(cat, ti, 1, 196, NULL, NULL, NULL, &err);
            }
            const ckpt_tensor *t = only_tensor(cat, &rc, &err);
            const char *how = indexed ? "indexed" : "one piece";
            expect last[] = {{F, 1, 203, 1}};
            check_plan(t, 7, 1, last, N(last),
                       indexed ? "indexed: the last byte" : "one piece: the last byte");
            ckpt_segment seg[4];
            uint64_t done = 99;
            size_t n = ckpt_plan(t, 8, 1, seg, 4, &done);
            ok(n == 0 && done == 0, "%s: a read at nbytes gives nothing (%zu, %llu)", how, n,
               (unsigned long long)done);
            for (uint64_t len = 3; len <= 5; len++) {
                n = ckpt_plan(t, 4, len, seg, 4, &done);
                uint64_t want = len < 4 ? len : 4;
                ok(n == 1 && done == want && seg[0].offset == 200 && seg[0].length == want,
                   "%s: %llu bytes from 4 of 8 give %llu (%zu segs, %llu)", how,
                   (unsigned long long)len, (unsigned long long)want, n, (unsigned long long)done);
            }
            ckpt_close(cat);
        }
    }
    { /* row-major is decided by the dims of more than one element: a stride of a dim of
       * size 1 is never used, so [1,4] with strides {7,1} takes the fast path, and [2,4]
       * with strides {5,1} (a padded row) needs the index */
        for (int padded = 0; padded <= 1; padded++) {
            ckpt_catalog *cat = fresh();
            uint64_t shape[] = {padded ? 2u : 1u, 4}, st[] = {padded ? 5u : 7u, 1};
            catalog_add_tensor(cat, "m", 1, CKPT_F32, 2, shape, &ti, &err);
            catalog_add_piece(cat, ti, 0, 0, NULL, NULL, st, &err);
            const ckpt_tensor *t = only_tensor(cat, &rc, &err);
            ok(t && (t->index != NULL) == padded, "%s: %s",
               padded ? "[2,4] strides {5,1}" : "[1,4] strides {7,1}",
               padded ? "indexed (rows are 5 apart)" : "row-major, no index");
            if (padded && t) {
                expect w[] = {{F, 0, 20, 16}};
                check_plan(t, 16, 16, w, N(w), "[2,4] strides {5,1}: row 1 starts at element 5");
            }
            ckpt_close(cat);
        }
    }
    { /* virtual file: header + tensor + trailer */
        ckpt_catalog *cat = fresh();
        uint64_t shape[] = {8};
        catalog_add_tensor(cat, "v", 1, CKPT_U8, 1, shape, &ti, &err);
        catalog_add_piece(cat, ti, 1, 40, NULL, NULL, NULL, &err);
        const ckpt_tensor *t = only_tensor(cat, &rc, &err);
        ckpt_vfile vf = {0};
        ckpt_vfile_add_mem(&vf, "HEAD", 4);
        ckpt_vfile_add_tensor(&vf, t, 2, 6);
        ckpt_vfile_add_mem(&vf, "TAIL", 4);
        is_u64(vf.size, 14, "vfile size adds its parts");
        ckpt_segment seg[8];
        uint64_t done;
        size_t n = ckpt_vfile_plan(&vf, 2, 10, seg, 8, &done);
        ok(n == 3 && done == 10 && seg[0].kind == CKPT_SEG_MEM && seg[0].length == 2 &&
               memcmp(seg[0].mem, "AD", 2) == 0 && seg[1].kind == F && seg[1].offset == 42 &&
               seg[1].length == 6 && seg[2].kind == CKPT_SEG_MEM && seg[2].length == 2,
           "vfile plan spans memory, tensor and memory parts");
        ckpt_vfile_free(&vf);
        ckpt_close(cat);
    }
    unlink(file_a);
    unlink(file_b);
    return tap_done();
}
