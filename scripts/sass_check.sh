#!/usr/bin/env bash
# The sm90 kernels' SASS check (src/kernels/sm90_wgmma/check_sass.py: HGMMA in every kernel, no local
# memory, no early reuse of an in-flight wgmma's registers, no serialised wgmmas) on a machine without a
# GPU, before any binary travels: the same check scripts/gpu_check.sh runs on the GPU machine.
#   usage: scripts/sass_check.sh [OBJECT_OR_BINARY]
# Default input: the sm90 kernels' object in build-gpu (scripts/gpu_build.sh); the ctest sm90.sass passes
# the built library. Needs a cuobjdump: $CUOBJDUMP, else one on PATH, else the CUDA toolkit's (beside
# nvcc), else .tools/bin/cuobjdump, which scripts/setup.sh takes from Triton's wheel where the toolkit
# has none (it reads nvcc 13.0's sm_90a code). Exit status: 0 clean, 1 a finding, 2 no input, 77 no
# cuobjdump (ctest: skipped).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
input=${1:-$root/build-gpu/src/CMakeFiles/fp4moe.dir/kernels/sm90_wgmma/sm90_nvfp4w4a16_grouped.cu.o}
[ -f "$input" ] || { echo "sass_check: no $input (run scripts/gpu_build.sh first, or name an object or binary)"; exit 2; }
tool=${CUOBJDUMP:-}
if [ -z "$tool" ]; then
  for t in "$(command -v cuobjdump || true)" "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/cuobjdump" \
           "$root/.tools/bin/cuobjdump"; do
    if [ -n "$t" ] && [ -x "$t" ]; then tool=$t; break; fi
  done
fi
[ -n "$tool" ] && [ -x "$tool" ] || { echo "sass_check: no cuobjdump (set CUOBJDUMP, or run scripts/setup.sh)"; exit 77; }
export PATH="$(dirname "$tool"):$PATH"  # cuobjdump runs the nvdisasm beside it
"$tool" -sass "$input" | python3 "$root/src/kernels/sm90_wgmma/check_sass.py"
