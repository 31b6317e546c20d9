#!/usr/bin/env bash
# Builds everything and runs every test: the normal suite (`default` preset: simulator and LibTorch
# backend), then the sanitizer suite (AddressSanitizer + UndefinedBehaviorSanitizer over everything
# that does not link LibTorch). Between them it configures the `backend` preset, the backend-only
# build with the carried headers that scripts/gpu-check.sh builds on a GPU machine, and checks its
# compile_commands.json (scripts/check-carried-build.py): no include path outside the carried
# folder, the venv's torch, the CUDA toolkit and the tree. Building that tree in CI as well (or
# instead of the default one's backend) is the next step; `bash scripts/test.sh --carried` does it.
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

# CI compiles the CUDA and NCCL code paths or fails: a compile error in GPU code must not pass.
configure_extra=()
if [ "${CI:-}" = true ]; then configure_extra+=(-DOOM_REQUIRE_CUDA=ON); fi
cmake --preset default "${configure_extra[@]}" >/dev/null
cmake --build --preset default -j "$jobs"
ctest --preset default -j "$jobs" --timeout 600

bash scripts/carry-deps.sh .carry
cmake --preset backend "${configure_extra[@]}" >/dev/null
python3 scripts/check-carried-build.py build-backend
if [ "${1:-}" = --carried ]; then
  cmake --build --preset backend -j "$jobs"
  python3 scripts/check-carried-build.py build-backend --headers
  ctest --preset backend -j "$jobs" --timeout 600
fi
normal_end=$(date +%s)

cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --preset asan -j "$jobs" --timeout 600
end=$(date +%s)

echo "test.sh: normal suite $((normal_end - start)) s, sanitizer suite $((end - normal_end)) s"
