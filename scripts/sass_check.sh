#!/usr/bin/env bash
# The sm90 kernels' SASS check (src/kernels/sm90_wgmma/check_sass.py: HGMMA in every kernel, no local
# memory, no early reuse of an in-flight wgmma's registers, no serialised wgmmas) on a machine without a
# GPU, before any binary travels: the same check scripts/gpu_check.sh runs on the GPU machine.
#   usage: scripts/sass_check.sh [OBJECT_OR_BINARY]
# Default input: the sm90 kernels' object in build-gpu (scripts/gpu_build.sh). Needs a cuobjdump: $CUOBJDUMP,
# else one on PATH, else the CUDA toolkit's. A toolkit without one can use the copy in Triton's wheel
# (`pip download triton==3.9.0 --no-deps -d DIR`, then `unzip -j DIR/triton-*.whl
# triton/backends/nvidia/bin/cuobjdump -d DIR`; it reads sm_90a objects of nvcc 13.0).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
input=${1:-$root/build-gpu/src/CMakeFiles/fp4moe.dir/kernels/sm90_wgmma/sm90_nvfp4w4a16_grouped.cu.o}
[ -f "$input" ] || { echo "sass_check: no $input (run scripts/gpu_build.sh first, or name an object or binary)"; exit 2; }
tool=${CUOBJDUMP:-$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)}
[ -x "$tool" ] || { echo "sass_check: no cuobjdump (set CUOBJDUMP; see this script's header for one from Triton's wheel)"; exit 2; }
"$tool" -sass "$input" | python3 "$root/src/kernels/sm90_wgmma/check_sass.py"
