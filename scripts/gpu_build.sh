#!/usr/bin/env bash
# Builds the GPU binaries (the fp4moe CLI, the sm90 microbenchmark and every test labelled "gpu") in build-gpu
# and stages stripped copies in .gpubuild/ (git-ignored) so they travel to a GPU machine within a small carry
# budget; also packs them into .gpubuild.tar.xz (a quarter of the size), which scripts/gpu_check.sh unpacks
# when .gpubuild/ is absent.
# The portable family is compiled for sm_90 only here (FP4MOE_PORTABLE_GENCODE) to keep the binaries
# small; the sm_90a family keeps its own flags. Usage: scripts/gpu_build.sh [BUILD_DIR]  (JOBS=N to
# set the parallelism, default 2).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
stage=$root/.gpubuild
jobs=${JOBS:-2}

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP4MOE_CUDA=ON -DFP4MOE_TESTS=ON \
  "-DFP4MOE_PORTABLE_GENCODE=-gencode=arch=compute_90,code=sm_90" >/dev/null

# The gpu-labelled tests. ctest names an executable only once it exists, so: the executable's name, or the
# test's name before the first build, is the target; build, then ask ctest again for the commands.
gpu_tests_json() { ctest --test-dir "$build" -L gpu --show-only=json-v1; }
mapfile -t names < <(gpu_tests_json | python3 -c '
import json, sys
import os
for t in json.load(sys.stdin).get("tests", []):
    cmd = t.get("command") or []
    if not cmd:
        print(t["name"])  # not built yet: the target is named like the test
    elif not os.path.basename(cmd[0]).startswith("python"):
        print(os.path.basename(cmd[0]))
')
targets=(fp4moe_cli bench_sm90 "${names[@]}")
echo "building: ${targets[*]}"
# Keep going past a test that does not compile: it is reported as not built, the rest is staged.
cmake --build "$build" --target fp4moe_cli -j "$jobs"
# The sm90 microbenchmark (scripts/gpu_check.sh STEPS=sm90); a build without the sm90 family has none.
cmake --build "$build" --target bench_sm90 -j "$jobs" || echo "warning: bench_sm90 did not build"
cmake --build "$build" --target "${names[@]}" -j "$jobs" -- -k 0 || echo "warning: some gpu test targets failed to build"

rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/tests"
cp "$build/tools/fp4moe/fp4moe" "$stage/bin/fp4moe"
[ ! -x "$build/tests/sm90/bench_sm90" ] || cp "$build/tests/sm90/bench_sm90" "$stage/bin/bench_sm90"
# Manifest, one test per line: "bin NAME" (staged in tests/) or "py SCRIPT ARGS..." (paths relative to the
# repository; @FP4MOE@ stands for the staged CLI).
gpu_tests_json | python3 -c '
import json, os, shutil, sys
root, build, stage = sys.argv[1:4]
cli = os.path.join(build, "tools/fp4moe/fp4moe")
lines = []
for t in json.load(sys.stdin).get("tests", []):
    cmd = t.get("command") or []
    if not cmd:
        print("warning: gpu test %s was not built" % t["name"], file=sys.stderr)
        lines.append("missing " + t["name"])
        continue
    if os.path.basename(cmd[0]).startswith("python"):
        args = ["@FP4MOE@" if a == cli else os.path.relpath(a, root) if a.startswith(root + "/") else a for a in cmd[1:]]
        lines.append("py " + " ".join(args))
    else:
        shutil.copy2(cmd[0], os.path.join(stage, "tests"))
        lines.append("bin " + os.path.basename(cmd[0]) + ("" if len(cmd) == 1 else " " + " ".join(cmd[1:])))
open(os.path.join(stage, "gpu_tests.txt"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
' "$root" "$build" "$stage"
strip "$stage/bin/"* "$stage/tests/"*
git -C "$root" describe --always --dirty --abbrev=7 >"$stage/revision.txt" 2>/dev/null || echo "uncommitted" >"$stage/revision.txt"
du -sh "$stage"
ls -l "$stage/bin" "$stage/tests"
tar -C "$root" -cf - .gpubuild | xz -T"$jobs" -3 >"$root/.gpubuild.tar.xz"
echo "staged $(du -sh "$stage" | cut -f1) in $stage, packed $(du -sh "$root/.gpubuild.tar.xz" | cut -f1) in .gpubuild.tar.xz"
