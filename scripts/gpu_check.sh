#!/usr/bin/env bash
# The whole GPU check in one go, on a GPU machine: every gpu-labelled test binary, the sm90 kernels' SASS
# (check_sass.py), compute-sanitizer memcheck and racecheck on the small cases (the Sanitize.* suite:
# every tactic on tail shapes, one
# forward per routing family and shared-expert kind, the chain routing itself, the resident tactic's forward
# in its default forms), racecheck of the sm90 tactics test, memcheck and
# racecheck of the e4m3 path's test and of the resident tactic's test, then `fp4moe
# bench` on the GLM-5 layer and the PyTorch peer in the same run, and the same for the layer's TP8 and
# EP8 shards. Uses the binaries
# staged in .gpubuild/ (scripts/gpu_build.sh; or its packed .gpubuild.tar.xz, unpacked first), or builds them when nvcc is available. Logs go to OUTDIR;
# a short summary is printed last (and written to OUTDIR/summary.txt). Exit status: 0 when every step
# passed.
#   usage: scripts/gpu_check.sh OUTDIR   (BENCH_TOKENS=1,8,... and BENCH_ITERS=N override the bench,
#   BENCH_TP=N / BENCH_EP=N the tensor- / expert-parallel shard also benchmarked (default 8, 0: none),
#   BENCH_ARGS="..." extra options for every `fp4moe bench` of the check (e.g. --extra-layouts);
#   TEST_TIMEOUT / SANITIZER_TIMEOUT / BENCH_TIMEOUT, in seconds, bound each step so a hang cannot eat
#   the run: a step that runs out of time is reported as TIMEOUT; STEPS=tests,sanitize,bench (the default: all
#   three) runs only the steps named, e.g. STEPS=bench to re-time binaries whose tests already passed; the
#   step sm90, never a default, runs bench_sm90 --tp8 and --resident-cc and the resident tactic's TP8 forward
#   A/B, step 5)
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUTDIR}
root=$(cd "$(dirname "$0")/.." && pwd)
stage=$root/.gpubuild
mkdir -p "$out"
out=$(cd "$out" && pwd)
steps=",${STEPS:-tests,sanitize,bench},"
for st in ${steps//,/ }; do
  case "$st" in
    tests | sanitize | bench | sm90) ;;
    *) echo "STEPS: unknown step '$st' (expected tests, sanitize, bench, sm90)"; exit 2 ;;
  esac
done
want() { [[ "$steps" == *",$1,"* ]]; }
want tests || want sanitize || want bench || want sm90 ||
  { echo "STEPS='${STEPS:-}' names no step (expected tests, sanitize, bench, sm90)"; exit 2; }

if [ ! -x "$stage/bin/fp4moe" ] && [ -f "$root/.gpubuild.tar.xz" ]; then
  tar -C "$root" -xJf "$root/.gpubuild.tar.xz" || { echo "could not unpack $root/.gpubuild.tar.xz"; exit 1; }
fi
if [ ! -x "$stage/bin/fp4moe" ]; then
  if command -v nvcc >/dev/null; then
    "$root/scripts/gpu_build.sh" >"$out/build.log" 2>&1 || { echo "build failed, see $out/build.log"; exit 1; }
  else
    echo "no staged binaries in $stage and no nvcc to build them"
    exit 1
  fi
fi

summary=()
status=0
note() { summary+=("$1"); }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >"$out/device.txt" 2>&1
note "device: $(tail -n 1 "$out/device.txt")"

# 1. GPU tests (the manifest written by gpu_build.sh: "bin NAME ARGS" or "py SCRIPT ARGS")
want tests || note "tests: not run (STEPS=${STEPS:-})"
want tests && while read -r kind t args; do
  [ -n "${t:-}" ] || continue
  name=$(basename "$t" .py)
  if [ "$kind" = missing ]; then
    status=1
    note "test $name: NOT BUILT (it failed to compile in gpu_build.sh)"
    continue
  fi
  if [ "$kind" = py ]; then
    cmd=(python3 "$root/$t")
    for a in $args; do [ "$a" = "@FP4MOE@" ] && cmd+=("$stage/bin/fp4moe") || cmd+=("$a"); done
  else
    cmd=("$stage/tests/$t")
    for a in $args; do cmd+=("$a"); done
  fi
  start=$SECONDS
  (cd "$root" && timeout -k 10 "${TEST_TIMEOUT:-300}" "${cmd[@]}") >"$out/test_$name.log" 2>&1
  rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    status=1
    # The last case started and, where the test prints them (sm90_tactics_test), its last progress line.
    last_run=$(grep '^\[ RUN' "$out/test_$name.log" | tail -n 1)
    last_step=$(grep '^\[ progress' "$out/test_$name.log" | tail -n 1)
    note "test $name: TIMEOUT after ${TEST_TIMEOUT:-300} s (last test started: $last_run${last_step:+; $last_step})"
  elif [ $rc -eq 0 ]; then
    note "test $name: PASS ($(grep -c '^\[       OK \]' "$out/test_$name.log") gtest cases, $((SECONDS - start)) s)"
  elif [ $rc -eq 77 ]; then
    note "test $name: SKIPPED (rc 77: $(tail -n 1 "$out/test_$name.log"))"
  else
    status=1
    note "test $name: FAIL rc=$rc ($(grep '^\[  FAILED  \]' "$out/test_$name.log" | sort -u | head -5 | tr '\n' ' '))"
  fi
done <"$stage/gpu_tests.txt"

# 1b. the sm90 kernels' SASS (src/kernels/sm90_wgmma/check_sass.py: HGMMA in every kernel, no local memory,
#     no early reuse of an in-flight wgmma's registers, no wgmmas that ptxas serialised)
if want tests; then
  objdump_bin=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
  if "$objdump_bin" -sass "$stage/bin/fp4moe" 2>"$out/sass_check.err" | python3 "$root/src/kernels/sm90_wgmma/check_sass.py" \
    >"$out/sass_check.log" 2>&1; then
    note "SASS check: PASS ($(grep -c 'HGMMA' "$out/sass_check.log") sm90 kernels)"
  else
    status=1
    note "SASS check: FAIL ($(grep -v ': HGMMA [0-9]*, LDL/STL 0$' "$out/sass_check.log" | head -3 | tr '\n' ' '))"
  fi
fi

# 2. compute-sanitizer on the small cases
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# sanitize LABEL LOG TOOL BINARY ARGS...: one compute-sanitizer run, bounded by SANITIZER_TIMEOUT, noted
# as PASS with its summary line or FAIL.
sanitize() {
  local label=$1 log=$2 tool=$3
  shift 3
  local start=$SECONDS
  timeout -k 10 "${SANITIZER_TIMEOUT:-180}" "$cs" --tool "$tool" --error-exitcode 99 "$@" >"$out/$log" 2>&1
  local rc=$?
  local line
  line=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/$log" | tail -n 1)
  if [ $rc -eq 0 ]; then
    note "compute-sanitizer $label: PASS (${line:-no summary line}; $((SECONDS - start)) s)"
  else
    status=1
    note "compute-sanitizer $label: FAIL rc=$rc (${line:-see log})"
  fi
}
# racecheck: the shared expert on the caller's stream (FP4MOE_SERIAL_STREAM=1); the same kernels, but
# racecheck did not finish the two-stream forward within minutes. Its run time on the warp-specialised
# kernels (warps spinning on mbarriers) varies from run to run for the same binary, from under a second
# to minutes for Sanitize.EngineForward on the H200: a TIMEOUT here is not a hazard (docs/perf.md).
if want sanitize; then
  FP4MOE_SERIAL_STREAM=0 sanitize memcheck sanitize_memcheck.log memcheck "$stage/tests/engine_gpu_test" --gtest_filter='Sanitize.*'
  FP4MOE_SERIAL_STREAM=1 sanitize racecheck sanitize_racecheck.log racecheck "$stage/tests/engine_gpu_test" --gtest_filter='Sanitize.*'
  # racecheck of every sm90 tactic on the tactics test's shapes (longer reductions and more rows than the
  # Sanitize.* cases, so every stage of the ring is reused), one GEMM at a time and chained (docs/perf.md,
  # sm90 step 24: clean since every consumer thread releases the stages it read)
  # (in two runs, each within SANITIZER_TIMEOUT: on the H200 the first takes about 90 s, the per-item wait
  # case alone about 90 s more)
  sanitize "racecheck (sm90 tactics)" sanitize_racecheck_sm90.log racecheck "$stage/tests/sm90_tactics_test" \
    --gtest_filter='*EveryTactic*:*Chained*-*ChainedLaunchWaitingPerItem*'
  sanitize "racecheck (sm90 chained, per-item wait)" sanitize_racecheck_sm90_wait.log racecheck \
    "$stage/tests/sm90_tactics_test" --gtest_filter='*ChainedLaunchWaitingPerItem*'
  # the e4m3 path's numerics (its token split writes shared memory that its wgmmas read)
  sanitize "memcheck (sm90 e4m3)" sanitize_memcheck_e4m3.log memcheck "$stage/tests/sm90_e4m3_test"
  sanitize "racecheck (sm90 e4m3)" sanitize_racecheck_e4m3.log racecheck "$stage/tests/sm90_e4m3_test"
  # the resident tactic (its last CTA per row reads the fp32 row the others added into, then zeroes it)
  sanitize "memcheck (sm90 resident)" sanitize_memcheck_cc.log memcheck "$stage/tests/sm90_cc_tactic_test"
  sanitize "racecheck (sm90 resident)" sanitize_racecheck_cc.log racecheck "$stage/tests/sm90_cc_tactic_test" \
    --gtest_filter='-*Tp8DecodeShape*'
else
  note "compute-sanitizer: not run (STEPS=${STEPS:-})"
fi

# 3. benchmark (the engine's own choice, then the portable family alone) + PyTorch peer, same run
tokens=${BENCH_TOKENS:-1,8,32,128,512,2048,8192}
iters=${BENCH_ITERS:-10}
dirs=()
want bench || note "benchmarks: not run (STEPS=${STEPS:-})"
for fam in any portable; do
  want bench || break
  d="$out/bench_$fam"
  mkdir -p "$d"
  famopt=()
  [ "$fam" = any ] || famopt=(--family "$fam")
  # shellcheck disable=SC2086  # BENCH_ARGS: words on purpose
  timeout -k 10 "${BENCH_TIMEOUT:-180}" "$stage/bin/fp4moe" bench --tokens "$tokens" --iters "$iters" "${famopt[@]}" \
    ${BENCH_ARGS:-} --dump-dir "$d" >"$out/bench_$fam.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then note "fp4moe bench ($fam): done"; dirs+=(--bench-dir "$d"); else status=1; note "fp4moe bench ($fam): FAIL rc=$rc"; fi
done
if [ ${#dirs[@]} -gt 0 ]; then
  timeout -k 10 "${BENCH_TIMEOUT:-180}" python3 "$root/bench/torch_peer.py" "${dirs[@]}" --iters "$iters" \
    >"$out/peer.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then note "torch peer: done"; else status=1; note "torch peer: FAIL rc=$rc (see peer.log)"; fi
fi

# 4. one GPU's shard of a multi-GPU layer, each with its peer on the same shard: BENCH_TP=8 (GLM-5's TP8:
#    I / 8 per expert) and BENCH_EP=8 (rank 0 of EP8: 32 of 256 experts + the shared expert); 0 skips one
for shard in "tp ${BENCH_TP:-8}" "ep ${BENCH_EP:-8}"; do
  want bench || break
  read -r kind n <<<"$shard"
  [ "$n" != 0 ] || continue
  d="$out/bench_$kind$n"
  mkdir -p "$d"
  # shellcheck disable=SC2086
  timeout -k 10 "${BENCH_TIMEOUT:-180}" "$stage/bin/fp4moe" bench "--$kind" "$n" --tokens "$tokens" --iters "$iters" \
    ${BENCH_ARGS:-} --dump-dir "$d" >"$out/bench_$kind$n.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    note "fp4moe bench --$kind $n: done"
    timeout -k 10 "${BENCH_TIMEOUT:-180}" python3 "$root/bench/torch_peer.py" --bench-dir "$d" --iters "$iters" \
      >"$out/peer_$kind$n.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then note "torch peer (${kind^^}$n shard): done"; else status=1; note "torch peer (${kind^^}$n shard): FAIL rc=$rc (see peer_$kind$n.log)"; fi
  else
    status=1
    note "fp4moe bench --$kind $n: FAIL rc=$rc"
  fi
done

# 5. (STEPS=sm90 only, not in the default) the issue's TP8 GEMM measurement and the resident tactic's A/B:
#    bench_sm90 --tp8 (every sm90 tactic per T, pair and chain, against the read ceiling of the same run;
#    SM90_TOKENS, default 1,8,32,128; with --layers SM90_LAYERS, default 16: the best chain and pair also as
#    that many layers of a decode-step graph, each with its own weights and routing); bench_sm90 --resident-cc
#    (step 66's probe and its variants, each checked against the CPU reference, then timed cold); then the
#    TP8 shard's forward at T = 1 without the resident tactic (FP4MOE_SM90_CC=0: the wgmma chain) and with it
#    (the defaults: the fused front end before its chained launch, the folded shared expert spread over its
#    128 CTAs, FC2's fp32 rows left to finalize), then the launch routing the token itself
#    (FP4MOE_ROUTE_IN_CHAIN=1), each of the other two forms turned off in turn, and the shared expert on the
#    side stream (FP4MOE_FOLD_SHARED=0), all with --extra-layouts (docs/perf.md, sm90 steps 67-72).
if want sm90; then
  if [ -x "$stage/bin/bench_sm90" ]; then
    timeout -k 10 "${BENCH_TIMEOUT:-180}" "$stage/bin/bench_sm90" --tp8 --tokens "${SM90_TOKENS:-1,8,32,128}" \
      --iters 20 --layers "${SM90_LAYERS:-16}" >"$out/bench_sm90_tp8.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
      note "bench_sm90 --tp8: done"
      while read -r line; do note "  $line"; done < <(grep -E "best pair|best chain|chain32" "$out/bench_sm90_tp8.log")
    else
      status=1
      note "bench_sm90 --tp8: FAIL rc=$rc (see bench_sm90_tp8.log)"
    fi
    timeout -k 10 "${BENCH_TIMEOUT:-180}" "$stage/bin/bench_sm90" --resident-cc --iters 200 \
      >"$out/bench_sm90_resident_cc.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
      note "bench_sm90 --resident-cc: done"
    else
      status=1
      note "bench_sm90 --resident-cc: FAIL rc=$rc (see bench_sm90_resident_cc.log)"
    fi
  else
    status=1
    note "bench_sm90: not staged (scripts/gpu_build.sh stages it)"
  fi
  # The TP8 forward at T = 1: the wgmma chain first and last, the defaults (the resident tactic) and each
  # variant of it between them.
  for v in FP4MOE_SM90_CC=0 defaults FP4MOE_ROUTE_IN_CHAIN=1 FP4MOE_CHAIN_FP32_ROWS=0 FP4MOE_SM90_CC_SPREAD=0 \
    FP4MOE_FOLD_SHARED=0 FP4MOE_SM90_CC=0; do
    tag=${v#FP4MOE_}
    d="$out/bench_tp8_${tag/=/_}"
    [ -d "$d" ] && d="${d}_again"
    mkdir -p "$d"
    assign=()
    [ "$v" = defaults ] || assign=("$v")
    env "${assign[@]}" FP4MOE_PRINT_TACTICS=1 timeout -k 10 "${BENCH_TIMEOUT:-180}" \
      "$stage/bin/fp4moe" bench --tp 8 --tokens 1 --iters 200 --extra-layouts --dump-dir "$d" \
      >"$d.log" 2>&1
    rc=$?
    what="fp4moe bench --tp 8 --tokens 1 --extra-layouts, $v"
    if [ $rc -eq 0 ]; then note "$what: done"; else status=1; note "$what: FAIL rc=$rc"; fi
  done
fi

{
  echo "== fp4moe GPU check ($(cat "$stage/revision.txt" 2>/dev/null)) =="
  for s in "${summary[@]}"; do echo "  $s"; done
  for f in "$out"/bench_*/table.md; do [ -f "$f" ] && { echo "-- $(basename "$(dirname "$f")")"; cat "$f"; }; done
  echo "overall: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
} | tee "$out/summary.txt"
exit $status
