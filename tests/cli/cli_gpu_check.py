"""On a machine with a CUDA device: `fp4moe run --backend cuda --check` (the default GLM-5-shaped layer,
synthetic weights generated on the device) agrees with the CPU reference on the same inputs (relative
L2 <= 1e-2, which --check enforces), for 1, 4 and 33 tokens; and `fp4moe bench` with a short settle and a
warm-up by time writes a bench.json whose row records the settle, more warm-up replays than --warmup gave
(the time-based ones), and SM clocks from the on-card probe within (100, 5000) MHz. Exits 77 (skipped)
without a usable device.

Usage: python3 cli_gpu_check.py BUILD/tools/fp4moe/fp4moe
"""
import json
import os
import sys
import tempfile

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
    with tempfile.TemporaryDirectory() as d:
        rc, out, err = run(fp, "bench", "--tokens", 1, "--iters", 2, "--warmup", 1, "--warmup-ms", 5, "--settle-ms", 5,
                           "--dump-dir", d)
        print(out, end="")
        check(rc == 0, f"bench --warmup-ms 5 --settle-ms 5 exits 0 (rc {rc}, stderr {err.strip()!r})")
        if rc == 0:
            with open(os.path.join(d, "bench.json")) as f:
                b = json.load(f)
            r = b["rows"][0]
            check(b.get("settle_ms") == 5 and b.get("warmup_ms") == 5, f"bench.json records the settle and warm-up ({b.get('settle_ms')}, {b.get('warmup_ms')})")
            check(r["warmup_replays"] >= 4, f"the time-based warm-up adds replays to --warmup 1 ({r['warmup_replays']})")
            for k in ("sm_mhz_before_warmup", "sm_mhz_after_timing"):
                check(100 < r[k] < 5000, f"{k} is a clock ({r[k]})")
    print(f"cli_gpu_check: all {cli_common.checks} checks passed")


if __name__ == "__main__":
    main()
