#!/usr/bin/env bash
# Builds the libFuzzer programs (the `fuzz` preset: clang, ASan + UBSan) and fuzzes every target
# of tests/fuzz/targets.txt for SECONDS each (default 60), one after the other.
#
#   scripts/fuzz.sh [SECONDS]
#
# Environment: OOM_FUZZ_RUNS=N stops a target after N inputs; OOM_FUZZ_MAX_LEN=N caps an input's bytes
# (default 8192); OOM_FUZZ_TARGETS="a b" fuzzes only
# those; OOM_JOBS build jobs (default 2). Corpora grow in build-fuzz/corpus/NAME (seeded from the
# targets' seed paths and tests/fuzz/regressions/NAME); a crashing input is written to
# build-fuzz/artifacts/NAME/ and belongs, once fixed, in tests/fuzz/regressions/NAME/.
# Prints one line per target with the inputs run; exits non-zero if any target failed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
jobs="${OOM_JOBS:-2}"
manifest=tests/fuzz/targets.txt

mapfile -t lines < <(grep -E '^[a-z]' "$manifest")
names=()
for line in "${lines[@]}"; do names+=("${line%% *}"); done
if [ -n "${OOM_FUZZ_TARGETS:-}" ]; then read -r -a names <<<"$OOM_FUZZ_TARGETS"; fi

cmake --preset fuzz >/dev/null
cmake --build build-fuzz -j "$jobs" --target $(printf 'fuzz_%s ' "${names[@]}")

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
summary=()
failed=0
for name in "${names[@]}"; do
  seeds=$(grep -E "^${name}[[:space:]]" "$manifest" | cut -d' ' -f2- | xargs -n1 echo | sed '/^$/d')
  corpus="build-fuzz/corpus/${name}"
  artifacts="build-fuzz/artifacts/${name}/"
  mkdir -p "$corpus" "$artifacts"
  # Seed inputs: every file below each seed path, and one input per line of a .jsonl file.
  seed_files=()
  for s in $seeds tests/fuzz/regressions/"$name"; do
    [ -e "$s" ] || continue
    while IFS= read -r -d '' f; do seed_files+=("$f"); done < <(find "$s" -type f -print0)
  done
  for f in "${seed_files[@]}"; do
    cp "$f" "$corpus/seed-$(echo "$f" | tr '/' '_')"
    if [[ "$f" == *.jsonl ]]; then
      n=0
      while IFS= read -r line; do
        n=$((n + 1))
        printf '%s' "$line" >"$corpus/seed-$(echo "$f" | tr '/' '_')-line$n"
      done <"$f"
    fi
  done
  # A dictionary of the field names and string values the seeds use.
  dict="build-fuzz/corpus/${name}.dict"
  cat "${seed_files[@]}" | grep -a -o '"[A-Za-z0-9_.-]\+"' | sort -u | sed 's/^/kw=/' >"$dict" || true
  log="build-fuzz/${name}.log"
  dict_opt=()
  if [ -s "$dict" ]; then dict_opt=(-dict="$dict"); fi  # libFuzzer refuses an empty dictionary (binary seeds)
  runs_opt=()
  if [ -n "${OOM_FUZZ_RUNS:-}" ]; then runs_opt=(-runs="$OOM_FUZZ_RUNS"); fi
  start=$(date +%s)
  set +e
  "build-fuzz/tests/fuzz/fuzz_${name}" "$corpus" "${dict_opt[@]}" -max_total_time="$seconds" "${runs_opt[@]}" \
    -timeout=10 -rss_limit_mb=2048 -max_len="${OOM_FUZZ_MAX_LEN:-8192}" -print_final_stats=1 -artifact_prefix="$artifacts" \
    >"$log" 2>&1
  rc=$?
  set -e
  elapsed=$(( $(date +%s) - start ))
  inputs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  if [ "$rc" -eq 0 ]; then result="ok"; else result="FAILED (rc $rc, see $log and $artifacts)"; failed=1; fi
  summary+=("$(printf '%-16s %12s inputs %6s s  %s' "$name" "$inputs" "$elapsed" "$result")")
  echo "fuzz: ${summary[-1]}"
done
echo "fuzz: summary"
printf '  %s\n' "${summary[@]}"
exit "$failed"
