#!/usr/bin/python3
"""-o as_dtype=f32: F16, BF16, F8_E4M3, F8_E5M2, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K,
TQ1_0, TQ2_0 and MXFP4 tensors read as float32, bit-exact with values this test computes itself from the source bytes (numpy, float32
arithmetic in the order of ggml's reference dequantizers); other tensors are unchanged."""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib"))
from mount_checks import mounted, read_json, run  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "lib",
                                "readers"))
from dequant import CONVERT, F  # noqa: E402


def same(a, b):
    """Bit-equal, or NaN in both places (NaN payloads may differ)."""
    if a.shape != b.shape:
        return False
    nan = np.isnan(a) & np.isnan(b)
    return bool(np.all(nan | (a.view(np.uint32) == b.view(np.uint32))))


def main(tap, ckptfs, fixtures):
    seen = set()
    for case in ("dtypes", "gguf/v3"):
        manifest = read_json(os.path.join(fixtures, case, "manifest.json"))
        tensors = manifest["tensors"]
        src = os.path.join(fixtures, case, manifest.get("source") or tensors[0]["file"])

        def checks(mnt):
            for t in tensors:
                path = os.path.join(mnt, t["path"])
                with open(os.path.join(fixtures, case, t["file"]), "rb") as f:
                    f.seek(t["offset"])
                    raw = f.read(t["nbytes"])
                side = json.load(open((path[:-4] if path.endswith(".raw") else path) + ".json"))
                if t["dtype"] not in CONVERT:
                    tap.ok(open(path, "rb").read() == raw and side["dtype"] == t["dtype"],
                           "%s: %s (%s) is not converted" % (case, t["name"], t["dtype"]))
                    continue
                seen.add(t["dtype"])
                want = CONVERT[t["dtype"]](raw)
                data = open(path, "rb").read()
                got = np.frombuffer(data, F)
                tap.ok(same(got, want), "%s: %s %s -> F32, %d values bit-exact"
                       % (case, t["name"], t["dtype"], want.size),
                       ["first differences at %s" % np.nonzero(got != want)[0][:5]] if got.shape == want.shape
                       else ["size %d, want %d" % (got.size, want.size)])
                tap.ok(side["dtype"] == "F32" and side["stored_dtype"] == t["dtype"] and
                       side["nbytes"] == 4 * want.size and side["numpy_dtype"] == "<f4" and
                       side["converted_on_read"] is True and os.path.getsize(path) == 4 * want.size,
                       "%s: %s sidecar says F32 converted from %s" % (case, t["name"], t["dtype"]))
                # Unaligned slices cross block boundaries.
                with open(path, "rb") as f:
                    full = want.tobytes()
                    for off, n in ((1, 7), (126, 300), (len(full) // 2 + 3, 5000)):
                        f.seek(off)
                        part = f.read(n)
                        ok = part == full[off:off + n] or np.isnan(want).any()
                        tap.ok(ok, "%s: %s slice [%d, +%d)" % (case, t["name"], off, n))

        mounted(tap, ckptfs, os.path.normpath(src), case, checks, ("-o", "as_dtype=f32"),
                "%s: mount with -o as_dtype=f32" % case)
    tap.ok(seen == set(CONVERT), "every convertible dtype was exercised", [sorted(set(CONVERT) - seen)])


if __name__ == "__main__":
    sys.exit(run(main))
