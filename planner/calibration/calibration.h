// Calibration: the few physical constants of one hardware that turn StepGraph demand into time.
//
// No equation gives how close a kernel or a link gets to its datasheet peak; these constants do,
// one set per hardware (configs/calibration/NAME.json), fitted by least squares over recorded
// measurements (planner/calibration/calibrate.h). Every constant is physical: an efficiency against the
// HardwareSpec's peak, an achieved bandwidth, a throughput or a per-stage overhead. None belongs
// to a single record. Efficiencies are fractions of peak (0..1]; a GEMM of m rows reaches
// `gemm_efficiency · m / (m + gemm_half_rows)` of the BF16 peak (small GEMMs underfill the GPU).
// Plain value type; the defaults are the uncalibrated estimates derived from a HardwareSpec.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "costmodel/hardware_spec.h"
#include "costmodel/units.h"

namespace oom {

// Flash attention's backward against its forward on the H100 SXM, both from one benchmark run:
// FlashAttention-3 at (batch 1, 32K tokens, 8 heads, head dim 128), 305 TFLOP/s backward and 500
// forward (Dao-AILab/flash-attention#1051): 0.61. (Its head-dim-256 backward, 373 TFLOP/s before
// Dao-AILab/flash-attention#2889, over the paper's 642 TFLOP/s forward gives 0.58.)
inline constexpr double kFlashBackwardRatio = 305.0 / 500.0;

// DRAM bytes a CPU task moves per parameter when the lowering leaves a stage's bytes at 0.
inline constexpr Bytes kAdamWDramBytesPerParam = 28;          // r/w FP32 master, m, v (24) + BF16 grad in (2) + BF16 weight out (2)
inline constexpr Bytes kTorchAdamWDramBytesPerParam = 28;     // r FP32 grad, master, m, v (16) + w master, m, v (12), fused
inline constexpr Bytes kHostAccumulateDramBytesPerParam = 10;  // BF16 partial in (2) + FP32 sum read and written (8)
inline constexpr Bytes kHostPrepDramBytesPerParam = 6;         // FP32 master in (4) + BF16 copy out (2)

// The host accumulation of BF16 partials is not fitted (one published record runs it): like the
// AdamW it streams host memory, so it runs at the AdamW rate times the ratio of their DRAM bytes
// per parameter, 28 / 10.
inline double accumulate_rate_of(double cpu_adamw_params_per_s) {
  return cpu_adamw_params_per_s * static_cast<double>(kAdamWDramBytesPerParam) / static_cast<double>(kHostAccumulateDramBytesPerParam);
}

struct Calibration {
  std::string hardware;  // the HardwareSpec name it was fitted for
  std::string fitted_from;  // a note on the records the fit used (free text)

  // GPU compute: efficiency against the BF16 dense peak.
  double gemm_efficiency = 0.70;          // large dense GEMMs
  double gemm_half_rows = 256;            // rows at which a GEMM reaches half of gemm_efficiency
  double expert_gemm_efficiency = 0.55;   // grouped routed-expert GEMMs at large token counts
  double expert_half_rows = 512;          // tokens per expert at half of expert_gemm_efficiency
  // Flash attention core forward (head dim ≤ 256, causal or full: PyTorch's fused
  // scaled_dot_product_attention). Estimate: FlashAttention-3's 642 TFLOP/s causal forward at head
  // dim 256 and 16K tokens on the H100 SXM5 (Shah et al. 2024, Fig. 5), 0.649 of the BF16 peak,
  // over the key-span ramp below at 8,192 keys per query (0.966): 0.67, the kernel's long-span value.
  double attention_efficiency = 0.67;
  // Flash attention core backward (head dim ≤ 256). A GPU fit sets it to kFlashBackwardRatio ×
  // attention_efficiency (planner/calibration/calibrate.cc); the estimate likewise.
  double attention_backward_efficiency = 0.67 * kFlashBackwardRatio;
  // Attention with head dim > 256 (PyTorch's memory-efficient kernel): its arithmetic only; its
  // K/V re-reads past L2 are priced at the HBM rate (planner/engine/duration_model.h). Estimate:
  // half of FlashAttention-2's 298 TFLOP/s forward at head dim 256 on the H100 (FlashAttention-3
  // paper), an SM80-style CUTLASS kernel that past head dim 128 keeps its output accumulator out
  // of registers (ATen mem_eff_attention kernel_forward.h, kSingleValueIteration false).
  double wide_attention_efficiency = 0.15;
  // Windowed attention core forward (a sliding window shorter than the sequence, head dim ≤ 256):
  // scaled_dot_product_attention takes no window, so a window runs another kernel (flash-attn's
  // window_size, FlexAttention's block mask), not the fused causal one above. Its backward runs at
  // attention_backward_efficiency · windowed / attention_efficiency. Estimate: between
  // FlashAttention-2's 0.30 (298 TFLOP/s at head dim 256, FlashAttention-3 paper) and the flash
  // estimate above. A calibration file without it prices windows as the flash kernel (its own
  // attention_efficiency), as calibrations before it did.
  double windowed_attention_efficiency = 0.45;
  // Attention kernels fill the GPU as the keys each query attends to grow: a core over κ keys per
  // query (half the sequence when causal, about the window when windowed) reaches
  // κ / (κ + attention_half_keys) of its efficiency. Not fitted: FlashAttention-2's causal forward
  // throughput at head dim 128 rises from about half of its 16K-token value at 512 tokens to ~92%
  // at 4K (Dao 2023, Fig. 4), which κ_half ≈ 290 keys (575 tokens causal) reproduces.
  double attention_half_keys = 290;
  double gdn_efficiency = 0.10;           // chunked Gated DeltaNet recurrence
  double hbm_efficiency = 0.80;           // bandwidth-bound kernels (norms, GPU AdamW) against HBM peak

  // Links: achieved rates.
  BytesPerS h2d_Bps = 0;          // per GPU PCIe link, pinned (0 = take the HardwareSpec's)
  BytesPerS d2h_Bps = 0;
  double fabric_efficiency = 0.80;  // A2A / AllGather / ReduceScatter against the fabric's per-GPU rate

  // CPU: throughput per socket (0 = take the HardwareSpec's adamw_params_per_s).
  double cpu_adamw_params_per_s = 0;
  double host_prep_params_per_s = 0;        // BF16 staging; 0 = 4 × the AdamW rate
  double host_accumulate_params_per_s = 0;  // FP32 accumulation of BF16 partials; 0 = accumulate_rate_of(AdamW)
  // torch.optim.AdamW stepping CPU tensors after the backward (FSDP2 with CPU offload, and the
  // FSDP2 part of KT-FT): another implementation than the update above; 0 = the AdamW rate.
  double torch_adamw_params_per_s = 0;

  // Fixed cost per compute stage of a running step besides its kernels' work: the launches and
  // eager dispatch of its operators, its waits on other streams' events, the host's bookkeeping
  // between stages (not paid by an operator timed alone). The estimate is a bare launch's; the
  // published H100 steps put it near 2 ms (traces/paper/README.md).
  Seconds compute_overhead_s = 20e-6;
  // Host dispatch per operator a compute stage issues (Stage::ops): eager LibTorch's dispatcher,
  // autograd bookkeeping and allocation around each call. 0 by default: on a GPU the host runs
  // ahead of the stream, so dispatch hides behind earlier kernels and the per-stage cost above
  // covers what shows; a device that runs its operators on the dispatching thread (the CPU
  // backend, `oom calibrate --backend`) pays it in full, and fits it.
  Seconds operator_overhead_s = 0;
  Seconds expert_overhead_s = 20e-6;  // per local expert of an expert-GEMM stage (per-expert launches)
  Seconds transfer_overhead_s = 10e-6;
  Seconds collective_overhead_s = 30e-6;
  Seconds cpu_task_overhead_s = 50e-6;

  bool operator==(const Calibration&) const = default;
};

// The uncalibrated constants for `h` (the defaults above, with its link and CPU rates).
Calibration default_calibration(const HardwareSpec& h);

nlohmann::json calibration_to_json(const Calibration& c);
// Parses the object calibration_to_json() writes; missing constants keep their defaults.
// Throws InputError naming `file`, the field and the value (efficiencies must lie in (0, 1]).
Calibration calibration_from_json(const nlohmann::json& j, const std::string& file);
// The calibration of hardware `to` that nobody fitted, from `fitted`, the calibration of hardware
// `from` whose GPUs are of the same architecture (GpuSpec::architecture): such GPUs run the same
// kernels on the same SMs, and their host software is the same, so
//   - the GPU efficiencies (fractions of the BF16 and HBM peaks), their fill ramps and the GPU
//     side's fixed costs (per stage, per operator, per expert, per transfer) carry over as fitted;
//   - link rates and CPU throughputs carry over as fractions of the datasheet figure they were
//     fitted against: h2d/d2h × to's PCIe rate / from's, the CPU rates × to's socket AdamW rate /
//     from's (each left at to's estimate when either spec does not state it);
//   - the fabric's efficiency and the per-collective overhead carry over only to the same kind of
//     fabric (NVLink or PCIe peer); on another, they keep the estimates;
//   - a probed device (GpuSpec::gemm_half_rows measured) keeps what default_calibration() gives
//     it: its own GEMM ramp, and one attention kernel for windowed and full cores.
// Memory-bound kernels priced by their HBM bytes (norms, permutations, GDN's chunked kernels'
// intermediates: costmodel/traffic.h) run at the target's own HBM rate. Kernels whose fitted
// efficiency still reflects a memory bound (small expert GEMMs) carry their H100-era fraction of
// the BF16 peak over: on a GPU of more HBM bandwidth and the same peak (the H200) they are
// predicted no faster. `fitted_from` says where the constants came from.
Calibration transfer_calibration(const Calibration& fitted, const HardwareSpec& from, const HardwareSpec& to);

// configs/calibration/NAME.json (under config_root()), or a path; for an engine other than
// "analytic", configs/calibration/NAME.ENGINE.json (the constants fitted with that engine,
// `oom calibrate --engine ENGINE`).
std::string calibration_path(const std::string& hardware_name, const std::string& engine = "analytic");
// Loads the calibration of `h` for `engine`: configs/calibration/<h.name>.<engine>.json when the
// engine is not "analytic" and that file exists, else configs/calibration/<h.name>.json when it
// exists (then the same for the node a cluster spec is made of), else the transfer
// (transfer_calibration()) of the calibration of a hardware in configs/hardware whose GPUs are of
// h's architecture — one of the same GPU model first, then the first by name — else
// default_calibration(h). A file that exists but is malformed throws InputError. `source`, when
// given, receives where the constants come from: the file read, the file transferred from (and the
// architecture), or the uncalibrated estimate.
Calibration load_calibration_for(const HardwareSpec& h, const std::string& engine = "analytic", std::string* source = nullptr);
// Loads the calibration file at `path` for hardware `h`; rates left at 0 take h's. Throws
// InputError when the file is malformed or names other hardware ("hardware" field).
Calibration load_calibration_file(const std::string& path, const HardwareSpec& h);

}  // namespace oom
