/* BLAKE3 from the specification (see blake3.h). Input is split into 1024-byte chunks of 64-byte
 * blocks; each chunk compresses to a chaining value, and chaining values pair up into parents
 * as a left-leaning binary tree. The last block of the last chunk and the final parents are
 * held back until finalize, because the root node is compressed with the ROOT flag. */
#include "blake3.h"
#include "le.h"

#include <string.h>

enum { CHUNK_START = 1, CHUNK_END = 2, PARENT = 4, ROOT = 8 };

static const uint32_t IV[8] = {0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
                               0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19};

/* Message word order of the next round, applied after every round. */
static const uint8_t PERMUTATION[16] = {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8};

static uint32_t rotr(uint32_t x, unsigned n) {
    return x >> n | x << (32 - n);
}

static void store32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16),
    p[3] = (uint8_t)(v >> 24);
}

static void mix(uint32_t s[16], int a, int b, int c, int d, uint32_t x, uint32_t y) {
    s[a] += s[b] + x;
    s[d] = rotr(s[d] ^ s[a], 16);
    s[c] += s[d];
    s[b] = rotr(s[b] ^ s[c], 12);
    s[a] += s[b] + y;
    s[d] = rotr(s[d] ^ s[a], 8);
    s[c] += s[d];
    s[b] = rotr(s[b] ^ s[c], 7);
}

/* The compression function: 7 rounds over a 16-word state. out[0..8] is the next chaining
 * value; all 16 words are root output. */
static void compress(const uint32_t cv[8], const uint8_t block[BLAKE3_BLOCK_LEN],
                     uint32_t block_len, uint64_t counter, uint32_t flags, uint32_t out[16]) {
    uint32_t m[16], s[16], t[16];
    for (int i = 0; i < 16; i++) m[i] = le32(block + 4 * i);
    for (int i = 0; i < 8; i++) s[i] = cv[i];
    for (int i = 0; i < 4; i++) s[8 + i] = IV[i];
    s[12] = (uint32_t)counter;
    s[13] = (uint32_t)(counter >> 32);
    s[14] = block_len;
    s[15] = flags;
    for (int round = 0; round < 7; round++) {
        mix(s, 0, 4, 8, 12, m[0], m[1]);
        mix(s, 1, 5, 9, 13, m[2], m[3]);
        mix(s, 2, 6, 10, 14, m[4], m[5]);
        mix(s, 3, 7, 11, 15, m[6], m[7]);
        mix(s, 0, 5, 10, 15, m[8], m[9]);
        mix(s, 1, 6, 11, 12, m[10], m[11]);
        mix(s, 2, 7, 8, 13, m[12], m[13]);
        mix(s, 3, 4, 9, 14, m[14], m[15]);
        for (int i = 0; i < 16; i++) t[i] = m[PERMUTATION[i]];
        memcpy(m, t, sizeof m);
    }
    for (int i = 0; i < 8; i++) {
        out[i] = s[i] ^ s[i + 8];
        out[i + 8] = s[i + 8] ^ cv[i];
    }
}

/* A node whose compression is deferred: either the last block of a chunk or a parent. */
typedef struct node {
    uint32_t cv[8];
    uint8_t block[BLAKE3_BLOCK_LEN];
    uint32_t block_len;
    uint64_t counter;
    uint32_t flags;
} node;

static void node_cv(const node *n, uint32_t cv[8]) {
    uint32_t out[16];
    compress(n->cv, n->block, n->block_len, n->counter, n->flags, out);
    memcpy(cv, out, 8 * sizeof *cv);
}

static void parent_node(const uint32_t left[8], const uint32_t right[8], node *n) {
    memcpy(n->cv, IV, sizeof n->cv);
    for (int i = 0; i < 8; i++) {
        store32(n->block + 4 * i, left[i]);
        store32(n->block + 32 + 4 * i, right[i]);
    }
    n->block_len = BLAKE3_BLOCK_LEN;
    n->counter = 0;
    n->flags = PARENT;
}

static void chunk_node(const blake3_hasher *h, node *n) {
    memcpy(n->cv, h->cv, sizeof n->cv);
    memset(n->block, 0, sizeof n->block);
    memcpy(n->block, h->block, h->block_len);
    n->block_len = h->block_len;
    n->counter = h->chunk_counter;
    n->flags = (h->blocks_compressed == 0 ? CHUNK_START : 0) | CHUNK_END;
}

void blake3_init(blake3_hasher *h) {
    memset(h, 0, sizeof *h);
    memcpy(h->cv, IV, sizeof h->cv);
}

/* A finished chunk joins the stack; while the number of chunks so far is even, the top two
 * subtrees are complete siblings and merge into their parent. */
static void push_chunk(blake3_hasher *h) {
    node n;
    uint32_t cv[8];
    chunk_node(h, &n);
    node_cv(&n, cv);
    uint64_t total = h->chunk_counter + 1;
    while ((total & 1) == 0) {
        node p;
        parent_node(h->stack[--h->stack_len], cv, &p);
        node_cv(&p, cv);
        total >>= 1;
    }
    memcpy(h->stack[h->stack_len++], cv, sizeof cv);
    memcpy(h->cv, IV, sizeof h->cv);
    h->chunk_counter++;
    h->blocks_compressed = 0;
    h->block_len = 0;
}

void blake3_update(blake3_hasher *h, const void *data, size_t len) {
    const uint8_t *p = data;
    while (len > 0) {
        /* Only now that more input exists is a full chunk or block known not to be the last. */
        if (h->blocks_compressed * BLAKE3_BLOCK_LEN + h->block_len == BLAKE3_CHUNK_LEN)
            push_chunk(h);
        if (h->block_len == BLAKE3_BLOCK_LEN) {
            uint32_t out[16];
            compress(h->cv, h->block, BLAKE3_BLOCK_LEN, h->chunk_counter,
                     h->blocks_compressed == 0 ? CHUNK_START : 0, out);
            memcpy(h->cv, out, sizeof h->cv);
            h->blocks_compressed++;
            h->block_len = 0;
        }
        size_t take = BLAKE3_BLOCK_LEN - h->block_len;
        if (take > len) take = len;
        memcpy(h->block + h->block_len, p, take);
        h->block_len += (uint8_t)take;
        p += take;
        len -= take;
    }
}

void blake3_finalize(const blake3_hasher *h, uint8_t *out, size_t out_len) {
    node root;
    chunk_node(h, &root);
    for (size_t i = h->stack_len; i > 0; i--) {
        uint32_t right[8];
        node_cv(&root, right);
        parent_node(h->stack[i - 1], right, &root);
    }
    uint32_t words[16];
    uint8_t bytes[BLAKE3_BLOCK_LEN];
    for (uint64_t counter = 0; out_len > 0; counter++) {
        compress(root.cv, root.block, root.block_len, counter, root.flags | ROOT, words);
        for (int i = 0; i < 16; i++) store32(bytes + 4 * i, words[i]);
        size_t n = out_len < sizeof bytes ? out_len : sizeof bytes;
        memcpy(out, bytes, n);
        out += n;
        out_len -= n;
    }
}

void blake3_hash(const void *data, size_t len, uint8_t out[BLAKE3_OUT_LEN]) {
    blake3_hasher h;
    blake3_init(&h);
    blake3_update(&h, data, len);
    blake3_finalize(&h, out, BLAKE3_OUT_LEN);
}
