"""Dequantizers written from ggml's reference C (dequantize_row_*) and the float formats'
definitions, in numpy with float32 arithmetic in ggml's order, so results are bit-exact;
shared by the tests of -o as_dtype=f32 (380-as-dtype.t, 450-zstd.t). Nothing here comes from
core/.

    CONVERT[dtype](raw bytes) -> numpy float32 array
"""
import numpy as np

F = np.float32


def f16(raw):
    return np.frombuffer(raw, "<f2").astype(F)


def e4m3(raw):
    b = np.frombuffer(raw, np.uint8).astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, b & 7
    normal = (1 + man / 8.0) * np.exp2(exp - 7.0)
    sub = man / 8.0 * 2.0 ** -6
    v = np.where(exp == 0, sub, normal) * sign
    v[(exp == 15) & (man == 7)] = np.nan
    return v.astype(F)


def e5m2(raw):
    b = np.frombuffer(raw, np.uint8).astype(np.uint16) << 8
    return b.view("<f2").astype(F)


def q8_0(raw):
    blk = np.frombuffer(raw, np.uint8).reshape(-1, 34)
    d = blk[:, :2].copy().view("<f2").astype(F)
    q = blk[:, 2:].view(np.int8).astype(F)
    return (q * d).reshape(-1)


def q4_0(raw):
    blk = np.frombuffer(raw, np.uint8).reshape(-1, 18)
    d = blk[:, :2].copy().view("<f2").astype(F)
    qs = blk[:, 2:].astype(np.int32)
    lo, hi = ((qs & 15) - 8).astype(F), ((qs >> 4) - 8).astype(F)
    return np.concatenate([lo * d, hi * d], axis=1).reshape(-1)


def scale_min_k4(j, q):
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def q4_k(raw):
    out = []
    for blk in np.frombuffer(raw, np.uint8).reshape(-1, 144):
        d, dmin = blk[:4].copy().view("<f2").astype(F)
        scales, q = [int(x) for x in blk[4:16]], blk[16:]
        y = np.empty(256, F)
        for n, j in enumerate(range(0, 256, 64)):
            sc, m = scale_min_k4(2 * n, scales)
            d1, m1 = F(d * F(sc)), F(dmin * F(m))
            sc, m = scale_min_k4(2 * n + 1, scales)
            d2, m2 = F(d * F(sc)), F(dmin * F(m))
            qq = q[32 * n:32 * n + 32]
            y[j:j + 32] = d1 * (qq & 15).astype(F) - m1
            y[j + 32:j + 64] = d2 * (qq >> 4).astype(F) - m2
        out.append(y)
    return np.concatenate(out) if out else np.empty(0, F)


def q6_k(raw):
    out = []
    for blk in np.frombuffer(raw, np.uint8).reshape(-1, 210):
        ql, qh = blk[:128].astype(np.int32), blk[128:192].astype(np.int32)
        sc = blk[192:208].view(np.int8).astype(F)
        d = blk[208:210].copy().view("<f2").astype(F)[0]
        y = np.empty(256, F)
        for n in range(2):
            L, H, S = ql[64 * n:64 * n + 64], qh[32 * n:32 * n + 32], sc[8 * n:8 * n + 8]
            for l in range(32):
                i = l // 16
                q1 = ((L[l] & 15) | ((H[l] >> 0) & 3) << 4) - 32
                q2 = ((L[l + 32] & 15) | ((H[l] >> 2) & 3) << 4) - 32
                q3 = ((L[l] >> 4) | ((H[l] >> 4) & 3) << 4) - 32
                q4 = ((L[l + 32] >> 4) | ((H[l] >> 6) & 3) << 4) - 32
                base = 128 * n + l
                y[base] = F(d * S[i]) * F(q1)
                y[base + 32] = F(d * S[i + 2]) * F(q2)
                y[base + 64] = F(d * S[i + 4]) * F(q3)
                y[base + 96] = F(d * S[i + 6]) * F(q4)
        out.append(y)
    return np.concatenate(out) if out else np.empty(0, F)


def _halves(blk, at):
    return blk[:, at:at + 2].copy().view("<f2").astype(F)


def _nibbles(qs):
    """Low nibbles of the 16 bytes are elements 0-15, high nibbles 16-31 (ggml's order)."""
    return np.concatenate([qs & 15, qs >> 4], axis=1)


def q4_1(raw):
    blk = np.frombuffer(raw, np.uint8).reshape(-1, 20)
    d, m = _halves(blk, 0), _halves(blk, 2)
    return (_nibbles(blk[:, 4:].astype(np.int32)).astype(F) * d + m).reshape(-1)


def _fifth_bits(qh_bytes):
    """Bit j of the little-endian uint32 qh, as 16 for element j."""
    qh = qh_bytes.astype(np.uint32)
    word = qh[:, 0] | qh[:, 1] << 8 | qh[:, 2] << 16 | qh[:, 3] << 24
    return (((word[:, None] >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.int32)


def q5_0(raw):
    blk = np.frombuffer(raw, np.uint8).reshape(-1, 22)
    d = _halves(blk, 0)
    q = (_nibbles(blk[:, 6:].astype(np.int32)) | _fifth_bits(blk[:, 2:6])) - 16
    return (q.astype(F) * d).reshape(-1)


def q5_1(raw):
    blk = np.frombuffer(raw, np.uint8).reshape(-1, 24)
    d, m = _halves(blk, 0), _halves(blk, 2)
    q = _nibbles(blk[:, 8:].astype(np.int32)) | _fifth_bits(blk[:, 4:8])
    return (q.astype(F) * d + m).reshape(-1)


def mxfp4(raw):
    """E8M0 exponent e, 16 bytes of E2M1 nibbles; E2M1 values doubled times 2^(e-128)."""
    blk = np.frombuffer(raw, np.uint8).reshape(-1, 17)
    e = blk[:, :1].astype(np.float64)
    half_scale = np.exp2(e - 128.0)          # exact: 2^-128 .. 2^127 are all float32 values
    e2m1_twice = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], F)
    q = e2m1_twice[_nibbles(blk[:, 1:].astype(np.int32))]
    with np.errstate(over="ignore"):  # e = 255 times 12 is +-inf, as in ggml
        return (q * half_scale.astype(F)).reshape(-1)


def _ternary(q, power):
    """Digit of base-3 fixed point byte q at 3^power: top of (q * 3^power mod 256) * 3."""
    return (((q.astype(np.int64) * 3 ** power) % 256) * 3 >> 8) - 1


def tq1_0(raw):
    blk = np.frombuffer(raw, np.uint8).reshape(-1, 54)
    d = _halves(blk, 52)
    parts = [_ternary(blk[:, 0:32], n) for n in range(5)]
    parts += [_ternary(blk[:, 32:48], n) for n in range(5)]
    parts += [_ternary(blk[:, 48:52], n) for n in range(4)]
    return (np.concatenate(parts, axis=1).astype(F) * d).reshape(-1)


def tq2_0(raw):
    blk = np.frombuffer(raw, np.uint8).reshape(-1, 66)
    d = _halves(blk, 64)
    qs = blk[:, :64].astype(np.int32)
    parts = [((qs[:, j:j + 32] >> (2 * l)) & 3) - 1 for j in (0, 32) for l in range(4)]
    return (np.concatenate(parts, axis=1).astype(F) * d).reshape(-1)


CONVERT = {"F16": f16, "BF16": lambda r: (np.frombuffer(r, "<u2").astype(np.uint32) << 16).view(F),
           "F8_E4M3": e4m3, "F8_E5M2": e5m2, "Q8_0": q8_0, "Q4_0": q4_0, "Q4_K": q4_k, "Q6_K": q6_k,
           "Q4_1": q4_1, "Q5_0": q5_0, "Q5_1": q5_1, "MXFP4": mxfp4, "TQ1_0": tq1_0,
           "TQ2_0": tq2_0}
