/* BLAKE3, default hash mode (no key, no derive-key context), with extendable output.
 *
 * gpt-rs names its parameters by BLAKE3(name)[0..16]; Debian bookworm packages no libblake3, so
 * this is a small portable implementation written from the BLAKE3 specification: one chunk
 * state plus a stack of subtree chaining values, no SIMD. It hashes names and test data, not
 * gigabytes, so clarity wins over speed. */
#ifndef CKPT_BLAKE3_H
#define CKPT_BLAKE3_H

#include <stddef.h>
#include <stdint.h>

enum { BLAKE3_OUT_LEN = 32, BLAKE3_BLOCK_LEN = 64, BLAKE3_CHUNK_LEN = 1024 };

typedef struct blake3_hasher {
    uint32_t cv[8];                  /* chaining value of the chunk being filled */
    uint64_t chunk_counter;          /* index of that chunk in the input */
    uint8_t block[BLAKE3_BLOCK_LEN]; /* pending bytes of its current block */
    uint8_t block_len;
    uint8_t blocks_compressed;
    uint8_t stack_len;
    uint32_t stack[54][8]; /* chaining values of completed subtrees; 2^54 chunks is the limit */
} blake3_hasher;

void blake3_init(blake3_hasher *h);
void blake3_update(blake3_hasher *h, const void *data, size_t len);
/* Writes out_len bytes of output (32 is the standard digest; more is the XOF stream). The
 * hasher is not changed, so more input may follow. */
void blake3_finalize(const blake3_hasher *h, uint8_t *out, size_t out_len);
/* One-shot 32-byte digest. */
void blake3_hash(const void *data, size_t len, uint8_t out[BLAKE3_OUT_LEN]);

#endif
