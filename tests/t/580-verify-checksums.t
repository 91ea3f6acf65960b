#!/usr/bin/python3
"""`ckptfs verify` checks the CRC-32 every torch zip record carries, and -q is quiet.

Files are written by real torch (torch.save) and damaged here; Python's zipfile.testzip() is
the independent judge of which record is bad, hashlib of which tensor bytes are right.
  - 4 flipped bytes inside the record of tensor "w": testzip names it; verify exits 3 with
    a MISMATCH line for "w" naming the record, and still prints the right digest of "b";
  - a wrong CRC-32 for a record no tensor reads ("version"): a MISMATCH line of its own;
  - --json lists the failed record; the undamaged file passes with every record checked;
  - -q without --manifest prints no digest lines, only failures and the totals.
"""

import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from ckptfs_test import Tap, run_capture  # noqa: E402

TIMEOUT = 60

MAKE = r"""
import sys, torch, hashlib, json
w = torch.arange(64, dtype=torch.float32).reshape(8, 8)
b = torch.ones(16, dtype=torch.float32)
torch.save({"w": w, "b": b}, sys.argv[1])
print(json.dumps({"w": hashlib.sha256(w.numpy().tobytes()).hexdigest(),
                  "b": hashlib.sha256(b.numpy().tobytes()).hexdigest()}))
"""


def record_data_offset(data, info):
    h = info.header_offset
    n, e = struct.unpack("<HH", data[h + 26:h + 30])
    return h + 30 + n + e


def testzip(data):
    return zipfile.ZipFile(io.BytesIO(bytes(data))).testzip()


def main():
    ckptfs = os.environ.get("CKPTFS", "")
    if not ckptfs or not os.access(ckptfs, os.X_OK):
        print("1..0 # SKIP CKPTFS (%r) is not an executable" % ckptfs)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        return checks(ckptfs, tmp)


def checks(ckptfs, tmp):
    good = os.path.join(tmp, "good.pt")
    p = subprocess.run(["/usr/bin/python3", "-c", MAKE, good], capture_output=True, text=True)
    if p.returncode != 0:
        print("1..0 # SKIP torch.save is not available to /usr/bin/python3: %s"
              % p.stderr.strip().splitlines()[-1:])
        return 0
    digests = json.loads(p.stdout)
    tap = Tap()
    data = open(good, "rb").read()
    z = zipfile.ZipFile(good)
    names = [i.filename for i in z.infolist()]
    w_record = [n for n in names if n.endswith("/data/0")][0]
    version = [n for n in names if n.endswith("/version")][0]
    tap.ok(testzip(data) is None, "zipfile.testzip: the torch.save file is sound")

    rc, out, err = run_capture([ckptfs, "verify", good], TIMEOUT)
    text = out.decode()
    tap.ok(rc == 0, "verify of the sound file exits 0", [err.decode()])
    tap.ok("zip records: %d CRC-32 checked, 0 failed" % len(names) in text,
           "verify checks the CRC-32 of all %d records" % len(names), [text])
    tap.ok("%s  w" % digests["w"] in text and "%s  b" % digests["b"] in text,
           "verify prints sha256sum lines that match hashlib")

    # 4 flipped bytes inside w's record
    bad = bytearray(data)
    off = record_data_offset(data, z.getinfo(w_record)) + 8
    bad[off:off + 4] = bytes(x ^ 0xFF for x in bad[off:off + 4])
    bad_path = os.path.join(tmp, "bad.pt")
    open(bad_path, "wb").write(bad)
    tap.ok(testzip(bad) == w_record, "zipfile.testzip names %s as bad" % w_record)
    rc, out, err = run_capture([ckptfs, "verify", bad_path], TIMEOUT)
    text = out.decode()
    tap.ok(rc == 3, "verify of 4 flipped bytes in a tensor record exits 3 (got %r)" % rc,
           [text, err.decode()])
    lines = [line for line in text.splitlines() if line.startswith("MISMATCH")]
    tap.ok(len(lines) == 1 and lines[0].split()[1] == "w:" and w_record in lines[0]
           and "CRC-32" in lines[0], "one MISMATCH line: w, naming its record and CRC-32",
           [text])
    tap.ok("%s  b" % digests["b"] in text, "the sound tensor b is still hashed right")
    tap.ok("zip records: %d CRC-32 checked, 1 failed" % len(names) in text,
           "the totals count one failed record", [text])

    rc, out, err = run_capture([ckptfs, "verify", "--json", bad_path], TIMEOUT)
    try:
        doc = json.loads(out)
    except ValueError:
        doc = {}
    failed = doc.get("zip_crc32_failed", [])
    tap.ok(rc == 3 and doc.get("result") == "mismatch" and len(failed) == 1
           and failed[0].get("record") == w_record,
           "--json: result mismatch, zip_crc32_failed names the record", [out.decode()[-600:]])
    stored = "%08x" % z.getinfo(w_record).CRC
    computed = "%08x" % (__import__("zlib").crc32(
        bad[record_data_offset(data, z.getinfo(w_record)):][:z.getinfo(w_record).file_size]))
    tap.ok(failed and failed[0].get("stored") == stored and failed[0].get("computed") == computed,
           "--json: stored and computed CRC-32 agree with zlib", [repr(failed), stored, computed])

    # A wrong CRC-32 in the central directory for the version record, which no tensor reads
    bad2 = bytearray(data)
    pos = 0
    while True:
        pos = bad2.find(b"PK\x01\x02", pos)
        if pos < 0:
            break
        nlen = struct.unpack("<H", bad2[pos + 28:pos + 30])[0]
        if bad2[pos + 46:pos + 46 + nlen].decode() == version:
            bad2[pos + 16] ^= 0x01
        pos += 4
    bad2_path = os.path.join(tmp, "bad-version.pt")
    open(bad2_path, "wb").write(bad2)
    tap.ok(testzip(bad2) == version, "zipfile.testzip names %s as bad" % version)
    rc, out, err = run_capture([ckptfs, "verify", bad2_path], TIMEOUT)
    text = out.decode()
    tap.ok(rc == 3 and any(line.startswith("MISMATCH") and version in line
                           for line in text.splitlines()),
           "a bad record that no tensor reads: a MISMATCH line of its own, exit 3",
           [text, err.decode()])
    tap.ok("%s  w" % digests["w"] in text, "the tensors are still hashed right")

    # -q without --manifest
    rc, out, err = run_capture([ckptfs, "verify", "-q", good], TIMEOUT)
    text = out.decode()
    tap.ok(rc == 0 and digests["w"] not in text and digests["b"] not in text
           and "2 tensors" in text, "verify -q without a manifest prints no digest lines",
           [text])
    rc, out, err = run_capture([ckptfs, "verify", "-q", bad_path], TIMEOUT)
    text = out.decode()
    tap.ok(rc == 3 and digests["b"] not in text and "MISMATCH    w:" in text,
           "verify -q still prints the failure", [text])
    tap.done()
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
