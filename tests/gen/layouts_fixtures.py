#!/usr/bin/python3
"""Write the everyday-layout fixtures for ckptfs (tests 65-68): HF cache repo folders, HF repos
with torch .bin weights, folders of single-file checkpoints, tar archives (.tar, .nemo).

usage: layouts_fixtures.py OUTDIR

Independent of ckptfs: safetensors files are written here with numpy, GGUF files with
gguf_fixtures.py's writer, tars with Python's tarfile (as NeMo writes .nemo: tarfile, arcname
"./..."), torch files are the committed ones of torch_layouts_fixtures.py (written by real
torch, whose manifest gives every tensor's sha256 as torch computed it).

OUTDIR/cases.json lists the cases: {group, name, src (relative to OUTDIR), options, format,
tensor_count, outside, tensors: [{name, path, dtype, shape, nbytes, sha256}], aux: {name: file
relative to OUTDIR}, hf_view: bool, summary: {member: expected value}, metadata: {key: subset},
warnings: [texts], archive: path of the tar the sidecars must point into}.
OUTDIR/hostile/cases.tsv lists what must be refused (and a few that must mount with a warning).
"""

import hashlib
import json
import os
import shutil
import sys
import tarfile

import numpy as np

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
import fixture_lib  # noqa: E402
import gguf_fixtures as gg  # noqa: E402

TORCH = os.path.join(HERE, "..", "fixtures", "torch_layouts")
NP = {"F32": "<f4", "F16": "<f2", "I32": "<i4"}


# ---------------------------------------------------------------------------
# safetensors, written here

def rand_tensors(rng, prefix, spec):
    out = {}
    for name, dt, shape in spec:
        out[prefix + name] = (dt, list(shape), rng.standard_normal(int(np.prod(shape))).astype(NP[dt]).tobytes()
                              if dt != "I32" else rng.integers(-9, 9, int(np.prod(shape)), dtype="<i4").tobytes())
    return out


def safetensors_bytes(tensors, metadata=None):
    header, pos, blobs = {}, 0, []
    for name in sorted(tensors):
        dt, shape, data = tensors[name]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
        blobs.append(data)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return len(h).to_bytes(8, "little") + h + b"".join(blobs)


def records(tensors, prefix_path="", aside=False):
    paths = fixture_lib.tree_paths(list(tensors))
    return [{"name": n, "path": prefix_path + paths[n], "dtype": dt, "shape": shape,
             "nbytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "aside": aside}
            for n, (dt, shape, data) in sorted(tensors.items())]


def torch_records(tensors, prefix_path="", aside=False):
    """Records from the committed torch manifest: {name: {dtype, shape, nbytes, sha256}}."""
    paths = fixture_lib.tree_paths(list(tensors))
    return [dict(t, name=n, path=prefix_path + paths[n], aside=aside)
            for n, t in sorted(tensors.items())]


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def write_json(path, doc):
    write(path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())


CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8}
SPEC = [("model.embed_tokens.weight", "F32", (16, 8)), ("model.norm.weight", "F32", (8,)),
        ("model.layers.0.mlp.up_proj.weight", "F16", (12, 8)),
        ("model.layers.0.self_attn.q_proj.weight", "F16", (8, 8)),
        ("lm_head.weight", "F32", (16, 8))]


def torch_manifest():
    with open(os.path.join(TORCH, "manifest.json")) as f:
        return json.load(f)


# ---------------------------------------------------------------------------
# 1. HF cache repo folders

def blob(repo, data):
    h = hashlib.sha256(data).hexdigest()
    write(os.path.join(repo, "blobs", h), data)
    return h


def link_snapshot(repo, commit, files):
    """snapshots/<commit>/NAME -> ../../blobs/<hash> (deeper names get more ../)."""
    for name, data in files.items():
        h = blob(repo, data)
        p = os.path.join(repo, "snapshots", commit, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        os.symlink(os.path.relpath(os.path.join(repo, "blobs", h), os.path.dirname(p)), p)


def gen_hfcache(out, rng, cases, hostile):
    repo = os.path.join(out, "hfcache", "models--org--tiny")
    c1, c2 = "a" * 40, "0123456789abcdef0123456789abcdef01234567"
    t1 = rand_tensors(rng, "", SPEC)
    names = sorted(t1)
    s1 = {n: t1[n] for n in names[:2]}
    s2 = {n: t1[n] for n in names[2:]}
    index = {"metadata": {"total_size": sum(len(v[2]) for v in t1.values())},
             "weight_map": {**{n: "model-00001-of-00002.safetensors" for n in s1},
                            **{n: "model-00002-of-00002.safetensors" for n in s2}}}
    cfg = json.dumps(CONFIG).encode()
    link_snapshot(repo, c1, {"model-00001-of-00002.safetensors": safetensors_bytes(s1),
                             "model-00002-of-00002.safetensors": safetensors_bytes(s2),
                             "model.safetensors.index.json": json.dumps(index).encode(),
                             "config.json": cfg})
    t2 = rand_tensors(rng, "", SPEC[:2])
    link_snapshot(repo, c2, {"model.safetensors": safetensors_bytes(t2), "config.json": cfg})
    write(os.path.join(repo, "refs", "main"), c1.encode())
    write(os.path.join(repo, "refs", "pr", "1"), (c2 + "\n").encode())
    rel = os.path.relpath(repo, out)
    cfg_rel = os.path.join(rel, "snapshots", c1, "config.json")
    base = {"group": "hfcache", "aux": {"config.json": cfg_rel}, "hf_view": True,
            "outside": 0, "warnings": []}
    cases.append(dict(base, name="repo-main", src=rel, options="", format="safetensors-sharded",
                      tensors=records(t1), metadata={"hf_cache": {"revision": "main",
                                                                   "commit": c1}}))
    cases.append(dict(base, name="repo-ref-pr1", src=rel, options="revision=pr/1",
                      format="safetensors", tensors=records(t2),
                      metadata={"hf_cache": {"revision": "pr/1", "commit": c2}}))
    cases.append(dict(base, name="repo-commit", src=rel, options="revision=" + c2,
                      format="safetensors", tensors=records(t2),
                      metadata={"hf_cache": {"commit": c2}}))
    cases.append(dict(base, name="snapshot-dir", src=os.path.join(rel, "snapshots", c1),
                      options="", format="safetensors-sharded", tensors=records(t1), metadata={}))

    # Hostile: what the index's text names, and refs that lead nowhere.
    def snap_with_index(name, shard_name):
        d = os.path.join(hostile.root, name)
        shutil.copytree(os.path.join(repo, "snapshots", c1), d, symlinks=False)
        os.unlink(os.path.join(d, "model.safetensors.index.json"))
        bad = dict(index, weight_map=dict(index["weight_map"]))
        bad["weight_map"][names[0]] = shard_name
        write_json(os.path.join(d, "model.safetensors.index.json"), bad)
    snap_with_index("hf_index_absolute", os.path.abspath(os.path.join(
        repo, "snapshots", c1, "model-00001-of-00002.safetensors")))
    hostile.row("hf_index_absolute", "refuse", "not inside",
                "index weight_map names an absolute path (of a real shard)")
    snap_with_index("hf_index_dotdot", "../hf_index_absolute/model-00001-of-00002.safetensors")
    hostile.row("hf_index_dotdot", "refuse", "not inside", "index weight_map names ../")
    snap_with_index("hf_index_deep_dotdot", "sub/../../x.safetensors")
    hostile.row("hf_index_deep_dotdot", "refuse", "not inside",
                "index weight_map names sub/../../ (leaves the directory through a subfolder)")
    for name, ref, needle, desc in (
            ("hf_ref_missing_snapshot", "f" * 40, "snapshots/" + "f" * 40 + "&missing",
             "refs/main names a commit without a snapshot"),
            ("hf_ref_garbage", "../../etc", "commit hash", "refs/main holds no commit hash")):
        d = os.path.join(hostile.root, name)
        os.makedirs(os.path.join(d, "snapshots"))
        write(os.path.join(d, "refs", "main"), ref.encode())
        hostile.row(name, "refuse", needle, desc)


# ---------------------------------------------------------------------------
# 2. HF repos with torch weights

def gen_binrepos(out, rng, cases, hostile):
    tm = torch_manifest()
    dst = os.path.join(out, "binrepo")
    for name in ("bin_single", "bin_sharded"):
        shutil.copytree(os.path.join(TORCH, name), os.path.join(dst, name))
    single_aux = {n: os.path.join("binrepo", "bin_single", n)
                  for n in ("config.json", "generation_config.json")}
    sharded_aux = {n: os.path.join("binrepo", "bin_sharded", n)
                   for n in ("config.json", "tokenizer_config.json")}
    base = {"group": "binrepo", "options": "", "hf_view": True, "outside": 0, "warnings": [],
            "metadata": {}}
    cases.append(dict(base, name="bin-single", src="binrepo/bin_single", format="torch-bin",
                      tensors=torch_records(tm["bin_single"]["tensors"]), aux=single_aux))
    cases.append(dict(base, name="bin-sharded", src="binrepo/bin_sharded",
                      format="torch-bin-sharded",
                      tensors=torch_records(tm["bin_sharded"]["tensors"]), aux=sharded_aux))
    # safetensors and .bin side by side: safetensors wins, as transformers chooses.
    both = os.path.join(dst, "both")
    shutil.copytree(os.path.join(TORCH, "bin_single"), both)
    st = rand_tensors(rng, "", SPEC)
    write(os.path.join(both, "model.safetensors"), safetensors_bytes(st))
    cases.append(dict(base, name="both-safetensors-wins", src="binrepo/both",
                      format="safetensors", tensors=records(st),
                      aux={n: os.path.join("binrepo", "both", n) for n in single_aux},
                      summary={"weights": {"loaded": "model.safetensors",
                                           "not_loaded": ["pytorch_model.bin"]}}))
    # An index that gets names wrong: transformers only warns, so does ckptfs.
    wrong = os.path.join(dst, "wrong_map")
    shutil.copytree(os.path.join(TORCH, "bin_sharded"), wrong)
    with open(os.path.join(wrong, "pytorch_model.bin.index.json")) as f:
        idx = json.load(f)
    shards = sorted(set(idx["weight_map"].values()))
    # A tensor of the first shard (which keeps others) put on another shard's line.
    first = sorted(k for k, v in idx["weight_map"].items() if v == shards[0])[0]
    idx["weight_map"][first] = [s for s in shards if s != idx["weight_map"][first]][0]
    idx["weight_map"]["not.a.tensor"] = shards[0]
    write_json(os.path.join(wrong, "pytorch_model.bin.index.json"), idx)
    cases.append(dict(base, name="bin-wrong-map", src="binrepo/wrong_map",
                      format="torch-bin-sharded",
                      tensors=torch_records(tm["bin_sharded"]["tensors"]),
                      aux={n: os.path.join("binrepo", "wrong_map", n) for n in sharded_aux},
                      warnings=["in no shard", "weight_map puts"]))

    def bad_bin(name, mutate, needle, desc):
        d = os.path.join(hostile.root, name)
        shutil.copytree(os.path.join(TORCH, "bin_sharded"), d)
        mutate(d)
        hostile.row(name, "refuse", needle, desc)

    def index_names(shard):
        def m(d):
            p = os.path.join(d, "pytorch_model.bin.index.json")
            with open(p) as f:
                doc = json.load(f)
            doc["weight_map"][sorted(doc["weight_map"])[0]] = shard
            write_json(p, doc)
        return m
    bad_bin("bin_index_dotdot", index_names("../bin_single/pytorch_model.bin"), "not inside",
            ".bin index names a shard in ../")
    bad_bin("bin_index_absolute", index_names("/etc/passwd"), "not inside",
            ".bin index names an absolute path")
    bad_bin("bin_shard_missing", lambda d: os.unlink(os.path.join(d, shards[-1])),
            "missing", "a shard the .bin index names is not there")

    def truncate(d):
        p = os.path.join(d, shards[0])
        size = os.path.getsize(p)
        with open(p, "r+b") as f:
            f.truncate(size // 2)
    bad_bin("bin_shard_truncated", truncate, shards[0], "a .bin shard cut in half")


# ---------------------------------------------------------------------------
# 3. Folders of single-file checkpoints

def gguf_tensors(rng, types):
    return [gg.rand_tensor(rng, "blk.0.attn_q.weight", types[0], [32, 4]),
            gg.rand_tensor(rng, "output_norm.weight", "F32", [32]),
            gg.rand_tensor(rng, "token_embd.weight", types[1], [32, 8])]


def gguf_records(recs, prefix_path="", aside=False):
    tensors = {r["name"]: r for r in recs}
    paths = fixture_lib.tree_paths(list(tensors))
    return [{"name": n, "path": prefix_path + paths[n], "dtype": r["dtype"], "shape": r["shape"],
             "nbytes": r["nbytes"], "sha256": r["sha256"], "aside": aside}
            for n, r in sorted(tensors.items())]


def gen_folders(out, rng, cases, hostile):
    root = os.path.join(out, "folders")
    kvs = [("general.architecture", gg.STRING, "llama"), ("general.name", gg.STRING, "tiny")]
    base = {"group": "folders", "options": "", "warnings": [], "aux": {}, "metadata": {}}
    # Several quantizations of one model: each a subtree, set aside.
    d = os.path.join(root, "quants")
    os.makedirs(d)
    recs = []
    for name, types in (("tiny-F16.gguf", ("F16", "F16")), ("tiny-Q8_0.gguf", ("Q8_0", "Q8_0"))):
        r = gg.write_gguf(os.path.join(d, name), kvs, gguf_tensors(rng, types))
        recs += gguf_records(r, name + "/", True)
    write(os.path.join(d, "README.md"), b"two quantizations\n")
    cases.append(dict(base, name="gguf-quants", src="folders/quants", format="folder",
                      tensors=recs, outside=len(recs), hf_view=False,
                      summary={"checkpoints": [
                          {"file": "tiny-F16.gguf", "dir": "tiny-F16.gguf", "tensors": 3},
                          {"file": "tiny-Q8_0.gguf", "dir": "tiny-Q8_0.gguf", "tensors": 3}]}))
    # The parts of a split GGUF: one model.
    d = os.path.join(root, "split")
    os.makedirs(d)
    t = gguf_tensors(rng, ("F16", "F32"))
    r, _, _ = gg.write_split(d, [t[:2], t[2:]], kvs)
    cases.append(dict(base, name="gguf-split", src="folders/split", format="gguf",
                      tensors=gguf_records(r), outside=0, hf_view=True))
    # Two training checkpoints.
    tm = torch_manifest()["pt"]["files"]
    d = os.path.join(root, "pts")
    os.makedirs(d)
    recs = []
    for name in sorted(tm):
        shutil.copy(os.path.join(TORCH, "pt", name), d)
        recs += torch_records(tm[name], name + "/", True)
    cases.append(dict(base, name="pt-steps", src="folders/pts", format="folder", tensors=recs,
                      outside=len(recs), hf_view=False,
                      summary={"checkpoints": [{"file": n, "dir": n} for n in sorted(tm)]}))
    # One checkpoint among other files: it is the model.
    d = os.path.join(root, "one")
    os.makedirs(d)
    shutil.copy(os.path.join(TORCH, "pt", "step100.pt"), d)
    write(os.path.join(d, "notes.txt"), b"not a checkpoint\n")
    cases.append(dict(base, name="one-pt", src="folders/one", format="torch-zip",
                      tensors=torch_records(tm["step100.pt"]), outside=0, hf_view=True))
    # Hostile: a damaged file among good ones; nothing to mount.
    d = os.path.join(hostile.root, "folder_bad_member")
    os.makedirs(d)
    shutil.copy(os.path.join(root, "quants", "tiny-F16.gguf"), d)
    with open(os.path.join(root, "quants", "tiny-Q8_0.gguf"), "rb") as f:
        data = f.read()
    write(os.path.join(d, "tiny-Q8_0.gguf"), data[:len(data) - 40])
    hostile.row("folder_bad_member", "refuse", "tiny-Q8_0.gguf",
                "a folder with a truncated GGUF beside a good one")
    d = os.path.join(hostile.root, "folder_nothing")
    os.makedirs(d)
    write(os.path.join(d, "README.md"), b"nothing here\n")
    hostile.row("folder_nothing", "refuse", "no checkpoint", "a folder without checkpoints")
    d = os.path.join(hostile.root, "folder_split_missing")
    os.makedirs(d)
    shutil.copy(os.path.join(root, "split", gg.split_name(1, 2)), d)
    hostile.row("folder_split_missing", "refuse", "missing",
                "the first part of a split GGUF without the second")


# ---------------------------------------------------------------------------
# 4. tar archives

def add_bytes(tf, name, data, **kw):
    import io
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mtime = 0
    for k, v in kw.items():
        setattr(ti, k, v)
    tf.addfile(ti, io.BytesIO(data))


def gen_tars(out, rng, cases, hostile):
    root = os.path.join(out, "tars")
    os.makedirs(root)
    tm = torch_manifest()
    base = {"group": "tar", "options": "", "warnings": [], "metadata": {}, "outside": 0}
    st = rand_tensors(rng, "", SPEC)
    st_bytes = safetensors_bytes(st)
    cfg = json.dumps(CONFIG).encode()
    write(os.path.join(root, "config.json"), cfg)
    for name, fmt, member in (("model.tar", tarfile.PAX_FORMAT, "model.safetensors"),
                              ("gnu-long.tar", tarfile.GNU_FORMAT, "x" * 120 + "/model.safetensors"),
                              ("pax-long.tar", tarfile.PAX_FORMAT, "p" * 150 + "/model.safetensors"),
                              ("ustar-prefix.tar", tarfile.USTAR_FORMAT,
                               "u" * 90 + "/" + "v" * 20 + "/model.safetensors")):
        with tarfile.open(os.path.join(root, name), "w", format=fmt) as tf:
            add_bytes(tf, "config.json", cfg)
            add_bytes(tf, member, st_bytes)
        cases.append(dict(base, name=name, src="tars/" + name, format="safetensors",
                          tensors=records(st), aux={"config.json": "tars/config.json"},
                          hf_view=True, archive="tars/" + name))
    # Sizes as the >8 GiB writers give them: GNU base-256, and a pax size= record (with the
    # ustar field zeroed, so only the record tells).
    for name, fmt, pax in (("gnu-base256.tar", tarfile.GNU_FORMAT, False),
                           ("pax-size.tar", tarfile.PAX_FORMAT, True)):
        path = os.path.join(root, name)
        with tarfile.open(path, "w", format=fmt) as tf:
            add_bytes(tf, "model.safetensors", st_bytes,
                      pax_headers={"size": str(len(st_bytes))} if pax else {})
        with open(path, "rb") as f:
            data = bytearray(f.read())
        at = 1024 if pax else 0  # the member's own header (after the pax header and its data)
        assert data[at:at + 17] == b"model.safetensors"
        data[at + 124:at + 136] = (b"%011o\0" % 0) if pax else \
            b"\x80" + len(st_bytes).to_bytes(11, "big")
        data[at + 148:at + 156] = b"        "
        data[at + 148:at + 156] = b"%06o\0 " % sum(data[at:at + 512])
        write(path, bytes(data))
        cases.append(dict(base, name=name, src="tars/" + name, format="safetensors",
                          tensors=records(st), aux={}, hf_view=True, archive="tars/" + name))
    # NeMo 1.x: tarfile, arcname "./..." (NeMo's SaveRestoreConnector).
    yaml = b"precision: 16\ntensor_model_parallel_size: 1\nencoder_seq_length: 64\n"
    write(os.path.join(root, "model_config.yaml"), yaml)
    nemo_w = os.path.join(TORCH, "nemo", "model_weights.ckpt")
    with tarfile.open(os.path.join(root, "model.nemo"), "w:") as tf:
        tf.add(os.path.join(root, "model_config.yaml"), arcname="./model_config.yaml")
        tf.add(nemo_w, arcname="./model_weights.ckpt")
    nemo_t = tm["nemo"]["tensors"]
    cases.append(dict(base, name="model.nemo", src="tars/model.nemo", format="nemo",
                      tensors=torch_records(nemo_t),
                      aux={"model_config.yaml": "tars/model_config.yaml"}, hf_view=True,
                      archive="tars/model.nemo", metadata={"tar": {"kind": "nemo"}}))
    with tarfile.open(os.path.join(root, "mp.nemo"), "w:") as tf:
        tf.add(os.path.join(root, "model_config.yaml"), arcname="./model_config.yaml")
        for r in (0, 1):
            tf.add(nemo_w, arcname="./mp_rank_%02d/model_weights.ckpt" % r)
    recs = []
    for r in (0, 1):
        recs += torch_records(nemo_t, "mp_rank_%02d/model_weights.ckpt/" % r, True)
    cases.append(dict(base, name="mp.nemo", src="tars/mp.nemo", format="nemo-model-parallel",
                      tensors=recs, outside=len(recs),
                      aux={"model_config.yaml": "tars/model_config.yaml"}, hf_view=False,
                      archive="tars/mp.nemo",
                      summary={"checkpoints": [{"file": "mp_rank_00/model_weights.ckpt"},
                                               {"file": "mp_rank_01/model_weights.ckpt"}]}))
    gen_tar_bounds(root, h_root=hostile.root, hostile=hostile, cases=cases, base=base,
                   st=st, st_bytes=st_bytes, cfg=cfg)
    # Hostile archives.
    h = hostile.root

    def tar_with(name, members, fmt=tarfile.PAX_FORMAT):
        with tarfile.open(os.path.join(h, name), "w", format=fmt) as tf:
            for mname, data in members:
                add_bytes(tf, mname, data)
        with open(os.path.join(h, name), "rb") as f:
            return bytearray(f.read())
    tar_with("tar_dotdot.tar", [("../evil.safetensors", st_bytes)])
    hostile.row("tar_dotdot.tar", "refuse", "leave the archive", "member named ../evil")
    tar_with("tar_absolute.tar", [("/abs/model.safetensors", st_bytes)], tarfile.GNU_FORMAT)
    hostile.row("tar_absolute.tar", "refuse", "leave the archive", "member with an absolute name")
    tar_with("tar_deep_dotdot.tar", [("a/../../x.safetensors", st_bytes)])
    hostile.row("tar_deep_dotdot.tar", "refuse", "leave the archive", "member named a/../../x")
    data = tar_with("tar_truncated.tar", [("model.safetensors", st_bytes)])
    write(os.path.join(h, "tar_truncated.tar"), bytes(data[:512 + len(st_bytes) // 2]))
    hostile.row("tar_truncated.tar", "refuse", "\"model.safetensors\"&truncated at byte offset %d"
                % (512 + len(st_bytes) // 2), "archive cut inside the member's data")

    def patch_size(data, at, size):
        data[at + 124:at + 136] = b"%011o\0" % size
        data[at + 148:at + 156] = b"        "
        data[at + 148:at + 156] = b"%06o\0 " % sum(data[at:at + 512])
        return bytes(data)
    data = tar_with("tar_size_big.tar", [("model.safetensors", st_bytes)], tarfile.USTAR_FORMAT)
    write(os.path.join(h, "tar_size_big.tar"), patch_size(data, 0, 1 << 30))
    hostile.row("tar_size_big.tar", "refuse", "size field lies",
                "size field says 1 GiB in a small archive")
    data = tar_with("tar_size_small.tar", [("a.safetensors", st_bytes), ("b.safetensors", st_bytes)],
                    tarfile.USTAR_FORMAT)
    write(os.path.join(h, "tar_size_small.tar"), patch_size(data, 0, len(st_bytes) - 1024))
    hostile.row("tar_size_small.tar", "refuse", "checksum",
                "size field smaller than the data: the next header is read from inside it")
    data = tar_with("tar_checksum.tar", [("model.safetensors", st_bytes)], tarfile.USTAR_FORMAT)
    data[0] ^= 1
    write(os.path.join(h, "tar_checksum.tar"), bytes(data))
    hostile.row("tar_checksum.tar", "refuse", "not a checkpoint",
                "first header's checksum broken: not recognised as a tar at all")
    tar_with("tar_dup.tar", [("model.safetensors", st_bytes), ("model.safetensors", st_bytes)])
    hostile.row("tar_dup.tar", "refuse", "twice", "the same member name twice")
    tar_with("tar_nothing.tar", [("README.md", b"hello\n")])
    hostile.row("tar_nothing.tar", "refuse", "none of the", "a tar without checkpoints")
    with tarfile.open(os.path.join(h, "model.tar.gz"), "w:gz") as tf:
        add_bytes(tf, "model.safetensors", st_bytes)
    hostile.row("model.tar.gz", "refuse", "gzip&decompress&convert",
                "a gzip-compressed tar: refused with the way out")
    with tarfile.open(os.path.join(h, "old.nemo"), "w:gz") as tf:
        add_bytes(tf, "./model_config.yaml", yaml)
    hostile.row("old.nemo", "refuse", "gzip&decompress", "an old gzip-compressed .nemo")
    with tarfile.open(os.path.join(h, "bad_weights.nemo"), "w:") as tf:
        add_bytes(tf, "./model_config.yaml", yaml)
        add_bytes(tf, "./model_weights.ckpt", st_bytes)
    hostile.row("bad_weights.nemo", "refuse", "not a torch.save",
                "a .nemo whose model_weights.ckpt is no torch file")


def gen_tar_bounds(root, h_root, hostile, cases, base, st, st_bytes, cfg):
    """The tar reader's bounds: the last member's data ending exactly at the end of the archive
    (no padding, no end blocks) and one byte short of its size field; one whole end block and
    511 bytes of one; a pax record reaching exactly the end of its data and one byte past it."""
    import io
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        add_bytes(tf, "config.json", cfg)
        add_bytes(tf, "model.safetensors", st_bytes)
    full = buf.getvalue()
    assert len(st_bytes) % 512, "the member must need padding for the bound to show"
    cfg_blocks = 512 + -(-len(cfg) // 512) * 512
    member_end = cfg_blocks + 512 + len(st_bytes)
    padded_end = cfg_blocks + 512 + -(-len(st_bytes) // 512) * 512
    name = "bound-one-end-block.tar"
    write(os.path.join(root, name), full[:padded_end] + bytes(512))
    # One end block of two: accepted, as GNU tar does ("A lone zero block"), with a warning.
    cases.append(dict(base, name=name, src="tars/" + name, format="safetensors",
                      tensors=records(st), aux={"config.json": "tars/config.json"},
                      hf_view=True, archive="tars/" + name,
                      warnings=["a lone zero block at offset %d" % padded_end]))
    # Without padding Python's tarfile (the tests' reader of member offsets) gives up, so this
    # one is a hostile case that must mount.
    write(os.path.join(h_root, "tar_bound_data_to_eof.tar"), full[:member_end])
    hostile.row("tar_bound_data_to_eof.tar", "mount",
                "ends at offset %d without its two end-of-archive zero blocks&without its "
                "padding" % member_end,
                "the last member's data ends the archive: no padding, no end blocks (warned)")
    hostile.names["tar_bound_data_to_eof.tar"] = sorted(st)
    at = cfg_blocks  # the model's header
    over = bytearray(full[:member_end])
    over[at + 124:at + 136] = b"%011o\0" % (len(st_bytes) + 1)
    over[at + 148:at + 156] = b"        "
    over[at + 148:at + 156] = b"%06o\0 " % sum(over[at:at + 512])
    write(os.path.join(h_root, "tar_bound_size_plus_1.tar"), bytes(over))
    hostile.row("tar_bound_size_plus_1.tar", "refuse",
                "\"model.safetensors\"&data at offset %d&says it has %d bytes&ends %d bytes "
                "after&truncated at byte offset %d" % (at + 512, len(st_bytes) + 1, len(st_bytes),
                                                      member_end),
                "the last member's size field one byte more than the archive holds")
    write(os.path.join(h_root, "tar_bound_header_511.tar"), full[:padded_end] + bytes(511))
    write(os.path.join(h_root, "tar_bound_header_1.tar"), full[:padded_end] + bytes(1))
    hostile.row("tar_bound_header_1.tar", "refuse", "ends inside a header block",
                "one stray byte after the last member")
    # The last member 511 bytes long without its one byte of padding: the archive ends one
    # byte before that member's block would.
    cfg511 = cfg + b" " * (511 - len(cfg))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        add_bytes(tf, "model.safetensors", st_bytes)
        add_bytes(tf, "config.json", cfg511)
    st_blocks = 512 + -(-len(st_bytes) // 512) * 512
    write(os.path.join(h_root, "tar_bound_last_511.tar"),
          buf.getvalue()[:st_blocks + 512 + 511])
    hostile.row("tar_bound_last_511.tar", "mount",
                "without its two end-of-archive zero blocks&without its padding",
                "the last member (511 bytes) ends the archive, one byte short of its block "
                "(warned)")
    # Cut right after a whole member's padding: the members before are whole, the ones after
    # are lost without a trace but the missing end blocks: warned, naming the offset.
    write(os.path.join(h_root, "tar_cut_between_members.tar"), buf.getvalue()[:st_blocks])
    hostile.row("tar_cut_between_members.tar", "mount",
                "ends at offset %d without its two end-of-archive zero blocks&may be truncated"
                % st_blocks, "the archive cut after its first member's blocks (warned)")
    hostile.names["tar_cut_between_members.tar"] = sorted(st)
    # Cut inside the last member's data: refused, naming the member and where the data ends.
    cut = st_blocks + 512 + 100
    write(os.path.join(h_root, "tar_cut_last_member.tar"), buf.getvalue()[:cut])
    hostile.row("tar_cut_last_member.tar", "refuse",
                "\"config.json\"&says it has 511 bytes&truncated at byte offset %d" % cut,
                "the archive cut 100 bytes into its last member's data")
    hostile.names["tar_bound_last_511.tar"] = sorted(st)
    hostile.row("tar_bound_header_511.tar", "refuse", "ends inside a header block",
                "511 zero bytes after the last member: less than a header block")
    # A pax header with one record: "NN path=...\n" whose length NN is exactly its data
    # (a good archive) or one more.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        add_bytes(tf, "p" * 150 + "/model.safetensors", st_bytes)
    pax = bytearray(buf.getvalue())
    assert pax[156:157] == b"x"
    size = int(pax[124:136].rstrip(b"\0 "), 8)
    rec = bytes(pax[512:512 + size])
    n = int(rec.split(b" ", 1)[0])
    assert n == size and rec.endswith(b"\n"), "one record, filling the data"
    longer = b"%d" % (n + 1)
    assert len(longer) == len(b"%d" % n)
    pax[512:512 + len(longer)] = longer
    write(os.path.join(h_root, "tar_bound_pax_record_plus_1.tar"), bytes(pax))
    hostile.row("tar_bound_pax_record_plus_1.tar", "refuse", "malformed record at byte 0",
                "the pax path record's length one byte more than the header's data")


def main(argv):
    out = fixture_lib.fresh_out(argv, __doc__)
    if out is None:
        return 2
    rng = np.random.default_rng(1313)
    cases = []
    hostile = fixture_lib.Hostile(os.path.join(out, "hostile"))
    gen_hfcache(out, rng, cases, hostile)
    gen_binrepos(out, rng, cases, hostile)
    gen_folders(out, rng, cases, hostile)
    gen_tars(out, rng, cases, hostile)
    hostile.finish()
    write_json(os.path.join(out, "cases.json"), cases)
    print("wrote %s: %d cases, %d hostile" % (out, len(cases), len(hostile.rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
