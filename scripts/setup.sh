#!/usr/bin/env bash
# Installs everything fp4moe needs to build and test, from Debian packages and PyPI, at pinned versions.
# Safe to run again: already-installed packages are left alone. Needs root (or sudo) for apt.
set -euo pipefail

# Debian 12 (bookworm) versions. If the mirror has moved on to a point release, the unpinned
# package is taken and a warning printed, so a security update never breaks a fresh machine.
DEB_PACKAGES=(
  "cmake=3.25.1-1"
  "ninja-build=1.11.1-1"
  "g++=4:12.2.0-3"
  "libgtest-dev=1.12.1-0.2"
  "nlohmann-json3-dev=3.11.2-2"
  "libcli11-dev=2.1.2+ds-1"
  "libfmt-dev=9.1.0+ds1-2"
  "python3-pip"
)
PY_PACKAGES=(
  "numpy==2.2.6"
  "ml_dtypes==0.5.1"
  "safetensors==0.5.3"
)

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null; then SUDO=sudo; fi

missing=()
for spec in "${DEB_PACKAGES[@]}"; do
  name=${spec%%=*}
  dpkg -s "$name" >/dev/null 2>&1 || missing+=("$spec")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
    echo "setup: warning: pinned versions unavailable, installing current ones" >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]%%=*}"
  fi
fi

PY=${PYTHON:-python3}
if ! $PY - <<'PYEOF' 2>/dev/null
import importlib.metadata as m, sys
want = {"numpy": "2.2.6", "ml_dtypes": "0.5.1", "safetensors": "0.5.3"}
sys.exit(0 if all(m.version(k) == v for k, v in want.items()) else 1)
PYEOF
then
  echo "setup: installing Python packages: ${PY_PACKAGES[*]}"
  $PY -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}" 2>&1 | grep -v "Running pip as the 'root' user" || true
  $PY -c "import numpy, ml_dtypes, safetensors" 
fi
# cuobjdump for the sm90 SASS check (scripts/sass_check.sh; the ctest sm90.sass) where the CUDA toolkit has
# none: the copy in Triton's wheel (pinned; only it and the nvdisasm it runs are kept), unpacked into
# .tools/bin (git-ignored). Best effort: offline, the check reports "skipped".
TRITON_WHEEL="triton==3.9.0"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools=$root/.tools/bin
if command -v nvcc >/dev/null && ! command -v cuobjdump >/dev/null && [ ! -x "$(dirname "$(command -v nvcc)")/cuobjdump" ] &&
   [ ! -x "$tools/cuobjdump" ]; then
  tmp=$(mktemp -d)
  echo "setup: fetching cuobjdump from $TRITON_WHEEL (for the sm90 SASS check)"
  if $PY -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$tmp" "$TRITON_WHEEL" \
       2>&1 | grep -v "Running pip as the 'root' user"; [ "${PIPESTATUS[0]}" = 0 ] &&
     $PY - "$tmp" "$tools" <<'PYEOF'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "triton-*.whl"))[0]
os.makedirs(sys.argv[2], exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    for tool in ("nvdisasm", "cuobjdump"):  # cuobjdump runs nvdisasm; cuobjdump last marks the pair complete
        dst = os.path.join(sys.argv[2], tool)
        with open(dst + ".part", "wb") as f:
            f.write(z.read("triton/backends/nvidia/bin/" + tool))
        os.chmod(dst + ".part", 0o755)
        os.replace(dst + ".part", dst)
PYEOF
  then
    echo "setup: cuobjdump in $tools"
  else
    echo "setup: warning: no cuobjdump fetched; the sm90 SASS check will be skipped" >&2
  fi
  rm -rf "$tmp"
fi
echo "setup: ok"
