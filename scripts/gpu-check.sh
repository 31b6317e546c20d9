#!/usr/bin/env bash
# The GPU check of the LibTorch backend: one command, under 8 minutes on a 16-core H100 or H200
# with PyTorch at /opt/torch/.venv and no network, every stage reported even when an earlier one
# fails.
#
#   bash scripts/gpu-check.sh [OUT_DIR]      (default $OUT, else build-gpu/gpu-check)
#
# Needs the carried headers in .carry (scripts/carry-deps.sh, run where Debian's packages are;
# OOM_CARRIED_DEPS names another folder). Writes five files into OUT_DIR:
#   gpu-check.json        every stage's status, seconds and reason, and every figure below
#   gpu-check.log         the output of every command
#   measured-trace.json   the measured plan step of the Qwen3.6-35B-A3B slice (oom train --trace)
#   predicted-trace.json  `oom simulate` of the same plan
#   diff.txt              `oom diff` of predicted against measured, for tiny-moe and the slice
# Stages, in order (each under its own time limit and what is left of 450 s):
#   bandwidth   pinned H2D and D2H GB/s (1 GiB and 64 MiB copies) against the hardware file's PCIe
#               figures; the hardware file is picked by the device's name (H100, H200, RTX 4090)
#   build       the `backend` preset (-DOOM_SIMULATOR=OFF, carried headers, CUDA and NCCL required)
#               against the machine's PyTorch; only oom, the plugin and oom_gpu_tests, all cores;
#               its include paths checked (scripts/check-carried-build.py)
#   exactness   FP32 on the GPU against FP32 on the CPU: oom_gpu_tests (losses, gradient norms,
#               every block's gradient, asserted) and 10 steps of `oom train` (losses within 1e-3)
#   drift       BF16 working weights against FP32 on the GPU, 10 steps of the same run: the
#               largest relative loss difference, held to 8 BF16 roundoffs (8 × 2^-8 = 3.1e-2)
#   plan_slice  a plan step of a 2-decoder slice of Qwen3.6-35B-A3B at its real dimensions (one
#               GDN and one full-attention decoder, 1 x 4096 tokens) on the Local path's Base plan
#               (`oom plan`): measured (`oom train --plan --trace`), predicted (`oom simulate`,
#               analytic engine), compared stage by stage (`oom diff`)
#   plan_tiny   the same for tiny-moe on a plan with every split
#   syncs       host synchronisations per step, read from the measured traces (status
#               not_available where the traces do not count them)
# Exits 0 when every stage passed (syncs: or not_available), 1 otherwise; without a GPU, 1 at once
# with one line saying why.
# Environment: OOM_TORCH_PYTHON (default /opt/torch/.venv/bin/python, else .venv/bin/python, else
# python3), OOM_GPU_BUILD (default build-gpu), OOM_CARRIED_DEPS (default .carry), OOM_JOBS
# (default nproc), OOM_GPU_CHECK_SECONDS (default 450).
set -uo pipefail
out_arg="${1:+$(realpath -m "$1")}"  # relative to the caller's folder
cd "$(dirname "$0")/.." || exit 1
root="$PWD"
start=$(date +%s)

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then
  echo "gpu-check: no CUDA device is visible (nvidia-smi lists no GPU); this check needs one" >&2
  exit 1
fi
py="${OOM_TORCH_PYTHON:-}"
if [ -z "$py" ]; then
  for c in /opt/torch/.venv/bin/python .venv/bin/python python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch' 2>/dev/null; then py="$(command -v "$c")"; break; fi
  done
fi
if [ -z "$py" ]; then
  echo "gpu-check: no python with torch found (set OOM_TORCH_PYTHON)" >&2
  exit 1
fi
if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() and torch.version.cuda else 1)' 2>/dev/null; then
  echo "gpu-check: $py's torch sees no CUDA device" >&2
  exit 1
fi

out="$(realpath -m "${out_arg:-${OUT:-build-gpu/gpu-check}}")"
build="$(realpath -m "${OOM_GPU_BUILD:-build-gpu}")"
carried="$(realpath -m "${OOM_CARRIED_DEPS:-.carry}")"
jobs="${OOM_JOBS:-$(nproc)}"
deadline=$((start + ${OOM_GPU_CHECK_SECONDS:-450}))
work="$build/gpu-check-work"  # everything but the five files of OUT_DIR
rm -rf "$work"
mkdir -p "$out" "$work"
log="$out/gpu-check.log"
: > "$log"
rm -f "$out/diff.txt" "$out/measured-trace.json" "$out/predicted-trace.json" "$out/gpu-check.json"
oom="$build/cli/oom"
export OOM_CONFIG_DIR="$root/configs"

say() { echo "gpu-check: $*" | tee -a "$log"; }
# lim CMD...: runs CMD within what is left of the running stage's time; cap S CMD...: within at most
# S seconds of it (so that a hung command leaves the stage's next ones their time).
lim() { cap 100000 "$@"; }
cap() {
  local left=$((stage_deadline - $(date +%s))) most=$1
  shift
  [ "$left" -le "$most" ] || left=$most
  [ "$left" -gt 0 ] || { echo "(no time left for: $*)"; return 124; }
  timeout --kill-after=5 "$left" "$@"
  local rc=$?
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || echo "(stopped after $left s: $*)" >&2
  return "$rc"
}
# fail REASON: ends the running stage (a subshell) as failed.
fail() { echo "$*" > "$work/$stage.reason"; exit 1; }
# figure JSON: the running stage's figures (one JSON object, merged into gpu-check.json).
figure() { printf '%s\n' "$1" > "$work/$stage.figures.json"; }

# The device, its hardware file (by name) and that file's PCIe figures.
"$py" - "$root/configs/hardware" > "$work/device.json" 2>> "$log" <<'PY'
import json, sys, torch
name = torch.cuda.get_device_name(0)
files = {"H200": "h200-node", "H100": "h100-sxm-node", "RTX 4090": "rtx4090-node"}
hw = next((f for key, f in files.items() if key in name), None)
pcie = json.load(open(f"{sys.argv[1]}/{hw}.json"))["pcie"] if hw else {}
print(json.dumps({"name": name, "hardware_file": hw, "torch": torch.__version__, "cuda": torch.version.cuda,
                  "file_h2d_Bps": pcie.get("h2d_Bps"), "file_d2h_Bps": pcie.get("d2h_Bps")}))
PY
hardware="$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["hardware_file"] or "")' "$work/device.json" 2>/dev/null)"
say "device $("$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["name"], "torch", d["torch"])' "$work/device.json" 2>/dev/null), hardware file ${hardware:-none}"

stage_bandwidth() {
  [ -n "$hardware" ] || fail "no hardware file for this device (H100, H200 or RTX 4090 by name)"
  lim "$py" - "$work/device.json" "$work/bandwidth.figures.json" <<'PY' || fail "the bandwidth probe failed"
import json, sys, torch
dev_info = json.load(open(sys.argv[1]))
def rate(nbytes, direction, reps):
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    copy = (lambda: dev.copy_(host, non_blocking=True)) if direction == "h2d" else (lambda: host.copy_(dev, non_blocking=True))
    copy(); torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps): copy()
    end.record(); torch.cuda.synchronize()
    return reps * nbytes / (start.elapsed_time(end) / 1e3)
res = {}
for label, n, reps in (("1GiB", 1 << 30, 5), ("64MiB", 64 << 20, 40)):
    for d in ("h2d", "d2h"):
        res[f"{d}_{label}_Bps"] = rate(n, d, reps)
for d in ("h2d", "d2h"):
    res[f"{d}_over_file"] = res[f"{d}_1GiB_Bps"] / dev_info[f"file_{d}_Bps"]
res["file_h2d_Bps"], res["file_d2h_Bps"] = dev_info["file_h2d_Bps"], dev_info["file_d2h_Bps"]
res["tolerance"] = "measured 1 GiB copies within 0.8-1.25x the hardware file's figure"
json.dump(res, open(sys.argv[2], "w"))
print(f"pinned H2D {res['h2d_1GiB_Bps']/1e9:.1f} GB/s, D2H {res['d2h_1GiB_Bps']/1e9:.1f} GB/s "
      f"(file {dev_info['file_h2d_Bps']/1e9:.0f} / {dev_info['file_d2h_Bps']/1e9:.0f} GB/s); "
      f"64 MiB: {res['h2d_64MiB_Bps']/1e9:.1f} / {res['d2h_64MiB_Bps']/1e9:.1f} GB/s")
bad = [d for d in ("h2d", "d2h") if not 0.8 <= res[f"{d}_over_file"] <= 1.25]
sys.exit(1 if bad else 0)
PY
}

stage_build() {
  [ -f "$carried/include/nlohmann/json.hpp" ] || fail "no carried headers in $carried (run scripts/carry-deps.sh where Debian's packages are)"
  local t0 t1 t2
  t0=$(date +%s)
  lim cmake --preset backend -B "$build" -DOOM_REQUIRE_CUDA=ON -DOOM_TORCH_PYTHON="$py" \
    -DOOM_CARRIED_DEPS="$carried" -DOOM_BUILD_BENCHMARKS=OFF || fail "configure failed"
  t1=$(date +%s)
  "$py" scripts/check-carried-build.py "$build" || fail "an include path leaves the carried folder, torch and the compiler"
  lim cmake --build "$build" -j "$jobs" --target oom oom_torch oom_gpu_tests || fail "the build failed"
  t2=$(date +%s)
  grep -q "OOM_BACKEND_CUDA=1" "$build/compile_commands.json" || fail "the build has no CUDA code paths"
  figure "{\"configure_s\": $((t1 - t0)), \"build_s\": $((t2 - t1)), \"jobs\": $jobs}"
}

built() { [ -x "$oom" ] && [ -e "$build/cli/liboom_torch.so" ] && [ -x "$build/tests/backend/oom_gpu_tests" ]; }

# train NAME ARGS...: `oom train` of tiny-moe (10 steps, 8 × 128 tokens) into $work/NAME.json.
train() {
  local name=$1
  shift
  lim "$oom" train --model tiny-moe --steps 10 --seq 128 --batch 8 --json "$@" > "$work/$name.json"
}

stage_exactness() {
  local gtest_rc=0
  cap 60 "$build/tests/backend/oom_gpu_tests" --gtest_output="json:$work/gpu-tests.json" || gtest_rc=$?
  train fp32-cuda --device cuda --fp32 || fail "oom train --device cuda --fp32 failed"
  train fp32-cpu --device cpu || fail "oom train --device cpu failed"
  "$py" - "$work" "$gtest_rc" <<'PY' || fail "$(cat "$work/exactness.why" 2>/dev/null)"
import json, os, sys
work, gtest_rc = sys.argv[1], int(sys.argv[2])
g, c = (json.load(open(f"{work}/fp32-{d}.json")) for d in ("cuda", "cpu"))
rel = [abs(a - b) / abs(b) for a, b in zip(g["losses"], c["losses"])]
gn = [abs(a - b) / abs(b) for a, b in zip(g.get("grad_norms", []), c.get("grad_norms", [])) if b]
fig = {"train_fp32_worst_rel_loss_diff": max(rel), "train_fp32_rel_loss_diff_per_step": rel,
       "train_fp32_worst_rel_grad_norm_diff": max(gn, default=None), "train_tolerance": 1e-3, "cuda_tokens_per_s": g["tokens_per_s"], "cpu_tokens_per_s": c["tokens_per_s"]}
why = []
if os.path.exists(f"{work}/gpu-tests.json"):
    t = json.load(open(f"{work}/gpu-tests.json"))
    failed = [f"{s['name']}.{c['name']}" for s in t["testsuites"] for c in s["testsuite"] if c.get("failures")]
    fig.update({"gpu_tests": t["tests"], "gpu_tests_failed": failed})
    if failed: why.append(f"oom_gpu_tests failed {len(failed)} of {t['tests']}: {', '.join(failed[:5])}")
else:
    fig["gpu_tests"] = None
    why.append(f"oom_gpu_tests exited {gtest_rc} without a report")
if gtest_rc and not why: why.append(f"oom_gpu_tests exited {gtest_rc}")
if max(rel) > 1e-3: why.append(f"FP32 losses GPU vs CPU differ by {max(rel):.2e} relative (> 1e-3)")
json.dump(fig, open(f"{work}/exactness.figures.json", "w"))
open(f"{work}/exactness.why", "w").write("; ".join(why))
print(f"exactness: oom_gpu_tests {fig['gpu_tests']} tests, failed {fig.get('gpu_tests_failed')}; "
      f"FP32 losses GPU vs CPU worst {max(rel):.2e} relative")
sys.exit(1 if why else 0)
PY
}

stage_drift() {
  [ -s "$work/fp32-cuda.json" ] || train fp32-cuda --device cuda --fp32 || fail "oom train --device cuda --fp32 failed"
  train bf16-cuda --device cuda --bf16 || fail "oom train --device cuda --bf16 failed"
  "$py" - "$work" <<'PY' || fail "$(cat "$work/drift.why")"
import json, sys
work = sys.argv[1]
b, f = (json.load(open(f"{work}/{p}-cuda.json")) for p in ("bf16", "fp32"))
rel = [abs(x - y) / abs(y) for x, y in zip(b["losses"], f["losses"])]
tol = 8 * 2.0 ** -8  # 8 roundoffs of BF16's 8-bit significand
json.dump({"bf16_vs_fp32_worst_rel_loss_diff": max(rel), "bf16_vs_fp32_rel_loss_diff_per_step": rel,
           "tolerance": tol, "bf16_tokens_per_s": b["tokens_per_s"], "fp32_tokens_per_s": f["tokens_per_s"]},
          open(f"{work}/drift.figures.json", "w"))
open(f"{work}/drift.why", "w").write(f"BF16 losses drift {max(rel):.2e} relative from FP32 (> {tol:.2e})")
print(f"drift: BF16 vs FP32 over {len(rel)} steps, worst {max(rel):.2e} relative (tolerance {tol:.2e})")
sys.exit(0 if max(rel) <= tol else 1)
PY
}

# plan_step NAME MODEL SEQ BATCH PLAN: `oom simulate` and `oom train --plan --trace` of the same plan,
# then `oom diff` (its text appended to diff.txt); traces into $work/NAME-{predicted,measured}.json.
plan_step() {
  local name=$1 model=$2 seq=$3 batch=$4 plan=$5
  cat > "$work/$name-workload.json" <<JSON
{"model": "$model", "hardware": "$hardware", "gpus": 1, "global_batch": $batch, "seq_len": $seq,
 "gpu_budget_gib": null, "host_budget_gib": null, "yarn_factor": 1}
JSON
  if [ -z "$plan" ]; then
    plan="$work/$name-plan.json"
    lim "$oom" plan --workload "$work/$name-workload.json" --path local --preset base -o "$plan" ||
      fail "oom plan --preset base failed"
  fi
  lim "$oom" simulate --workload "$work/$name-workload.json" --plan "$plan" --engine analytic \
    --trace "$work/$name-predicted.json" --json > "$work/$name-simulate.json" || fail "oom simulate failed"
  lim "$oom" train --device cuda --model "$model" --steps 3 --seq "$seq" --batch "$batch" --plan "$plan" \
    --trace "$work/$name-measured.json" --json > "$work/$name-train.json" || fail "oom train --plan failed"
  { echo "== $name: oom diff predicted measured"; lim "$oom" diff "$work/$name-predicted.json" "$work/$name-measured.json"; } \
    >> "$out/diff.txt" 2>&1 || fail "oom diff failed"
  lim "$oom" diff "$work/$name-predicted.json" "$work/$name-measured.json" --summary --json > "$work/$name-diff.json" ||
    fail "oom diff --summary --json failed"
  "$py" - "$work" "$name" "$work/$stage.figures.json" <<'PY'
import json, sys
work, name, path = sys.argv[1:]
load = lambda s: json.load(open(f"{work}/{name}-{s}.json"))
fig = {"simulate": load("simulate"), "train": load("train"), "diff_summary": load("diff")}
json.dump(fig, open(path, "w"))
PY
}

stage_plan_tiny() {
  cat > "$work/tiny-plan.json" <<'JSON'
{"version": 1, "path": "local", "resident_layers": [], "moe_retained_layers": [], "routing_chunk_tokens": 65536,
 "param_transfer": "full", "transfer_chunk_mib": 64, "cpu_grad_slots": 2,
 "split": {"attention_head_group": 1, "gdn_chunk_tokens": 64, "moe_chunk_tokens": 512, "sub_batch_seqs": 4},
 "keep_attention_results": true, "boundaries": {"host_kept": [0, 2], "gpu_held": [1], "regenerate_cap": 1},
 "notes": "gpu-check: head groups, GDN chunks, MoE chunks, sub-batches, kept O/LSE, held and regenerated boundaries"}
JSON
  plan_step tiny tiny-moe 128 8 "$work/tiny-plan.json"
}

stage_plan_slice() {
  # Two decoders of Qwen3.6-35B-A3B at its real dimensions: a Gated DeltaNet one and a full-attention one.
  "$py" - "$root/configs/models/qwen3.6-35b-a3b.json" "$work/qwen3.6-slice.json" <<'PY' || fail "cannot write the slice's config"
import json, sys
c = json.load(open(sys.argv[1]))
c["num_hidden_layers"] = 2
c["layer_types"] = ["linear_attention", "full_attention"]
c.pop("full_attention_interval", None)
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
  plan_step slice "$work/qwen3.6-slice.json" 4096 1 ""
  cp "$work/slice-measured.json" "$out/measured-trace.json"
  cp "$work/slice-predicted.json" "$out/predicted-trace.json"
}

stage_syncs() {
  "$py" - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
fig = {}
for name in ("tiny", "slice"):
    path = f"{work}/{name}-measured.json"
    if not os.path.exists(path):
        fig[name] = "no measured trace"
        continue
    t = json.load(open(path))
    meta = t.get("otherData", t)
    fig[name] = meta["host_syncs"] if "host_syncs" in meta else "not available"
json.dump({"host_syncs_per_step": fig}, open(f"{work}/syncs.figures.json", "w"))
print(f"host syncs per step: {fig}")
if all(isinstance(v, str) for v in fig.values()):
    open(f"{work}/syncs.why", "w").write(f"not available ({fig})")
    sys.exit(2)
PY
  local rc=$?
  [ "$rc" -eq 2 ] && { cp "$work/syncs.why" "$work/syncs.reason"; exit 2; }
  return "$rc"
}

declare -A status seconds
order=(bandwidth build exactness drift plan_slice plan_tiny syncs)
declare -A limit=([bandwidth]=40 [build]=280 [exactness]=120 [drift]=45 [plan_tiny]=60 [plan_slice]=150 [syncs]=10)
for stage in "${order[@]}"; do
  t0=$(date +%s)
  stage_deadline=$((t0 + limit[$stage]))
  [ "$stage_deadline" -le "$deadline" ] || stage_deadline=$deadline
  if [ $((stage_deadline - t0)) -lt 5 ]; then
    status[$stage]=skipped
    echo "no time left of ${OOM_GPU_CHECK_SECONDS:-450} s" > "$work/$stage.reason"
  elif [[ "$stage" != bandwidth && "$stage" != build && "$stage" != syncs ]] && ! built; then
    status[$stage]=skipped
    echo "nothing built to run" > "$work/$stage.reason"
  else
    echo "== $stage" >> "$log"
    (stage_$stage) > "$work/$stage.out" 2>&1
    case $? in 0) status[$stage]=passed ;; 2) status[$stage]=not_available ;; *) status[$stage]=failed ;; esac
    cat "$work/$stage.out" >> "$log"
    # A failure's reason ends with the first error of its output (a Python traceback's last line, a
    # compiler's or CMake's first error), or else its last line.
    if [ "${status[$stage]}" = failed ]; then
      if grep -q "^Traceback" "$work/$stage.out"; then
        detail="$(grep -v '^\s*$' "$work/$stage.out" | tail -n 1)"
      else
        detail="$(grep -m1 -A1 -E "error:|CMake Error|failed" "$work/$stage.out" | tr -s ' \n' ' ' ||
                  grep -v '^\s*$' "$work/$stage.out" | tail -n 1)"
      fi
      [ -z "$detail" ] || echo "$(cat "$work/$stage.reason" 2>/dev/null): ${detail:0:300}" > "$work/$stage.reason"
    fi
  fi
  seconds[$stage]=$(($(date +%s) - t0))
  say "$stage ${status[$stage]} (${seconds[$stage]} s)$([ -s "$work/$stage.reason" ] && echo ": $(cat "$work/$stage.reason")")"
done

for stage in "${order[@]}"; do echo "$stage ${status[$stage]} ${seconds[$stage]}"; done > "$work/statuses.txt"
"$py" - "$work" "$out/gpu-check.json" $(($(date +%s) - start)) <<'PY'
import json, os, sys
work, path, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
read = lambda p: json.load(open(p)) if os.path.exists(p) else None
result = {"device": read(f"{work}/device.json"), "total_s": total, "stages": {}}
for line in open(f"{work}/statuses.txt"):
    name, status, secs = line.split()
    reason = open(f"{work}/{name}.reason").read().strip() if os.path.exists(f"{work}/{name}.reason") else ""
    result["stages"][name] = {"status": status, "seconds": int(secs), "reason": reason,
                              "figures": read(f"{work}/{name}.figures.json")}
json.dump(result, open(path, "w"), indent=1)
PY
say "$(($(date +%s) - start)) s; figures in $out/gpu-check.json"
# A figure the backend does not yet record (not_available) fails nothing.
for stage in "${order[@]}"; do [[ "${status[$stage]}" = passed || "${status[$stage]}" = not_available ]] || exit 1; done
exit 0
