/* SHA-256 (FIPS 180-4) for `ckptfs verify` and its manifests.
 *
 * Written from the standard rather than linked from libcrypto so the tool needs no new
 * dependency. Verifying a checkpoint hashes gigabytes, so on x86-64 processors with the SHA
 * extensions the block function uses them (chosen at run time); elsewhere it is portable C.
 * Debian's nettle (3.8.1, a fat build that also uses SHA-NI) was measured against it on the
 * project's machine, interleaved, 40 runs over 64 MiB: 357 MB/s mean (631 best) against
 * 421 (760) here, so it stays: nettle would remove this file but cost ~15% of verify's
 * hashing speed. (gpt-rs's BLAKE3 has no Debian library in bookworm: blake3.c stays too.) */
#ifndef CKPT_SHA256_H
#define CKPT_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { SHA256_DIGEST_LEN = 32, SHA256_BLOCK_LEN = 64, SHA256_HEX_LEN = 64 };

typedef struct sha256_ctx {
    uint32_t state[8];
    uint64_t total; /* bytes hashed so far */
    uint8_t block[SHA256_BLOCK_LEN];
    size_t used; /* pending bytes in block */
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t len);
void sha256_final(sha256_ctx *c, uint8_t out[SHA256_DIGEST_LEN]);
/* One-shot digest. */
void sha256(const void *data, size_t len, uint8_t out[SHA256_DIGEST_LEN]);
/* Lower-case hex, NUL-terminated (out holds SHA256_HEX_LEN + 1 bytes). */
void sha256_hex(const uint8_t digest[SHA256_DIGEST_LEN], char *out);

/* Whether the hardware block function is in use. Tests switch it off to check the portable
 * one; sha256_set_hardware(true) turns it back on only when the processor has it. */
bool sha256_hardware(void);
void sha256_set_hardware(bool on);

#endif
