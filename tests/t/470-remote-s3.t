#!/usr/bin/python3
"""Sources by s3:// URL: every fixture mounts from an S3-compatible server and reads
byte-identical to its local mount.

Environment: CKPTFS, FIXTURES.

The server is tests/lib/s3_sigv4_server.py, which verifies every request's SigV4 signature
(140-remote-s3-sigv4.t and 906-clients-s3.t show that it refuses wrong ones), on a free loopback
port with a bucket holding the fixtures: the files every object of an upload would be, linked
into the bucket's folder (snapshot links followed, as an upload reads them). Credentials come
from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, the endpoint from AWS_ENDPOINT_URL (path-style
addressing by default for a custom endpoint), and in one case from -o s3_endpoint= and a shared
credentials file (AWS_SHARED_CREDENTIALS_FILE + AWS_PROFILE). A directory is a prefix listed
with ListObjectsV2 (a prefix holding only deeper keys still opens). A missing key: exit 2
naming the URL. Wrong credentials and multi-page listings are in 140-remote-s3-sigv4.t.
The layouts (tests/lib/remote_layouts.py: tar/.nemo, HF cache folders uploaded with their
snapshot links followed, .bin repos, folders, split GGUF, Meta MP, DeepSpeed) mount from s3://
prefixes too, pass their own checks and equal their local mounts.
"""

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import run_capture  # noqa: E402
from mount_checks import finish, start  # noqa: E402
import remote_compare  # noqa: E402
import remote_fixtures  # noqa: E402
import remote_layouts  # noqa: E402
import remote_servers as rs  # noqa: E402
import s3_sigv4_server  # noqa: E402

BUCKET = "ckpt"
CLI_TIMEOUT = 60


def bucket_tree(served, rels, root):
    """Links under root to every file an upload of rels (files or folders under served) would
    PUT, each at its key (a file two rels hold, once); returns how many."""
    n = 0
    for rel in rels:
        top = os.path.join(served, rel)
        files = [top] if os.path.isfile(top) else [
            os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs]
        for f in files:
            key = os.path.join(root, os.path.relpath(f, served))
            if os.path.lexists(key):
                continue
            os.makedirs(os.path.dirname(key), exist_ok=True)
            os.symlink(os.path.realpath(f), key)
            n += 1
    return n


def body(tap, ckptfs, fixtures, served, server, n):
    tap.ok(n > 100, "the bucket holds %d fixture files" % n)
    for k in ("AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_ENDPOINT_URL_S3", "AWS_REGION",
              "AWS_DEFAULT_REGION", "AWS_SESSION_TOKEN"):
        os.environ.pop(k, None)
    os.environ.update(AWS_ACCESS_KEY_ID=rs.S3_KEY, AWS_SECRET_ACCESS_KEY=rs.S3_SECRET,
                      AWS_ENDPOINT_URL=server.url)
    remote_compare.compare_all(tap, ckptfs, fixtures, lambda rel: "s3://%s/%s" % (BUCKET, rel))
    remote_layouts.compare_layouts(tap, ckptfs, served, lambda rel: "s3://%s/%s" % (BUCKET, rel))
    remote_layouts.check_hostile(tap, ckptfs, served,
                                 lambda rel: "s3://%s/%s" % (BUCKET, rel))

    work = tempfile.mkdtemp(prefix="ckptfs-t47.")
    try:
        creds_checks(tap, ckptfs, server, work)
    finally:
        shutil.rmtree(work)  # it holds the test server's key
        tap.ok(not os.path.exists(work), "the credentials file's folder is removed")

    mnt = tempfile.mkdtemp(prefix="ckptfs-t47.")
    rc, out, err = run_capture_env([ckptfs, "s3://%s/nothing/model.safetensors" % BUCKET, mnt],
                                   dict(os.environ))
    os.rmdir(mnt)
    tap.ok(rc == 2 and b"s3://ckpt/nothing/model.safetensors" in err,
           "mount of a missing key exits 2 naming it", [rc, err])


def creds_checks(tap, ckptfs, server, work):
    """Endpoint from -o s3_endpoint=, credentials from a shared credentials file profile."""
    creds = os.path.join(work, "credentials")
    with open(creds, "w") as f:
        f.write("[default]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n\n"
                "[test]\naws_access_key_id = %s\naws_secret_access_key = %s\n"
                % (rs.S3_KEY, rs.S3_SECRET))
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=creds, AWS_PROFILE="test")
    rc, out, err = run_capture_env([ckptfs, "verify", "-o", "s3_endpoint=" + server.url,
                                    "s3://%s/sharded" % BUCKET], env)
    tap.ok(rc == 0 and b"model.embed_tokens.weight" in out,
           "s3_endpoint= and a credentials-file profile: verify of a prefix", [rc, out, err])


def run_capture_env(argv, env):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        return run_capture(argv, CLI_TIMEOUT)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main():
    started = start()
    if not started:
        return 0
    tap, ckptfs, fixtures = started
    served = remote_layouts.served_root(fixtures)
    bucket = tempfile.mkdtemp(prefix="ckptfs-t47b.")
    try:
        rels = remote_fixtures.fixture_sources(fixtures) + remote_layouts.upload_rels(served)
        n = bucket_tree(served, rels, bucket)
        with s3_sigv4_server.Running(bucket, BUCKET, rs.S3_KEY, rs.S3_SECRET) as server:
            body(tap, ckptfs, fixtures, served, server, n)
            reqs = server.requests()
            refused = [r for r in reqs if r["status"] == 403]
            tap.ok(reqs and not refused, "every one of the %d requests was signed right"
                   % len(reqs), refused[:3])
    finally:
        shutil.rmtree(served)
        shutil.rmtree(bucket, ignore_errors=True)
    return finish(tap)


if __name__ == "__main__":
    sys.exit(main())
