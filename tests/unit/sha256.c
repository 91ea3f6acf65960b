/* SHA-256 against the FIPS 180-4 example messages (NIST's "SHA256.pdf" and "SHA2_Additional"
 * examples: "abc", the 448- and 896-bit messages, the empty string, a million 'a'), and padding
 * boundaries around 55/56/64 bytes (input byte i = i % 251, digests from an independent
 * implementation). Every vector runs through the portable block function and, where the
 * processor has SHA-NI, the hardware one; incremental updates split at awkward places must
 * equal the one-shot digest. */
#include "util/sha256.h"
#include "tap.h"

#include <stdlib.h>

static const struct vector {
    const char *what;
    const char *text; /* NULL: pattern input of len bytes */
    size_t len;
    const char *hex;
} vectors[] = {
    {"abc", "abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    {"448-bit message", "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56,
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    {"896-bit message",
     "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmn"
     "opqrsmnopqrstnopqrstu",
     112, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    {"empty", "", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
    {"55 bytes (padding fits)", NULL, 55,
     "463eb28e72f82e0a96c0a4cc53690c571281131f672aa229e0d45ae59b598b59"},
    {"56 bytes (padding spills)", NULL, 56,
     "da2ae4d6b36748f2a318f23e7ab1dfdf45acdc9d049bd80e59de82a60895f562"},
    {"63 bytes", NULL, 63, "29af2686fd53374a36b0846694cc342177e428d1647515f078784d69cdb9e488"},
    {"64 bytes", NULL, 64, "fdeab9acf3710362bd2658cdc9a29e8f9c757fcf9811603a8c447cd1d9151108"},
    {"65 bytes", NULL, 65, "4bfd2c8b6f1eec7a2afeb48b934ee4b2694182027e6d0fc075074f2fabb31781"},
    {"119 bytes", NULL, 119, "da18797ed7c3a777f0847f429724a2d8cd5138e6ed2895c3fa1a6d39d18f7ec6"},
    {"1000 bytes", NULL, 1000, "4e4c294b331f7a2099a379bec34b9f9fc03dc46ab465d998f4d683da53487e6d"},
    {"4097 bytes", NULL, 4097, "a16560d668b843fb3be99ace41dbd18471f342bd3255a1d21204b35e43f74436"},
};

static char *input_of(const struct vector *v) {
    char *buf = malloc(v->len + 1);
    if (!buf) abort();
    for (size_t i = 0; i < v->len; i++) buf[i] = v->text ? v->text[i] : (char)(i % 251);
    return buf;
}

static void hex_of(const void *data, size_t len, char hex[SHA256_HEX_LEN + 1]) {
    uint8_t d[SHA256_DIGEST_LEN];
    sha256(data, len, d);
    sha256_hex(d, hex);
}

static void run_vectors(const char *impl) {
    char hex[SHA256_HEX_LEN + 1];
    for (size_t i = 0; i < sizeof vectors / sizeof *vectors; i++) {
        const struct vector *v = &vectors[i];
        char *in = input_of(v);
        hex_of(in, v->len, hex);
        ok(strcmp(hex, v->hex) == 0, "%s: %s", impl, v->what);
        if (strcmp(hex, v->hex) != 0) printf("#   got  %s\n#   want %s\n", hex, v->hex);

        /* Incremental: 1, 2, 3, ... byte pieces. */
        sha256_ctx c;
        sha256_init(&c);
        for (size_t at = 0, step = 1; at < v->len; at += step, step++)
            sha256_update(&c, in + at, step < v->len - at ? step : v->len - at);
        uint8_t d[SHA256_DIGEST_LEN];
        sha256_final(&c, d);
        sha256_hex(d, hex);
        ok(strcmp(hex, v->hex) == 0, "%s: %s in growing pieces", impl, v->what);
        free(in);
    }

    /* A million 'a' in 1000-byte updates (FIPS 180-4 long message). */
    char a[1000];
    memset(a, 'a', sizeof a);
    sha256_ctx c;
    sha256_init(&c);
    for (int i = 0; i < 1000; i++) sha256_update(&c, a, sizeof a);
    uint8_t d[SHA256_DIGEST_LEN];
    sha256_final(&c, d);
    sha256_hex(d, hex);
    ok(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0,
       "%s: one million 'a'", impl);
}

int main(void) {
    bool hw = sha256_hardware();
    sha256_set_hardware(false);
    ok(!sha256_hardware(), "the hardware path can be switched off");
    run_vectors("portable");
    if (hw) {
        sha256_set_hardware(true);
        ok(sha256_hardware(), "the hardware path can be switched back on");
        run_vectors("SHA-NI");

        /* Both paths agree on pseudo-random data of many lengths, at odd alignments. */
        enum { MAX = 3000 };
        unsigned char *buf = malloc(MAX + 16);
        if (!buf) abort();
        uint32_t x = 2463534242u;
        for (size_t i = 0; i < MAX + 16; i++) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            buf[i] = (unsigned char)x;
        }
        int bad = 0;
        for (size_t len = 0; len <= MAX; len += 7) {
            char h1[SHA256_HEX_LEN + 1], h2[SHA256_HEX_LEN + 1];
            sha256_set_hardware(true);
            hex_of(buf + len % 16, len, h1);
            sha256_set_hardware(false);
            hex_of(buf + len % 16, len, h2);
            bad += strcmp(h1, h2) != 0;
        }
        ok(bad == 0, "SHA-NI and portable agree on 429 random inputs (%d differ)", bad);
        free(buf);
    } else {
        printf("# no SHA-NI on this processor: portable path only\n");
    }
    return tap_done();
}
