#!/usr/bin/env bash
# The main job: builds the `oom` command and runs the default what-if study (experiments/study.h):
# the table on stdout, study.csv, study.json and the PNG plots in results/default/. The `oom`
# program needs no LibTorch (the backend is a plugin), so neither PyTorch nor the backend is built.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --simulator-only  # the study needs no PyTorch
cmake --preset default >/dev/null
cmake --build --preset default -j "${OOM_JOBS:-$(nproc)}" --target oom
./build/cli/oom whatif "$@"
