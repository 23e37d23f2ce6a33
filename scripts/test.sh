#!/usr/bin/env bash
# Builds fp4moe and runs the whole test suite, then the sanitizer subset:
#   1. scripts/setup.sh (dependencies);
#   2. build/ (Release, CUDA when nvcc is found): every test; GPU tests report "skipped" without a GPU;
#   3. build-asan/ (ASan + UBSan, CPU code only): the tests labelled "sanitize".
# Prints ctest's summaries and exits non-zero if any build or test fails.
# Environment: JOBS (default: all cores), FP4MOE_BUILD_DIR / FP4MOE_ASAN_BUILD_DIR (default build, build-asan).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

jobs=${JOBS:-$(nproc)}
build=${FP4MOE_BUILD_DIR:-build}
asan=${FP4MOE_ASAN_BUILD_DIR:-build-asan}
start=$SECONDS
status=0
summary=()

step() { echo; echo "== test.sh: $* ($((SECONDS - start)) s)"; }
fail() { echo "test.sh: FAILED: $*" >&2; summary+=("FAILED: $*"); status=1; }

step "setup"
bash scripts/setup.sh || { echo "test.sh: FAILED: scripts/setup.sh" >&2; exit 1; }

step "configure and build $build/"
if bash scripts/configure.sh "$build" && cmake --build "$build" -j"$jobs"; then
  step "ctest $build/ (all tests)"
  if ctest --test-dir "$build" --output-on-failure -j"$jobs"; then
    summary+=("ok: all tests ($build/)")
  else
    fail "tests in $build/"
  fi
else
  fail "build of $build/"
fi

step "configure and build $asan/ (AddressSanitizer + UndefinedBehaviorSanitizer)"
if bash scripts/configure.sh "$asan" -DFP4MOE_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-g -O1" &&
   cmake --build "$asan" -j"$jobs"; then
  step "ctest $asan/ (label sanitize)"
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --test-dir "$asan" -L sanitize --output-on-failure -j"$jobs"; then
    summary+=("ok: sanitize tests ($asan/)")
  else
    fail "sanitize tests in $asan/"
  fi
else
  fail "build of $asan/"
fi

echo
echo "== test.sh summary ($((SECONDS - start)) s)"
printf '  %s\n' "${summary[@]}"
exit $status
