#!/usr/bin/env bash
# scripts/gpu-check.sh without a GPU must fail at once with one line saying why.
# Exit 77 (skipped) where a GPU is visible.
set -u
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then exit 77; fi
out="$(OOM_GPU_BUILD="$(mktemp -d)" bash "$1" all 2>&1)"
rc=$?
echo "exit $rc: $out"
[ "$rc" -eq 1 ] || { echo "expected exit 1"; exit 1; }
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || { echo "expected one line"; exit 1; }
printf '%s' "$out" | grep -q "no CUDA device" || { echo "expected the reason"; exit 1; }
