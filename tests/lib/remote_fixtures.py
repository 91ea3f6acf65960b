"""The fixtures a remote test mounts: every source named by a manifest.json under FIXTURES
(the hostile trees aside: those are refused, locally and remotely alike), as paths relative
to FIXTURES so a server rooted there serves each at the same relative URL."""

import json
import os

SKIP_DIRS = ("hostile", "torch_hostile")


def fixture_sources(root):
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        if "manifest.json" not in filenames:
            continue
        with open(os.path.join(dirpath, "manifest.json")) as f:
            m = json.load(f)
        cands = []
        if isinstance(m, dict):
            for key in ("source", "sources"):
                v = m.get(key)
                for s in (v if isinstance(v, list) else [v]):
                    if isinstance(s, dict):
                        s = s.get("file") or s.get("path") or s.get("source")
                    if isinstance(s, str):
                        cands.append(os.path.normpath(os.path.join(dirpath, s)))
        if not cands:
            cands = [dirpath] + [os.path.join(dirpath, n) for n in sorted(filenames)
                                 if n != "manifest.json"]
        for c in cands:
            rel = os.path.relpath(c, root)
            if not rel.startswith("..") and os.path.exists(c):
                out.add(rel)
    return sorted(out)
