// Megatron-LM as a baseline (reference §7b): the parallelisms a user of Megatron-LM would set on
// one node, CPU optimizer offload and full recomputation, lowered to the same StepGraph as the
// other baselines (planner/lowering/baselines.h) so both engines run it.
//
// The setup, as Megatron-LM runs an MoE model on the P GPUs of one node:
//   - tensor parallelism t with sequence parallelism over the dense part (attention or GDN
//     projections and cores, router, shared expert, dense MLP, vocabulary projection): each rank
//     holds 1/t of those weights and 1/t of the tokens between sublayers; per sublayer an
//     all-gather before and a reduce-scatter after, of the layer's hidden states;
//   - expert parallelism over all P GPUs (the largest divisor of P that divides E): each rank
//     holds E/EP experts whole; tokens are dispatched and returned by all-to-all (Eq. 6);
//   - data parallelism d = P/t with the distributed optimizer: after the backward the dense
//     gradients are reduce-scattered over d ranks, each rank copies its shard's FP32 gradients to
//     the host, CPU Adam (torch.optim.AdamW, fused) updates the FP32 masters and moments there
//     (--optimizer-cpu-offload --optimizer-offload-fraction 1.0 --use-precision-aware-optimizer,
//     the flags megatron/core/optimizer/cpu_offloading/README.md gives; D2H, update and H2D one
//     after the other, --overlap-cpu-optimizer-d2h-h2d being off by default), the masters come
//     back as FP32 and are cast to the BF16 weights on the GPU, and the dense part is all-gathered;
//   - pipeline parallelism 1: every decoder on every rank (one node; stages would only add bubbles
//     when the weights fit, and the configuration below raises t first);
//   - full recomputation: each decoder's input stays on the GPU (1/t of it with sequence
//     parallelism); the backward recomputes the decoder, all-to-alls included;
//   - gradient accumulation over micro-batches of the rank's sequences.
// GPU memory per rank: M_0, BF16 weights and FP32 main gradients of its dense share and its
// experts, the kept decoder inputs, and the largest workset (a decoder's recompute and backward,
// or the loss: the whole micro-batch's logits, BF16 and an FP32 copy, as the unfused
// vocabulary-parallel cross entropy holds them). Host: FP32 master, moments and gradients (16 B/param) plus process memory.
// The configuration tries t = 1, 2, 4, ... (dividing P and every head count) and, for each, the
// largest micro-batch first; the first that fits the GPU and host budgets is taken. Nothing fits:
// out-of-memory with where, at the largest t and the smallest micro-batch. Units: bytes,
// seconds. Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "planner/lowering/baselines.h"

namespace oom {

struct MegatronSetup {
  int tensor_parallel = 1;
  int expert_parallel = 1;
  int data_parallel = 1;
  std::int64_t micro_batch_seqs = 1;  // sequences per micro-batch of a data-parallel rank
  int accumulation_steps = 1;
};

// Static memory of a setup, with where the GPU peaks.
BaselineMemory megatron_static_memory(const MegatronSetup& setup, const WorkloadContext& ctx,
                                      const MemoryConstants& constants = {});

struct MegatronFit {
  std::optional<MegatronSetup> setup;
  std::optional<OutOfMemory> oom;
};
MegatronFit configure_megatron(const WorkloadContext& ctx, const MemoryConstants& constants = {});

// One step of the setup for every rank; satisfies check_step_graph().
StepGraph lower_megatron(const MegatronSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options = {});

}  // namespace oom
