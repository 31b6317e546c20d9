#!/usr/bin/env bash
# scripts/gpu-check.sh without a GPU must fail at once with one line saying why, writing nothing.
# Exit 77 (skipped) where a GPU is visible.
set -u
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then exit 77; fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
out="$(OOM_GPU_BUILD="$tmp/build" bash "$1" "$tmp/out" 2>&1)"
rc=$?
echo "exit $rc: $out"
[ "$rc" -eq 1 ] || { echo "expected exit 1"; exit 1; }
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || { echo "expected one line"; exit 1; }
printf '%s' "$out" | grep -q "no CUDA device" || { echo "expected the reason"; exit 1; }
[ -z "$(ls -A "$tmp")" ] || { echo "expected nothing written: $(ls -A "$tmp")"; exit 1; }
