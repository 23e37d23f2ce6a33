"""`fp4moe run` with no arguments: the embedded GLM-5-shaped layer (H=6144, I=2048, E=256, top-8,
sigmoid, routed scale 2.5, one shared expert) on 4 synthetic tokens completes and prints the backend,
the model, the time and a checksum line; the same run again gives the same checksum.

Usage: python3 cli_run_default.py BUILD/tools/fp4moe/fp4moe [--once]
"""
import re
import sys
import time

import cli_common
from cli_common import check, parse_fields, run_ok


def main():
    fp = sys.argv[1]
    start = time.monotonic()
    out = run_ok(fp, "run")
    wall = time.monotonic() - start
    print(out, end="")
    f = parse_fields(out)
    check(re.fullmatch(r"(cpu|cuda) \(.+\)", f.get("backend", "")) is not None, f"backend line: {f.get('backend')!r}")
    model = f.get("model", "")
    for part in ("H=6144", "I=2048", "E=256", "top-8", "sigmoid", "2.5", "shared=2048"):
        check(part in model, f"default model is GLM-5 shaped: {part!r} in {model!r}")
    check(f.get("tokens") == "4", "default run uses 4 tokens")
    check(re.fullmatch(r"[0-9.]+ ms.*", f.get("time", "")) is not None, f"time line: {f.get('time')!r}")
    csum = f.get("checksum", "")
    check(re.fullmatch(r"-?[0-9.e+-]+ [0-9a-f]{16}", csum) is not None, f"checksum line: {csum!r}")
    check(wall < 60.0, f"default run took {wall:.1f} s (< 60 s)")
    if "--once" not in sys.argv:
        again = parse_fields(run_ok(fp, "run"))
        check(again.get("checksum") == csum, "a second default run gives the same checksum")
    print(f"cli_run_default: all {cli_common.checks} checks passed (one run {wall:.1f} s wall)")


if __name__ == "__main__":
    main()
