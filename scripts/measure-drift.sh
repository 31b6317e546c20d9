#!/usr/bin/env bash
# Measures how far two implementations of the backend drift apart after optimizer steps on this
# machine, under each instruction set it has (tests/backend/drift.h says why a bound between two
# implementations after an AdamW update is a measurement and not a constant):
#   native  the kernels LibTorch, MKL and oneDNN pick for this CPU (AVX2 or AVX-512);
#   scalar  ATen's non-vectorized kernels, MKL at SSE4.2, oneDNN at SSE4.1;
#   avx2    on a CPU with AVX-512: ATen, MKL and oneDNN held to AVX2.
# Runs the backend test program with OOM_DRIFT_LOG set and prints, for every check that records its
# difference, the largest over its runs per instruction set, and the largest over all of them: the
# figure a test's bound is set from (with the figures in a comment beside it).
#
#   scripts/measure-drift.sh [BUILD_DIR] [GTEST_FILTER]
#     BUILD_DIR     default build (the default preset's)
#     GTEST_FILTER  default: the suites that compare implementations after steps
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
filter="${2:-OomTrainPlan.AppliesTheLrSchedule*:DefaultPlan.*:GradientAccumulation.*:PlanTrainer.*:Train.ReferenceTrainerAgreesWithTheDefaultPlanOnTheSameRun:TrainRanks.*:OomTrainRanks.*}"
program="$build/tests/backend/oom_backend_tests"
[ -x "$program" ] || { echo "measure-drift: $program not found: build the default preset first" >&2; exit 2; }

configs=(native scalar)
if grep -qw avx512f /proc/cpuinfo; then configs+=(avx2); fi
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
for c in "${configs[@]}"; do
  env_for=()
  case "$c" in
    scalar) env_for=(ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41) ;;
    avx2) env_for=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2) ;;
  esac
  echo "measure-drift: $c ${env_for[*]:-}" >&2
  # The bounds are what is measured: a check over its current bound fails its test here, is
  # listed, and the measurement goes on.
  env "${env_for[@]}" OOM_DRIFT_LOG="$logs/$c.log" OOM_CONFIG_DIR="$PWD/configs" \
    "$program" --gtest_filter="$filter" >"$logs/$c.out" 2>&1 ||
    { echo "measure-drift: $c: over their bounds or failed:" >&2; grep '^\[  FAILED  \] [A-Za-z]' "$logs/$c.out" | sort -u >&2 || true; }
done
/usr/bin/python3 - "$logs" "${configs[@]}" <<'PY'
import os, sys
logs, configs = sys.argv[1], sys.argv[2:]
worst = {}
for c in configs:
    path = os.path.join(logs, c + ".log")
    if not os.path.exists(path):
        continue
    for line in open(path):
        test, check, value = line.split()
        key = (test, check)
        worst.setdefault(key, {})
        worst[key][c] = max(worst[key].get(c, 0.0), float(value))
width = max((len(t) + len(k) + 1 for t, k in worst), default=10)
print(f"{'check':<{width}} " + " ".join(f"{c:>9}" for c in configs) + "       max")
for (test, check), by in sorted(worst.items()):
    row = " ".join(f"{by[c]:9.2e}" if c in by else f"{'-':>9}" for c in configs)
    print(f"{test + ' ' + check:<{width}} {row} {max(by.values()):9.2e}")
PY
