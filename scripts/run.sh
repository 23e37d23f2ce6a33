#!/usr/bin/env bash
# Sets up, builds the fp4moe tool (in build/, or $FP4MOE_BUILD_DIR) and runs `fp4moe run` with the given
# arguments; with none, the embedded default: a GLM-5-shaped layer with synthetic NVFP4 weights on a few
# tokens. Setup and build messages go to stderr; stdout holds only the run's output.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=${FP4MOE_BUILD_DIR:-build}
{
  bash scripts/setup.sh
  bash scripts/configure.sh "$build" >/dev/null
  cmake --build "$build" --target fp4moe_cli -j"$(nproc)"
} >&2
exec "$build/tools/fp4moe/fp4moe" run "$@"
