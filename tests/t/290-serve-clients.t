#!/usr/bin/python3
"""ckptfs serve with real clients: the npm package @huggingface/hub and headless Chromium.

Environment:
  CKPTFS    path of the ckptfs binary (its folder holds node/, where the test installs
            @huggingface/hub with `npm i -E`, never globally)

  1. @huggingface/hub (listFiles, downloadFile, Blob.slice) with hubUrl pointed at the server
     downloads the HF view of two DCP fixtures; the model.safetensors it wrote passes the strict
     safetensors reader of 320-hfview.t and holds the manifest's model tensors byte for byte;
     the listing equals the server's tree; the slice equals the file's bytes.
  2. the same client against a server with --token-file: refused without the token, served
     with it.
  3. ckptfs itself as the client (hf:// with HF_ENDPOINT at the server): `ckptfs cat` of every
     model tensor equals the manifest; a FUSE mount of hf://ckptfs/NAME shows the tensors with
     the manifest's bytes and its HF view is byte for byte the model.safetensors the server
     gives; with --token-file, HF_TOKEN is needed and enough.
  4. Chromium (Debian's, headless) loads a repo page: the DOM holds the tensor tree, the
     summary and the dtype bar; the screenshot is decoded here (PNG, zlib) and must show the
     page (text and the bar's colours), not a blank or an error page.
Skips: no node/npm (the npm package cannot be had), no chromium (not in `make deps`: it is
large; `apt-get install chromium` enables the check).
"""

import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, is_mounted, run_capture, unmount  # noqa: E402
from serve_util import Server, load_hfview_checks, request  # noqa: E402

HERE = os.path.dirname(os.path.realpath(__file__))
LIB = os.path.join(HERE, "..", "lib")
DCP_CASES = ["v113_sharded", "v2x_layout"]
HUB_VERSION = "2.17.5"
hv = load_hfview_checks()


def node_dir_ready(node_dir):
    """Installs @huggingface/hub into node_dir (npm i -E); None, or why it cannot."""
    pkg = os.path.join(node_dir, "node_modules", "@huggingface", "hub", "package.json")
    if os.path.exists(pkg) and json.load(open(pkg)).get("version") == HUB_VERSION:
        return None
    if not shutil.which("node") or not shutil.which("npm"):
        return "node/npm not installed"
    os.makedirs(node_dir, exist_ok=True)
    p = subprocess.run(["npm", "i", "-E", "--no-audit", "--no-fund", "--prefix", node_dir,
                        "@huggingface/hub@" + HUB_VERSION], capture_output=True, timeout=300)
    if p.returncode != 0 or not os.path.exists(pkg):
        return "npm i @huggingface/hub failed: %s" % p.stderr.decode()[-300:]
    return None


def run_client(node_dir, srv, repo, out, token=None):
    script = os.path.join(node_dir, "hub_client.mjs")  # ESM resolves from the script's folder
    shutil.copyfile(os.path.join(LIB, "hub_client.mjs"), script)
    argv = ["node", script, srv.url, repo, out] + ([token] if token else [])
    p = subprocess.run(argv, capture_output=True, timeout=300)
    try:
        return p.returncode, json.loads(p.stdout.decode().strip().splitlines()[-1]), p.stderr
    except (ValueError, IndexError):
        return p.returncode, None, p.stderr + p.stdout


def check_hub_client(tap, node_dir, ckptfs, tmp):
    srcs = ["%s=%s" % (c, os.path.join(HERE, "..", "fixtures", "dcp", c)) for c in DCP_CASES]
    with Server(ckptfs, srcs) as srv:
        for case in DCP_CASES:
            out = os.path.join(tmp, "dl-" + case)
            rc, res, err = run_client(node_dir, srv, "ckptfs/" + case, out)
            tap.ok(rc == 0 and res is not None, "%s: @huggingface/hub listFiles + downloadFile "
                   "ran" % case, [rc, err[-800:]])
            if res is None:
                continue
            tree = json.loads(request(srv, "/api/models/ckptfs/%s/tree/main?recursive=true"
                                      % case).body)
            got = sorted((e["type"], e["path"], e["size"]) for e in res["listed"])
            want = sorted((e["type"], e["path"], e["size"]) for e in tree)
            tap.ok(got == want and ("directory", "tensors", 0) in got and
                   not any(p.startswith("tensors/") for _, p, _ in got),
                   "%s: listFiles(recursive) = the tree API (%d entries), tensors/ a directory "
                   "whose files it does not pull in" % (case, len(got)), [got[:6]])
            path = os.path.join(out, "model.safetensors")
            data = open(path, "rb").read() if os.path.exists(path) else b""
            manifest = json.load(open(os.path.join(HERE, "..", "fixtures", "dcp", case,
                                                   "manifest.json")))
            try:
                view = hv.parse_strict(data, len(data))
                problems = hv.writer_style_problems(view)
                want_t, _ = hv.manifest_want({"tensors": [
                    t for t in manifest["tensors"] if not t.get("aside") and not t.get("prefix")]})
                problems += hv.compare_tensors(view, data, want_t)
                if not want_t:
                    problems.append("the manifest has no model tensor")
            except hv.Invalid as e:
                problems = ["strict reader: %s" % e]
            tap.ok(not problems, "%s: the downloaded model.safetensors (%d bytes) passes the "
                   "strict reader and holds the manifest's %d model tensors"
                   % (case, len(data), len(view.tensors) if not problems else 0), problems[:8])
            tap.ok(res["size"] == len(data) and res["slice"] == data[3:40].hex(),
                   "%s: Blob.slice(3, 40) of the remote file (a Range request) is exact" % case)


def check_token_client(tap, node_dir, ckptfs, tmp):
    tok = os.path.join(tmp, "token")
    # @huggingface/hub accepts only tokens that start with hf_, as the Hub issues them.
    secret = "hf_ckptfs%d%d" % (random.randrange(10 ** 9), os.getpid())
    open(tok, "w").write(secret + "\n")
    src = "dcp=" + os.path.join(HERE, "..", "fixtures", "dcp", DCP_CASES[0])
    with Server(ckptfs, [src], ["--token-file", tok]) as srv:
        rc, res, err = run_client(node_dir, srv, "ckptfs/dcp", os.path.join(tmp, "t1"))
        tap.ok(rc != 0 and res is None, "token server: the client without accessToken fails",
               [rc, err[-300:]])
        rc, res, err = run_client(node_dir, srv, "ckptfs/dcp", os.path.join(tmp, "t2"), secret)
        tap.ok(rc == 0 and res and any(d["path"] == "model.safetensors"
                                       for d in res["downloaded"]),
               "token server: with accessToken the client downloads the view", [rc, err[-300:]])


def model_tensors(case):
    m = json.load(open(os.path.join(HERE, "..", "fixtures", "dcp", case, "manifest.json")))
    return [t for t in m["tensors"] if not t.get("aside") and not t.get("prefix")]


def check_ckptfs_client(tap, ckptfs, tmp):
    case = DCP_CASES[0]
    want = model_tensors(case)
    src = "dcp=" + os.path.join(HERE, "..", "fixtures", "dcp", case)
    with Server(ckptfs, [src]) as srv:
        env = dict(os.environ, HF_ENDPOINT=srv.url)
        env.pop("HF_TOKEN", None)
        bad = []
        for t in want:
            p = subprocess.run([ckptfs, "cat", "hf://ckptfs/dcp", t["name"]], env=env,
                               capture_output=True, timeout=60)
            if p.returncode != 0 or hashlib.sha256(p.stdout).hexdigest() != t["sha256"]:
                bad.append("%s: exit %d %s" % (t["name"], p.returncode, p.stderr[-200:]))
        tap.ok(not bad, "round trip: `ckptfs cat hf://ckptfs/dcp NAME` (HF_ENDPOINT at the "
               "server) gives the manifest's bytes for all %d model tensors" % len(want), bad)
        if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
            tap.skip("round trip through a FUSE mount", "/dev/fuse or fusermount3 missing")
            return
        mnt = tempfile.mkdtemp(prefix="mnt.", dir=tmp)
        # run_capture passes this process's environment: env(1) adds the endpoint.
        rc, _, err = run_capture(["env", "HF_ENDPOINT=" + srv.url, ckptfs, "hf://ckptfs/dcp",
                                  mnt], 60)
        mounted = rc == 0 and is_mounted(mnt)
        tap.ok(mounted, "round trip: ckptfs mounts hf://ckptfs/dcp from ckptfs serve",
               [rc, err[-300:]])
        if mounted:
            try:
                bad = []
                for t in want:
                    data = open(os.path.join(mnt, t["path"]), "rb").read()
                    if hashlib.sha256(data).hexdigest() != t["sha256"]:
                        bad.append(t["path"])
                tap.ok(not bad, "round trip: the mounted tensors have the manifest's bytes", bad)
                served = request(srv, "/ckptfs/dcp/resolve/main/model.safetensors").body
                again = open(os.path.join(mnt, ".ckptfs", "hf", "model.safetensors"), "rb").read()
                tap.ok(served == again and len(served) > 0,
                       "round trip: the mount's HF view of the served model.safetensors is that "
                       "file byte for byte (%d bytes)" % len(served))
            finally:
                tap.ok(unmount(mnt), "round trip: unmounted")
    tok = os.path.join(tmp, "rt-token")
    secret = "hf_roundtrip%d" % random.randrange(10 ** 9)
    open(tok, "w").write(secret + "\n")
    with Server(ckptfs, [src], ["--token-file", tok]) as srv:
        env = dict(os.environ, HF_ENDPOINT=srv.url)
        env.pop("HF_TOKEN", None)
        env["HF_HOME"] = os.path.join(tmp, "no-hf-home")  # no token file of the user's
        env.pop("HF_TOKEN_PATH", None)
        p1 = subprocess.run([ckptfs, "ls", "hf://ckptfs/dcp"], env=env, capture_output=True,
                            timeout=60)
        env["HF_TOKEN"] = secret
        p2 = subprocess.run([ckptfs, "ls", "hf://ckptfs/dcp"], env=env, capture_output=True,
                            timeout=60)
        names = sorted(p2.stdout.decode().split())
        tap.ok(p1.returncode != 0 and p2.returncode == 0 and
               names == sorted(t["name"] for t in want),
               "round trip with a token: refused without HF_TOKEN, listed with it",
               [p1.returncode, p1.stderr[-200:], p2.returncode, p2.stderr[-200:]])


# ---------------------------------------------------------------------------
# PNG decoding (8-bit RGB/RGBA, non-interlaced: what Chromium writes)

def decode_png(data):
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise ValueError("PNG type %d/%d/%d not handled" % (depth, ctype, interlace))
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def check_browser(tap, ckptfs, tmp, fixtures):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        tap.skip_unless_ci("Chromium renders the repo page", "chromium is not installed (not in make "
                 "deps: too large; apt-get install chromium enables this check)")
        return
    src = os.path.join(fixtures, "sharded") if fixtures and os.path.isdir(
        os.path.join(fixtures or "", "sharded")) else os.path.join(HERE, "..", "fixtures",
                                                                  "dcp", DCP_CASES[0])
    with Server(ckptfs, ["page=" + src]) as srv:
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
        url = srv.url + "/ckptfs/page"
        prof = tempfile.mkdtemp(prefix="chromium.", dir=tmp)
        p = subprocess.run([chromium] + flags + ["--user-data-dir=" + prof, "--dump-dom", url],
                           capture_output=True, timeout=120)
        dom = p.stdout.decode("utf-8", "replace")
        manifest = json.load(open(os.path.join(src, "manifest.json")))
        leaf = manifest["tensors"][0]["path"].split("/")[-1]
        tap.ok(p.returncode == 0 and "<details" in dom and "Summary" in dom
               and ">%s</a>" % leaf in dom and "<svg" in dom and "model.safetensors" in dom,
               "Chromium --dump-dom: the tensor tree, summary, files and the SVG bar are there",
               [p.returncode, p.stderr.decode()[-400:], dom[:300]])
        shot = os.path.join(os.environ.get("SERVE_SCREENSHOT_DIR", tmp), "serve-page.png")
        prof2 = tempfile.mkdtemp(prefix="chromium.", dir=tmp)
        p = subprocess.run([chromium] + flags + ["--user-data-dir=" + prof2,
                                                 "--window-size=1280,2400",
                                                 "--screenshot=" + shot, url],
                           capture_output=True, timeout=120)
        try:
            w, h, bpp, rows = decode_png(open(shot, "rb").read())
            dark = colored = 0
            for row in rows[::4]:
                for x in range(0, w * bpp, bpp * 4):
                    r, g, b = row[x], row[x + 1], row[x + 2]
                    dark += r + g + b < 200
                    colored += (r, g, b) in ((0x4E, 0x79, 0xA7), (0xF2, 0x8E, 0x2B),
                                             (0xE1, 0x57, 0x59), (0x76, 0xB7, 0xB2))
            samples = len(rows[::4]) * len(range(0, w * bpp, bpp * 4))
            ok = (w, h) == (1280, 2400) and 0.003 < dark / samples < 0.5 and colored > 20
            diag = ["%dx%d, %.2f%% dark (text), %d samples of the dtype bar's colours"
                    % (w, h, 100.0 * dark / samples, colored)]
        except (OSError, ValueError, zlib.error) as e:
            ok, diag = False, ["screenshot: %s" % e, p.stderr.decode()[-400:]]
        tap.ok(ok, "Chromium screenshot of the repo page shows text and the dtype bar", diag)
        tap.diag(diag[0])


def main():
    tap = Tap()
    ckptfs = os.environ.get("CKPTFS")
    if not ckptfs or not os.access(ckptfs, os.X_OK):
        tap.skip("ckptfs serve clients", "CKPTFS (%r) is not an executable" % ckptfs)
        tap.done()
        return 0
    tmp = tempfile.mkdtemp(prefix="ckptfs-t29.")
    try:
        node_dir = os.path.join(os.path.dirname(os.path.realpath(ckptfs)), "node")
        why = node_dir_ready(node_dir)
        if why:
            tap.skip_unless_ci("@huggingface/hub against ckptfs serve", why)
        else:
            check_hub_client(tap, node_dir, ckptfs, tmp)
            check_token_client(tap, node_dir, ckptfs, tmp)
        check_ckptfs_client(tap, ckptfs, tmp)
        check_browser(tap, ckptfs, tmp, os.environ.get("FIXTURES"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
