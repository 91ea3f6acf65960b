"""The layout fixtures over a remote kind (tests/t/46..48): tar archives and .nemo files, HF cache
repo folders (refs/ + snapshots/, with -o revision=), .bin repos, folders of checkpoints and
split GGUF parts (FIXTURES/layouts, the cases of tests/t/65-68), Meta model-parallel and
DeepSpeed ZeRO folders (tests/fixtures/meta_mp and deepspeed, tests/t/150-meta-mp and 79).

A server serves served_root(FIXTURES): FIXTURES itself (links to its entries, so every other
fixture keeps its relative URL) plus committed/meta_mp and committed/deepspeed. Each case is
mounted from its URL once: the checks of its local test run on that mount (manifest sha256s,
sidecars, summary, HF view; the tar checks read the archive's offsets with Python's tarfile),
and the whole tree must equal a local mount's, file by file (the root renamed to the URL)."""

import os
import tempfile

import committed_checks
import hostile
import layout_checks
import remote_compare
from ckptfs_test import run_capture
from mount_checks import read_json

HERE = os.path.dirname(os.path.realpath(__file__))
COMMITTED = os.path.realpath(os.path.join(HERE, "..", "fixtures"))
COMMITTED_LAYOUTS = ("meta_mp", "deepspeed")


def served_root(fixtures):
    """A folder of links: every entry of FIXTURES, and committed/{meta_mp,deepspeed}."""
    root = tempfile.mkdtemp(prefix="ckptfs-served.")
    for name in sorted(os.listdir(fixtures)):
        os.symlink(os.path.join(os.path.realpath(fixtures), name), os.path.join(root, name))
    os.mkdir(os.path.join(root, "committed"))
    for name in COMMITTED_LAYOUTS:
        os.symlink(os.path.join(COMMITTED, name), os.path.join(root, "committed", name))
    return root


def cases(tap, served):
    """[(label, path relative to served, mount options, checks(mnt))] of every layout case."""
    out = []
    layouts = os.path.join(served, "layouts")
    for case in read_json(os.path.join(layouts, "cases.json")):
        mine = dict(case, name="remote " + case["name"])
        opts = ["-o", case["options"]] if case["options"] else []
        out.append((case["name"], "layouts/" + case["src"], opts,
                    layout_checks.case_checks(tap, mine, layouts)))
    for name, case in sorted(read_json(os.path.join(COMMITTED, "meta_mp", "manifest.json"))
                             ["cases"].items()):
        out.append(("meta_mp " + name, "committed/meta_mp/" + name, [],
                    committed_checks.meta_mp_checks(tap, "remote " + name, case)))
    for name, case in sorted(read_json(os.path.join(COMMITTED, "deepspeed", "manifest.json"))
                             ["cases"].items()):
        src = os.path.join(COMMITTED, "deepspeed", name)
        out.append(("deepspeed " + name, "committed/deepspeed/" + name, [],
                    committed_checks.deepspeed_checks(tap, "remote " + name, case, src)))
    return out


def upload_rels(served):
    """What an object store needs to hold for cases(): the folders and archives, by path."""
    rels = ["committed/" + n for n in COMMITTED_LAYOUTS] + ["layouts/hostile"]
    for case in read_json(os.path.join(served, "layouts", "cases.json")):
        rels.append("layouts/" + case["src"])
    return sorted(set(rels))


def compare_layouts(tap, ckptfs, served, url_of, repo_of=None):
    """Every layout case mounted from url_of(relative path): its own checks on that mount, and
    the mount equal to the local one. repo_of(rel) names what the root shows when it differs
    from the URL asked for (hf:// names are pinned to a commit)."""
    found = cases(tap, served)
    tap.ok(len(found) >= 25, "%d layout cases (tar/.nemo, HF cache, .bin, folders, split GGUF, "
           "Meta MP, DeepSpeed)" % len(found))
    for label, rel, opts, checks in found:
        local_root = os.path.realpath(os.path.join(served, rel))
        url = url_of(rel)
        shown = repo_of(rel) if repo_of else url
        local, f1 = remote_compare.snapshot(ckptfs, local_root, rename=((local_root, shown),),
                                            options=opts)
        remote, f2 = remote_compare.snapshot(ckptfs, url, options=opts, also=checks)
        if f1 or f2:
            tap.ok(False, "%s: both mounts work" % label, f1 + f2)
            continue
        remote_compare.compare(tap, "%s (%s)" % (label, rel), local, remote)
    return found



def hostile_cases(served):
    """[(label, path relative to served, mount options, needle)] of the hostile layout inputs:
    FIXTURES/layouts/hostile/cases.tsv (hostile.py's needle syntax) and the committed
    fixtures' hostile folders (every word of the manifest's "error")."""
    out = []
    hdir = os.path.join(served, "layouts", "hostile")
    for row in hostile.read_cases(os.path.join(hdir, "cases.tsv")):
        if row["expect"] == "refuse":
            opts = ["-o", row["options"]] if row["options"] else []
            out.append((row["path"], "layouts/hostile/" + row["path"], opts, row["needle"]))
    for layout in COMMITTED_LAYOUTS:
        manifest = read_json(os.path.join(COMMITTED, layout, "manifest.json"))
        for name, h in sorted(manifest["hostile"].items()):
            out.append(("%s %s" % (layout, name), "committed/%s/hostile/%s" % (layout, name), [],
                        "&".join(h["error"])))
    return out


def check_hostile(tap, ckptfs, served, url_of):
    """Each hostile layout input, opened from its URL, is refused as it is locally: exit 2 and
    one line holding the needle."""
    problems = []
    found = hostile_cases(served)
    for label, rel, opts, needle in found:
        rc, _, err = run_capture([ckptfs, "info", url_of(rel)] + opts, 60)
        text = err.decode("utf-8", "replace")
        if rc != hostile.EXIT_SOURCE or text.count("\n") != 1 or not \
                hostile.needle_matches(needle, text):
            problems.append("%s: exit %r, stderr %r, want %r" % (label, rc, text.strip(), needle))
    tap.ok(len(found) >= 25 and not problems,
           "%d hostile layout inputs refused from URLs as they are locally" % len(found),
           problems)
