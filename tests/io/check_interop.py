#!/usr/bin/env python3
"""Checks fp4moe's safetensors reader and writer against the official `safetensors` Python package.

usage: python3 check_interop.py PATH/TO/st_tool WORK_DIR

1. Files written by safetensors.numpy.save_file (every dtype fp4moe reads: BF16 and F8_E4M3 through
   ml_dtypes, F16, F32, U8, I8, I32, I64; scalars; zero-size tensors; metadata; exhaustive bit patterns
   for BF16, F16 and F8_E4M3) are dumped by `st_tool dump`: names, dtypes, shapes, raw bytes and the
   decoded values equal NumPy's / ml_dtypes' for every element.
2. Files the package writes but fp4moe must refuse (an F64 tensor, a truncated file) make st_tool exit 1
   with a message, never a crash.
3. The file written by `st_tool write` is loaded by safetensors.numpy.load_file and safe_open with the
   values listed below (written out independently of the C++ side), the same metadata, and a header
   padded to a multiple of 8 bytes.
Exits non-zero on the first failure.
"""
import json
import os
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file, load_file

# safetensors' NumPy loader looks dtypes up by name on the numpy module, which has no bfloat16 or
# float8 types; ml_dtypes provides them.
np.bfloat16 = ml_dtypes.bfloat16
np.float8_e4m3fn = ml_dtypes.float8_e4m3fn

BF16 = np.dtype(ml_dtypes.bfloat16)
F8 = np.dtype(ml_dtypes.float8_e4m3fn)
ST_NAME = {BF16: "BF16", np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.uint8): "U8",
           F8: "F8_E4M3", np.dtype(np.int8): "I8", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64"}
FLOATS = {"BF16", "F16", "F32", "F8_E4M3"}

TOOL = None
WORK = None


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def ok(msg):
    print(f"ok: {msg}")


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def run_tool(*args):
    return subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=120)


def dump(path):
    r = run_tool("dump", path)
    if r.returncode != 0:
        fail(f"st_tool dump {path} exited {r.returncode}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def same_float(a, b):
    return (np.isnan(a) and np.isnan(b)) or (a == b and np.signbit(a) == np.signbit(b))


def compare(dumped, expected, metadata, what):
    """dumped: st_tool's JSON; expected: name -> ndarray as the package wrote it."""
    got_names = sorted(t["name"] for t in dumped["tensors"])
    if got_names != sorted(expected):
        fail(f"{what}: tensor names {got_names} != {sorted(expected)}")
    if dumped["metadata"] != (metadata or {}):
        fail(f"{what}: metadata {dumped['metadata']} != {metadata}")
    elements = 0
    for t in dumped["tensors"]:
        name = t["name"]
        arr = expected[name]
        if t["dtype"] != ST_NAME[arr.dtype]:
            fail(f"{what}: '{name}' dtype {t['dtype']} != {ST_NAME[arr.dtype]}")
        if t["shape"] != list(arr.shape):
            fail(f"{what}: '{name}' shape {t['shape']} != {list(arr.shape)}")
        raw = arr.tobytes()
        if t["hex"] != raw.hex() or t["fnv1a64"] != fnv1a64(raw):
            fail(f"{what}: '{name}' raw bytes differ")
        flat = arr.reshape(-1)
        if len(t["values"]) != flat.size:
            fail(f"{what}: '{name}' has {len(t['values'])} values, expected {flat.size}")
        if t["dtype"] in FLOATS:
            with np.errstate(invalid="ignore"):  # ml_dtypes warns when casting NaN
                ref = flat.astype(np.float64)
            for i, s in enumerate(t["values"]):
                if not same_float(float(s), ref[i]):
                    fail(f"{what}: '{name}'[{i}] decodes to {s}, expected {ref[i]!r} (bits {flat[i:i+1].tobytes().hex()})")
        else:
            for i, s in enumerate(t["values"]):
                if int(s) != int(flat[i]):
                    fail(f"{what}: '{name}'[{i}] = {s}, expected {int(flat[i])}")
        elements += flat.size
    return elements


def check_python_written():
    rng = np.random.default_rng(20240521)
    tensors = {
        "model.bf16": rng.standard_normal((3, 5)).astype(BF16),
        "model.f16": np.concatenate([rng.standard_normal(9), [np.inf, -np.inf, np.nan, 6e-8, -0.0, 65504]]).astype(np.float16),
        "model.f32": np.concatenate([rng.standard_normal(10) * 1e3, [np.inf, np.nan, 1e-45, -0.0]]).astype(np.float32).reshape(2, 7),
        "model.u8": np.arange(256, dtype=np.uint8).reshape(16, 16),
        "model.f8": (rng.standard_normal((4, 16)) * 10).astype(F8),
        "model.i8": np.arange(-128, 128, dtype=np.int64).astype(np.int8),
        "model.i32": np.array([-(2**31), -1, 0, 1, 2**31 - 1], dtype=np.int32),
        "model.i64": np.array([[-(2**63), 2**63 - 1], [0, 12345678901234]], dtype=np.int64),
        "scalar.f32": np.array(3.25, dtype=np.float32),
        "scalar.bf16": np.array(-0.5, dtype=BF16),
        "scalar.i64": np.array(-7, dtype=np.int64),
        "empty.f32": np.zeros((0,), dtype=np.float32),
        "empty.u8": np.zeros((4, 0), dtype=np.uint8),
        "empty.f8": np.zeros((0, 3), dtype=F8),
    }
    meta = {"format": "pt", "note": "written by safetensors.numpy"}
    path = os.path.join(WORK, "py_all.safetensors")
    save_file(tensors, path, metadata=meta)
    n = compare(dump(path), tensors, meta, "py_all")
    ok(f"{len(tensors)} tensors of every dtype (scalars, zero-size) from save_file: {n} values and all bytes equal")

    # Exhaustive bit patterns, built as raw uint16 / uint8 views.
    exhaustive = {
        "bf16.all": np.arange(65536, dtype=np.uint32).astype(np.uint16).view(BF16).reshape(256, 256),
        "f16.all": np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16),
        "f8.all": np.arange(256, dtype=np.uint16).astype(np.uint8).view(F8),
    }
    path = os.path.join(WORK, "py_exhaustive.safetensors")
    save_file(exhaustive, path)
    n = compare(dump(path), exhaustive, None, "py_exhaustive")
    ok(f"every BF16, F16 and F8_E4M3 bit pattern decodes as ml_dtypes/NumPy decode it ({n} values)")

    path = os.path.join(WORK, "py_empty.safetensors")
    save_file({}, path)
    compare(dump(path), {}, None, "py_empty")
    ok("an empty file (no tensors) from save_file loads")

    # Many small tensors: the package orders them by alignment and name, leaving ours unaligned.
    many = {f"t{i:03d}": rng.integers(-100, 100, size=(i % 5,)).astype([np.int8, np.int32, np.int64, np.float32,
                                                                         np.float16][i % 5]) for i in range(120)}
    path = os.path.join(WORK, "py_many.safetensors")
    save_file(many, path)
    compare(dump(path), many, None, "py_many")
    ok("120 mixed-dtype tensors in the package's own order load")


def check_refusals():
    path = os.path.join(WORK, "py_f64.safetensors")
    save_file({"x": np.ones(3, dtype=np.float64)}, path)
    r = run_tool("dump", path)
    if r.returncode != 1 or "unsupported dtype 'F64'" not in r.stderr or "'x'" not in r.stderr:
        fail(f"F64 file: expected exit 1 naming the dtype and tensor, got {r.returncode}: {r.stderr.strip()}")
    ok(f"an F64 tensor is refused by name: {r.stderr.strip()}")

    good = os.path.join(WORK, "py_all.safetensors")
    data = open(good, "rb").read()
    header_len = int.from_bytes(data[:8], "little")
    for cut in (4, 8 + header_len // 2, 8 + header_len + 10, len(data) - 1):
        path = os.path.join(WORK, "py_cut.safetensors")
        with open(path, "wb") as f:
            f.write(data[:cut])
        r = run_tool("dump", path)
        if r.returncode != 1 or "py_cut.safetensors" not in r.stderr:
            fail(f"file cut to {cut} bytes: expected exit 1 with a message, got {r.returncode}: {r.stderr.strip()}")
    ok("files cut at 4 bytes, mid-header, mid-data and one byte short are refused with a message")


def check_tool_written():
    path = os.path.join(WORK, "tool.safetensors")
    r = run_tool("write", path)
    if r.returncode != 0:
        fail(f"st_tool write exited {r.returncode}: {r.stderr.strip()}")
    expected = {
        "bf16": np.array([[1.0, -2.5, 0.15625], [3.140625, -1024.0, 0.0078125]], dtype=BF16),
        "f16": np.array([1.0, -0.5, 65504.0, 6.103515625e-05], dtype=np.float16),
        "f32": np.array([[1.5, -3.25], [1e-30, 123456.75]], dtype=np.float32),
        "u8": np.array([0, 1, 127, 128, 255], dtype=np.uint8),
        "f8_e4m3": np.array([[0x00, 0x38, 0xB8, 0x7E], [0x01, 0x7F, 0x40, 0xC4]], dtype=np.uint8).view(F8),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "i32": np.array([[-(2**31)], [7], [2**31 - 1]], dtype=np.int32),
        "i64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
        "scalar_f32": np.array(2.5, dtype=np.float32),
        "empty_f32": np.zeros((0, 4), dtype=np.float32),
    }
    meta = {"format": "pt", "writer": "st_tool"}
    # The f8 values in words, as ml_dtypes reads them: 0, 1, -1, 448, 2^-9, NaN, 2, -3.
    f8_vals = expected["f8_e4m3"].astype(np.float64).reshape(-1)
    if list(f8_vals[[0, 1, 2, 3, 4, 6, 7]]) != [0, 1, -1, 448, 2**-9, 2, -3] or not np.isnan(f8_vals[5]):
        fail(f"test bug: f8 bytes decode to {f8_vals}")

    loaded = load_file(path)
    with safe_open(path, framework="np") as f:
        if f.metadata() != meta:
            fail(f"safe_open metadata {f.metadata()} != {meta}")
        opened = {k: f.get_tensor(k) for k in f.keys()}
    if sorted(loaded) != sorted(expected) or sorted(opened) != sorted(expected):
        fail(f"names: load_file {sorted(loaded)}, safe_open {sorted(opened)}, expected {sorted(expected)}")
    for name, want in expected.items():
        for how, got in (("load_file", loaded[name]), ("safe_open", opened[name])):
            if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
                fail(f"{how} '{name}': {got.dtype} {got.shape} {got!r} != {want.dtype} {want.shape} {want!r}")
    data = open(path, "rb").read()
    n = int.from_bytes(data[:8], "little")
    header = data[8:8 + n].decode("utf-8")
    if n % 8 != 0 or header != header.rstrip() + " " * (n - len(header.rstrip())):
        fail(f"header length {n} not a multiple of 8 or not space-padded: {header!r}")
    if list(json.loads(header)) != ["__metadata__"] + list(expected):
        fail(f"header order {list(json.loads(header))} is not metadata then insertion order")
    ok(f"st_tool's {len(expected)} tensors (every dtype, scalar, zero-size) load in load_file and safe_open "
       f"bit-exact with metadata; header {n} bytes, space-padded, in insertion order")
    compare(dump(path), expected, meta, "tool round trip")
    ok("st_tool reads its own file back with the same values")


def main():
    global TOOL, WORK
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    TOOL, WORK = sys.argv[1], sys.argv[2]
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    check_python_written()
    check_refusals()
    check_tool_written()
    print("all interop checks passed")


if __name__ == "__main__":
    main()
