/* The scheme table of remote names answers what the strncmp chains did, without a network:
 * which names are URLs (prefixes are case-sensitive, as before), which names are directories
 * by their shape alone (a bucket, a Hub repo), what an http(s) name shows (no user:password@,
 * no ?query) and which URL it requests (the real one again, also under a directory named with
 * its trailing slash). */
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
    /* A directory named with its slash and a secret: its files, named under the shown
     * prefix without the slash, request the URL with the secret put back. */
    const char *dir = "http://u:pw@example.invalid/d/";
    remote_shown(dir, shown, sizeof shown);
    ok(strcmp(shown, "http://example.invalid/d/") == 0, "a directory shows no password (%s)",
       shown);
    ok(remote_target_of("http://example.invalid/d/f.bin", &t, &err) == 0 &&
           strcmp(t.url.data, "http://u:pw@example.invalid/d/f.bin") == 0,
       "a file under a directory named with its slash requests it with the password (%s)",
       t.url.data);
    remote_target_free(&t);
    ok(remote_scheme_of("http://h/d/")->slash_names_dir &&
           remote_scheme_of("https://h/d/")->slash_names_dir &&
           !remote_scheme_of("s3://b/d/")->slash_names_dir &&
           !remote_scheme_of("hf://o/n/d/")->slash_names_dir,
       "http(s) names with a trailing slash name directories; s3 and hf names do not say");
    ckpt_shown_name("/local/a?b", shown, sizeof shown);
    ok(strcmp(shown, "/local/a?b") == 0, "a local name shows as it is");
    remote_shown("s3://b/k", shown, sizeof shown);
    ok(strcmp(shown, "s3://b/k") == 0, "an s3 name shows as it is");
    ok(remote_target_of("/local", &t, &err) == -EINVAL, "a local name has no target (%s)", err.msg);
    return tap_done();
}
