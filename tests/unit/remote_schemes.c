/* The scheme table of remote names answers what the strncmp chains did, without a network:
 * which names are URLs (prefixes are case-sensitive, as before), which names are directories
 * by their shape alone (a bucket, a Hub repo), what an http(s) name shows (no user:password@,
 * no ?query) and which URL it requests (the real one again). */
#include "io/remote/remote.h"
#include "tap.h"

#include <errno.h>
#include <string.h>

int main(void) {
    static const struct {
        const char *name;
        bool url;
    } urls[] = {
        {"http://h/x", true},   {"https://h/x", true}, {"s3://b/k", true},
        {"hf://o/n", true},     {"HTTP://h/x", false}, {"file:///x", false},
        {"/local/file", false}, {"s3:/b", false},      {"hf:/o", false},
    };
    for (size_t i = 0; i < sizeof urls / sizeof *urls; i++)
        ok(ckpt_is_url(urls[i].name) == urls[i].url, "%s is %sa URL", urls[i].name,
           urls[i].url ? "" : "not ");

    static const char *const dirs[] = {"s3://bucket", "s3://bucket/", "hf://org",
                                       "hf://org/name@0123abcd", "hf://org/name@main/."};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++)
        is_u64(remote_kind(dirs[i]), REMOTE_DIR, "%s is a directory by its shape", dirs[i]);
    is_u64(remote_kind("/local/dir"), REMOTE_MISSING, "a local name is no remote kind");

    const char *secret = "https://user:pw@example.invalid/m/model.safetensors?token=abc";
    char shown[256];
    remote_shown(secret, shown, sizeof shown);
    ok(!strstr(shown, "user") && !strstr(shown, "pw") && !strstr(shown, "token") &&
           strstr(shown, "example.invalid/m/model.safetensors"),
       "an https name shows no user, password or query (%s)", shown);
    remote_target t;
    ckpt_err err;
    ok(remote_target_of(shown, &t, &err) == 0 && strcmp(t.url.data, secret) == 0,
       "its shown name requests the real URL again");
    remote_target_free(&t);
    remote_shown("s3://b/k", shown, sizeof shown);
    ok(strcmp(shown, "s3://b/k") == 0, "an s3 name shows as it is");
    ok(remote_target_of("/local", &t, &err) == -EINVAL, "a local name has no target (%s)", err.msg);
    return tap_done();
}
