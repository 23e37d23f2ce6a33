#!/usr/bin/env python3
"""Checks fp4moe's NVFP4 format against an independent implementation (NumPy + ml_dtypes).

usage: python3 check_format.py PATH/TO/format_tool

1. Every E2M1 code and every E4M3 byte decodes to ml_dtypes' float4_e2m1fn / float8_e4m3fn value.
2. Encoding >= 100,000 fp32 values (random, exact ties between neighbours and one step either side,
   subnormals, past saturation, +-0, NaN, +-Inf) matches ml_dtypes' rounding where the value is finite
   and within the format's range, and fp4moe's documented rules elsewhere: saturation to +-6 / +-448
   (ml_dtypes gives NaN for e4m3fn beyond 464), NaN -> 0x0 (E2M1) and 0x7F (E4M3).
3. Nibble packing matches the layout (element 2i in the low nibble).
4. Quantising random matrices (several shapes, all-zero blocks, wide dynamic range, extremes) gives the
   same codes, block scales and tensor scale as the NumPy implementation below, and dequantising gives
   the same fp32 values bit for bit.
5. Bad input (k % 16 != 0, NaN) makes the tool fail with a message naming the problem.
Exits non-zero on the first failure.
"""
import os
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np

F4 = ml_dtypes.float4_e2m1fn
F8 = ml_dtypes.float8_e4m3fn
F32 = np.float32

TOOL = None
TMP = None
CHECKS = []


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def ok(msg):
    CHECKS.append(msg)
    print(f"ok: {msg}")


def tool(*args, expect_rc=0):
    r = subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True)
    if r.returncode != expect_rc:
        fail(f"format_tool {' '.join(map(str, args))} exited {r.returncode} (expected {expect_rc}): {r.stderr}")
    return r


def path(name):
    return os.path.join(TMP, name)


def run_encode(kind, x):
    x = np.ascontiguousarray(x, dtype=F32)
    x.tofile(path("enc.f32"))
    tool(f"{kind}-encode", path("enc.f32"), path("enc.u8"))
    return np.fromfile(path("enc.u8"), dtype=np.uint8)


def run_decode(kind, b):
    np.ascontiguousarray(b, dtype=np.uint8).tofile(path("dec.u8"))
    tool(f"{kind}-decode", path("dec.u8"), path("dec.f32"))
    return np.fromfile(path("dec.f32"), dtype=F32)


def same_values(a, b):
    """Equal as fp32 values, with the sign of zero and NaN-ness both significant."""
    a = np.asarray(a, F32)
    b = np.asarray(b, F32)
    nan = np.isnan(a) & np.isnan(b)
    return nan | ((a == b) & (np.signbit(a) == np.signbit(b)))


# ---------------------------------------------------------------------------------------------
# Independent encoders: ml_dtypes rounding for in-range finite values, the documented rules elsewhere.

E2M1_MAX = F32(6.0)
E4M3_MAX = F32(448.0)


def ref_e2m1_encode(x):
    x = np.asarray(x, F32)
    out = np.empty(x.shape, np.uint8)
    finite = np.isfinite(x) & (np.abs(x) <= E2M1_MAX)
    out[finite] = x[finite].astype(F4).view(np.uint8) & 0xF
    big = ~np.isnan(x) & ~finite  # |x| > 6 or +-Inf: saturate, keep the sign
    out[big] = np.where(np.signbit(x[big]), 0xF, 0x7)
    out[np.isnan(x)] = 0x0
    return out


def ref_e4m3_encode(x):
    x = np.asarray(x, F32)
    out = np.empty(x.shape, np.uint8)
    finite = np.isfinite(x) & (np.abs(x) <= E4M3_MAX)
    out[finite] = x[finite].astype(F8).view(np.uint8)
    big = ~np.isnan(x) & ~finite
    out[big] = np.where(np.signbit(x[big]), 0xFE, 0x7E)
    out[np.isnan(x)] = 0x7F
    return out


def all_values(dtype, nbits):
    codes = np.arange(1 << nbits, dtype=np.uint8)
    return codes, codes.view(dtype).astype(F32)


# ---------------------------------------------------------------------------------------------


def check_decode():
    codes, want = all_values(F4, 4)
    got = run_decode("e2m1", codes)
    bad = ~same_values(got, want)
    if bad.any():
        i = np.flatnonzero(bad)[0]
        fail(f"e2m1 decode of code {codes[i]}: got {got[i]}, ml_dtypes {want[i]}")
    ok("e2m1 decode: all 16 codes equal ml_dtypes float4_e2m1fn")

    codes, want = all_values(F8, 8)
    got = run_decode("e4m3", codes)
    bad = ~same_values(got, want)
    if bad.any():
        i = np.flatnonzero(bad)[0]
        fail(f"e4m3 decode of byte {codes[i]:#04x}: got {got[i]}, ml_dtypes {want[i]}")
    ok("e4m3 decode: all 256 bytes equal ml_dtypes float8_e4m3fn (NaN at 0x7F/0xFF)")

    r = tool("e2m1-decode", _write(np.array([3, 0x13], np.uint8), "wide.u8"), path("x.f32"), expect_rc=1)
    if "4-bit" not in r.stderr:
        fail(f"e2m1-decode of a 5-bit byte: unexpected message {r.stderr!r}")


def _write(arr, name):
    arr.tofile(path(name))
    return path(name)


def encode_inputs(dtype, fmt_max, rng):
    """fp32 values that exercise every rounding case of a format with maximum fmt_max."""
    _, vals = all_values(dtype, 8 if dtype == F8 else 4)
    pos = np.unique(vals[np.isfinite(vals) & (vals >= 0)])  # 0, subnormals, normals, max
    mids = ((pos[:-1].astype(np.float64) + pos[1:]) / 2).astype(F32)  # exact ties (dyadic values)
    assert np.all(mids.astype(np.float64) == (pos[:-1].astype(np.float64) + pos[1:]) / 2)
    around = np.concatenate([np.nextafter(mids, F32(0)), np.nextafter(mids, F32(np.inf)), pos,
                             np.nextafter(pos, F32(0)), np.nextafter(pos, F32(np.inf))])
    smallest_sub = pos[1]
    parts = [
        mids, around,
        # values below, at and around half the smallest subnormal (rounding to zero or up)
        (smallest_sub / 2) * rng.uniform(0, 2, 5000).astype(F32),
        # fp32 subnormals and tiny values
        rng.uniform(-1, 1, 3000).astype(F32) * F32(1e-38),
        np.array([np.finfo(F32).smallest_subnormal, np.finfo(F32).tiny], F32),
        # uniform over the range and a bit beyond, and log-uniform magnitudes
        rng.uniform(-1.2 * fmt_max, 1.2 * fmt_max, 40000).astype(F32),
        np.exp2(rng.uniform(-20, np.log2(fmt_max) + 2, 40000)).astype(F32),
        # past saturation
        rng.uniform(fmt_max, 100 * fmt_max, 3000).astype(F32),
        np.exp2(rng.uniform(np.log2(fmt_max), 127, 3000)).astype(F32),
        np.array([fmt_max, np.nextafter(F32(fmt_max), F32(np.inf)), np.finfo(F32).max], F32),
        # random fp32 bit patterns (all exponents), specials
        rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(F32),
        np.array([0.0, np.inf, np.nan], F32),
    ]
    x = np.concatenate(parts).astype(F32)
    x = np.concatenate([x, -x])  # both signs, incl. -0, -Inf, -NaN
    return x


def check_encode(kind, dtype, fmt_max, ref, rng):
    x = encode_inputs(dtype, fmt_max, rng)
    got = run_encode(kind, x)
    want = ref(x)
    bad = got != want
    if bad.any():
        i = np.flatnonzero(bad)
        j = i[0]
        fail(f"{kind} encode: {len(i)} mismatches, first x = {x[j]!r} ({x[j:j+1].view(np.uint32)[0]:#010x}): "
             f"got {got[j]:#04x}, expected {want[j]:#04x}")
    # Explicit coverage of each special rule.
    n_sat = int(np.sum(np.isfinite(x) & (np.abs(x) > fmt_max)))
    n_nan = int(np.sum(np.isnan(x)))
    n_inf = int(np.sum(np.isinf(x)))
    n_negzero = int(np.sum((x == 0) & np.signbit(x)))
    if min(n_sat, n_nan, n_inf, n_negzero) == 0:
        fail(f"{kind}: input set lacks a special case")
    ok(f"{kind} encode: {len(x)} values (ties, subnormals, {n_sat} past saturation, NaN, +-Inf, -0) "
       f"match ml_dtypes in range and the saturation/NaN rules outside")
    if len(x) < 100000:
        fail(f"{kind}: only {len(x)} values encoded")


def check_pack(rng):
    codes = rng.integers(0, 16, 4096, dtype=np.uint8)
    tool("pack", _write(codes, "codes.u8"), path("packed.u8"))
    packed = np.fromfile(path("packed.u8"), np.uint8)
    want = (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)
    if not np.array_equal(packed, want):
        fail("pack: layout differs from element 2i in the low nibble")
    tool("unpack", len(codes), path("packed.u8"), path("back.u8"))
    if not np.array_equal(np.fromfile(path("back.u8"), np.uint8), codes):
        fail("unpack: round trip differs")
    r = tool("pack", _write(codes[:3], "odd.u8"), path("packed.u8"), expect_rc=1)
    if "count = 3" not in r.stderr:
        fail(f"pack of 3 codes: unexpected message {r.stderr!r}")
    ok("pack/unpack: element 2i in the low nibble, round trip, odd count rejected")


# ---------------------------------------------------------------------------------------------
# Independent NVFP4 quantiser (DESIGN.md section 2), fp32 arithmetic throughout.


def ref_quantize(w):
    n, k = w.shape
    w = w.astype(F32)
    absw = np.abs(w)
    amax = absw.max() if w.size else F32(0)
    ts = F32(amax) / F32(6.0 * 448.0)
    if ts == 0:
        ts = F32(1.0)
    bamax = absw.reshape(n, k // 16, 16).max(axis=2)
    scales = ref_e4m3_encode(bamax / F32(6.0) / ts)
    one = np.array([1.0], F32).astype(F8).view(np.uint8)[0]
    scales[scales.view(F8).astype(F32) == 0] = one
    denom = scales.view(F8).astype(F32) * ts
    v = w / np.repeat(denom, 16, axis=1)
    codes = ref_e2m1_encode(v)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, scales, F32(ts)


def ref_dequantize(packed, scales, ts):
    n = packed.shape[0]
    codes = np.empty((n, packed.shape[1] * 2), np.uint8)
    codes[:, 0::2] = packed & 0xF
    codes[:, 1::2] = packed >> 4
    e2m1 = codes.view(F4).astype(F32)
    s = np.repeat(scales.view(F8).astype(F32), 16, axis=1)
    return (e2m1 * s) * F32(ts)


def run_quantize(w):
    n, k = w.shape
    np.ascontiguousarray(w, F32).tofile(path("w.f32"))
    tool("quantize", n, k, path("w.f32"), path("q"))
    codes = np.fromfile(path("q.codes"), np.uint8).reshape(n, k // 2)
    scales = np.fromfile(path("q.scales"), np.uint8).reshape(n, k // 16)
    ts = np.fromfile(path("q.tensor_scale"), F32)
    if ts.shape != (1,):
        fail("tensor_scale file does not hold one float")
    tool("dequantize", n, k, path("q"), path("deq.f32"))
    deq = np.fromfile(path("deq.f32"), F32).reshape(n, k)
    return codes, scales, ts[0], deq


def quantize_cases(rng):
    cases = []
    for n, k in [(1, 16), (3, 32), (7, 64), (64, 256), (128, 1024), (5, 4096)]:
        cases.append((f"gaussian {n}x{k}", rng.normal(0, 0.02, (n, k)).astype(F32)))
    # Wide dynamic range per block (1e-12 .. 1e6), some all-zero blocks, some -0.0.
    n, k = 48, 512
    mag = np.repeat(10.0 ** rng.uniform(-12, 6, (n, k // 16)), 16, axis=1)
    w = (rng.normal(0, 1, (n, k)) * mag).astype(F32)
    blocks = w.reshape(n, k // 16, 16)
    blocks[rng.random((n, k // 16)) < 0.15] = 0.0
    blocks[rng.random((n, k // 16)) < 0.05] = -0.0
    cases.append(("wide dynamic range with zero blocks 48x512", w))
    # Per-element log-uniform magnitudes with random signs.
    w = (np.exp2(rng.uniform(-40, 40, (16, 256))) * rng.choice([-1, 1], (16, 256))).astype(F32)
    cases.append(("per-element log-uniform 2^-40..2^40 16x256", w))
    # Exact ties of the scaled values. amax = 6 * 448 makes the tensor scale exactly 1; each block's
    # amax is 6 * s for an E4M3 value s (normal or subnormal), so the block scale is exactly s and
    # w / s lands on multiples of 0.25: every E2M1 midpoint (0.25, 0.75, ..., 5) occurs.
    n, k = 16, 256
    s_choices = np.array([448, 1, 0.5, 0.875, 3 * 2.0**-9, 2.0**-9, 7 * 2.0**-9, 2.0**-6, 240], F32)
    s = np.repeat(rng.choice(s_choices, (n, k // 16)), 16, axis=1)
    w = (rng.integers(-24, 25, (n, k)) / 4.0).astype(F32)
    w[:, ::16] = np.where(rng.random((n, k // 16)) < 0.5, -6.0, 6.0)
    w[0, 0] = 6.0
    s[0, :16] = 448
    w = (w * s).astype(F32)
    assert F32(np.abs(w).max()) / F32(2688) == 1.0
    cases.append(("exact E2M1 ties, tensor scale 1, normal and subnormal block scales 16x256", w))
    cases += boundary_cases(rng)
    w = rng.normal(0, 1, (4, 64)).astype(F32)
    w[2, 17] = 1e4  # one outlier: most block scales small / subnormal
    cases.append(("single outlier 4x64", w))
    cases.append(("all zero 6x48", np.zeros((6, 48), F32)))
    cases.append(("all -0.0 2x32", np.full((2, 32), -0.0, F32)))
    cases.append(("denormal-tiny tensor 2x32", (rng.normal(0, 1, (2, 32)) * 1e-44).astype(F32)))
    cases.append(("tiny tensor (denormal tensor scale) 2x32", (rng.normal(0, 1, (2, 32)) * 1e-38).astype(F32)))
    cases.append(("huge tensor 2x32", (rng.uniform(-1, 1, (2, 32)) * 3e38).astype(F32)))
    return cases


def ulp_steps(x, steps):
    """x moved by `steps` fp32 ulps (steps may be negative), elementwise."""
    x = np.asarray(x, F32)
    out = x.copy()
    for _ in range(int(np.max(np.abs(steps)))):
        up = steps > 0
        more = np.abs(steps) > 0
        out = np.where(more, np.nextafter(out, np.where(up, F32(np.inf), F32(-np.inf))), out).astype(F32)
        steps = steps - np.sign(steps)
    return out


def boundary_cases(rng):
    """Inputs within a few ulps of rounding boundaries, where the order of the fp32 operations decides
    the result: w / (s * ts) against the E2M1 midpoints, and block_amax / 6 / ts against E4M3 midpoints."""
    cases = []
    e2m1_mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], F32)
    for trial in range(3):
        n, k = 32, 512
        w = rng.normal(0, 1, (n, k)).astype(F32) * F32(10.0 ** rng.uniform(-3, 3))
        _, scales, ts = ref_quantize(w)
        unit = np.repeat(scales.view(F8).astype(F32) * ts, 16, axis=1)
        blocks = np.abs(w).reshape(n, k // 16, 16)
        is_max = (blocks == blocks.max(axis=2, keepdims=True)).reshape(n, k)
        mids = rng.choice(e2m1_mids, (n, k)) * rng.choice(np.array([-1, 1], F32), (n, k))
        near = ulp_steps((mids * unit).astype(F32), rng.integers(-3, 4, (n, k)))
        # keep each block's amax element (so the scales stay), move the others onto the boundaries
        w2 = np.where(is_max, w, near).astype(F32)
        cases.append((f"E2M1 rounding boundaries +-3 ulp, trial {trial} {n}x{k}", w2))
    # Block amax at E4M3 midpoints (normal and subnormal) times 6 * tensor_scale, +-3 ulp.
    _, vals = all_values(F8, 8)
    pos = np.unique(vals[np.isfinite(vals) & (vals > 0)])
    e4m3_mids = ((pos[:-1].astype(np.float64) + pos[1:]) / 2).astype(F32)
    n, k = 64, 256
    amax = F32(10.0 ** rng.uniform(-2, 2))
    ts = amax / F32(2688)
    target = rng.choice(e4m3_mids, (n, k // 16))
    bamax = ulp_steps((target * F32(6) * ts).astype(F32), rng.integers(-3, 4, (n, k // 16)))
    w = (rng.uniform(-1, 1, (n, k)).astype(F32) * np.repeat(bamax, 16, axis=1)).astype(F32)
    w.reshape(n, k // 16, 16)[:, :, 0] = bamax * rng.choice(np.array([-1, 1], F32), (n, k // 16))
    w[0, 1] = amax  # fixes the tensor scale
    cases.append((f"E4M3 block-scale rounding boundaries +-3 ulp {n}x{k}", w))
    return cases


def check_quantize(rng):
    one = np.array([1.0], F32).astype(F8).view(np.uint8)[0]
    total = 0
    cases = quantize_cases(rng)
    for name, w in cases:
        codes, scales, ts, deq = run_quantize(w)
        rc, rs, rts = ref_quantize(w)
        if not same_values(ts, rts):
            fail(f"quantize {name}: tensor_scale {ts!r} != reference {rts!r}")
        if not np.array_equal(scales, rs):
            i = np.argwhere(scales != rs)[0]
            fail(f"quantize {name}: block scale [{i[0]}, {i[1]}] = {scales[tuple(i)]:#04x}, "
                 f"reference {rs[tuple(i)]:#04x}")
        if not np.array_equal(codes, rc):
            i = np.argwhere(codes != rc)[0]
            fail(f"quantize {name}: packed codes [{i[0]}, {i[1]}] = {codes[tuple(i)]:#04x}, "
                 f"reference {rc[tuple(i)]:#04x}")
        rdeq = ref_dequantize(rc, rs, rts)
        bad = ~same_values(deq, rdeq)
        if bad.any():
            i = np.argwhere(bad)[0]
            fail(f"dequantize {name}: [{i[0]}, {i[1]}] = {deq[tuple(i)]!r}, reference {rdeq[tuple(i)]!r}")
        if not np.all(np.isfinite(deq)) or not np.all(np.isfinite(scales.view(F8).astype(F32))):
            fail(f"quantize {name}: non-finite output")
        n_one = int(np.sum(scales == one))
        n_sub = int(np.sum((scales & 0x78) == 0))  # E4M3 subnormal (or zero) exponent field
        print(f"   {name}: tensor_scale {float(ts):.6g}, {scales.size} blocks ({n_one} with scale 1, "
              f"{n_sub} subnormal), "
              f"max |deq - w| {float(np.max(np.abs(deq.astype(np.float64) - w))):.3g}")
        total += w.size
    ok(f"quantize/dequantize: {len(cases)} matrices, {total} elements: codes, "
       f"scales, tensor scale and dequantised values identical to the NumPy implementation")


def check_errors():
    np.ones((2, 24), F32).tofile(path("bad.f32"))
    r = tool("quantize", 2, 24, path("bad.f32"), path("bad"), expect_rc=1)
    for part in ("[2, 24]", "multiple of 16"):
        if part not in r.stderr:
            fail(f"k = 24: message lacks {part!r}: {r.stderr!r}")
    w = np.ones((3, 32), F32)
    w[1, 9] = np.nan
    w.tofile(path("bad.f32"))
    r = tool("quantize", 3, 32, path("bad.f32"), path("bad"), expect_rc=1)
    for part in ("row 1", "col 9", "nan"):
        if part not in r.stderr:
            fail(f"NaN input: message lacks {part!r}: {r.stderr!r}")
    ok("errors: k % 16 != 0 and NaN input rejected with the shape / element named")


def main():
    global TOOL, TMP
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    TOOL = sys.argv[1]
    rng = np.random.default_rng(20240611)
    with tempfile.TemporaryDirectory(prefix="fp4moe_format_") as tmp:
        TMP = tmp
        check_decode()
        check_encode("e2m1", F4, 6.0, ref_e2m1_encode, rng)
        check_encode("e4m3", F8, 448.0, ref_e4m3_encode, rng)
        check_pack(rng)
        check_quantize(rng)
        check_errors()
    print(f"check_format: all {len(CHECKS)} checks passed (ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
