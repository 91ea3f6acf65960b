#!/usr/bin/python3
"""s3:// sources against a server that VERIFIES SigV4 (tests/lib/s3_sigv4_server.py, written
from the AWS documentation; 470-remote-s3.t runs on it too, 906-clients-s3.t checks it with boto3).

  - the server itself: a request signed by the test uploader's own signer (remote_servers,
    a second implementation) is accepted, the same request with one byte of the path changed
    or signed with another secret is refused;
  - right credentials with a session token (AWS_SESSION_TOKEN): fixtures mount and read
    byte-identical to their local mounts; every request was signed, carried the token and was
    accepted;
  - wrong secret, a missing session token, a wrong region: the mount exits 2 with one line
    naming the URL, and the server saw a refused signature (not a missing object);
  - path-style (the default with a custom endpoint) and virtual-hosted addressing
    (-o s3_addressing=virtual, Host: BUCKET.localhost:PORT);
  - listings longer than a page: a model of 1100 shards under one prefix with S3's own cap of 1000
    keys a page (the index on page 2), and 250 with a server cap of 100, every tensor listed
    and its bytes right.
"""

import os
import shutil
import struct
import sys
import tempfile
import json

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import run_capture  # noqa: E402
from mount_checks import finish, start  # noqa: E402
import remote_compare  # noqa: E402
import remote_servers  # noqa: E402
import s3_sigv4_server  # noqa: E402

BUCKET = "ckpt"
KEY, SECRET, TOKEN = "AKIDCKPTFSTEST", "s3cr3t/With+Special=", "FwoGZXIvYXdzE+token/with=="
TIMEOUT = 120
FIXTURE_CASES = ("sharded", "dcphf/grid", "gguf/split/model-00001-of-00003.gguf")


def env_with(**kv):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["HOME"] = "/nonexistent"  # no ~/.aws/credentials of whoever runs the suite
    env.update({k: v for k, v in kv.items() if v is not None})
    return env


def run_env(argv, env, timeout=TIMEOUT):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        return run_capture(argv, timeout)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def write_many(root, prefix, n):
    """A model of n shards under root/prefix with its model.safetensors.index.json (which sorts
    after every shard, so on the last page); tensor layer.I.w of shard I holds I, I+1, I+2."""
    d = os.path.join(root, prefix)
    os.makedirs(d, exist_ok=True)
    weight_map = {}
    for i in range(n):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, n)
        header = json.dumps({"layer.%d.w" % i: {"dtype": "I32", "shape": [3],
                                                "data_offsets": [0, 12]}}).encode()
        header += b" " * (-len(header) % 8)
        with open(os.path.join(d, fname), "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header + struct.pack("<3i", i, i + 1, i + 2))
        weight_map["layer.%d.w" % i] = fname
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 12 * n}, "weight_map": weight_map}, f)


def tensor_bytes(i):
    return struct.pack("<3i", i, i + 1, i + 2)


def cross_check(tap, root):
    with s3_sigv4_server.Running(root, BUCKET, KEY, SECRET) as srv:
        path = "/%s/many/model-00008-of-01100.safetensors" % BUCKET
        st, data = remote_servers.s3_request(srv.url, "GET", path, key=KEY, secret=SECRET)
        tap.ok(st == 200 and data.endswith(struct.pack("<3i", 7, 8, 9)),
               "the server accepts a request signed by the uploader's separate signer", [st])
        st, _ = remote_servers.s3_request(srv.url, "GET", path, key=KEY, secret=SECRET + "x")
        errors = [r["error"] for r in srv.requests()]
        tap.ok(st == 403 and errors[-1].startswith("SignatureDoesNotMatch"),
               "the server refuses a signature made with another secret", [st, errors[-1:]])
        st, _ = remote_servers.s3_request(srv.url, "GET", path, key=KEY + "X", secret=SECRET)
        errors = [r["error"] for r in srv.requests()]
        tap.ok(st == 403 and errors[-1].startswith("InvalidAccessKeyId"),
               "the server refuses an unknown access key", [st, errors[-1:]])
        st, data = remote_servers.s3_request(srv.url, "GET", "/%s/" % BUCKET, key=KEY,
                                             secret=SECRET, query="list-type=2&max-keys=2&prefix=many%2F")
        tap.ok(st == 200 and data.count(b"<Key>") == 2 and b"<IsTruncated>true" in data,
               "the server pages a signed ListObjectsV2 (max-keys=2)", [st, data[:300]])


def failing_mount(tap, ckptfs, server, env, url, label, want_error):
    mnt = tempfile.mkdtemp(prefix="ckptfs-t47s.")
    before = len(server.requests())
    rc, out, err = run_env([ckptfs, url, mnt], env)
    try:
        os.rmdir(mnt)
    except OSError:
        pass
    lines = err.decode("utf-8", "replace").strip().splitlines()
    seen = [r["error"] for r in server.requests()[before:] if r["status"] == 403]
    tap.ok(rc == 2 and len(lines) == 1 and url in lines[0] and "403" in lines[0]
           and SECRET not in lines[0] and TOKEN not in lines[0],
           "%s: mount exits 2 with one line naming the URL" % label, [rc, lines])
    tap.ok(seen and all(e.startswith(want_error) for e in seen),
           "%s: the server refused it as %s" % (label, want_error), seen[:3])


def body(tap, ckptfs, fixtures):
    work = tempfile.mkdtemp(prefix="ckptfs-t47s.")
    root = os.path.join(work, "bucket")
    os.makedirs(root)
    for top in sorted({rel.split("/")[0] for rel in FIXTURE_CASES}):
        os.symlink(os.path.join(fixtures, top), os.path.join(root, top))
    write_many(root, "many", 1100)
    try:
        cross_check(tap, root)
        with s3_sigv4_server.Running(root, BUCKET, KEY, SECRET, token=TOKEN) as server:
            good = env_with(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET,
                            AWS_SESSION_TOKEN=TOKEN, AWS_ENDPOINT_URL=server.url)
            saved = dict(os.environ)
            os.environ.clear()
            os.environ.update(good)
            try:
                for rel in FIXTURE_CASES:
                    local_path = os.path.realpath(os.path.join(fixtures, rel))
                    url = "s3://%s/%s" % (BUCKET, rel)
                    local, f1 = remote_compare.snapshot(ckptfs, local_path,
                                                        rename=((local_path, url),))
                    remote, f2 = remote_compare.snapshot(ckptfs, url)
                    if f1 or f2:
                        tap.ok(False, "%s: both mounts work" % rel, f1 + f2)
                    else:
                        remote_compare.compare(tap, "SigV4 + session token: " + rel, local,
                                               remote)
            finally:
                os.environ.clear()
                os.environ.update(saved)
            reqs = server.requests()
            tap.ok(reqs and all(r["status"] in (200, 206) for r in reqs),
                   "every request of those mounts was accepted (%d requests)" % len(reqs),
                   [r for r in reqs if r["status"] not in (200, 206)][:3])
            tap.ok(all("x-amz-security-token" in r["amz"] and "x-amz-date" in r["amz"]
                       and "x-amz-content-sha256" in r["amz"] for r in reqs),
                   "every request carried x-amz-date, x-amz-content-sha256 and the token")
            tap.ok({r["host"] for r in reqs} == {"127.0.0.1:%d" % server.port}
                   and all(r["path"].startswith("/%s/" % BUCKET) for r in reqs),
                   "path-style addressing with a custom endpoint")

            url = "s3://%s/sharded" % BUCKET
            failing_mount(tap, ckptfs, server, dict(good, AWS_SECRET_ACCESS_KEY="wrong" + SECRET),
                          url, "wrong secret", "SignatureDoesNotMatch")
            no_token = dict(good)
            del no_token["AWS_SESSION_TOKEN"]
            failing_mount(tap, ckptfs, server, no_token, url, "no session token", "InvalidToken")
            failing_mount(tap, ckptfs, server, dict(good, AWS_REGION="eu-west-3"), url,
                          "wrong region", "AuthorizationHeaderMalformed")

            # Virtual-hosted: BUCKET.localhost resolves to loopback (RFC 6761, as curl does).
            before = len(server.requests())
            virt = dict(good, AWS_ENDPOINT_URL="http://localhost:%d" % server.port)
            rc, out, err = run_env([ckptfs, "cat", "-o", "s3_addressing=virtual",
                                    "s3://%s/many/model-00043-of-01100.safetensors" % BUCKET,
                                    "layer.42.w"], virt)
            reqs = server.requests()[before:]
            tap.ok(rc == 0 and out == struct.pack("<3i", 42, 43, 44),
                   "virtual-hosted addressing: cat reads the tensor", [rc, out, err])
            tap.ok(reqs and all(r["host"] == "%s.localhost:%d" % (BUCKET, server.port)
                                and not r["path"].startswith("/%s/" % BUCKET) for r in reqs),
                   "virtual-hosted requests name the bucket in Host only",
                   [(r["host"], r["path"]) for r in reqs[:3]])

            # 1100 keys under one prefix: two pages of S3's 1000.
            before = len(server.requests())
            rc, out, err = run_env([ckptfs, "ls", "s3://%s/many" % BUCKET], good, 300)
            names = sorted(out.decode().split())
            want = sorted("layer.%d.w" % i for i in range(1100))
            tap.ok(rc == 0 and names == want,
                   "ls of a 1100-shard model (1101 keys, the index on page 2) lists every tensor",
                   [rc, len(names), err[-300:]])
            pages = [r for r in server.requests()[before:]
                     if "list-type=2" in r["query"] and "prefix=many" in r["query"]]
            tap.ok(len(pages) >= 2 and any("continuation-token=" in r["query"] for r in pages),
                   "the listing took %d pages with a continuation token" % len(pages),
                   [r["query"] for r in pages])
            rc, out, err = run_env([ckptfs, "cat", "s3://%s/many" % BUCKET, "layer.1099.w"], good)
            tap.ok(rc == 0 and out == tensor_bytes(1099),
                   "a tensor of the last shard reads right", [rc, out, err])

        # A server that pages every 100 keys: a mounted model of 250 shards.
        small = os.path.join(work, "small")
        write_many(small, "few", 250)
        with s3_sigv4_server.Running(small, BUCKET, KEY, SECRET, max_keys=100) as server:
            env = env_with(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET,
                           AWS_ENDPOINT_URL=server.url)
            mnt = tempfile.mkdtemp(prefix="ckptfs-t47s.")
            rc, _, err = run_env([ckptfs, "s3://%s/few" % BUCKET, mnt], env)
            ok = rc == 0
            try:
                names = sorted(os.listdir(os.path.join(mnt, "layer"))) if ok else []
                tap.ok(names == sorted(str(i) for i in range(250)),
                       "a 250-shard model listed in pages of 100 mounts whole",
                       [rc, err, len(names)])
                picks = (0, 99, 100, 199, 200, 249)
                got = [open(os.path.join(mnt, "layer", str(i), "w"), "rb").read()
                       for i in picks] if ok else []
                tap.ok(got == [tensor_bytes(i) for i in picks],
                       "tensors of shards on every page read right")
            finally:
                if ok:
                    run_capture(["fusermount3", "-u", mnt], 30)
                os.rmdir(mnt)
            lists = [r for r in server.requests() if "list-type=2" in r["query"]]
            # s3://BUCKET/few is told a directory by one-key listings of "few/" (and "few"),
            # never by listing the bucket, which could hold millions of keys.
            probes = [r for r in lists if "max-keys=1&" in r["query"]]
            tap.ok(1 <= len(probes) <= 2 and
                   not any(r["query"].endswith("prefix=") for r in lists),
                   "the mount point's kind took %d one-key listings and no listing of the "
                   "bucket" % len(probes), [r["query"] for r in lists])
            pages = [r for r in lists if r not in probes]
            tap.ok(len(pages) >= 3 and all("max-keys" not in r["query"]
                                           or "max-keys=1000" in r["query"] for r in pages),
                   "the server's cap of 100 took %d pages" % len(pages),
                   [r["query"] for r in pages])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    started = start()
    if not started:
        return 0
    tap, ckptfs, fixtures = started
    body(tap, ckptfs, fixtures)
    return finish(tap)


if __name__ == "__main__":
    sys.exit(main())
