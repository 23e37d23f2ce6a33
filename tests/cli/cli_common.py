"""Helpers shared by the CLI tests: running the fp4moe binary, checking its error contract, and
reading/writing safetensors files with the official `safetensors` package (BF16 and F8_E4M3 through
ml_dtypes, which safetensors.numpy cannot load by itself)."""
import subprocess
import sys

import ml_dtypes
import numpy as np
from safetensors import deserialize
from safetensors.numpy import save

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_BAD_INPUT, EXIT_UNSUPPORTED, EXIT_NO_TACTIC, EXIT_CHECK_FAILED = range(7)

_NP_TYPES = {
    "BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
    "U8": np.uint8, "I8": np.int8, "I32": np.int32, "I64": np.int64, "F8_E4M3": ml_dtypes.float8_e4m3fn,
}

checks = 0


def check(cond, what):
    """Counts and prints one checked fact; exits non-zero on the first failure."""
    global checks
    if not cond:
        print(f"FAIL: {what}", flush=True)
        sys.exit(1)
    checks += 1
    print(f"ok: {what}", flush=True)


def run(binary, *args, timeout=600):
    proc = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def run_ok(binary, *args, timeout=600):
    rc, out, err = run(binary, *args, timeout=timeout)
    if rc != 0:
        print(f"FAIL: fp4moe {' '.join(map(str, args))} exited {rc}\nstdout:\n{out}\nstderr:\n{err}", flush=True)
        sys.exit(1)
    return out


def expect_error(binary, args, code, command, words):
    """Runs a failing command: exit code `code`, stderr exactly one line 'fp4moe <command>: error: ...'
    containing every word in `words` (case-insensitive)."""
    rc, out, err = run(binary, *args)
    lines = [l for l in err.splitlines() if l.strip()]
    desc = f"fp4moe {' '.join(map(str, args))}"
    check(rc == code, f"{desc}: exit code {rc}, expected {code} (stderr: {err.strip()!r})")
    check(len(lines) == 1, f"{desc}: one line on stderr (found {len(lines)}: {err.strip()!r})")
    prefix = f"fp4moe {command}: error: " if command else "fp4moe: error: "
    check(lines[0].startswith(prefix), f"{desc}: stderr starts with {prefix!r}: {lines[0]!r}")
    for w in words:
        check(str(w).lower() in lines[0].lower(), f"{desc}: message names {w!r}")
    return lines[0]


def read_safetensors(path):
    """{name: (dtype string, shape list, numpy array)} read with safetensors.deserialize."""
    with open(path, "rb") as f:
        data = f.read()
    result = {}
    for name, v in deserialize(data):
        arr = np.frombuffer(bytes(v["data"]), dtype=_NP_TYPES[v["dtype"]]).reshape(v["shape"])
        result[name] = (v["dtype"], list(v["shape"]), arr)
    return result


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: numpy array} (ml_dtypes.bfloat16 arrays become BF16)."""
    with open(path, "wb") as f:
        f.write(save(tensors, metadata=metadata))


def parse_fields(stdout):
    """'key: value' lines of `fp4moe run` as a dict."""
    fields = {}
    for line in stdout.splitlines():
        if ": " in line:
            k, v = line.split(": ", 1)
            fields.setdefault(k.strip(), v.strip())
    return fields


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h
