"""`fp4moe --help`, `--version` and every registered command's `--help` exit 0 and print usage; usage
errors exit 2 with one line on stderr. The command list is read from `fp4moe --help`, so commands added
later are covered too.

Usage: python3 cli_usage.py BUILD/tools/fp4moe/fp4moe
"""
import sys

import cli_common
from cli_common import EXIT_USAGE, check, expect_error, run


def main():
    fp = sys.argv[1]
    rc, out, err = run(fp, "--help")
    check(rc == 0 and "Usage" in out and err == "", f"fp4moe --help exits 0 with usage on stdout (rc {rc})")
    lines = out.splitlines()
    start = next((i for i, l in enumerate(lines) if l.strip().lower().startswith("subcommands")), None)
    check(start is not None, "fp4moe --help lists subcommands")
    commands = []
    for l in lines[start + 1:]:
        if not l.startswith("  ") or not l.strip():
            break
        commands.append(l.split()[0])
    for required in ("run", "quantize", "inspect"):
        check(required in commands, f"fp4moe --help lists '{required}' (found {commands})")
    for cmd in commands:
        rc, out, err = run(fp, cmd, "--help")
        check(rc == 0 and "Usage" in out and cmd in out and err == "",
              f"fp4moe {cmd} --help exits 0 with its usage (rc {rc}, stderr {err.strip()!r})")
    rc, out, err = run(fp, "--version")
    check(rc == 0 and out.startswith("fp4moe "), f"fp4moe --version prints the version ({out.strip()!r})")

    expect_error(fp, [], EXIT_USAGE, "", ["subcommand"])
    expect_error(fp, ["no-such-command"], EXIT_USAGE, "", ["no-such-command"])
    expect_error(fp, ["run", "--no-such-option"], EXIT_USAGE, "run", ["--no-such-option"])
    expect_error(fp, ["run", "--tokens", "0"], EXIT_USAGE, "run", ["--tokens"])
    expect_error(fp, ["run", "--preset", "glm5", "--config", "x.json"], EXIT_USAGE, "run", ["--preset", "--config"])
    expect_error(fp, ["run", "--preset", "no-such-model", "--backend", "cpu"], 3, "run", ["no-such-model", "glm5"])
    expect_error(fp, ["inspect"], EXIT_USAGE, "inspect", ["PATH"])
    rc, out, err = run(fp, "bench", "--help")
    check(rc == 0 and "--settle-ms" in out and "--warmup-ms" in out, "fp4moe bench --help lists --settle-ms and --warmup-ms")
    expect_error(fp, ["bench", "--settle-ms", "-1"], EXIT_USAGE, "bench", ["--settle-ms"])
    expect_error(fp, ["bench", "--settle-ms", "20000"], EXIT_USAGE, "bench", ["--settle-ms"])
    expect_error(fp, ["bench", "--warmup-ms", "-5"], EXIT_USAGE, "bench", ["--warmup-ms"])
    print(f"cli_usage: all {cli_common.checks} checks passed")


if __name__ == "__main__":
    main()
