#!/usr/bin/env bash
# Builds the LibTorch backend against a CUDA LibTorch and checks it on a GPU machine in one
# command: configure + build (backend, its tests, the `oom` command), run the backend tests, run
# a short streamed training on the GPU and the same on the reference trainer, then a plan-driven
# step with a trace held against its prediction: `oom calibrate --backend --quick` measures the GPU
# (hardware spec, records, calibration under $build), `oom simulate` predicts the plan's step on
# it, `oom train --plan --trace` measures it, `oom diff` prints predicted vs measured by stage.
# Prints a summary.
#
#   scripts/gpu-check.sh [TORCH_DIR]     (TORCH_DIR: the folder holding TorchConfig.cmake;
#                                         default $Torch_DIR, else python3's torch, if installed)
# Environment: OOM_GPU_BUILD (build folder, default build-gpu), OOM_JOBS (default nproc).
set -uo pipefail
cd "$(dirname "$0")/.."

torch_dir="${1:-${Torch_DIR:-}}"
if [ -z "$torch_dir" ] && command -v python3 >/dev/null; then
  torch_dir="$(python3 -c 'import torch, os; print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))' 2>/dev/null || true)"
fi
build="${OOM_GPU_BUILD:-build-gpu}"
jobs="${OOM_JOBS:-$(nproc)}"
summary=()
status=0
step() {  # step NAME COMMAND...: runs, records pass/fail with the time taken
  local name="$1"; shift
  local t0=$(date +%s)
  if "$@" > "$build/gpu-check-$name.log" 2>&1; then
    summary+=("PASS  $name ($(( $(date +%s) - t0 )) s)")
  else
    summary+=("FAIL  $name ($(( $(date +%s) - t0 )) s, log: $build/gpu-check-$name.log)")
    status=1
  fi
}

mkdir -p "$build"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$build/gpu-check-gpu.txt" 2>&1 \
  || echo "nvidia-smi not available" > "$build/gpu-check-gpu.txt"

cmake_args=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOOM_BUILD_BENCHMARKS=ON)
[ -n "$torch_dir" ] && cmake_args+=("-DTorch_DIR=$torch_dir")
step configure cmake "${cmake_args[@]}"
step build cmake --build "$build" -j "$jobs" --target oom oom_backend_tests step_bench adamw_bench
if grep -q "OOM_BACKEND_CUDA" "$build/compile_commands.json" 2>/dev/null; then
  summary+=("INFO  CUDA LibTorch found: CUDA code paths compiled")
else
  summary+=("WARN  LibTorch without CUDA: CUDA code paths not compiled")
fi
step backend-tests ctest --test-dir "$build" -R "^(ModelLayout|AttentionCore|Gdn|MoeFfn|Route|Rope|AttentionMixing|ModelLoss|CpuAdamW|DeviceAdamW|Streamed|Clip|Safetensors|HostState|Checkpoint|Train|OomTrain|PlanTrainer|PlanOps|CheckPlanForRun|TorchExecutor|OomDiff|RecordedLocalRuns)" --output-on-failure -j 4
step train-streamed "$build/cli/oom" train --model tiny-moe --steps 30 --seq 128 --batch 8 --json
step train-reference "$build/cli/oom" train --model tiny-moe --steps 30 --seq 128 --batch 8 --reference --json
step adamw-bench "$build/tests/bench/adamw_bench" --benchmark_min_time=0.2

# Plan-driven step with a trace, predicted vs measured. The plan exercises every Local mechanism.
plan="$build/gpu-check-plan.json"
cat > "$plan" <<'JSON'
{"version": 1, "path": "local", "resident_layers": [], "moe_retained_layers": [], "routing_chunk_tokens": 65536,
 "param_transfer": "full", "transfer_chunk_mib": 64, "cpu_grad_slots": 2,
 "split": {"attention_head_group": 1, "gdn_chunk_tokens": 64, "moe_chunk_tokens": 512, "sub_batch_seqs": 4},
 "keep_attention_results": true, "boundaries": {"host_kept": [0, 2], "gpu_held": [1], "regenerate_cap": 1},
 "notes": "gpu-check: head groups, GDN chunks, MoE chunks, sub-batches, kept O/LSE, held and regenerated boundaries"}
JSON
cat > "$build/gpu-check-workload.json" <<JSON
{"model": "tiny-moe", "hardware": "$PWD/$build/local-gpu.json", "gpus": 1, "global_batch": 8, "seq_len": 128,
 "gpu_budget_gib": null, "host_budget_gib": null, "yarn_factor": 1}
JSON
step calibrate-backend "$build/cli/oom" calibrate --backend --quick --name local-gpu --hardware-out "$build/local-gpu.json" \
  --records-out "$build/local-gpu.jsonl" --calibration-out "configs/calibration/local-gpu.json"
step plan-predict "$build/cli/oom" simulate --workload "$build/gpu-check-workload.json" --plan "$plan" \
  --trace "$build/gpu-check-predicted.json"
step plan-train "$build/cli/oom" train --model tiny-moe --steps 5 --seq 128 --batch 8 --plan "$plan" \
  --trace "$build/gpu-check-measured.json" --json
step plan-diff "$build/cli/oom" diff "$build/gpu-check-predicted.json" "$build/gpu-check-measured.json" --summary

echo "== gpu-check summary =="
echo "GPU: $(cat "$build/gpu-check-gpu.txt")"
printf '%s\n' "${summary[@]}"
for t in streamed reference; do
  f="$build/gpu-check-train-$t.log"
  [ -f "$f" ] && echo "train $t: $(tail -n 1 "$f" | python3 -c 'import json,sys; j=json.load(sys.stdin); print("first loss %.4f, last loss %.4f, %.0f tokens/s" % (j["losses"][0], j["losses"][-1], j["tokens_per_s"]))' 2>/dev/null || echo "no JSON result")"
done
[ -f "$build/gpu-check-adamw-bench.log" ] && grep -E "ratio|triad bandwidth" "$build/gpu-check-adamw-bench.log"
[ -f "$build/gpu-check-calibrate-backend.log" ] && head -n 1 "$build/gpu-check-calibrate-backend.log"
if [ -f "$build/gpu-check-plan-diff.log" ]; then
  echo "== plan-driven step: predicted vs measured (oom diff --summary) =="
  cat "$build/gpu-check-plan-diff.log"
fi
exit $status
