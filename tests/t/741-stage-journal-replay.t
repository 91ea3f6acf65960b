#!/usr/bin/python3
"""A stage's journal replayed with malformed records in it (issue 29: the replay of a
malformed record was run by no test).

Environment: CKPTFS.

A stage of OUT.safetensors (nocommit) gets a file a.bin written, then is unmounted. Records are
appended to SPOOL/journal by hand: 12 bad ones (a mode that is not octal, unknown kinds, a pack
offset that is not a number, a rename with one path, records with too few or too many fields)
and a last line without its newline. Staged again: the mount comes up, stderr names the first
10 bad lines with why ("journal line N: malformed record (skipped)"), then only the count in
all, the line without its newline is dropped silently, a.bin holds its bytes, and nothing the
bad records named exists.
"""

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, is_mounted, run_capture  # noqa: E402
import staging  # noqa: E402

# (record, what the replay calls it); 12 of them: the first 10 are named one by one, then the
# count in all.
BAD = [(b"f /x notamode 3", "malformed"), (b"Z /what", "unknown"),
       (b"p /y 0644 1 notanumber 5", "malformed"), (b"r /a.bin", "malformed"),
       (b"u", "malformed"), (b"d /z", "malformed"), (b"m /a.bin 9x9", "malformed"),
       (b"s /a.bin many", "malformed"), (b"l /w", "malformed"), (b"Q", "unknown"),
       (b"f /v 0644", "malformed"), (b"d /q 0755 extra", "malformed")]
PAYLOAD = bytes(range(256)) * 16


def main():
    tap = Tap()
    ckptfs = os.environ.get("CKPTFS", "build/ckptfs")
    tmp = tempfile.mkdtemp(prefix="ckptfs-t114.")
    out = os.path.join(tmp, "out.safetensors")
    mnt = os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    spool = staging.spool_of(out)
    try:
        rc, _, err = staging.stage(ckptfs, out, mnt, "-o", "nocommit")
        if not tap.ok(rc == 0 and is_mounted(mnt), "stage", [err.decode(errors="replace")]):
            tap.done()
            return 1
        with open(os.path.join(mnt, "a.bin"), "wb") as f:
            f.write(PAYLOAD)
        pid = staging.daemon_pid(spool)
        tap.ok(staging.stop_stage(mnt, pid, spool=spool), "unmounted, the daemon ended")
        journal = os.path.join(spool, "journal")
        with open(journal, "rb") as f:
            lines = f.read().split(b"\n")
        first_bad = len([l for l in lines if l]) + 1  # the lines appended next, numbered from 1
        with open(journal, "ab") as f:
            f.write(b"".join(l + b"\n" for l, _ in BAD) + b"d /partial 07")
        rc, _, err = staging.stage(ckptfs, out, mnt, "-o", "nocommit")
        text = err.decode(errors="replace")
        tap.ok(rc == 0 and is_mounted(mnt), "staged again over the journal", [text])
        named = [n for n, (_, why) in enumerate(BAD[:10], first_bad)
                 if "journal line %d: %s record (skipped)" % (n, why) in text]
        tap.ok(len(named) == 10, "the first 10 bad lines are named as skipped, with why (%d)"
               % len(named), [text])
        tap.ok("journal line %d" % (first_bad + 10) not in text and
               "%d records skipped in all" % len(BAD) in text,
               "past 10, only the count in all is said", [text])
        tap.ok("line %d" % (first_bad + len(BAD)) not in text,
               "the last line without its newline is dropped without a word", [text])
        try:
            with open(os.path.join(mnt, "a.bin"), "rb") as f:
                got = f.read()
        except OSError as e:
            got = e
        tap.ok(got == PAYLOAD, "a.bin holds its bytes")
        names = sorted(os.listdir(mnt))
        tap.ok(not {"x", "y", "z", "v", "q", "w", "what", "partial"} & set(names),
               "nothing a bad record named exists (%r)" % names)
        pid = staging.daemon_pid(spool)
        tap.ok(staging.stop_stage(mnt, pid, spool=spool), "unmounted again")
    finally:
        if is_mounted(mnt):
            run_capture(["fusermount3", "-u", "-z", mnt], 20)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(spool, ignore_errors=True)
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
