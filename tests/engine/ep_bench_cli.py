"""`fp4moe bench --ep N` option errors, checked before any device work (so the same with or without a GPU):
N must divide the model's routed experts, --ep-rank must be in [0, N), --ep with --tp > 1 is refused, and
each error is one line naming the values, with exit code 3 (bad input) or 2 (usage).

Usage: python3 ep_bench_cli.py BUILD/tools/fp4moe/fp4moe
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
import cli_common  # noqa: E402
from cli_common import EXIT_BAD_INPUT, EXIT_USAGE, check, expect_error, run  # noqa: E402


def main():
    fp = sys.argv[1]
    rc, out, err = run(fp, "bench", "--help")
    check(rc == 0 and "--ep" in out and "--ep-rank" in out, "fp4moe bench --help lists --ep and --ep-rank")
    # GLM-5 has 256 routed experts, Mixtral 8.
    expect_error(fp, ["bench", "--ep", "3"], EXIT_BAD_INPUT, "bench", ["--ep 3", "256", "divide"])
    expect_error(fp, ["bench", "--preset", "mixtral-8x7b", "--ep", "16"], EXIT_BAD_INPUT, "bench",
                 ["--ep 16", "8", "divide"])
    expect_error(fp, ["bench", "--ep", "8", "--tp", "8"], EXIT_BAD_INPUT, "bench",
                 ["--ep 8", "--tp 8", "not supported together"])
    expect_error(fp, ["bench", "--ep", "2", "--tp", "2", "--tokens", "1"], EXIT_BAD_INPUT, "bench",
                 ["not supported together"])
    expect_error(fp, ["bench", "--ep", "8", "--ep-rank", "8"], EXIT_BAD_INPUT, "bench", ["--ep-rank 8", "--ep 8"])
    expect_error(fp, ["bench", "--ep", "0"], EXIT_USAGE, "bench", ["--ep"])
    expect_error(fp, ["bench", "--ep-rank", "-1"], EXIT_USAGE, "bench", ["--ep-rank"])
    # A valid shard passes the checks: without a GPU the next error is the missing device or backend.
    rc, out, err = run(fp, "bench", "--ep", "8", "--tokens", "1", "--iters", "1", "--warmup", "0", timeout=300)
    if rc == 0:
        check("EP8 shard, rank 0: routed experts [0, 32) of 256" in out, "fp4moe bench --ep 8 names its shard")
    else:
        check(rc == 4 and "--ep" not in err, f"fp4moe bench --ep 8 is accepted (rc {rc}: {err.strip()!r})")
    print(f"ep_bench_cli: all {cli_common.checks} checks passed")


if __name__ == "__main__":
    main()
