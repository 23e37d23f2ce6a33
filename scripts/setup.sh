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
echo "setup: ok"
