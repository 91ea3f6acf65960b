"""Remote mount == local mount, file by file: what tests/t/46..48 share.

A file that cannot be read (a tensor with a hole gives EIO) is recorded by its errno, so both
mounts must fail it alike. .ckptfs/cache.json exists only in remote mounts (live counters).
Equal mounts could still be equally wrong, so each remote mount is also held to its fixture's
manifest.json (what the generator wrote, not what ckptfs read): every tensor the manifest lists
with a tree path and a sha256 is a readable file of the remote mount with those bytes."""

import hashlib
import json
import os

from mount_checks import mounted, read_bytes
import remote_fixtures

LIVE = os.path.join(".ckptfs", "cache.json")


class Quiet:
    """Collects what a helper mount reports, so only the comparisons are TAP lines."""

    def __init__(self):
        self.failures = []

    def ok(self, cond, desc, diag=()):
        if not cond:
            self.failures.append("%s: %s" % (desc, " ".join(str(d) for d in diag)))
        return cond

    def diag(self, text):
        pass


def snapshot(ckptfs, src, rename=(), options=(), also=None):
    """({relative path: bytes or "errno N"}, [failures]) of a mount of src; also(mnt), when
    given, runs first on the same mount (its TAP lines are its own)."""
    got, q = {}, Quiet()

    def take(mnt):
        if also:
            also(mnt)
        for dirpath, _, files in os.walk(mnt):
            for name in files:
                full = os.path.join(dirpath, name)
                try:
                    data = read_bytes(full)
                except OSError as e:
                    data = "errno %d" % e.errno
                if isinstance(data, bytes) and name.endswith((".json", ".tsv")):
                    for old, new in rename:
                        data = data.replace(old.encode(), new.encode())
                got[os.path.relpath(full, mnt)] = data

    mounted(q, ckptfs, src, src, take, options=list(options))
    return got, q.failures


def compare(tap, label, local, remote):
    remote = dict(remote)
    live = remote.pop(LIVE, None)
    problems = [] if live is not None else ["no %s in the remote mount" % LIVE]
    for k in sorted(set(local) | set(remote)):
        if k not in remote:
            problems.append("missing remotely: " + k)
        elif k not in local:
            problems.append("only remotely: " + k)
        elif local[k] != remote[k]:
            problems.append("differs: %s (%d vs %d bytes)" % (k, len(local[k]), len(remote[k])))
    return tap.ok(not problems and local, "%s: remote mount equals local mount (%d files)"
                  % (label, len(local)), problems[:10])


def manifest_of(fixtures, rel):
    """The generator's manifest.json for a fixture source (beside a file, in a directory)."""
    path = os.path.join(fixtures, rel)
    for d in (path, os.path.dirname(path)):
        m = os.path.join(d, "manifest.json")
        if os.path.isdir(d) and os.path.isfile(m):
            with open(m) as f:
                return json.load(f)
    return None


def manifest_problems(manifest, remote):
    """[] when every tensor of the manifest with a path and a sha256 reads so remotely."""
    problems = []
    tensors = manifest.get("tensors") if isinstance(manifest, dict) else None
    for t in tensors if isinstance(tensors, list) else []:
        if not isinstance(t, dict) or not t.get("path") or not t.get("sha256"):
            continue
        got = remote.get(t["path"])
        if not isinstance(got, bytes):
            problems.append("%s: %s" % (t["path"], got or "missing"))
        elif hashlib.sha256(got).hexdigest() != t["sha256"]:
            problems.append("%s: other bytes than the generator wrote" % t["path"])
    return problems


def compare_all(tap, ckptfs, fixtures, url_of, options=()):
    """Every fixture source, mounted locally and at url_of(relative path)."""
    sources = remote_fixtures.fixture_sources(fixtures)
    tap.ok(len(sources) >= 60, "fixture manifests name %d sources" % len(sources))
    for rel in sources:
        local_path = os.path.realpath(os.path.join(fixtures, rel))
        url = url_of(rel)
        local, f1 = snapshot(ckptfs, local_path, rename=((local_path, url),))
        remote, f2 = snapshot(ckptfs, url, options=options)
        if f1 or f2:
            tap.ok(False, "%s: both mounts work" % rel, f1 + f2)
            continue
        compare(tap, rel, local, remote)
        manifest = manifest_of(fixtures, rel)
        listed = [t for t in (manifest or {}).get("tensors", []) or []
                  if isinstance(t, dict) and t.get("path") and t.get("sha256")] \
            if isinstance(manifest, dict) else []
        if listed:
            problems = manifest_problems(manifest, remote)
            tap.ok(not problems, "%s: the remote mount's %d tensors are the generator's bytes"
                   % (rel, len(listed)), problems[:10])
    return sources


def snapshot_of(mnt):
    """{relative path: bytes} of a mounted tree (unreadable files left out)."""
    out = {}
    for dirpath, _, files in os.walk(mnt):
        for name in files:
            full = os.path.join(dirpath, name)
            try:
                out[os.path.relpath(full, mnt)] = read_bytes(full)
            except OSError:
                pass
    return out
