#!/usr/bin/env bash
# The main job: builds the `oom` command and runs the default what-if study (experiments/study.h):
# the table on stdout, study.csv, study.json and the PNG plots in results/default/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "${OOM_JOBS:-$(nproc)}" --target oom
./build/cli/oom whatif "$@"
