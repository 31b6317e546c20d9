#!/usr/bin/env bash
# Installs the Debian 12 packages the build and tests need; skips those already installed.
# Idempotent; run as root (or with sudo available). Nothing is downloaded outside apt.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config clang
  libgtest-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev libeigen3-dev libboost-graph-dev
  libsimgrid-dev
  libtorch-dev libgloo-dev libopenblas0-pthread
  pybind11-dev python3-dev python3-matplotlib python3-numpy
  jupyter-nbconvert python3-nbformat python3-ipykernel
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
