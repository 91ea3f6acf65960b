#!/usr/bin/python3
"""Sources by s3:// URL: every fixture mounts from an S3-compatible server and reads
byte-identical to its local mount.

Environment: CKPTFS, FIXTURES; BUILD (default: FIXTURES/..) is where npm installs s3rver.

s3rver (npm, installed under build/npm by this test when missing; it checks SigV4 signatures)
runs on a free loopback port with a bucket holding the fixtures, uploaded with a SigV4 signer
written here. Credentials come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, the endpoint from
AWS_ENDPOINT_URL (path-style addressing by default for a custom endpoint), and in one case from
-o s3_endpoint= and a shared credentials file (AWS_SHARED_CREDENTIALS_FILE + AWS_PROFILE). A
directory is a prefix listed with ListObjectsV2 (a prefix holding only deeper keys, which
s3rver leaves out of its parent's listing, still opens). A missing key: exit 2 naming the URL.
Not covered here: s3rver 3.7 accepts any signature and answers 500 to listings of more than
1000 keys, so wrong credentials and multi-page listings are tested in 14-remote-s3-sigv4.t
against a server of our own that verifies SigV4.
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

BUCKET = "ckpt"
CLI_TIMEOUT = 60


def body(tap, ckptfs, fixtures, served, server):
    rels = remote_fixtures.fixture_sources(fixtures) + remote_layouts.upload_rels(served)
    n = rs.s3_upload_tree(server.url, BUCKET, served, rels)
    tap.ok(n > 100, "uploaded %d fixture files with SigV4 PUTs" % n)
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
    build = os.environ.get("BUILD") or os.path.dirname(fixtures)
    cli, why = rs.s3rver_install(build)
    if not cli:
        tap.skip_unless_ci("s3 tests", why)
        return finish(tap)
    served = remote_layouts.served_root(fixtures)
    try:
        with rs.S3rver(cli, BUCKET) as server:
            body(tap, ckptfs, fixtures, served, server)
    finally:
        shutil.rmtree(served)
    return finish(tap)


if __name__ == "__main__":
    sys.exit(main())
