"""On a machine with a CUDA device: `fp4moe run --backend cuda --check` (the default GLM-5-shaped layer,
synthetic weights generated on the device) agrees with the CPU reference on the same inputs (relative
L2 <= 1e-2, which --check enforces), for 1, 4 and 33 tokens. Exits 77 (skipped) without a usable device.

Usage: python3 cli_gpu_check.py BUILD/tools/fp4moe/fp4moe
"""
import sys

import cli_common
from cli_common import EXIT_UNSUPPORTED, check, parse_fields, run


def main():
    fp = sys.argv[1]
    for tokens in (1, 4, 33):
        rc, out, err = run(fp, "run", "--backend", "cuda", "--check", "--tokens", tokens)
        if rc == EXIT_UNSUPPORTED and tokens == 1:
            print(f"skipped: no usable CUDA backend ({err.strip()})")
            sys.exit(77)
        print(out, end="")
        check(rc == 0, f"run --backend cuda --check --tokens {tokens} exits 0 (rc {rc}, stderr {err.strip()!r})")
        f = parse_fields(out)
        check(f.get("backend", "").startswith("cuda"), f"backend is cuda ({f.get('backend')!r})")
        check(f.get("check", "").endswith(": ok"), f"check line reports ok ({f.get('check')!r})")
    print(f"cli_gpu_check: all {cli_common.checks} checks passed")


if __name__ == "__main__":
    main()
