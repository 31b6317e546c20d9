#!/usr/bin/env bash
# Builds everything and runs every test, in three build trees:
#  1. `simulator` preset: every library and test but the LibTorch backend;
#  2. `backend` preset: the backend-only build with the carried headers (scripts/carry-deps.sh
#     makes .carry afresh), the configuration scripts/gpu-check.sh builds on a GPU machine, checked
#     to read nothing from Debian's -dev packages (scripts/check-carried-build.py), with the
#     backend's tests and benchmarks: so the first GPU check never builds what nobody built;
#  3. `asan` preset: AddressSanitizer + UndefinedBehaviorSanitizer over everything that does not
#     link LibTorch.
# This is README's test command and what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
jobs="${OOM_JOBS:-$(nproc)}"
# ccache: paths relative to the checkout (a fresh clone elsewhere reuses the cache of an earlier
# build on the same machine) and precompiled headers cacheable (the LibTorch translation units).
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
start=$(date +%s)

cmake --preset simulator >/dev/null
cmake --build --preset simulator -j "$jobs"
ctest --preset simulator -j "$jobs" --timeout 600
simulator_end=$(date +%s)

# CI compiles the CUDA and NCCL code paths or fails: a compile error in GPU code must not pass.
configure_extra=()
if [ "${CI:-}" = true ]; then configure_extra+=(-DOOM_REQUIRE_CUDA=ON); fi
bash scripts/carry-deps.sh .carry
cmake --preset backend "${configure_extra[@]}" >/dev/null
python3 scripts/check-carried-build.py build-backend
cmake --build --preset backend -j "$jobs"
python3 scripts/check-carried-build.py build-backend --headers
ctest --preset backend -j "$jobs" --timeout 600
backend_end=$(date +%s)

cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --preset asan -j "$jobs" --timeout 600
end=$(date +%s)

echo "test.sh: simulator suite $((simulator_end - start)) s, backend suite (carried headers)" \
  "$((backend_end - simulator_end)) s, sanitizer suite $((end - backend_end)) s"
