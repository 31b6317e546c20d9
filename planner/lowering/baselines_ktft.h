// KT-FT as a baseline (reference §7b): the routed experts computed on the CPU with AMX BF16
// kernels, everything else trained with FSDP2 and CPU offload; lowered to the same StepGraph as
// the other baselines (planner/lowering/baselines.h) so both engines run it.
//
// One step per rank, micro-batch by micro-batch (gradient accumulation as in FSDP2):
//   - the dense part of each decoder (attention or GDN, router, shared expert, dense MLP) is
//     FSDP2-sharded: FP32 shard copied host-to-device, BF16 all-gather, FP32 reduce-scatter of
//     its gradient and D2H of the rank's shard; decoder inputs stay on the GPU (activation
//     checkpointing) and each decoder is recomputed in the backward;
//   - at each MoE sublayer the rank's hidden states go to the host, the routed experts run on
//     the CPU cores of the rank's socket (AMX BF16; the socket's throughput is shared by the ranks
//     on it), and the expert outputs come back; the backward does the same with twice the FLOPs;
//   - after the backward every rank's CPU Adam updates its 1/P of the dense shards and of the
//     expert banks (expert gradients are summed in host memory first).
// Host: 16 B/param for the dense part (FSDP2) and 18 B/param for the experts (BF16 weights the
// AMX kernels read, FP32 gradient, master and moments), plus process memory per rank. GPU: M_0,
// the two-slot window of the largest dense decoder and its staging, the kept decoder inputs, the
// largest workset. Needs NumaSpec::amx_bf16_flops_per_s > 0 (hardware without AMX is bad input).
// Units: bytes, seconds, FLOP/s. Pure functions; thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "planner/engine/duration_model.h"
#include "planner/lowering/baselines.h"

namespace oom {

// Achieved fraction of the AMX BF16 peak by the CPU expert GEMMs (estimate: no published KT-FT
// step record to fit it on; AMX GEMMs of expert size reach a few tenths of the tile peak).
inline constexpr double kKtFtAmxEfficiency = 0.3;

BaselineMemory ktft_static_memory(const BaselineSetup& setup, const WorkloadContext& ctx, const MemoryConstants& constants = {});
BaselineFit configure_ktft(const WorkloadContext& ctx, const MemoryConstants& constants = {});
StepGraph lower_ktft(const BaselineSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options = {});

// Prices KT-FT's CPU expert GEMMs (kExpertGemm stages on a CPU update executor) at the socket's
// AMX BF16 throughput × kKtFtAmxEfficiency, shared by the ranks on the socket; every other stage
// as the calibrated model does (a CalibratedDurationModel, so the SimGrid engine finds its
// hardware). Thread-safe.
class KtFtDurationModel : public CalibratedDurationModel {
 public:
  KtFtDurationModel(HardwareSpec hardware, Calibration calibration, int ranks);
  StageCost cost(const Stage& s, const StepGraph& g) const override;

 private:
  std::vector<int> ranks_per_numa_;
};

// Configures, lowers and executes KT-FT with the StepEngine of `engines` named `engine`
// (run_baseline() of BaselineSystem::kKtFt comes here). Throws InputError for an engine that
// `engines` does not offer or hardware without AMX throughput (naming numa[n].amx_bf16_flops_per_s).
BaselineResult run_ktft(const WorkloadContext& ctx, const StepEngines& engines, const std::string& engine,
                        const Calibration& calibration, const MemoryConstants& constants = {});

}  // namespace oom
