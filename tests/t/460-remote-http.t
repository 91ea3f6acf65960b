#!/usr/bin/python3
"""Sources by http:// URL: every fixture mounts from nginx and reads byte-identical to its local
mount.

Environment: CKPTFS (the binary), FIXTURES (the generated fixtures).

An nginx (Debian's, run in the foreground with its own configuration on a free port, stopped
at the end) serves FIXTURES with Range support and index pages. For every source a fixture
manifest names (files and directory layouts of every format), the remote mount shows the same
files with the same bytes as the local mount; sidecars, summary.json and metadata.json name the
URL where the local mount names the path. Then: `ckptfs cat/verify/info` read URLs; a second
read of a tensor costs no request (block cache); .ckptfs/cache.json counts what was fetched; a
URL with user:password@ and ?query never shows them (summary, sidecars, errors); the access log
shows that a mount of a sharded directory fetched only the first block of each shard.
The layouts (tar/.nemo, HF cache folders, .bin repos, folders, split GGUF, Meta MP, DeepSpeed:
tests/lib/remote_layouts.py) mount from URLs too: their own checks pass on the remote mount and
it equals the local one. A directory probe HEADs each name missing from an index page once; a
directory URL without its slash costs one HEAD (the redirect that adds the slash), not two.
"""

import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import run_capture  # noqa: E402
from mount_checks import mounted, read_bytes, read_json, start, finish, tree_bytes  # noqa: E402
import remote_compare  # noqa: E402
import remote_layouts  # noqa: E402
import remote_servers  # noqa: E402

CLI_TIMEOUT = 60


def body(tap, ckptfs, fixtures, served, server):
    url = server.url
    remote_compare.compare_all(tap, ckptfs, fixtures, lambda rel: url + "/" + rel)
    remote_layouts.compare_layouts(tap, ckptfs, served, lambda rel: url + "/" + rel)
    remote_layouts.check_hostile(tap, ckptfs, served, lambda rel: url + "/" + rel)
    # Names an index page leaves out (dot files: .metadata, .hf_metadata) are asked for once
    # each, not once per probe (the NeMo step's probes ask for some of them again and again).
    for d in ("nemo/step_dcphf/epoch_0_step_20", "dcphf/grid"):
        before = len(server.requests())
        rc, out, err = run_capture([ckptfs, "ls", url + "/" + d], CLI_TIMEOUT)
        heads = [l.split('"')[1] for l in server.requests()[before:] if '"HEAD ' in l]
        tap.ok(rc == 0 and heads and len(heads) == len(set(heads)),
               "%s: the probes HEAD each name missing from index pages once (%d HEADs)"
               % (d, len(heads)), [rc, err] + heads)

    # A directory named without its slash: one HEAD tells it (nginx's redirect to the name
    # with a slash says so), then its listing; not a second HEAD of the name with the slash.
    before = len(server.requests())
    rc, out, err = run_capture([ckptfs, "ls", url + "/sharded"], CLI_TIMEOUT)
    asked = [l.split('"')[1] for l in server.requests()[before:]]
    heads = [a for a in asked if a.startswith("HEAD /sharded ") or a.startswith("HEAD /sharded/ ")]
    tap.ok(rc == 0 and b"model" in out and len(heads) == 1 and "GET /sharded/ HTTP/1.1" in asked,
           "a directory URL without its slash costs one HEAD and the listing (%d HEADs)"
           % len(heads), [rc, err] + asked)

    # The CLI takes URLs as it takes paths.
    src = url + "/sharded"
    rc, out, err = run_capture([ckptfs, "verify", src], CLI_TIMEOUT)
    tap.ok(rc == 0, "ckptfs verify URL of a sharded directory", [out, err])
    rc, out, err = run_capture([ckptfs, "info", "--json", src], CLI_TIMEOUT)
    tap.ok(rc == 0 and json.loads(out or b"{}").get("source") == src,
           "ckptfs info --json names the URL as source", [out[:300], err])
    local = os.path.join(fixtures, "dtypes", "model.safetensors")
    rc1, out1, _ = run_capture([ckptfs, "cat", local, "--all"], CLI_TIMEOUT)
    rc2, out2, err2 = run_capture([ckptfs, "cat", url + "/dtypes/model.safetensors", "--all"],
                                  CLI_TIMEOUT)
    tap.ok(rc1 == rc2 and out1 == out2, "ckptfs cat URL equals cat of the file", [err2])

    # Mount reads only what decoders need: one ranged GET per shard (its first block).
    before = len(server.requests())

    def sharded_checks(mnt):
        log = server.requests()[before:]
        shard_gets = [l for l in log if '"GET /sharded/model-' in l]
        tap.ok(len(shard_gets) == 3 and all(" 206 " in l for l in shard_gets),
               "mount of 3 shards: one ranged GET each (206)", log)
        summary = read_json(os.path.join(mnt, ".ckptfs", "summary.json"))
        # The URL as source; every file it names is a file of the served folder with the size
        # the folder says (read from it, not from ckptfs), and the three shards are among them.
        folder = os.path.join(fixtures, "sharded")
        got = [(f.get("path"), f.get("size")) for f in summary.get("files", [])]
        wrong = [(p, n) for p, n in got if not os.path.isfile(os.path.join(folder, p or "?"))
                 or os.path.getsize(os.path.join(folder, p)) != n]
        shards = {f for f in os.listdir(folder) if f.endswith(".safetensors")}
        tap.ok(summary.get("source") == src and not wrong and len(shards) == 3 and
               shards <= {p for p, _ in got},
               "summary.json names the URL and every shard with its size",
               [json.dumps(summary)[:400], wrong, sorted(shards)])
        names = [n for n in os.listdir(mnt) if not n.startswith(".")]
        tap.ok(bool(names), "tree is not empty")
        # A tensor read twice: the second read comes from the block cache.
        tensors = [l.split("\t")[0] for l in read_bytes(
            os.path.join(mnt, ".ckptfs", "tensors.tsv")).decode().splitlines()[1:]]
        stats0 = read_json(os.path.join(mnt, ".ckptfs", "cache.json"))
        n0 = len(server.requests())
        first = read_bytes(os.path.join(mnt, *tensors[0].split(".")))
        n1 = len(server.requests())
        stats1 = read_json(os.path.join(mnt, ".ckptfs", "cache.json"))
        tap.ok(n1 == n0 and stats1["block_hits"] > stats0["block_hits"],
               "reading a tensor of a cached block makes no request", [n0, n1, stats0, stats1])
        tap.ok(stats1["bytes_fetched"] > 0 and stats1["requests"] >= 4 and len(first) > 0,
               ".ckptfs/cache.json counts requests and bytes fetched", [stats1])
        # Its size in stat is the size of what a read gives (counters may move in between:
        # a prefetch still landing; three tries).
        live = os.path.join(mnt, ".ckptfs", "cache.json")
        seen = []
        for _ in range(3):
            before_size = os.stat(live).st_size
            text = read_bytes(live)
            seen.append((before_size, len(text), os.stat(live).st_size))
            if before_size == len(text) == seen[-1][2]:
                break
        tap.ok(seen[-1][0] == seen[-1][1] == seen[-1][2] > 0,
               "stat of .ckptfs/cache.json gives the size a read gives (not 0)", seen)

    mounted(tap, ckptfs, src, "sharded over http", sharded_checks)

    # Secrets in a URL never show: not in documents, sidecars or messages.
    secret_url = url.replace("http://", "http://user:s3cr3tpass@") + \
        "/dtypes/model.safetensors?X-Sig=t0psecret"

    def secret_checks(mnt):
        blob = b"".join(tree_bytes(mnt).values())
        tap.ok(b"s3cr3tpass" not in blob and b"t0psecret" not in blob,
               "user:password@ and ?query appear in no file of the mount")
        tap.ok(b"127.0.0.1:%d/dtypes/model.safetensors" % server.port in blob,
               "the mount names the URL without them")

    mounted(tap, ckptfs, secret_url, "URL with credentials", secret_checks)
    rc, out, err = run_capture([ckptfs, "info", url.replace("http://", "http://u:s3cr3tpass@")
                                + "/nope.safetensors?sig=t0psecret"], CLI_TIMEOUT)
    tap.ok(rc == 2 and b"404" in err and b"s3cr3tpass" not in err and b"t0psecret" not in err
           and err.count(b"\n") == 1, "404: one line naming the URL without secrets, exit 2",
           [rc, err])
    mnt = tempfile.mkdtemp(prefix="ckptfs-t46.")
    rc, out, err = run_capture([ckptfs, url + "/missing/model.safetensors", mnt], CLI_TIMEOUT)
    os.rmdir(mnt)
    tap.ok(rc == 2 and b"/missing/model.safetensors" in err and b"not found" in err,
           "mount of a missing URL exits 2 naming it", [rc, err])


def main():
    started = start()
    if not started:
        return 0
    tap, ckptfs, fixtures = started
    reason = remote_servers.nginx_skip_reason()
    if reason:
        tap.skip_unless_ci("remote http tests", reason)
        return finish(tap)
    served = remote_layouts.served_root(fixtures)
    try:
        with remote_servers.Nginx(served) as server:
            body(tap, ckptfs, fixtures, served, server)
    finally:
        shutil.rmtree(served)
    return finish(tap)


if __name__ == "__main__":
    sys.exit(main())
