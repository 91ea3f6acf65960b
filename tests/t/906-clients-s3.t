#!/usr/bin/python3
"""boto3 1.44 (botocore's SigV4 signer: shares nothing with core/io/remote/s3.c nor with the
test signers of remote_servers.py) against the SigV4-verifying server of 140-remote-s3-sigv4.t
(tests/lib/s3_sigv4_server.py), and against what ckptfs mounts from it.

- The server refuses what is not signed right: botocore with the right credentials and session
  token gets 200; the same request signed by botocore and then changed in one hex digit of the
  signature, or in one byte of the path after signing, or sent without Authorization, is 403
  SignatureDoesNotMatch / AccessDenied; boto3 with another secret gets SignatureDoesNotMatch,
  with an unknown key InvalidAccessKeyId. So signing is checked, not only exercised, by a
  signer other than ckptfs's.
- boto3 lists the bucket (list_objects_v2 paginated, 2 keys a page) and gets each object:
  the keys, sizes and bytes of the files under the server's root.
- ckptfs mounts s3://BUCKET/PREFIX of several fixtures: the files its summary.json names, with
  their sizes, are the keys boto3 lists under the prefix with the same sizes, and every
  tensor's bytes equal what boto3's ranged GETs return at the extents its sidecar's sources
  name (file, offset, length; a tensor of pieces, DCP-HF chunks, assembled here by their
  boxes).
"""

import json
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from clients_env import under_clients  # noqa: E402

under_clients("boto3", "botocore")

import boto3  # noqa: E402
import botocore.auth  # noqa: E402
import botocore.awsrequest  # noqa: E402
import botocore.credentials  # noqa: E402
from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

import mount_checks as mc  # noqa: E402
import s3_sigv4_server  # noqa: E402

BUCKET = "ckpt93"
KEY, SECRET, TOKEN = "AKIDCKPTFS93", "s3cr3t/93+Special=", "FwoGZXIvYXdzE+t93/with=="
REGION = "us-east-1"
CASES = ("sharded", "gguf/v3/model.gguf", "dcphf/grid")


def client(url, key=KEY, secret=SECRET, token=TOKEN):
    return boto3.client("s3", endpoint_url=url, aws_access_key_id=key,
                        aws_secret_access_key=secret, aws_session_token=token,
                        region_name=REGION,
                        config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                                      retries={"max_attempts": 1}))


def error_code(call):
    try:
        call()
    except ClientError as e:
        return e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"]
    return None, 200


def signed_request(url, path):
    """A GET of path signed by botocore's SigV4Auth: (url, headers)."""
    creds = botocore.credentials.Credentials(KEY, SECRET, TOKEN)
    req = botocore.awsrequest.AWSRequest(method="GET", url=url + path)
    req.headers["x-amz-content-sha256"] = botocore.auth.EMPTY_SHA256_HASH
    botocore.auth.SigV4Auth(creds, "s3", REGION).add_auth(req)
    return req.url, dict(req.headers.items())


def http_status(url, headers):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        code = body.split("<Code>")[1].split("</Code>")[0] if "<Code>" in body else ""
        return e.code, code


def signing_checks(tap, url, key_path):
    path = "/%s/%s" % (BUCKET, key_path)
    u, h = signed_request(url, path)
    tap.ok(http_status(u, h) == (200, ""), "botocore-signed GET is accepted", [http_status(u, h)])
    sig = h["Authorization"]
    flipped = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    st = http_status(u, dict(h, Authorization=flipped))
    tap.ok(st == (403, "SignatureDoesNotMatch"), "one hex digit of the signature changed: 403 "
           "SignatureDoesNotMatch", [st])
    other = u[:-1] + ("x" if u[-1] != "x" else "y")
    st = http_status(other, h)
    tap.ok(st[0] == 403 and st[1] == "SignatureDoesNotMatch",
           "path changed after signing: 403 SignatureDoesNotMatch", [st])
    st = http_status(u, {k: v for k, v in h.items() if k != "Authorization"})
    tap.ok(st[0] == 403, "no Authorization: 403", [st])
    st = http_status(u, dict(h, **{"X-Amz-Security-Token": "other" + TOKEN}))
    tap.ok(st[0] == 403, "another session token than the one signed: 403", [st])
    tap.ok(error_code(lambda: client(url, secret="wrong" + SECRET).head_object(
        Bucket=BUCKET, Key=key_path))[1] == 403 and
        error_code(lambda: client(url, secret="wrong" + SECRET).list_objects_v2(
            Bucket=BUCKET))[0] == "SignatureDoesNotMatch",
        "boto3 with another secret: 403 SignatureDoesNotMatch")
    tap.ok(error_code(lambda: client(url, key="AKIDNOBODY").list_objects_v2(Bucket=BUCKET))[0]
           == "InvalidAccessKeyId", "boto3 with an unknown key: InvalidAccessKeyId")


def local_files(root):
    out = {}
    for dirpath, _, files in os.walk(root, followlinks=True):
        for name in files:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, root)] = os.path.getsize(full)
    return out


def listing_checks(tap, s3, root):
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                         PaginationConfig={"PageSize": 2})
    listed, npages = {}, 0
    for page in pages:
        npages += 1
        for obj in page.get("Contents", []):
            listed[obj["Key"]] = obj["Size"]
    want = local_files(root)
    tap.ok(listed == want, "boto3 lists every key with its size (%d keys, %d pages)"
           % (len(want), npages), [sorted(set(listed) ^ set(want))])
    bad = []
    for key in sorted(want):
        with open(os.path.join(root, key), "rb") as f:
            data = f.read()
        if s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() != data:
            bad.append(key)
    tap.ok(not bad, "boto3's get_object of every key equals the file", bad)
    return listed


def assemble(side, pieces):
    """The tensor's bytes from contiguous pieces placed at their boxes (replicas, the same box
    twice, write the same place again); None when a piece is strided or does not fit."""
    import numpy as np
    shape = side["shape"]
    count = int(np.prod(shape)) if shape else 1
    if not count or side["nbytes"] % count:
        return None
    out = np.zeros(shape, "V%d" % (side["nbytes"] // count))
    for src, data in zip(side["sources"], pieces):
        box = src.get("box")
        if box is None or "strides" in src or len(data) != out.itemsize * int(np.prod(box["sizes"])):
            return None
        where = tuple(slice(o, o + n) for o, n in zip(box["offsets"], box["sizes"]))
        out[where] = np.frombuffer(data, out.dtype).reshape(box["sizes"])
    return out.tobytes()


def mount_checks(tap, ckptfs, s3, rel, listed, url):
    """The mount of s3://BUCKET/rel against boto3's listing and ranged GETs."""
    prefix = rel if rel.endswith((".gguf", ".safetensors")) else rel + "/"

    def checks(mnt):
        summary = mc.read_json(os.path.join(mnt, ".ckptfs", "summary.json"))
        files = {f["path"]: f["size"] for f in summary["files"]}
        keys = {(rel if prefix == rel else prefix + p): s for p, s in files.items()}
        under = {k: s for k, s in listed.items() if k == rel or k.startswith(prefix)}
        tap.ok(files and all(under.get(k) == s for k, s in keys.items()),
               "%s: the files ckptfs read are keys boto3 lists, same sizes" % rel,
               [keys, under])
        bad, n = [], 0
        for dirpath, _, names in os.walk(mnt):
            if os.path.relpath(dirpath, mnt).split(os.sep)[0] == ".ckptfs":
                continue
            for name in names:
                if not name.endswith(".json"):
                    continue
                side = mc.read_json(os.path.join(dirpath, name))
                if "sources" not in side:
                    continue
                raw = os.path.join(dirpath, name[:-5])
                if not os.path.exists(raw):
                    raw += ".raw"
                with open(raw, "rb") as f:
                    data = f.read()
                pieces = []
                for src in side["sources"]:
                    key = rel if prefix == rel else prefix + src["file"]
                    if src["length"] == 0:
                        pieces.append(b"")
                        continue
                    rng = "bytes=%d-%d" % (src["offset"], src["offset"] + src["length"] - 1)
                    pieces.append(s3.get_object(Bucket=BUCKET, Key=key, Range=rng)["Body"].read())
                n += 1
                if len(side["sources"]) == 1 and "box" not in side["sources"][0]:
                    if pieces[0] != data:
                        bad.append("%s: bytes differ from boto3's range" % side["name"])
                elif assemble(side, pieces) != data:
                    bad.append("%s: its pieces, placed by their boxes, differ" % side["name"])
        tap.ok(n and not bad, "%s: %d tensors equal boto3's ranged GETs of their sources"
               % (rel, n), bad)
    env = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
           "AWS_SESSION_TOKEN": TOKEN, "AWS_ENDPOINT_URL": url, "HOME": "/nonexistent"}
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        mc.mounted(tap, ckptfs, "s3://%s/%s" % (BUCKET, rel), "s3 " + rel, checks)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main():
    started = mc.start()
    if not started:
        return 0
    tap, ckptfs, fixtures = started
    work = tempfile.mkdtemp(prefix="ckptfs-t93.")
    root = os.path.join(work, "bucket")
    try:
        for rel in CASES:
            src = os.path.join(fixtures, rel)
            dst = os.path.join(root, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, dst)
        with s3_sigv4_server.Running(root, BUCKET, KEY, SECRET, token=TOKEN) as server:
            signing_checks(tap, server.url, "sharded/" + sorted(os.listdir(
                os.path.join(root, "sharded")))[0])
            s3 = client(server.url)
            listed = listing_checks(tap, s3, root)
            for rel in CASES:
                mount_checks(tap, ckptfs, s3, rel, listed, server.url)
            reqs = server.requests()
            tap.ok(any(r["status"] == 403 for r in reqs) and
                   all(r["status"] in (200, 206, 403) for r in reqs),
                   "the server logged the refusals and nothing but 200/206/403 (%d requests)"
                   % len(reqs))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return mc.finish(tap)


if __name__ == "__main__":
    sys.exit(main())
