#!/usr/bin/env bash
# scripts/gpu_check.sh refuses what it cannot run before it unpacks or builds anything: no OUTDIR, an
# unknown step or an empty list in STEPS. It runs on a copy of the script in an empty tree (no staged
# binaries, no packed ones) with a PATH of only the two tools those checks use (so no nvcc, wherever one is
# installed): a check that came too late would end in "no staged binaries" instead.
# Usage: gpu_check_args_test.sh PATH/TO/gpu_check.sh
set -u
src=${1:?usage: gpu_check_args_test.sh PATH/TO/gpu_check.sh}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/root/scripts" "$tmp/bin"
cp "$src" "$tmp/root/scripts/gpu_check.sh"
for tool in dirname mkdir; do ln -s "$(command -v "$tool")" "$tmp/bin/$tool"; done
fails=0
# expect NAME WANT_RC WANT_TEXT CMD...: runs CMD, checks its exit status and that its output holds WANT_TEXT.
expect() {
  local name=$1 want_rc=$2 want_text=$3
  shift 3
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want_rc" ] || [[ "$out" != *"$want_text"* ]]; then
    echo "FAIL $name: rc $rc (want $want_rc), output: $out"
    fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}
run() { env -i HOME="$tmp" PATH="$tmp/bin" "$@" "$BASH" "$tmp/root/scripts/gpu_check.sh" "${args[@]}"; }
args=()
expect "no OUTDIR" 1 "usage: scripts/gpu_check.sh OUTDIR" run
args=("$tmp/out1")
expect "unknown step" 2 "STEPS: unknown step 'sanitise' (expected tests, sanitize, bench, sm90)" run STEPS=tests,sanitise
[ -e "$tmp/root/.gpubuild" ] && { echo "FAIL unknown step: .gpubuild was created"; fails=$((fails + 1)); }
expect "no step" 2 "STEPS=',' names no step" run STEPS=,
args=("$tmp/out2")
expect "known steps reach the binaries' check" 1 "no staged binaries" run STEPS=bench,tests
args=("$tmp/out3")
expect "default steps reach the binaries' check" 1 "no staged binaries" run
args=("$tmp/out4")
expect "the sm90 step reaches the binaries' check" 1 "no staged binaries" run STEPS=sm90
echo "gpu_check_args_test: $fails failed"
[ "$fails" -eq 0 ]
