#!/usr/bin/python3
"""`ckptfs serve` under the repos' real ids (issue 28 item 5), used by the real Hub client
(huggingface_hub in $CLIENTS_PY, HF_ENDPOINT pointed at the server, nothing else set):

- ORG/NAME=SRC serves SRC as ORG/NAME: model_info, list_repo_files and hf_hub_download of
  "my-org/tiny" return the source's files;
- an HF cache folder models--ORG--NAME is served as ORG/NAME without being told;
- any other source stays ckptfs/NAME (the file or folder name);
- the recursive listing holds tensors/ as a directory, not its files (list_repo_files is the
  HF view: what snapshot_download would fetch);
- a file's ETag (and X-Linked-Etag) is the sha256 of its bytes, and huggingface_hub keeps
  the download as blobs/<that sha256>;
- a file's response carries Last-Modified: the newest mtime of its sources, and an hf://
  mount of the repo shows it (not 1970);
- the repo's HTML page shows the architecture and sizes of config.json, the parameter count
  and its dtypes, the download command, and no server path (nor does the index).
"""
import email.utils
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
from ckptfs_test import Tap, skip_reason  # noqa: E402
from serve_util import Server, request  # noqa: E402
from staging import write_st  # noqa: E402

CKPTFS = os.environ.get("CKPTFS")
FIXTURES = os.environ.get("FIXTURES")
CLIENTS_PY = os.environ.get("CLIENTS_PY", "")

CLIENT = r'''
import json, os, sys
from huggingface_hub import HfApi, hf_hub_download
api = HfApi()
out = {}
for repo in sys.argv[1:]:
    info = api.model_info(repo)
    files = sorted(api.list_repo_files(repo))
    path = hf_hub_download(repo, "config.json")
    out[repo] = {"id": info.id, "sha": info.sha, "files": files,
                 "config": open(path).read()}
print(json.dumps(out))
'''


def folder(path, tag):
    os.makedirs(path)
    write_st(os.path.join(path, "model.safetensors"),
             {"w": ("F32", [4], bytes(range(16)))})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": 64, "num_hidden_layers": 2, "tag": tag}, f)


def hf_cache(root, org, name, tag):
    """An HF cache repo folder as huggingface_hub leaves it: blobs, refs/main, a snapshot of
    symlinks."""
    repo = os.path.join(root, "models--%s--%s" % (org, name))
    commit = "a" * 40
    snap = os.path.join(repo, "snapshots", commit)
    os.makedirs(snap)
    os.makedirs(os.path.join(repo, "blobs"))
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(commit)
    tmp = os.path.join(root, "tmp-" + name)
    folder(tmp, tag)
    for fname in os.listdir(tmp):
        blob = os.path.join(repo, "blobs", "blob-" + fname)
        shutil.move(os.path.join(tmp, fname), blob)
        os.symlink(os.path.join("..", "..", "blobs", "blob-" + fname), os.path.join(snap, fname))
    os.rmdir(tmp)
    return repo


def main():
    why = skip_reason(CKPTFS, FIXTURES)
    if not why and not os.access(CLIENTS_PY, os.X_OK):
        why = "CLIENTS_PY (%r) is not set: make deps-clients" % CLIENTS_PY
    if why:
        print("1..0 # SKIP %s" % why)
        return 0
    tap = Tap()
    work = tempfile.mkdtemp(prefix="ckptfs-t88.")
    try:
        plain = os.path.join(work, "plain-model")
        named = os.path.join(work, "some-dir")
        folder(plain, "plain")
        folder(named, "named")
        cache = hf_cache(os.path.join(work, "hub"), "meta-llama", "Llama-3-8B", "cache")
        srcs = ["my-org/tiny=" + named, cache, plain]
        with Server(CKPTFS, srcs) as srv:
            ids = sorted(srv.ids)
            want = ["ckptfs/plain-model", "meta-llama/Llama-3-8B", "my-org/tiny"]
            tap.ok(ids == want, "serve announces ORG/NAME=SRC, the cache folder's own id, "
                   "ckptfs/NAME otherwise", [ids])
            env = dict(os.environ, HF_ENDPOINT=srv.url, HF_HOME=os.path.join(work, "hf-home"),
                       HF_HUB_DISABLE_TELEMETRY="1")
            p = subprocess.run([CLIENTS_PY, "-c", CLIENT] + want, capture_output=True, env=env,
                               timeout=180)
            res = json.loads(p.stdout) if p.returncode == 0 else {}
            tap.ok(p.returncode == 0, "huggingface_hub: model_info, list_repo_files, "
                   "hf_hub_download of the three ids", [p.stderr.decode(errors="replace")[-800:]])
            for rid, tag in (("my-org/tiny", "named"), ("meta-llama/Llama-3-8B", "cache"),
                             ("ckptfs/plain-model", "plain")):
                r = res.get(rid, {})
                cfg = json.loads(r.get("config", "{}"))
                tap.ok(r.get("id") == rid and cfg.get("tag") == tag,
                       "%s: the client sees the repo under that id, with its source's config.json"
                       % rid, [r.get("id"), cfg])
                tap.ok(r.get("files") == ["config.json", "model.safetensors"],
                       "%s: list_repo_files is the HF view (tensors/ not pulled in)" % rid,
                       [r.get("files")])
            r = request(srv, "/my-org/tiny/resolve/main/config.json", method="HEAD")
            lm = r.header("last-modified")
            when = email.utils.parsedate_to_datetime(lm).timestamp() if lm else 0
            newest = max(os.stat(os.path.join(named, f)).st_mtime for f in os.listdir(named))
            tap.ok(r.status == 200 and abs(when - int(newest)) < 1,
                   "Last-Modified is the newest source mtime (%s)" % lm, [r.status, newest])
            bad = []
            for f in ("model.safetensors", "config.json", "tensors/w"):
                body = request(srv, "/my-org/tiny/resolve/main/" + f).body
                h = request(srv, "/my-org/tiny/resolve/main/" + f, method="HEAD")
                digest = '"%s"' % hashlib.sha256(body).hexdigest()
                if h.header("etag") != digest or h.header("x-linked-etag") != digest:
                    bad.append("%s: %s, sha256 %s" % (f, h.header("etag"), digest))
            tap.ok(not bad, "ETag and X-Linked-Etag are the sha256 of the bytes (the Hub's LFS "
                   "ETag)", bad)
            blobs = os.path.join(work, "hf-home", "hub", "models--my-org--tiny", "blobs")
            names = sorted(os.listdir(blobs)) if os.path.isdir(blobs) else []
            cfg_sha = hashlib.sha256(open(os.path.join(named, "config.json"), "rb").read())
            tap.ok(cfg_sha.hexdigest() in names,
                   "huggingface_hub stores the download under that sha256", [names])
            r = request(srv, "/my-org/tiny")
            page = r.body.decode("utf-8", "replace")
            tap.ok(r.status == 200 and "LlamaForCausalLM" in page and ">64<" in page and
                   "huggingface-cli download my-org/tiny" in page and "HF_ENDPOINT=http://" in page
                   and ">4 <" in page.replace("4 <span", "4 <") and "F32" in page,
                   "the repo page: architecture and sizes from config.json, parameters, dtype "
                   "breakdown, the download command", [page[:1500]])
            index = request(srv, "/").body.decode("utf-8", "replace")
            tap.ok(work not in page and work not in index,
                   "no server path on the repo page or the index")
            hmnt = os.path.join(work, "hf-mount")
            os.mkdir(hmnt)
            p = subprocess.run([CKPTFS, "hf://my-org/tiny", hmnt], capture_output=True,
                               env=env, timeout=60)
            try:
                st = os.stat(os.path.join(hmnt, ".ckptfs", "hf", "config.json"))
                shown = st.st_mtime
            except OSError as e:
                shown = e
            subprocess.run(["fusermount3", "-u", hmnt], capture_output=True, timeout=30)
            cfg_mtime = os.stat(os.path.join(named, "config.json")).st_mtime
            tap.ok(p.returncode == 0 and isinstance(shown, float) and abs(shown - cfg_mtime) < 1,
                   "an hf:// mount of the repo shows the source's mtime, not 1970",
                   [p.stderr[-300:], shown, cfg_mtime])
            r = request(srv, "/api/models/nobody/none")
            tap.ok(r.status == 404 and r.header("x-error-code") == "RepoNotFound",
                   "an unknown ORG/NAME: 404 RepoNotFound", [r.status])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tap.done()
    return 0 if tap.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
