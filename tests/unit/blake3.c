/* BLAKE3 against the official test vectors (BLAKE3-team/BLAKE3 test_vectors/test_vectors.json,
 * "hash" mode): input byte i is i % 251; each expected value is the 131-byte extended output,
 * whose first 32 bytes are the standard digest. Also: incremental updates split at awkward
 * places equal the one-shot hash, and the gpt-rs base ids of the format notes. */
#include "util/blake3.h"
#include "tap.h"

#include <stdlib.h>

static const struct vector {
    size_t input_len;
    const char *hash;
} vectors[] = {
    {0, "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        "e00f03e7b69af26b7faaf09fcd333050338ddfe085b8cc869ca98b206c08243a"
        "26f5487789e8f660afe6c99ef9e0c52b92e7393024a80459cf91f476f9ffdbda"
        "7001c22e159b402631f277ca96f2defdf1078282314e763699a31c5363165421"
        "cce14d"},
    {1, "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213"
        "c3a6cb8bf623e20cdb535f8d1a5ffb86342d9c0b64aca3bce1d31f60adfa137b"
        "358ad4d79f97b47c3d5e79f179df87a3b9776ef8325f8329886ba42f07fb138b"
        "b502f4081cbcec3195c5871e6c23e2cc97d3c69a613eba131e5f1351f3f1da78"
        "6545e5"},
    {1023, "10108970eeda3eb932baac1428c7a2163b0e924c9a9e25b35bba72b28f70bd11"
           "a182d27a591b05592b15607500e1e8dd56bc6c7fc063715b7a1d737df5bad333"
           "9c56778957d870eb9717b57ea3d9fb68d1b55127bba6a906a4a24bbd5acb2d12"
           "3a37b28f9e9a81bbaae360d58f85e5fc9d75f7c370a0cc09b6522d9c8d822f2f"
           "28f485"},
    {1024, "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7"
           "1cf8107265ecdaf8505b95d8fcec83a98a6a96ea5109d2c179c47a387ffbb404"
           "756f6eeae7883b446b70ebb144527c2075ab8ab204c0086bb22b7c93d465efc5"
           "7f8d917f0b385c6df265e77003b85102967486ed57db5c5ca170ba441427ed9a"
           "fa684e"},
    {1025, "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444"
           "f4c4a22b4b399155358a994e52bf255de60035742ec71bd08ac275a1b51cc6bf"
           "e332b0ef84b409108cda080e6269ed4b3e2c3f7d722aa4cdc98d16deb554e562"
           "7be8f955c98e1d5f9565a9194cad0c4285f93700062d9595adb992ae68ff1280"
           "0ab67a"},
    {2048, "e776b6028c7cd22a4d0ba182a8bf62205d2ef576467e838ed6f2529b85fba24a"
           "9a60bf80001410ec9eea6698cd537939fad4749edd484cb541aced55cd9bf547"
           "64d063f23f6f1e32e12958ba5cfeb1bf618ad094266d4fc3c968c2088f677454"
           "c288c67ba0dba337b9d91c7e1ba586dc9a5bc2d5e90c14f53a8863ac75655461"
           "cea8f9"},
    {2049, "5f4d72f40d7a5f82b15ca2b2e44b1de3c2ef86c426c95c1af0b6879522563030"
           "96de31d71d74103403822a2e0bc1eb193e7aecc9643a76b7bbc0c9f9c52e8783"
           "aae98764ca468962b5c2ec92f0c74eb5448d519713e09413719431c802f948dd"
           "5d90425a4ecdadece9eb178d80f26efccae630734dff63340285adec2aed3b51"
           "073ad3"},
    {3072, "b98cb0ff3623be03326b373de6b9095218513e64f1ee2edd2525c7ad1e5cffd2"
           "9a3f6b0b978d6608335c09dc94ccf682f9951cdfc501bfe47b9c9189a6fc7b40"
           "4d120258506341a6d802857322fbd20d3e5dae05b95c88793fa83db1cb08e7d8"
           "008d1599b6209d78336e24839724c191b2a52a80448306e0daa84a3fdb566661"
           "a37e11"},
    {3073, "7124b49501012f81cc7f11ca069ec9226cecb8a2c850cfe644e327d22d3e1cd3"
           "9a27ae3b79d68d89da9bf25bc27139ae65a324918a5f9b7828181e52cf373c84"
           "f35b639b7fccbb985b6f2fa56aea0c18f531203497b8bbd3a07ceb5926f1cab7"
           "4d14bd66486d9a91eba99059a98bd1cd25876b2af5a76c3e9eed554ed72ea952"
           "b603bf"},
    {4096, "015094013f57a5277b59d8475c0501042c0b642e531b0a1c8f58d2163229e969"
           "0289e9409ddb1b99768eafe1623da896faf7e1114bebeadc1be30829b6f8af70"
           "7d85c298f4f0ff4d9438aef948335612ae921e76d411c3a9111df62d27eaf871"
           "959ae0062b5492a0feb98ef3ed4af277f5395172dbe5c311918ea0074ce00364"
           "54f620"},
    {4097, "9b4052b38f1c5fc8b1f9ff7ac7b27cd242487b3d890d15c96a1c25b8aa0fb995"
           "05f91b0b5600a11251652eacfa9497b31cd3c409ce2e45cfe6c0a016967316c4"
           "26bd26f619eab5d70af9a418b845c608840390f361630bd497b1ab4401931635"
           "7c61dbe091ce72fc16dc340ac3d6e009e050b3adac4b5b2c92e722cffdc46501"
           "531956"},
    {5120, "9cadc15fed8b5d854562b26a9536d9707cadeda9b143978f319ab34230535833"
           "acc61c8fdc114a2010ce8038c853e121e1544985133fccdd0a2d507e8e615e61"
           "1e9a0ba4f47915f49e53d721816a9198e8b30f12d20ec3689989175f1bf7a300"
           "eee0d9321fad8da232ece6efb8e9fd81b42ad161f6b9550a069e66b11b40487a"
           "5f5059"},
    {5121, "628bd2cb2004694adaab7bbd778a25df25c47b9d4155a55f8fbd79f2fe154cff"
           "96adaab0613a6146cdaabe498c3a94e529d3fc1da2bd08edf54ed64d40dcd677"
           "7647eac51d8277d70219a9694334a68bc8f0f23e20b0ff70ada6f844542dfa32"
           "cd4204ca1846ef76d811cdb296f65e260227f477aa7aa008bac878f72257484f"
           "2b6c95"},
    {6144, "3e2e5b74e048f3add6d21faab3f83aa44d3b2278afb83b80b3c35164ebeca205"
           "4d742022da6fdda444ebc384b04a54c3ac5839b49da7d39f6d8a9db03deab32a"
           "ade156c1c0311e9b3435cde0ddba0dce7b26a376cad121294b689193508dd631"
           "51603c6ddb866ad16c2ee41585d1633a2cea093bea714f4c5d6b903522045b20"
           "395c83"},
    {6145, "f1323a8631446cc50536a9f705ee5cb619424d46887f3c376c695b70e0f0507f"
           "18a2cfdd73c6e39dd75ce7c1c6e3ef238fd54465f053b25d21044ccb2093beb0"
           "15015532b108313b5829c3621ce324b8e14229091b7c93f32db2e4e63126a377"
           "d2a63a3597997d4f1cba59309cb4af240ba70cebff9a23d5e3ff0cdae2cfd54e"
           "070022"},
    {7168, "61da957ec2499a95d6b8023e2b0e604ec7f6b50e80a9678b89d2628e99ada77a"
           "5707c321c83361793b9af62a40f43b523df1c8633cecb4cd14d00bdc79c78fca"
           "5165b863893f6d38b02ff7236c5a9a8ad2dba87d24c547cab046c29fc5bc1ed1"
           "42e1de4763613bb162a5a538e6ef05ed05199d751f9eb58d332791b8d73fb74e"
           "4fce95"},
    {7169, "a003fc7a51754a9b3c7fae0367ab3d782dccf28855a03d435f8cfe74605e7817"
           "98a8b20534be1ca9eb2ae2df3fae2ea60e48c6fb0b850b1385b5de0fe460dbe9"
           "d9f9b0d8db4435da75c601156df9d047f4ede008732eb17adc05d96180f8a735"
           "48522840779e6062d643b79478a6e8dbce68927f36ebf676ffa7d72d5f68f050"
           "b119c8"},
    {8192, "aae792484c8efe4f19e2ca7d371d8c467ffb10748d8a5a1ae579948f718a2a63"
           "5fe51a27db045a567c1ad51be5aa34c01c6651c4d9b5b5ac5d0fd58cf18dd61a"
           "47778566b797a8c67df7b1d60b97b19288d2d877bb2df417ace009dcb0241ca1"
           "257d62712b6a4043b4ff33f690d849da91ea3bf711ed583cb7b7a7da2839ba71"
           "309bbf"},
    {8193, "bab6c09cb8ce8cf459261398d2e7aef35700bf488116ceb94a36d0f5f1b7bc3b"
           "b2282aa69be089359ea1154b9a9286c4a56af4de975a9aa4a5c497654914d279"
           "bea60bb6d2cf7225a2fa0ff5ef56bbe4b149f3ed15860f78b4e2ad04e158e375"
           "c1e0c0b551cd7dfc82f1b155c11b6b3ed51ec9edb30d133653bb5709d1dbd55f"
           "4e1ff6"},
    {16384, "f875d6646de28985646f34ee13be9a576fd515f76b5b0a26bb324735041ddde4"
            "9d764c270176e53e97bdffa58d549073f2c660be0e81293767ed4e4929f9ad34"
            "bbb39a529334c57c4a381ffd2a6d4bfdbf1482651b172aa883cc13408fa67758"
            "a3e47503f93f87720a3177325f7823251b85275f64636a8f1d599c2e49722f42"
            "e93893"},
    {31744, "62b6960e1a44bcc1eb1a611a8d6235b6b4b78f32e7abc4fb4c6cdcce94895c47"
            "860cc51f2b0c28a7b77304bd55fe73af663c02d3f52ea053ba43431ca5bab7bf"
            "ea2f5e9d7121770d88f70ae9649ea713087d1914f7f312147e247f87eb2d4ffe"
            "f0ac978bf7b6579d57d533355aa20b8b77b13fd09748728a5cc327a8ec470f40"
            "13226f"},
    {102400, "bc3e3d41a1146b069abffad3c0d44860cf664390afce4d9661f7902e7943e085"
             "e01c59dab908c04c3342b816941a26d69c2605ebee5ec5291cc55e15b76146e6"
             "745f0601156c3596cb75065a9c57f35585a52e1ac70f69131c23d611ce11ee4a"
             "b1ec2c009012d236648e77be9295dd0426f29b764d65de58eb7d01dd42248204"
             "f45f8e"},
};

static void to_hex(const uint8_t *b, size_t n, char *out) {
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[b[i] >> 4];
        out[2 * i + 1] = hex[b[i] & 15];
    }
    out[2 * n] = 0;
}

/* gpt-rs BaseParamId bytes: BLAKE3(name)[0..16] (format notes, section 1.3). */
static const struct {
    const char *name;
    const char *id;
} base_ids[] = {
    {"", "af1349b9f5f9a1a6a0404dea36dcc949"},
    {"abc", "6437b3ac38465133ffb63b75273a8db5"},
    {"tok_embeddings.weight", "7e7feacfe1ddb49f69ba6d05e7ec9ee6"},
    {"pos_embeddings", "09c8373ac0584896e1997566f5e9656c"},
    {"lm_head", "585d23eebd91ff137aef590d2ec762a9"},
    {"final_ln.gamma", "509eeb6a25813629c92e9d286e53c711"},
    {"final_ln.beta", "79ec67343d0c7f14cc9df61fc7ef27e6"},
    {"blocks.0.attention.w_qkv", "e72a6ef8ed8165a87745cd77f2ec344c"},
    {"blocks.0.ln_1.gamma", "3b001706aa5220c453c6702ba50ad7cd"},
};

int main(void) {
    enum { MAX_INPUT = 102400, OUT = 131 };
    uint8_t *input = malloc(MAX_INPUT);
    if (!input) return 1;
    for (size_t i = 0; i < MAX_INPUT; i++) input[i] = (uint8_t)(i % 251);

    uint8_t out[OUT], digest[BLAKE3_OUT_LEN];
    char hex[2 * OUT + 1];
    for (size_t v = 0; v < sizeof vectors / sizeof *vectors; v++) {
        const struct vector *t = &vectors[v];
        blake3_hasher h;
        blake3_init(&h);
        blake3_update(&h, input, t->input_len);
        blake3_finalize(&h, out, OUT);
        to_hex(out, OUT, hex);
        ok(strcmp(hex, t->hash) == 0, "input_len %zu: 131-byte extended output", t->input_len);
        if (strcmp(hex, t->hash) != 0) printf("#   got  %s\n#   want %s\n", hex, t->hash);

        blake3_hash(input, t->input_len, digest);
        ok(memcmp(digest, out, BLAKE3_OUT_LEN) == 0, "input_len %zu: default 32-byte digest",
           t->input_len);

        /* Feed the same input in pieces of 1, 63, 64, 65, 1023 and 1025 bytes, cycling. */
        static const size_t steps[] = {1, 63, 64, 65, 1023, 1025};
        blake3_init(&h);
        size_t at = 0;
        for (size_t k = 0; at < t->input_len; k++) {
            size_t n = steps[k % 6];
            if (n > t->input_len - at) n = t->input_len - at;
            blake3_update(&h, input + at, n);
            blake3_update(&h, input + at, 0);
            at += n;
        }
        uint8_t piecewise[OUT];
        blake3_finalize(&h, piecewise, OUT);
        ok(memcmp(piecewise, out, OUT) == 0, "input_len %zu: incremental updates agree",
           t->input_len);
    }

    /* Output shorter than a block and crossing a block boundary is a prefix of the stream. */
    blake3_hasher h;
    blake3_init(&h);
    blake3_update(&h, input, 1025);
    uint8_t short_out[5], long_out[70];
    blake3_finalize(&h, short_out, sizeof short_out);
    blake3_finalize(&h, long_out, sizeof long_out);
    to_hex(long_out, sizeof long_out, hex);
    ok(memcmp(short_out, long_out, sizeof short_out) == 0 &&
           strncmp(hex, vectors[4].hash, 2 * sizeof long_out) == 0,
       "XOF prefixes: 5 and 70 bytes");

    for (size_t i = 0; i < sizeof base_ids / sizeof *base_ids; i++) {
        blake3_hash(base_ids[i].name, strlen(base_ids[i].name), digest);
        to_hex(digest, 16, hex);
        ok(strcmp(hex, base_ids[i].id) == 0, "gpt-rs base id of \"%s\" is %s", base_ids[i].name,
           base_ids[i].id);
    }
    free(input);
    return tap_done();
}
