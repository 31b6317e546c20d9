#!/usr/bin/env bash
# Checks the LibTorch backend on a GPU machine, in stages that run one at a time (each well under
# 5 minutes on an H200), and writes every figure as JSON into one folder.
#
#   scripts/gpu-check.sh STAGE...        STAGE: build | tests | runs | all (= build tests runs)
#
#   build  configures the backend-only build (-DOOM_SIMULATOR=OFF, CUDA and NCCL required) against
#          the machine's PyTorch and builds `oom`, the backend plugin and the GPU tests. Needs the carried headers (scripts/carry-deps.sh, run where Debian's packages
#          are) in $OOM_CARRIED_DEPS (default .carry).
#   tests  runs oom_gpu_tests: the graph runner with the default plan (with and without
#          sub-batches), a plan with every split, an EP plan with a resident shard on one rank, and
#          the device AdamW, each on the GPU against the CPU: losses, gradient norms and every
#          block's gradient (asserted, not printed).
#   runs   (1) `oom train --device cuda` against `--device cpu` on the same run (the default plan
#          through the graph runner): losses asserted
#          within 1e-3 relative; (2) a plan-driven GPU step with a trace, diffed against the
#          simulator's prediction of the same plan on configs/hardware/h200-node.json
#          (`oom diff --summary --json`); (3) pinned H2D and D2H bandwidth against the hardware
#          file's PCIe figure.
#
# Exits non-zero, with one line saying why, when no CUDA device is visible or the build has no CUDA.
# Environment: OOM_TORCH_PYTHON (default .venv/bin/python, else /opt/torch/.venv/bin/python, else
# python3), OOM_GPU_BUILD (default build-gpu), OOM_GPU_OUT (default $OUT, else $OOM_GPU_BUILD/gpu-check),
# OOM_CARRIED_DEPS (default .carry), OOM_JOBS (default nproc).
set -uo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
build="${OOM_GPU_BUILD:-build-gpu}"
out="${OOM_GPU_OUT:-${OUT:-$build/gpu-check}}"
jobs="${OOM_JOBS:-$(nproc)}"
carried="${OOM_CARRIED_DEPS:-$root/.carry}"
py="${OOM_TORCH_PYTHON:-}"
if [ -z "$py" ]; then
  for c in .venv/bin/python /opt/torch/.venv/bin/python python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch' 2>/dev/null; then py="$c"; break; fi
  done
fi
export OOM_CONFIG_DIR="$root/configs"

die() { echo "gpu-check: $*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: scripts/gpu-check.sh build|tests|runs|all ..."
[ -n "$py" ] || die "no python with torch found (set OOM_TORCH_PYTHON)"
# One line saying why, before any work, when there is no GPU to check.
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then
  die "no CUDA device is visible (nvidia-smi lists no GPU); this check needs one"
fi
"$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() and torch.version.cuda else 1)' 2>/dev/null ||
  die "$py's torch sees no CUDA device (torch $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null))"
mkdir -p "$build" "$out"

record() {  # record NAME JSON: one figure file per step
  echo "$2" > "$out/$1.json"
}

stage_build() {
  [ -f "$carried/include/nlohmann/json.hpp" ] || die "no carried headers in $carried (run scripts/carry-deps.sh where Debian's packages are)"
  local t0=$(date +%s)
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOOM_SIMULATOR=OFF -DOOM_REQUIRE_CUDA=ON \
    -DOOM_TORCH_PYTHON="$(command -v "$py")" -DOOM_CARRIED_DEPS="$carried" -DOOM_BUILD_BENCHMARKS=OFF \
    > "$out/configure.log" 2>&1 || { tail -n 20 "$out/configure.log"; die "configure failed ($out/configure.log)"; }
  cmake --build "$build" -j "$jobs" --target oom oom_torch oom_gpu_tests > "$out/build.log" 2>&1 ||
    { grep -m 20 -E "error|Error" "$out/build.log"; die "build failed ($out/build.log)"; }
  grep -q "OOM_BACKEND_CUDA=1" "$build/compile_commands.json" || die "the build has no CUDA code paths"
  record build "{\"configure_and_build_s\": $(( $(date +%s) - t0 )), \"torch\": \"$("$py" -c 'import torch; print(torch.__version__)')\"}"
}

stage_tests() {
  [ -x "$build/tests/backend/oom_gpu_tests" ] || die "run the build stage first"
  "$build/tests/backend/oom_gpu_tests" --gtest_output="json:$out/gpu-tests.json" > "$out/gpu-tests.log" 2>&1 ||
    { tail -n 30 "$out/gpu-tests.log"; die "GPU tests failed ($out/gpu-tests.log)"; }
  tail -n 3 "$out/gpu-tests.log"
}

stage_runs() {
  local oom="$build/cli/oom"
  [ -x "$oom" ] || die "run the build stage first"
  # (1) the default plan (no --plan): GPU against CPU, loss for loss.
  for d in cuda cpu; do
    "$oom" train --device "$d" --model tiny-moe --steps 10 --seq 128 --batch 8 --json > "$out/train-$d.json" 2> "$out/train-$d.log" ||
      die "oom train --device $d failed ($out/train-$d.log)"
  done
  "$py" - "$out" <<'PY' || die "GPU and CPU training losses differ"
import json, sys
out = sys.argv[1]
g, c = (json.load(open(f"{out}/train-{d}.json")) for d in ("cuda", "cpu"))
worst = max(abs(a - b) / abs(b) for a, b in zip(g["losses"], c["losses"]))
json.dump({"worst_rel_loss_diff": worst, "cuda_tokens_per_s": g["tokens_per_s"], "cpu_tokens_per_s": c["tokens_per_s"]},
          open(f"{out}/train-compare.json", "w"))
print(f"train: GPU vs CPU worst relative loss difference {worst:.2e}; {g['tokens_per_s']:.0f} vs {c['tokens_per_s']:.0f} tokens/s")
sys.exit(0 if worst <= 1e-3 else 1)
PY
  # (2) a plan-driven step on the GPU, measured and predicted.
  cat > "$out/plan.json" <<'JSON'
{"version": 1, "path": "local", "resident_layers": [], "moe_retained_layers": [], "routing_chunk_tokens": 65536,
 "param_transfer": "full", "transfer_chunk_mib": 64, "cpu_grad_slots": 2,
 "split": {"attention_head_group": 1, "gdn_chunk_tokens": 64, "moe_chunk_tokens": 512, "sub_batch_seqs": 4},
 "keep_attention_results": true, "boundaries": {"host_kept": [0, 2], "gpu_held": [1], "regenerate_cap": 1},
 "notes": "gpu-check: head groups, GDN chunks, MoE chunks, sub-batches, kept O/LSE, held and regenerated boundaries"}
JSON
  cat > "$out/workload.json" <<'JSON'
{"model": "tiny-moe", "hardware": "h200-node", "gpus": 1, "global_batch": 8, "seq_len": 128,
 "gpu_budget_gib": null, "host_budget_gib": null, "yarn_factor": 1}
JSON
  "$oom" simulate --workload "$out/workload.json" --plan "$out/plan.json" --engine analytic --trace "$out/predicted-trace.json" \
    > "$out/simulate.log" 2>&1 || die "oom simulate failed ($out/simulate.log)"
  "$oom" train --device cuda --model tiny-moe --steps 5 --seq 128 --batch 8 --plan "$out/plan.json" \
    --trace "$out/measured-trace.json" --json > "$out/plan-train.json" 2> "$out/plan-train.log" || die "plan run failed ($out/plan-train.log)"
  "$oom" diff "$out/predicted-trace.json" "$out/measured-trace.json" --summary --json > "$out/diff.json" 2> "$out/diff.log" ||
    die "oom diff failed ($out/diff.log)"
  "$oom" diff "$out/predicted-trace.json" "$out/measured-trace.json" --summary
  # (3) pinned host-device copies against the hardware file's PCIe figure.
  "$py" - "$out" "$root/configs/hardware/h200-node.json" <<'PY' || die "bandwidth probe failed"
import json, sys, torch
out, hw = sys.argv[1], json.load(open(sys.argv[2]))
n = 1 << 30
host = torch.empty(n, dtype=torch.uint8).pin_memory()
dev = torch.empty(n, dtype=torch.uint8, device="cuda")
def rate(copy):
    copy(); torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5): copy()
    end.record(); torch.cuda.synchronize()
    return 5 * n / (start.elapsed_time(end) / 1e3)
h2d = rate(lambda: dev.copy_(host, non_blocking=True))
d2h = rate(lambda: host.copy_(dev, non_blocking=True))
peak = hw["pcie"]["h2d_Bps"]
res = {"h2d_pinned_Bps": h2d, "d2h_pinned_Bps": d2h, "hardware_file_h2d_Bps": peak, "h2d_over_file": h2d / peak}
json.dump(res, open(f"{out}/bandwidth.json", "w"))
print(f"pinned H2D {h2d/1e9:.1f} GB/s, D2H {d2h/1e9:.1f} GB/s ({100*h2d/peak:.0f}% of the hardware file's {peak/1e9:.0f} GB/s)")
PY
}

stages=("$@")
[ "${stages[0]}" = all ] && stages=(build tests runs)
for s in "${stages[@]}"; do
  case "$s" in
    build|tests|runs) t0=$(date +%s); "stage_$s"; echo "gpu-check: $s passed ($(( $(date +%s) - t0 )) s); figures in $out" ;;
    *) die "unknown stage '$s' (build, tests, runs or all)" ;;
  esac
done
