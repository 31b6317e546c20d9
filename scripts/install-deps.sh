#!/usr/bin/env bash
# Installs what the build and tests need on Debian 12, idempotently (run as root, or with sudo):
#  - Debian's packages (compilers, CMake, the simulator's libraries, Python for plots and notebooks);
#  - the project's virtual environment .venv/ (git-ignored) with PyTorch from PyPI, pinned to the
#    GPU machines' minor version: its LibTorch (CUDA 13 build, c10d with Gloo and NCCL) is the one
#    the backend compiles against, and its torchrun launches multi-node jobs. Test-only Python
#    packages (DeepSpeed for the AdamW peer benchmark; scikit-build-core and pybind11, which build
#    the wheel of `pip install .` and its test) go into the same environment.
# Nothing is downloaded outside apt and PyPI. OOM_VENV overrides the environment's folder.
#
#   scripts/install-deps.sh [--simulator-only]   (--simulator-only: Debian's packages alone; the
#                                                  what-if study and every simulator command need
#                                                  no PyTorch)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config clang
  libgtest-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev libeigen3-dev libboost-graph-dev
  libsimgrid-dev
  # Headers only: PyPI's torch links Gloo into libtorch_cpu but ships none of Gloo's headers, which
  # c10d's ProcessGroupGloo.hpp includes. Nothing links Debian's Gloo library.
  libgloo-dev
  pybind11-dev python3-dev python3-venv python3-matplotlib python3-numpy
  jupyter-nbconvert python3-nbformat python3-ipykernel
)
# The pinned PyTorch (the GPU machines run 2.11 with CUDA 13), the peers of the AdamW benchmark, and
# the reference implementation of the parity tests with its file formats (transformers pinned:
# the parity fixtures are made with it).
torch_spec="torch==2.11.*"
# scikit-build-core and pybind11 build the wheel (pyproject.toml; the wheel test builds one).
venv_packages=(numpy "deepspeed==0.19.*" py-cpuinfo psutil "transformers==5.24.*" safetensors tokenizers scikit-build-core pybind11)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "${1:-}" = --simulator-only ]; then exit 0; fi

venv="${OOM_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  echo "install-deps: creating the virtual environment $venv"
  /usr/bin/python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.11.") else 1)' 2>/dev/null; then
  echo "install-deps: installing $torch_spec into $venv (PyPI)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$torch_spec"
fi
if ! "$venv/bin/python" -c 'import numpy, deepspeed, cpuinfo, psutil, transformers, safetensors, tokenizers, scikit_build_core, pybind11' 2>/dev/null; then
  echo "install-deps: installing ${venv_packages[*]} into $venv (PyPI)"
  # DeepSpeed builds nothing at install time (its ops compile on first use) but imports torch.
  DS_BUILD_OPS=0 "$venv/bin/python" -m pip install -q --disable-pip-version-check "${venv_packages[@]}"
fi
echo "install-deps: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)')"
