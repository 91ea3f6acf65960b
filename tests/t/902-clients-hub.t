#!/usr/bin/python3
"""huggingface_hub (2.4, the pinned client venv) against `ckptfs serve`.

Environment: CKPTFS; CLIENTS_PY (build/clients-venv/bin/python): the test re-execs itself with
it and fails naming the client if huggingface_hub, safetensors or transformers do not import.

Served: a tiny Llama saved by transformers (one file, and with --max-shard-size so the view is
shards + index) and a committed torch-written DCP fixture. The repo ids are the ones serve
gives today, ckptfs/NAME (serving under org/name ids is issue 28 item 5).
  - HfApi.model_info (with files_metadata) and list_repo_files: the id, a 40-hex sha, the
    siblings are the files of the mount's HF view with their sizes, list_repo_files is those
    (the recursive listing shows tensors/ as a directory only), list_repo_tree of tensors/
    is the mount's tree; at revision=sha the same.
  - hf_hub_download of the view's files and of a raw tensor under tensors/: the bytes of the
    mount's files; the tensors of model.safetensors equal the original's (safetensors).
  - snapshot_download into a cache_dir: the view's files only, the model once (2.x lists a
    snapshot with the recursive tree, which holds tensors/ as a directory); with
    ignore_patterns=tensors/* the same view files, in a cache folder (snapshots/SHA, blobs) that ckptfs mounts, its HF view
    equal to the served files byte for byte. One cache serves both servers of a source (one
    file, shards), as a user's cache does: their commits must differ.
  - HfFileSystem: ls, info sizes and a ranged read.
  - the `hf download --exclude 'tensors/*'` command with HF_ENDPOINT: exit 0, the snapshot it
    names holds the served view.
  - with --token-file: model_info without the token fails with 401, with it succeeds.
"""

import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
import clients_env as ce  # noqa: E402

HERE = os.path.dirname(os.path.realpath(__file__))
CASE_SECONDS = 120


def files_under(top, skip_ckptfs):
    """relative path -> absolute path of every file under top."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        if skip_ckptfs and dirpath == top:
            dirnames[:] = [d for d in dirnames if d != ".ckptfs"]
        for fn in filenames:
            p = os.path.join(dirpath, fn)
            out[os.path.relpath(p, top)] = p
    return out


def read(p):
    with open(p, "rb") as f:
        return f.read()


def expected_repo(tap, ckptfs, src, label, shard_opt):
    """From mounts of src: the HF view's files and the tensors/ tree serve must show."""
    want = {"view": {}, "tree": {}}
    opts = ["-o", "view=hf" + (",max_shard_size=" + shard_opt if shard_opt else "")]
    mnt = ce.mount(tap, ckptfs, src, label + " (view=hf)", opts)
    if mnt:
        want["view"] = {r: read(p) for r, p in files_under(mnt, True).items()}
        ce.release(tap, mnt, label)
    mnt = ce.mount(tap, ckptfs, src, label + " (tree)")
    if mnt:
        tree = files_under(mnt, True)
        for r in (".ckptfs/summary.json", ".ckptfs/metadata.json", ".ckptfs/tensors.tsv"):
            if os.path.exists(os.path.join(mnt, r)):
                tree[r] = os.path.join(mnt, r)
        # Serve's tensors/ is the tree without the .npy files (ckptfs(1), SERVING).
        want["tree"] = {"tensors/" + r: read(p) for r, p in tree.items()
                        if not r.endswith(".npy")}
        ce.release(tap, mnt, label)
    return want


def check_api(tap, srv, repo, want):
    from huggingface_hub import HfApi
    api = HfApi(endpoint=srv.url, token=False)
    info = api.model_info(repo, files_metadata=True)
    tap.ok(info.id == repo and isinstance(info.sha, str) and len(info.sha) == 40 and
           all(c in "0123456789abcdef" for c in info.sha),
           "%s: HfApi.model_info: id and a commit sha" % repo, [info.id, info.sha])
    sib = {s.rfilename: s.size for s in info.siblings}
    exp = {r: len(b) for r, b in want["view"].items()}
    tap.ok(sib == exp, "%s: model_info's siblings are the HF view's %d files with their sizes"
           % (repo, len(exp)), ["got %s" % sorted(sib.items()), "want %s" % sorted(exp.items())])
    files = set(api.list_repo_files(repo))
    exp_files = set(want["view"])
    tap.ok(files == exp_files, "%s: list_repo_files = the view's %d files, tensors/ not pulled "
           "in" % (repo, len(exp_files)), ["extra %s" % sorted(files - exp_files)[:8],
                                          "missing %s" % sorted(exp_files - files)[:8]])
    tree = {e.path for e in api.list_repo_tree(repo, path_in_repo="tensors", recursive=True)
            if getattr(e, "size", None) is not None and not hasattr(e, "tree_id")}
    tap.ok(tree == set(want["tree"]), "%s: list_repo_tree of tensors/ lists the mount's tree "
           "(%d files)" % (repo, len(want["tree"])), ["extra %s" % sorted(tree - set(want["tree"]))[:8],
                                                       "missing %s" % sorted(set(want["tree"]) - tree)[:8]])
    pinned = api.model_info(repo, revision=info.sha)
    tap.ok(pinned.sha == info.sha and {s.rfilename for s in pinned.siblings} == set(sib),
           "%s: model_info at revision=sha is the same commit" % repo)
    return info.sha


def check_downloads(tap, srv, repo, want, work, commit, orig_file=None):
    from huggingface_hub import hf_hub_download
    cache = os.path.join(work, "dl-" + repo.replace("/", "-"))
    problems = []
    for rel, data in sorted(want["view"].items()):
        p = hf_hub_download(repo, rel, cache_dir=cache, endpoint=srv.url, token=False)
        if read(p) != data:
            problems.append("%s: %d bytes, differ" % (rel, os.path.getsize(p)))
    raw = sorted(r for r in want["tree"] if not r.endswith(".json") and "/.ckptfs/" not in r)
    if raw:
        p = hf_hub_download(repo, raw[0], cache_dir=cache, endpoint=srv.url, token=False,
                            revision=commit)
        if read(p) != want["tree"][raw[0]]:
            problems.append("%s (raw tensor, revision=sha) differs" % raw[0])
    tap.ok(not problems, "%s: hf_hub_download of the %d view files and a raw tensor: the "
           "mount's bytes" % (repo, len(want["view"])), problems)
    if orig_file:
        from safetensors.numpy import load_file
        got = load_file(hf_hub_download(repo, "model.safetensors", cache_dir=cache,
                                        endpoint=srv.url, token=False))
        ref = load_file(orig_file)
        bad = [k for k in ref if k not in got or got[k].tobytes() != ref[k].tobytes()]
        tap.ok(not bad and set(got) == set(ref), "%s: the downloaded model.safetensors holds "
               "the original's %d tensors" % (repo, len(ref)), bad[:5])


def check_snapshot(tap, ckptfs, srv, repo, want, work, shard):
    """One cache for every server of the test, as a user's ~/.cache/huggingface is: a server
    with other files must give another commit, or the client's cached listing is stale."""
    from huggingface_hub import snapshot_download
    cache = os.path.join(work, "snap-" + repo.replace("/", "-"))
    # huggingface_hub 2.x lists a snapshot with the recursive tree API, not the siblings: serve's
    # recursive listing holds tensors/ as a directory only, so the model is fetched once.
    snap = snapshot_download(repo, cache_dir=cache, endpoint=srv.url, token=False)
    got = {r: read(p) for r, p in files_under(snap, False).items()}
    exp = dict(want["view"])
    bad = sorted(r for r in set(got) | set(exp) if got.get(r) != exp.get(r))
    tap.ok(not bad, "%s: snapshot_download writes the view's %d files, the model once, with "
           "the served bytes" % (repo, len(exp)), bad[:8])
    cache = os.path.join(work, "snap-view-" + repo.replace("/", "-"))
    snap = snapshot_download(repo, cache_dir=cache, endpoint=srv.url, token=False,
                             ignore_patterns=["tensors/*"])
    folder = os.path.join(cache, "models--" + repo.replace("/", "--"))
    got = {r: read(p) for r, p in files_under(snap, False).items()}
    tap.ok(got == want["view"] and os.path.isdir(os.path.join(folder, "blobs")),
           "%s: snapshot_download(ignore_patterns=tensors/*) writes the view's files into a "
           "cache folder" % repo, [sorted(got), sorted(want["view"])])
    # Mounted with the server's shard size, the view must be the served files again.
    mnt = ce.mount(tap, ckptfs, folder, repo + " cache folder",
                   ["-o", "view=hf" + (",max_shard_size=" + shard if shard else "")])
    if mnt:
        view = {r: read(p) for r, p in files_under(mnt, True).items()}
        bad = sorted(r for r in set(view) | set(want["view"])
                     if view.get(r) != want["view"].get(r))
        tap.ok(not bad, "%s: ckptfs mounts the cache huggingface_hub wrote; its HF view is "
               "the served files byte for byte" % repo, bad[:8])
        ce.release(tap, mnt, repo)


def check_hffs(tap, srv, repo, want):
    from huggingface_hub import HfFileSystem
    fs = HfFileSystem(endpoint=srv.url, token=False, skip_instance_cache=True)
    listed = {e["name"].split("/", 2)[2]: e["size"] for e in fs.ls(repo, detail=True)
              if e["type"] == "file"}
    top = {r: len(b) for r, b in want["view"].items() if "/" not in r}
    problems = [] if listed == top else ["ls: %s, want %s" % (sorted(listed.items()),
                                                             sorted(top.items()))]
    name = max(want["view"], key=lambda r: len(want["view"][r]))
    data = want["view"][name]
    if fs.info(repo + "/" + name)["size"] != len(data):
        problems.append("info(%s) size" % name)
    a = random.Random(7).randrange(0, max(1, len(data) - 100))
    with fs.open(repo + "/" + name, "rb", block_size=4096) as f:
        f.seek(a)
        if f.read(100) != data[a:a + 100]:
            problems.append("%s: read(100) at %d differs" % (name, a))
    tap.ok(not problems, "%s: HfFileSystem ls, info and a ranged read of %s" % (repo, name),
           problems)


def check_cli(tap, srv, repo, want, work):
    hf = os.path.join(os.path.dirname(sys.executable), "hf")
    cache = os.path.join(work, "cli-" + repo.replace("/", "-"))
    env = dict(os.environ, HF_ENDPOINT=srv.url)
    p = subprocess.run([hf, "download", repo, "--cache-dir", cache, "--exclude", "tensors/*"],
                       env=env, capture_output=True, timeout=CASE_SECONDS)
    # It prints the snapshot folder last, as "path: DIR" (2.x) or DIR alone (1.x).
    out = p.stdout.decode("utf-8", "replace").strip().splitlines()
    snap = out[-1].strip() if out else ""
    if snap.startswith("path:"):
        snap = snap[5:].strip()
    got = {r: read(x) for r, x in files_under(snap, False).items()} if os.path.isdir(snap) \
        else {}
    tap.ok(p.returncode == 0 and got == want["view"], "%s: `hf download --exclude 'tensors/*'` "
           "(HF_ENDPOINT) exits 0 and its snapshot holds the served view" % repo,
           [p.returncode, p.stderr.decode("utf-8", "replace")[-600:], snap, sorted(got)])


def check_token(tap, ckptfs, src, work):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError
    from serve_util import Server
    secret = "hf_ckptfs%d" % random.randrange(10 ** 12)
    tok = os.path.join(work, "token")
    with open(tok, "w") as f:
        f.write(secret + "\n")
    with Server(ckptfs, ["tok=" + src], ["--token-file", tok]) as srv:
        try:
            HfApi(endpoint=srv.url, token=False).model_info("ckptfs/tok")
            status = None
        except HfHubHTTPError as e:
            status = e.response.status_code if e.response is not None else "no response"
        tap.ok(status == 401, "--token-file: model_info without the token fails with 401",
               [status])
        info = HfApi(endpoint=srv.url, token=secret).model_info("ckptfs/tok")
        tap.ok(info.id == "ckptfs/tok", "--token-file: model_info with the token works")


def main():
    tap, ckptfs = ce.reexec_in_clients(["huggingface_hub", "safetensors", "transformers"])
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    from serve_util import Server
    work = ce.scratch_dir("ckptfs-t87.")
    try:
        cfg = ce.tiny_configs()["llama"]
        llama = os.path.join(work, "llama")
        ce.make_model("llama", cfg).save_pretrained(llama)
        ce.share_with_others(llama)  # saved 0600: see share_with_others
        dcp = os.path.join(HERE, "..", "fixtures", "dcp", "v2x_layout")
        commits = {}
        for shard in (None, "16KB"):
            extra = ["--max-shard-size", shard] if shard else []
            with Server(ckptfs, ["llama=" + llama, "dcp=" + dcp], extra) as srv:
                for name, src in (("llama", llama), ("dcp", dcp)):
                    repo = "ckptfs/" + name
                    label = repo + (" (shards of %s)" % shard if shard else "")
                    with ce.Deadline(tap, label, CASE_SECONDS):
                        want = expected_repo(tap, ckptfs, src, label, shard)
                        if not want["view"]:
                            continue
                        if shard and name == "llama":
                            tap.ok("model.safetensors.index.json" in want["view"],
                                   "%s: the view is sharded" % label)
                        commit = check_api(tap, srv, repo, want)
                        commits.setdefault(name, []).append(commit)
                        check_downloads(tap, srv, repo, want, work, commit,
                                        os.path.join(llama, "model.safetensors")
                                        if name == "llama" and not shard else None)
                        check_snapshot(tap, ckptfs, srv, repo, want, work, shard)
                        check_hffs(tap, srv, repo, want)
                        check_cli(tap, srv, repo, want, work)
        tap.ok(len(set(commits.get("llama", []))) == 2, "ckptfs/llama: the sharded repo has "
               "another commit than the one-file repo of the same source", [commits])
        with ce.Deadline(tap, "token server", CASE_SECONDS):
            check_token(tap, ckptfs, llama, work)
    except Exception as e:
        import traceback
        tap.ok(False, "the hub checks ran to the end: %s: %s" % (type(e).__name__, e),
               traceback.format_exc().splitlines()[-12:])
    finally:
        for mnt in list(ce.Deadline.mounts):
            ce.release(tap, mnt, mnt)
        ce.rmtree(work)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
