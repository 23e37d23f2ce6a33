#!/usr/bin/env bash
# Configures a build folder: scripts/configure.sh DIR [extra cmake arguments].
# Release, Ninja when available, the CUDA backend when nvcc is found (on PATH or in /usr/local/cuda).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir=${1:?usage: scripts/configure.sh DIR [cmake arguments]}
shift
args=(-S . -B "$dir" -DCMAKE_BUILD_TYPE=Release)
# The generator can only be chosen when the folder is new.
if [ ! -f "$dir/CMakeCache.txt" ] && command -v ninja >/dev/null; then args+=(-G Ninja); fi
nvcc=$(command -v nvcc || true)
if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
if [ -n "$nvcc" ]; then
  args+=(-DFP4MOE_CUDA=ON "-DCMAKE_CUDA_COMPILER=$nvcc")
else
  args+=(-DFP4MOE_CUDA=OFF)
fi
cmake "${args[@]}" "$@"
