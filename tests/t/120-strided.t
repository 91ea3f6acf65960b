#!/usr/bin/python3
"""Strided tensors (views saved as they are: transposed, permuted, sliced, broadcast) through a
mount, compared byte for byte with numpy's row-major copy of the same view.

The torch.save file is assembled here without torch (the zip and pickle writers of
tests/gen/torch_hostile_fixtures.py) around random storages; numpy's as_strided over each
storage says what every tensor file must hold. Two tensors are larger than the band ckptfs
materializes at once (16 MiB), so reads cross bands and bands get evicted. Every tensor is read
whole and by `ckptfs cat`; then reader processes do random-range preads for STRIDED_SECONDS
(default 8), dropping the kernel's cached pages now and then so requests reach the daemon, all
tensors at once (they share the daemon's band cache). Zero mismatches and zero errors wanted.
"""

import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "gen"))
from mount_checks import mounted, run  # noqa: E402

import numpy as np  # noqa: E402
from torch_hostile_fixtures import state_dict, rebuild, torch_zip  # noqa: E402

SECONDS = float(os.environ.get("STRIDED_SECONDS", "8"))
READERS = 4

# storage key: (torch storage class, numpy dtype, elements)
STORAGES = {
    "0": ("FloatStorage", np.float32, 2048 * 1536),
    "1": ("BFloat16Storage", np.uint16, 3000 * 3000),
    "2": ("DoubleStorage", np.float64, 40 * 30 * 20 + 7),
    "3": ("HalfStorage", np.float16, 700 * 400),
    "4": ("ByteStorage", np.uint8, 100000),
    "5": ("FloatStorage", np.float32, 3 * 1100 * 1300),
}
# name: (storage key, storage offset, size, stride), in elements
TENSORS = {
    "f32_t": ("0", 0, [1536, 2048], [1, 1536]),
    "f32_c": ("0", 0, [2048, 1536], [1536, 1]),
    "bf16_t": ("1", 0, [3000, 3000], [1, 3000]),
    "f64_perm": ("2", 7, [20, 40, 30], [1, 600, 20]),
    "f16_slice_t": ("3", 5, [333, 100], [1, 1400]),
    "u8_step": ("4", 11, [33000], [3]),
    "f32_expand": ("0", 100, [500, 700], [0, 2]),
    "f32_perm3": ("5", 0, [1300, 3, 1100], [3300, 1, 3]),
}


def build(path):
    rng = np.random.default_rng(16)
    storages = {}
    for key, (_, dt, n) in STORAGES.items():
        if np.dtype(dt).kind == "f":
            storages[key] = rng.standard_normal(n).astype(dt)
        else:
            storages[key] = rng.integers(0, np.iinfo(dt).max, n, dtype=dt)
    entries, want = [], {}
    for name, (key, off, size, stride) in TENSORS.items():
        cls, dt, n = STORAGES[key]
        entries.append((name, rebuild(cls, key, n, off, size, stride)))
        s = storages[key]
        view = np.lib.stride_tricks.as_strided(
            s[off:], shape=size, strides=[x * s.itemsize for x in stride])
        want[name] = np.ascontiguousarray(view).tobytes()
    records = [("data.pkl", state_dict(entries))]
    records += [("data/" + k, storages[k].tobytes()) for k in STORAGES]
    records.append(("version", b"3\n"))
    with open(path, "wb") as f:
        f.write(torch_zip(records)[0])
    return want


def reader(mnt, want, seed, seconds):
    """Random preads of every tensor until the time is up; the number of bad reads."""
    rnd = random.Random(seed)
    fds = {n: os.open(os.path.join(mnt, n), os.O_RDONLY) for n in want}
    bad, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        name = rnd.choice(list(want))
        data, fd = want[name], fds[name]
        if rnd.random() < 0.2:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        off = rnd.randrange(len(data))
        n = rnd.choice([1, 3, 4096, 65536, 1 << 20, 3 << 20])
        try:
            if os.pread(fd, n, off) != data[off:off + n]:
                bad += 1
        except OSError:
            bad += 1
    for fd in fds.values():
        os.close(fd)
    return bad


def body(tap, ckptfs, _root):
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "views.pt")
        want = build(src)

        def checks(mnt):
            for name, data in want.items():
                with open(os.path.join(mnt, name), "rb") as f:
                    got = f.read()
                tap.ok(got == data, "%s: the file holds numpy's row-major bytes of the view "
                       "(%d bytes)" % (name, len(data)),
                       ["got %d bytes" % len(got)] if got != data else [])
            sys.stdout.flush()
            pids = []
            for i in range(READERS):
                pid = os.fork()
                if pid == 0:
                    os._exit(min(reader(mnt, want, 1000 + i, SECONDS), 100))
                pids.append(pid)
            bad = sum(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids)
            tap.ok(bad == 0, "%d readers x %.0f s of random preads with cache drops: every "
                   "byte as numpy says" % (READERS, SECONDS), ["%d bad reads" % bad])

        mounted(tap, ckptfs, src, "views.pt", checks)

        problems = []
        for name, data in want.items():
            r = subprocess.run([ckptfs, "cat", src, name], capture_output=True, timeout=120)
            if r.returncode or r.stdout != data:
                problems.append("%s: status %d, %d bytes" % (name, r.returncode, len(r.stdout)))
        tap.ok(not problems, "ckptfs cat: every tensor as numpy says", problems)


sys.exit(run(body))
