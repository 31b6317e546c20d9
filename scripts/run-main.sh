#!/usr/bin/env bash
# The main job: builds the `oom` command and runs the default study.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "${OOM_JOBS:-$(nproc)}" --target oom
./build/cli/oom report "$@"
