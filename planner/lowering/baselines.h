// Baselines: the systems a user would pick instead of an OOM plan (reference §7b), lowered to the
// same StepGraph so that the analytic and SimGrid engines run them like any plan.
//
// Three systems, each described by its published design as data (BaselineTraits):
//   - "fsdp2-offload": FSDP2 with CPU offload. Parameters, FP32 gradients and optimizer state are
//     sharded over the GPUs and live on the host (16 B/param: FP32 master, FP32 gradient, two
//     moments); each decoder's FP32 shard is copied host-to-device, cast and all-gathered in BF16;
//     gradients are reduce-scattered in FP32 and copied to the host; one CPU Adam step runs after
//     the whole backward. Decoder checkpointing with the checkpoints offloaded to the host.
//     Gradient accumulation (GAS) reaches the global batch when a micro-batch does not fit.
//   - "zero-offload": DeepSpeed ZeRO-3 with CPU parameter and optimizer offload: BF16 parameter
//     shards on the host, BF16 all-gather and reduce-scatter, FP32 gradient, master and moments on
//     the host (18 B/param), CPU Adam after the backward; checkpointing with activation offload;
//     gradient accumulation.
//   - "megatrain": single-GPU-style layer streaming: every GPU copies each decoder's whole BF16
//     weights, gradients go to the host as BF16 and are summed there in FP32, each layer's CPU
//     update overlaps the backward of the layers below; its multi-GPU path does not accumulate
//     gradients, so the per-GPU batch must fit at once. Host: FP32 master and moments, BF16 layer
//     copies and an FP32 gradient of every parameter (18 B/param), and per rank pinned BF16
//     gradient slabs (megatrain_pinned_buffer_bytes).
// Every system computes the whole expert bank of a layer on each GPU over its own tokens (no
// expert parallelism) and checkpoints every decoder with its input on the host.
//
// Units of the sharded systems. FSDP2 all-gathers, frees and reduce-scatters per fully_shard()
// module, and a tuned FSDP2 wraps a MoE decoder too large for one unit as several: the decoder's
// other parameters as one unit and its routed experts as units of their own (each expert module
// may be fully_shard()-ed: torch.distributed.fsdp.fully_shard documentation, "nested" modules).
// ZeRO-3 fetches and releases per submodule (its prefetch bucket bounds what is live). Both are
// modelled by `expert_units`: a MoE decoder's routed experts form that many units of equal expert
// count, each delivered (H2D, all-gather) for its slice of the expert computation, in the forward,
// in the recompute and in the backward, with its own gradient reduce-scatter and D2H; the
// decoder's other parameters stay one unit, held through the decoder. configure_baseline() picks
// the fewest units that fit (1 keeps the decoder whole, the wrapping of every recorded run).
//
// A baseline that does not fit answers out-of-memory with where (GPU or host NUMA node, the phase
// or the item) and the numbers, never a step time. Units: bytes, seconds. Pure functions of their
// arguments; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/memory.h"
#include "costmodel/params.h"
#include "costmodel/workload.h"
#include "planner/lowering/step_graph.h"
#include "traces/trace.h"

namespace oom {

// kMegatronLm and kKtFt are modelled apart (planner/lowering/baselines_megatron.h: TP/SP, EP, DP, CPU
// optimizer offload, full recomputation; planner/lowering/baselines_ktft.h: routed experts on the CPU with
// AMX, the rest through FSDP2); run_baseline() and configure_baseline() hand them over there.
enum class BaselineSystem { kFsdp2Offload, kZeroOffload, kMegaTrain, kMegatronLm, kKtFt };

// "fsdp2-offload", "zero-offload", "megatrain", "megatron-lm", "kt-ft" (the names of recorded
// measurements' "system").
std::string_view baseline_system_name(BaselineSystem s);
// The system of a name, or nullopt for an unknown name.
std::optional<BaselineSystem> baseline_system_from_name(std::string_view name);
// The offload systems a study sets against by default, in the order tables list them.
std::vector<BaselineSystem> all_baseline_systems();
// Every system a study may name: all_baseline_systems(), Megatron-LM and KT-FT.
std::vector<BaselineSystem> known_baseline_systems();

// How a system runs a step, as the lowering and the memory estimate read it.
struct BaselineTraits {
  bool sharded_params = true;       // each rank copies 1/P of a decoder and all-gathers the rest
  Bytes h2d_bytes_per_param = 2;    // bytes per parameter copied host-to-device
  Bytes grad_bytes_per_param = 2;   // gradient element on the GPU, in communication and D2H
  bool optimizer_overlaps_backward = false;  // per-layer CPU updates during backward (else after it)
  bool publishes_bf16 = false;      // a BF16 copy of the updated masters is staged for the next step
  bool accumulates_gradients = true;  // may split the per-GPU batch into micro-batches (GAS)
  Bytes host_bytes_per_param = 16;  // host state per model parameter, over all ranks together
  // The CPU optimizer's implementation: torch.optim.AdamW over the CPU shards (FSDP2) or a fused
  // CPU Adam kernel (DeepSpeed's CPUAdam, MegaTrain's update), priced apart (planner/calibration/calibration.h).
  OpKind optimizer = OpKind::kCpuAdamW;
};
BaselineTraits baseline_traits(BaselineSystem s, int gpus);

// Micro-batching of a baseline's step: `accumulation_steps` micro-batches of `micro_batch_seqs`
// sequences per GPU.
struct BaselineSetup {
  BaselineSystem system = BaselineSystem::kFsdp2Offload;
  std::int64_t micro_batch_seqs = 1;
  int accumulation_steps = 1;
  // Units a MoE decoder's routed experts are wrapped in (a divisor of the experts; sharded
  // systems only): 1, the whole decoder is one unit.
  int expert_units = 1;
};

// The parameters of one decoder's units under `expert_units`: the unit delivered for the whole
// decoder (all of it, or its non-expert parameters when the experts form units of their own) and
// one expert unit (0 when the experts are not apart).
struct DecoderUnits {
  ParamCount outer = 0;
  ParamCount expert_unit = 0;
  int expert_units = 0;  // 0 when the experts are not apart
};
DecoderUnits decoder_units(const LayerParams& layer, int expert_units);
// The expert-unit counts a system may use on a model, fewest first: {1}, or for a sharded system on
// a MoE model every divisor of the expert count.
std::vector<int> expert_unit_options(BaselineSystem s, const ModelSpec& m, int gpus);

// Static memory of a setup: the Eq. 2 GPU peak with where it peaks, and host bytes per NUMA node.
struct BaselineMemory {
  Bytes gpu_peak_bytes = 0;
  Bytes window_bytes = 0;   // the unsharded BF16 weight slots (two per window: decoders, expert units)
  Bytes staging_bytes = 0;  // the copied shards' staging
  std::string gpu_peak_at;             // e.g. "decoder 3 (full_attention) backward"
  std::vector<Bytes> host_bytes_per_numa;
  std::vector<Bytes> host_budget_per_numa;
};
BaselineMemory baseline_static_memory(const BaselineSetup& setup, const WorkloadContext& ctx,
                                      const MemoryConstants& constants = {});
// MegaTrain's pinned host buffers on each of `gpus` ranks (its public code, DLYuanGod/MegaTrain
// infinity/model/mp_worker.py and cpu_master.py): `num_grad_slabs` (12 by default,
// infinity/config/training.py) BF16 gradient slabs of the largest decoder's parameters and one
// each of the head's and the embedding's, all `pin_memory=True`, so each held at the power of two
// above its bytes (pinned_host_block_bytes); several GPUs read the shared BF16 layer copies
// directly (registered with cudaHostRegister, no staging), one GPU reads each layer's own pinned
// copy (rounded alike) through two pinned staging buffers.
inline constexpr int kMegaTrainGradSlabs = 12;
Bytes megatrain_pinned_buffer_bytes(const ModelParams& params, int gpus);
// What pinning adds to FSDP2's host state on each of `gpus` ranks, beyond its 16 B/param.
// CPUOffloadPolicy (pin_memory=True, its default) pins each parameter's padded FP32 shard
// (torch/distributed/fsdp/_fully_shard/_fsdp_param.py: `padded_sharded_param.pin_memory()`), and
// each reduced FP32 gradient shard reaches the host through `.to("cpu", non_blocking=True)`
// (_fsdp_collectives.py foreach_reduce, for the first micro-batch and without accumulation), which
// allocates it pinned (ATen's _to_copy, `pin_out`); the caching host allocator holds every pinned
// block at the next power of two (pinned_host_block_bytes). Counted for the routed experts (most
// of an MoE model's parameters): Qwen3.5-122B-A10B's [1024, 3072] experts pin 4/3 of their bytes,
// Qwen3.6-35B-A3B's [512, 2048] none more.
Bytes fsdp2_pinned_rounding_bytes(const ModelSpec& m, int gpus);

// Out-of-memory: where and by how much.
struct OutOfMemory {
  std::string space;  // "gpu" or "host"
  int device = 0;     // GPU rank or NUMA node
  std::string where;  // the phase (GPU) or the NUMA node's largest item (host)
  Bytes needed_bytes = 0;
  Bytes available_bytes = 0;
  // A host NUMA node's name on the hardware ("NUMA node 1", "node 3 NUMA node 1"); empty: by index.
  std::string device_label;
  // One line: "GPU out of memory: 91.2 GiB needed > 80.0 GiB at decoder 3 (full_attention) backward".
  std::string message() const;
};

// The host of the first node whose sockets together cannot hold `bytes` (per NUMA node) within
// `budget` (per NUMA node): a socket's overflow spills into its node's other sockets
// (costmodel/host_placement.h). `where` names what fills it.
std::optional<OutOfMemory> host_out_of_memory(const WorkloadContext& ctx, const std::vector<Bytes>& bytes,
                                              const std::vector<Bytes>& budget, const std::string& where);

// Why system `s` cannot run the workload: every baseline system but FSDP2 runs whole sequences
// per GPU. FSDP2 splits them with context parallelism (ring attention over each sequence's GPUs,
// as PyTorch's context_parallel beside fully_shard does; planner/lowering/lowering_baselines.cc).
// Empty when it can.
std::string whole_sequences_only(BaselineSystem s, const Workload& w);

// Chooses the largest micro-batch (a divisor of the sequences per GPU; only the whole per-GPU
// batch when the system does not accumulate), and at it the fewest expert units
// (expert_unit_options()), whose static GPU peak fits the workload's GPU budget and whose host
// bytes fit every NUMA node's share of the host budget. Returns the setup, or the
// out-of-memory that stops it: the host (first NUMA node over budget) when some micro-batch fitted
// the GPU, else the GPU at the smallest micro-batch allowed. Throws InputError naming
// "global_batch" for a workload with fewer sequences than GPUs, except for FSDP2 (the others run
// whole sequences per GPU; FSDP2 splits each over its GPUs with context parallelism).
struct BaselineFit {
  std::optional<BaselineSetup> setup;
  std::optional<OutOfMemory> oom;
};
BaselineFit configure_baseline(BaselineSystem s, const WorkloadContext& ctx, const MemoryConstants& constants = {});

// Lowers one step of the setup for every rank (planner/lowering/lowering_baselines.cc). The graph uses the
// same resources, operator kinds and memory events as lower(), so every StepEngine runs it; it
// satisfies check_step_graph().
StepGraph lower_baseline(const BaselineSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options = {});

// The StepGraph of one step of system `s` as configure_baseline() sets it up, or the
// out-of-memory that stops it. Megatron-LM and KT-FT are lowered apart (run_baseline()): InputError.
struct BaselineGraph {
  std::optional<BaselineSetup> setup;
  std::optional<OutOfMemory> oom;
  StepGraph graph;
};
// `symmetric_nodes`: one node's stages when the nodes are alike (LoweringOptions::symmetric_nodes;
// for the analytic engine only).
BaselineGraph baseline_step_graph(BaselineSystem s, const WorkloadContext& ctx, const MemoryConstants& constants = {},
                                  bool symmetric_nodes = false);

}  // namespace oom
