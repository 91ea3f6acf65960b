#!/usr/bin/python3
"""Sources by hf:// name: every fixture mounts from a Hub-shaped site and reads byte-identical to
its local mount.

Environment: CKPTFS, FIXTURES.

nginx (run by the test) serves a site shaped like the Hugging Face Hub (tests/lib/hub_tree.py):
the revision API names a commit, the tree API lists the repo in pages linked by Link headers,
resolve URLs answer 302 to the bytes elsewhere, and every API and resolve request needs the
token (401 without). With HF_ENDPOINT and HF_TOKEN set, hf://test/fixtures@main/PATH of every
fixture source mounts equal to the local mount, naming hf://test/fixtures@SHA/PATH (the revision
pinned to its commit at mount). The token appears in no file of a mount; without it the mount
exits 2 with one line naming the repo. The layouts (tests/lib/remote_layouts.py: tar/.nemo, HF
cache folders, .bin repos, folders, split GGUF, Meta MP, DeepSpeed) mount from hf:// paths too,
pass their own checks and equal their local mounts.
"""

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import run_capture  # noqa: E402
from mount_checks import finish, mounted, start  # noqa: E402
import hub_tree  # noqa: E402
import remote_compare  # noqa: E402
import remote_layouts  # noqa: E402
import remote_servers  # noqa: E402

REPO = "test/fixtures"
SHA = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_t0k3nSECRET"


def body(tap, ckptfs, fixtures, served, server):
    os.environ.update(HF_ENDPOINT=server.url, HF_TOKEN=TOKEN)
    sources = remote_compare.compare_all(
        tap, ckptfs, fixtures, lambda rel: "hf://%s@%s/%s" % (REPO, SHA, rel))
    remote_layouts.compare_layouts(tap, ckptfs, served,
                                   lambda rel: "hf://%s@%s/%s" % (REPO, SHA, rel))
    remote_layouts.check_hostile(tap, ckptfs, served,
                                 lambda rel: "hf://%s@%s/%s" % (REPO, SHA, rel))
    # By branch name: pinned to the commit; the token shows nowhere.
    src = "hf://%s/sharded" % REPO

    def checks(mnt):
        blob = b"".join(remote_compare.snapshot_of(mnt).values())
        tap.ok(("hf://%s@%s/sharded" % (REPO, SHA)).encode() in blob,
               "hf://REPO (main) is pinned to its commit in summary and sidecars")
        tap.ok(TOKEN.encode() not in blob, "the token appears in no file of the mount")
        # Read with the token: a user without it gets 401 from the Hub, so nothing of the mount
        # may be readable by group or others (with -o allow_other the kernel checks these).
        wide = []
        for root, dirs, files in os.walk(mnt):
            for n in dirs + files:
                m = os.stat(os.path.join(root, n)).st_mode
                if m & 0o077:
                    wide.append("%s %04o" % (os.path.relpath(os.path.join(root, n), mnt), m & 0o7777))
        tap.ok(not wide, "a repo read with a token: every file 0400, every directory 0500",
               wide[:5])

    mounted(tap, ckptfs, src, "hf:// by branch", checks)
    env = dict(os.environ)
    del os.environ["HF_TOKEN"]
    try:
        os.environ["HF_TOKEN_PATH"] = "/nonexistent"
        os.environ["HF_HOME"] = "/nonexistent"
        mnt = tempfile.mkdtemp(prefix="ckptfs-t48.")
        rc, out, err = run_capture([ckptfs, src, mnt], 60)
        os.rmdir(mnt)
        tap.ok(rc == 2 and b"hf://test/fixtures" in err and b"401" in err and
               err.count(b"\n") == 1, "without the token: exit 2, one line naming the repo",
               [rc, err])
    finally:
        os.environ.clear()
        os.environ.update(env)
    tap.ok(len(sources) > 0, "the Hub tree came in several pages (%d files)"
           % sum(len(fs) for _, _, fs in os.walk(fixtures)))


def main():
    started = start()
    if not started:
        return 0
    tap, ckptfs, fixtures = started
    reason = remote_servers.nginx_skip_reason()
    if reason:
        tap.skip_unless_ci("hub tests", reason)
        return finish(tap)
    site = tempfile.mkdtemp(prefix="ckptfs-hub.")
    served = remote_layouts.served_root(fixtures)
    try:
        extra = hub_tree.build_site(site, served, REPO, SHA, page_size=500, require_token=TOKEN)
        with remote_servers.Nginx(site, extra=extra) as server:
            body(tap, ckptfs, fixtures, served, server)
    finally:
        shutil.rmtree(served)
        shutil.rmtree(site)
    return finish(tap)


if __name__ == "__main__":
    sys.exit(main())
