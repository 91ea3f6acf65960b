#!/usr/bin/python3
"""Errors about a source say what to do next (issue 28 item 10).

- s3:// without an endpoint: the host AWS's default endpoint gives cannot be reached; the
  message names that host and how to name another service (-o s3_endpoint=, AWS_ENDPOINT_URL_S3).
- s3:// against a server that answers as S3 does (tests/lib/s3_sigv4_server.py): a missing
  bucket and a missing key are told apart (NoSuchBucket / NoSuchKey), for a file and a prefix.
- An HF cache root (~/.cache/huggingface/hub) given as SOURCE lists its models--* repo folders
  instead of "no checkpoint in this directory".
- -o revision= takes an unambiguous start of a commit hash (4+ hex digits, as git does): the
  mount shows that snapshot and .ckptfs/ says its full commit; an ambiguous one names two
  candidates; an unknown one is refused as before.
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap  # noqa: E402
import s3_sigv4_server  # noqa: E402

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
CKPTFS = os.environ.get("CKPTFS") or os.path.join(ROOT, "build", "ckptfs")
KEY, SECRET = "AKIDCKPTFSTEST", "s3cr3t"


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWS_") and not k.startswith("HF_")}
    env["HOME"] = tempfile.gettempdir()  # no ~/.aws/credentials of the machine
    env.update(extra)
    return env


def run(argv, env):
    p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def write_safetensors(path, v=1.0):
    header = b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + struct.pack("<2f", v, 2.0))


def main():
    tap = Tap()
    env = clean_env(AWS_REGION="ckptfs-test-none-1")
    rc, _, err = run([CKPTFS, "ls", "s3://ckptfs-no-bucket/m.safetensors", "-o",
                      "retries=0,remote_timeout=10"], env)
    host = "ckptfs-no-bucket.s3.ckptfs-test-none-1.amazonaws.com"
    if "HTTP " in err:
        tap.skip("s3 without an endpoint names the host", "this machine reaches AWS: " + err)
    else:
        tap.ok(rc == 2 and host in err and "s3_endpoint=" in err and "AWS_ENDPOINT_URL_S3" in err
               and len(err.splitlines()) == 1,
               "s3 without an endpoint: one line naming the host %s and how to set the "
               "endpoint" % host, [err])

    hub = tempfile.mkdtemp(prefix="ckptfs-t18hub.")
    try:
        commits = {"abcdef0123456789abcdef0123456789abcdef01": 1.0,
                   "abcd990000000000000000000000000000000000": 2.0,
                   "1234560000000000000000000000000000000000": 3.0}
        for name in ("models--org--one", "models--org--two"):
            os.makedirs(os.path.join(hub, name, "refs"))
            for c, v in commits.items():
                snap = os.path.join(hub, name, "snapshots", c)
                os.makedirs(snap)
                write_safetensors(os.path.join(snap, "model.safetensors"), v)
            with open(os.path.join(hub, name, "refs", "main"), "w") as f:
                f.write("1234560000000000000000000000000000000000")
        os.makedirs(os.path.join(hub, ".locks"))
        rc, _, err = run([CKPTFS, "ls", hub], clean_env())
        tap.ok(rc == 2 and "models--org--one, models--org--two" in err
               and "no checkpoint" not in err, "an HF cache root names its repo folders", [err])
        repo = os.path.join(hub, "models--org--one")
        p = subprocess.run([CKPTFS, "cat", repo, "w", "-o", "revision=abcdef01"],
                           env=clean_env(), capture_output=True, timeout=60)
        tap.ok(p.returncode == 0 and p.stdout == struct.pack("<2f", 1.0, 2.0),
               "revision=abcdef01 (a short commit id) reads that snapshot", [p.stderr])
        rc, out, err = run([CKPTFS, "info", repo, "--json", "-o", "revision=1234"], clean_env())
        tap.ok(rc == 0 and "1234560000000000000000000000000000000000" in out,
               "revision=1234: the full commit is reported", [err])
        rc, _, err = run([CKPTFS, "ls", repo, "-o", "revision=abcd"], clean_env())
        tap.ok(rc == 2 and "ambiguous" in err and "abcd99" in err and "abcdef" in err,
               "revision=abcd (two snapshots start so): ambiguous, naming both", [err])
        rc, _, err = run([CKPTFS, "ls", repo, "-o", "revision=ffff"], clean_env())
        tap.ok(rc == 2 and "neither a ref" in err, "revision=ffff: no such revision", [err])
        rc, _, err = run([CKPTFS, "ls", repo, "-o", "revision=abc"], clean_env())
        tap.ok(rc == 2 and "neither a ref" in err,
               "revision=abc (under 4 digits) is no short id, as in git", [err])
    finally:
        shutil.rmtree(hub, ignore_errors=True)

    work = tempfile.mkdtemp(prefix="ckptfs-t18.")
    try:
        os.makedirs(os.path.join(work, "dir"))
        write_safetensors(os.path.join(work, "dir", "model.safetensors"))
        with s3_sigv4_server.Running(work, "ckpt", KEY, SECRET) as srv:
            env = clean_env(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET,
                            AWS_ENDPOINT_URL=srv.url)
            rc, out, err = run([CKPTFS, "ls", "s3://ckpt/dir/model.safetensors"], env)
            tap.ok(rc == 0 and out.split() == ["w"], "the server serves the bucket", [out, err])
            for url, want, not_want in (
                    ("s3://nobucket/dir/model.safetensors", "NoSuchBucket", "NoSuchKey"),
                    ("s3://ckpt/dir/absent.safetensors", "NoSuchKey", "NoSuchBucket"),
                    ("s3://nobucket/dir/", "NoSuchBucket", "NoSuchKey")):
                rc, _, err = run([CKPTFS, "ls", url, "-o", "retries=0"], env)
                tap.ok(rc == 2 and want in err and not_want not in err and url.rstrip("/")
                       in err, "%s: exit 2 saying %s" % (url, want), [err])
            rc, _, err = run([CKPTFS, "ls", "s3://nobucket/dir/model.safetensors"], env)
            tap.ok("no such bucket" in err, "a missing bucket is said in words", [err])
            rc, _, err = run([CKPTFS, "ls", "s3://ckpt/dir/absent.safetensors"], env)
            tap.ok("no such key" in err, "a missing key is said in words", [err])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tap.done()
    sys.exit(1 if tap.failed else 0)


if __name__ == "__main__":
    main()
