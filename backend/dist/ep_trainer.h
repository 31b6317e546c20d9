// EpTrainer: one rank's share of a multi-rank training step (expert parallelism and data
// parallelism over a Communicator), checked against the single-process PlainTrainer.
//
// The global batch [B, S] is split by sequences: rank r trains rows [r·B/P, (r+1)·B/P) (B must be a
// multiple of P). Each rank's loss is its local token mean scaled by 1/P, so the sum over ranks of
// the gradients equals the gradient of the global mean loss the reference computes.
//
// Parameters:
//   replicated  every block's non-expert weights (embeddings, norms, attention/GDN, router, shared
//               expert, dense MLP) live on every rank as one flat FP32 buffer per block; their
//               gradients are summed over ranks with one all-reduce per block. Their FP32 masters
//               and Adam moments live in host memory, as the modeled system keeps them: the
//               gradient goes to the host, the CPU AdamW updates the host master, and the new
//               weights go back to the device's working copy (on a CPU device the working copy is
//               the master itself). Delivery kFull: every rank updates the whole buffer. Delivery
//               kShard: rank r keeps master and moments only for its 1/P slice, updates that slice
//               and the ranks all-gather the updated slices (the same arithmetic, 1/P of the
//               optimizer state per rank).
//   experts     with expert_parallel, rank r owns experts [r·E/P, (r+1)·E/P) of every layer (E must
//               be a multiple of P). Tokens go to the owner and back by all-to-all with uneven
//               splits, once per routing chunk of moe_chunk_tokens local tokens (0 = one chunk). The
//               owner's expert gradients are complete after backward (every token that used the
//               expert came to it), so they are not reduced. Resident shards (resident_experts) stay
//               on the compute device with their moments and are updated there by device AdamW;
//               streamed shards live in host memory (master and moments), are copied to the device
//               for the step and released after it, and are updated by the CPU AdamW on the host.
//               Without expert_parallel every rank holds all experts, computes them locally, and
//               their gradients are all-reduced like the rest.
//
// Host updates (replicated buffers and streamed shards) go through at most cpu_grad_slots host
// gradient buffers: a gradient is copied into a free slot, the CPU AdamW runs on a worker thread
// while the next gradient is copied, and a slot is reused only once its update finished. The bound
// holds with clipping too: the global norm is known before the first host update starts.
//
// Per layer, resident_layers (when set) decides which decoders' shards are resident; the others
// are streamed as above.
//
// Step schedule: forward layer by layer, keeping every decoder's input. In a MoE-retained decoder
// (every decoder unless moe_retained_layers says otherwise) the token mixing (attention or GDN) runs
// without autograd while its MoE part keeps its autograd graph, so the dispatch all-to-alls are not
// repeated; backward backpropagates the MoE graph (its all-to-alls run again in reverse), then
// replays the token mixing from the kept input with autograd and backpropagates it. A decoder that
// is not retained runs whole without autograd in forward and is replayed whole (mixing, routing,
// dispatch and return all-to-alls) from its kept input in backward. Routing is a deterministic
// function of the input, so the replay sends the same rows. Gradient clipping uses the global norm:
// replicated gradients (identical on all ranks after the all-reduce) count once, expert shards are
// summed over ranks. FP32 on CPU agrees with PlainTrainer within float rounding (tests: 1e-5).
// Not thread-safe; every rank must call step() with the same global batch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "backend/dist/process_group.h"
#include "backend/runtime.h"
#include "backend/state.h"

namespace oom::backend::dist {

enum class Delivery { kFull, kShard };

struct EpConfig {
  TrainerConfig trainer;
  Delivery delivery = Delivery::kFull;
  bool expert_parallel = true;
  bool resident_experts = true;
  std::int64_t moe_chunk_tokens = 0;  // local tokens per dispatch; 0 = all local tokens at once
  // Per decoder layer, from a Plan (resident_layers, moe_retained_layers). Unset: every layer's
  // shard follows resident_experts, and every layer is MoE-retained.
  std::optional<std::vector<int>> resident_layers;
  std::optional<std::vector<int>> moe_retained_layers;
  int cpu_grad_slots = 2;  // host gradient buffers in flight (Plan cpu_grad_slots), ≥ 1
};

// Rows each rank sent to each rank in one dispatch all-to-all of the last step (layer, chunk order).
struct DispatchRecord {
  int layer = 0;
  int chunk = 0;
  std::vector<std::int64_t> send_rows;  // [P] rows this rank sent to each rank
};

class EpTrainer {
 public:
  // Copies the masters, Adam moments and step of `init` (a fresh or a resumed state). Throws InputError when the batch or the
  // experts cannot be divided over the ranks (checked in step() for the batch).
  EpTrainer(const HostState& init, EpConfig config, Communicator& comm, at::Device device = at::kCPU);
  ~EpTrainer();
  EpTrainer(const EpTrainer&) = delete;
  EpTrainer& operator=(const EpTrainer&) = delete;

  // One optimizer step on the global batch tokens/targets int64 [B, S]; returns the global mean
  // loss (and global gradient norm with clipping), identical on every rank. Collective.
  StepStats step(const at::Tensor& tokens, const at::Tensor& targets);
  // The learning rate of the following steps (the same on every rank).
  void set_lr(double lr);

  // Every block's full weights in layout order (experts gathered from their owners), as one flat
  // FP32 CPU tensor per block like PlainTrainer::flat_params. Collective.
  std::vector<at::Tensor> gather_flat_params();

  // The last step's gradients (summed over ranks, before clipping) in the same layout, as one flat
  // FP32 CPU tensor per block: the gradient the plain trainer's autograd gives. Collective.
  std::vector<at::Tensor> gather_flat_grads();

  // Writes the whole training state into `out` (same model): masters, both Adam moments (shards
  // and slices gathered from their owners) and the step; republishes its working copies. With it a
  // checkpoint of a multi-rank run is the same file as a single-process one. Collective.
  void export_state(HostState& out);

  const std::vector<DispatchRecord>& last_dispatch() const;
  // Host gradient buffers allocated so far (≤ cpu_grad_slots) and their bytes.
  int host_grad_slots_used() const;
  std::int64_t host_grad_slot_bytes() const;
  // Bytes of expert weights held on the compute device between steps (resident shards only).
  std::int64_t device_expert_bytes_between_steps() const;
  std::int64_t steps() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace oom::backend::dist
