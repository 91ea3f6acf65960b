#!/usr/bin/python3
"""Staging round trips into every format ckptfs writes, and the writer's directory guard.

Environment: CKPTFS, FIXTURES (tests/gen wrote sharded/, an HF folder with a manifest).

1. For each OUT the writer table (core/write/writer.c) can write — .safetensors, an HF directory
   (shards of a small max_shard_size), .gguf, .bpk, .gptrsten from FIXTURES/sharded (BF16),
   .lwt from lwt/natural (LWT holds F32 only), .gptrs from gptrs/chk-python (a checkpoint
   with its config), and the .zst form of each single file — `ckptfs stage OUT MNT --from
   SOURCE`, the manifest's first tensor rewritten, its last removed (of those with bytes),
   one added, `ckptfs commit`. OUT is read by the independent readers of
   tests/lib/readers (GGUF, Burnpack, LWT, gpt-rs) or the strict safetensors reader of
   tests/lib/staging.py, after `zstd -dc` for .zst: it holds exactly the generator manifest's
   tensors minus the removed one plus the added one; the tensors nobody touched have the
   manifest's sha256, the other two the bytes written.
2. An HF directory OUT made of packs: each shard is a file of the spool (written once, its
   header padded to the reserved 1 MiB), no shard holds more than max_shard_size unless it is
   one tensor, a tensor that crossed the limit went to another shard; config.json written into
   the stage goes along. A second commit (one removed, one added) links the shards nobody
   changed again (same inodes) and compacts the one with the hole; after the unmount the
   spool is gone and OUT stands alone.
3. The writer's guard (core/write/writers/safetensors_dir.c): a stage of DIR/ --from
   DIR/model.safetensors (not OUT itself, so the stage does not own it) is refused at the
   commit, naming the file, DIR untouched; a stage of DIR/ --from DIR/ (its own commits)
   commits twice.
4. The stage's loop has one thread by default and a commit runs on a thread of its own:
   during a commit of a 256 MiB source to .gguf.zst, .ckptfs/status says "committing" and a
   listing of the mount answers at once.
"""

import hashlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "lib", "readers"))
import burnpack_reader  # noqa: E402
import gguf_reader  # noqa: E402
import gptrs_reader  # noqa: E402
import lwt_reader  # noqa: E402
from ckptfs_test import Watchdog, run_cases  # noqa: E402
from staging import (RESERVED, StageSession, put, remove, rnd, spool_inodes,  # noqa: E402
                     strict_read, strict_read_dir, write_st)

CKPTFS = os.environ.get("CKPTFS")
FIXTURES = os.environ.get("FIXTURES")
CHECK_TIMEOUT = 120
ADDED = "extra.bias"


def sha(b):
    return hashlib.sha256(b).hexdigest()


def read_out(out, ext):
    """{name: sha256} of OUT read without ckptfs."""
    if ext.endswith(".zst"):
        plain = out + ".plain"
        with open(plain, "wb") as f:
            if subprocess.run(["zstd", "-dc", out], stdout=f).returncode != 0:
                raise ValueError("zstd -dc failed")
        try:
            return read_out(plain, ext[:-4])
        finally:
            os.unlink(plain)
    if ext == "/":
        return {k: sha(v) for k, v in strict_read_dir(out)[0].items()}
    if ext == ".safetensors":
        return {k: sha(v[2]) for k, v in strict_read(out)[0].items()}
    if ext == ".gguf":
        g = gguf_reader.read(out)
        return {t.name: sha(g.tensor_bytes(t)) for t in g.tensors}
    if ext == ".lwt":
        f = lwt_reader.read(out)
        return {t.name: sha(f.tensor_bytes(t)) for t in f.tensors}
    if ext == ".bpk":
        b = burnpack_reader.read(out)
        return {t.name: sha(b.data(t)) for t in b.tensors}
    if ext in (".gptrsten", ".gptrs"):
        g = gptrs_reader.read(out)
        return {t.name: sha(g.tensor_bytes(t)) for t in g.tensors}
    raise ValueError("no reader for %s" % ext)


CASES = [(ext, "sharded", "") for ext in ("/", ".safetensors", ".safetensors.zst", ".gguf",
                                           ".gguf.zst", ".bpk", ".bpk.zst", ".gptrsten",
                                           ".gptrsten.zst")]
CASES += [(ext, "lwt/natural", "model.lwt") for ext in (".lwt", ".lwt.zst")]  # F32 only
CASES += [(ext, "gptrs/chk-python", "model.bin") for ext in (".gptrs", ".gptrs.zst")]


def round_trip(tap, work, ext, fixture, member):
    src = os.path.join(FIXTURES, fixture, member) if member else os.path.join(FIXTURES, fixture)
    with open(os.path.join(FIXTURES, fixture, "manifest.json")) as f:
        manifest = json.load(f)["tensors"]
    by_name = {t["name"]: t for t in manifest}
    nonempty = [t for t in manifest if t["nbytes"]]
    rewritten = nonempty[0]
    removed = nonempty[-1]["name"]
    new_bytes = rnd(rewritten["nbytes"], 80)
    added = rnd(64, 81)
    want = {t["name"]: t["sha256"] for t in manifest if t["name"] != removed}
    want[rewritten["name"]] = sha(new_bytes)
    want[ADDED] = sha(added)
    out = os.path.join(work, "rt-%s%s" % (fixture.replace("/", "-"), ext)
                       if ext != "/" else "rt-dir/")
    extra = ("-o", "max_shard_size=2KiB") if ext == "/" else ()
    what = "%s into %s" % (fixture, "an HF directory" if ext == "/" else ext)
    s = StageSession(CKPTFS, out, "--from", src, *extra, prefix="ckptfs-t80.")
    if not tap.ok(s.ok, "%s: stage --from %s" % (what, fixture), [s.err]):
        return
    try:
        with Watchdog(s.mnt, CHECK_TIMEOUT):
            with open(s.path(rewritten["path"]), "r+b") as f:
                f.write(new_bytes)
            remove(s.mnt, by_name[removed]["path"])
            put(s.mnt, ADDED.replace(".", "/"), added)
            rc, text = s.commit()
        tap.ok(rc == 0, "%s: commit" % what, [text])
    finally:
        s.close()
    try:
        got = read_out(out.rstrip("/"), ext)
    except Exception as e:  # any reader's refusal is the finding
        tap.ok(False, "%s: OUT read by the independent reader" % what, [repr(e)])
        return
    problems = ["missing " + k for k in sorted(set(want) - set(got))]
    problems += ["unexpected " + k for k in sorted(set(got) - set(want))]
    problems += ["differs: " + k for k in sorted(set(want) & set(got)) if want[k] != got[k]]
    tap.ok(not problems, "%s: OUT holds the manifest's tensors byte for byte, one rewritten, "
           "one removed, one added (%d)" % (what, len(want)), problems[:10])


def round_trips(tap, work):
    for ext, fixture, member in CASES:
        round_trip(tap, work, ext, fixture, member)


def spool_files(out):
    return spool_inodes(out)


def hf_directory(tap, work):
    out = os.path.join(work, "packed")
    limit = 8 << 20
    s = StageSession(CKPTFS, out + "/", "-o", "max_shard_size=%d" % limit, prefix="ckptfs-t80.")
    if not tap.ok(s.ok, "packed directory: stage", [s.err]):
        return
    want = {"w%d" % i: rnd(3 << 20, 90 + i) for i in range(5)}
    config = b'{"model_type": "test"}\n'
    try:
        with Watchdog(s.mnt, CHECK_TIMEOUT):
            for k, v in want.items():
                put(s.mnt, k, v)
            with open(s.path("config.json"), "wb") as f:
                f.write(config)
            rc, text = s.commit()
        tap.ok(rc == 0, "packed directory: first commit", [text])
        try:
            got, sizes = strict_read_dir(out)
        except (OSError, ValueError) as e:
            got, sizes = {}, {}
            tap.ok(False, "packed directory: OUT read strictly", [str(e)])
        tap.ok(got == want, "packed directory: the shards and the index hold the 5 tensors",
               [sorted(got)])
        over = [k for k, v in sizes.items() if v > limit]
        tap.ok(len(sizes) == 3 and not over,
               "packed directory: 15 MiB in 3 shards of at most 8 MiB (the tensor that "
               "crossed the limit moved on)", [sizes])
        inodes = spool_files(out + "/")
        shard_ino = {k: os.stat(os.path.join(out, k)).st_ino for k in sizes}
        tap.ok(shard_ino and all(i in inodes for i in shard_ino.values()),
               "packed directory: every shard is a file of the spool, written once",
               [shard_ino, sorted(inodes)])
        heads = []
        for k in sizes:
            with open(os.path.join(out, k), "rb") as f:
                heads.append(int.from_bytes(f.read(8), "little"))
        tap.ok(heads and all(h == RESERVED - 8 for h in heads),
               "packed directory: each shard's header fills the reserved 1 MiB", [heads])
        with open(os.path.join(out, "config.json"), "rb") as f:
            tap.ok(f.read() == config, "packed directory: config.json went along")

        with Watchdog(s.mnt, CHECK_TIMEOUT):
            # w0 sits in the first pack with w1: that pack gets a hole
            remove(s.mnt, "w0")
            del want["w0"]
            want["n"] = rnd(1 << 20, 99)
            put(s.mnt, "n", want["n"])
            rc, text = s.commit()
        tap.ok(rc == 0, "packed directory: second commit (one removed, one added)", [text])
        try:
            got, sizes2 = strict_read_dir(out)
        except (OSError, ValueError) as e:
            got, sizes2 = {}, {}
            tap.ok(False, "packed directory: OUT read strictly after the second commit", [str(e)])
        tap.ok(got == want, "packed directory: the second commit's tensors", [sorted(got)])
        index = json.load(open(os.path.join(out, "model.safetensors.index.json")))["weight_map"]
        again = {os.stat(os.path.join(out, index[k])).st_ino for k in ("w2", "w3", "w4")}
        tap.ok(again <= set(shard_ino.values()),
               "packed directory: the shards nobody changed are the same files (linked again)",
               [again, shard_ino])
        over = [k for k, v in sizes2.items() if v > limit]
        tap.ok(not over, "packed directory: still no shard over the limit", [sizes2])
    finally:
        s.close()
    try:
        got, sizes = strict_read_dir(out)
    except (OSError, ValueError):
        got, sizes = {}, {}
    links = [os.stat(os.path.join(out, k)).st_nlink for k in sizes]
    tap.ok(got == want and not os.path.exists(s.spool) and links and set(links) == {1},
           "packed directory: after the unmount the spool is gone and OUT stands alone",
           [links, os.path.exists(s.spool)])


def guard(tap, work):
    d = os.path.join(work, "guarded")
    os.mkdir(d)
    model = os.path.join(d, "model.safetensors")
    raw = rnd(64, 70)
    write_st(model, {"a": ("F32", [16], raw)})
    before = (os.stat(model).st_ino, sha(open(model, "rb").read()))
    s = StageSession(CKPTFS, d + "/", "--from", model, prefix="ckptfs-t80.")
    if tap.ok(s.ok, "guard: stage DIR/ --from DIR/model.safetensors", [s.err]):
        try:
            with Watchdog(s.mnt, CHECK_TIMEOUT):
                put(s.mnt, "b", rnd(32, 71))
                rc, text = s.commit()
            tap.ok(rc != 0 and "model.safetensors" in text and "write elsewhere" in text,
                   "guard: the commit is refused, naming the source file inside OUT", [rc, text])
            after = (os.stat(model).st_ino, sha(open(model, "rb").read()))
            tap.ok(after == before and sorted(os.listdir(d)) == ["model.safetensors"],
                   "guard: DIR untouched", [os.listdir(d)])
        finally:
            s.kill()  # the commit on unmount would be refused the same way
    own = os.path.join(work, "own")
    os.mkdir(own)
    write_st(os.path.join(own, "model.safetensors"), {"a": ("F32", [16], raw)})
    s = StageSession(CKPTFS, own + "/", "--from", own + "/", prefix="ckptfs-t80.")
    if tap.ok(s.ok, "own source: stage DIR/ --from DIR/", [s.err]):
        try:
            with Watchdog(s.mnt, CHECK_TIMEOUT):
                b, c = rnd(32, 72), rnd(48, 73)
                put(s.mnt, "b", b)
                rc1, t1 = s.commit()
                put(s.mnt, "c", c)
                rc2, t2 = s.commit()
            try:
                got = strict_read_dir(own)[0]
            except (OSError, ValueError) as e:
                got = {"error": str(e)}
            tap.ok(rc1 == 0 and rc2 == 0 and got == {"a": raw, "b": b, "c": c},
                   "own source: two commits into the directory the stage came from",
                   [t1, t2, sorted(got)])
        finally:
            s.close()


def answers_during_commit(tap, work):
    """One loop thread by default; the commit runs on its own, so status and lookups answer
    while it works (a 256 MiB source written as .gguf.zst takes a while)."""
    src = os.path.join(work, "big.safetensors")
    n = 256 << 20
    head = json.dumps({"big": {"dtype": "I8", "shape": [n], "data_offsets": [0, n]}}).encode()
    head += b" " * (-len(head) % 8)
    with open(src, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        for _ in range(n >> 24):
            f.write(os.urandom(1 << 24))  # incompressible: zstd takes its time
    out = os.path.join(work, "slow.gguf.zst")
    s = StageSession(CKPTFS, out, "--from", src, prefix="ckptfs-t80.")
    if not tap.ok(s.ok, "during a commit: stage --from a 256 MiB source", [s.err]):
        return
    seen, slow = [], []
    try:
        with Watchdog(s.mnt, CHECK_TIMEOUT):
            put(s.mnt, "small", rnd(64, 101))
            client = subprocess.Popen([CKPTFS, "commit", s.mnt], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT)
            while client.poll() is None:
                t0 = time.time()
                with open(s.path(".ckptfs/status")) as f:
                    state = json.load(f)["state"]
                os.listdir(s.mnt)
                took = time.time() - t0
                seen.append(state)
                if took > 1.0:
                    slow.append(round(took, 2))
                time.sleep(0.02)
            text = client.stdout.read().decode(errors="replace")
        tap.ok(client.returncode == 0, "during a commit: the commit succeeds", [text])
        tap.ok("committing" in seen and not slow,
               "during a commit: .ckptfs/status and a listing answer at once, the status says "
               "committing (%d reads)" % len(seen), [sorted(set(seen)), slow])
    finally:
        s.close()


def main():
    return run_cases("ckptfs-t80w.", round_trips, hf_directory, guard, answers_during_commit)


if __name__ == "__main__":
    sys.exit(main())
