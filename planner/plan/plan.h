// Plan: how one training step is executed: expert path, residency, retention, partitions,
// O/LSE placement and boundary policy (DESIGN.md "Plan (JSON)", version 1).
//
// Plain data, produced by the planners and consumed by lowering (StepGraph) and the backend.
// plan_from_json() checks types and ranges; validate_plan() checks the plan against a model
// and workload (layer indices in range, partitions that divide, path-specific fields).
// Both throw InputError naming the file, the field and the value.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/model_spec.h"
#include "costmodel/workload.h"

namespace oom {

enum class ExpertPath { kEp, kLocal };
enum class ParamTransfer { kFull, kShard };

// Operator partitions (0 = unpartitioned).
struct SplitSpec {
  int attention_head_group = 0;      // query heads per group within each GQA group
  std::int64_t gdn_chunk_tokens = 0;  // GDN sequence chunk with FP32 state hand-off
  std::int64_t moe_chunk_tokens = 0;  // MoE token chunk after routing
  std::int64_t sub_batch_seqs = 0;    // complete sequences per sub-batch
  bool operator==(const SplitSpec&) const = default;
};

// Which decoder inputs ("boundaries") are kept where; the rest are regenerated.
struct BoundaryPolicy {
  bool host_kept_all = true;          // "all": every boundary kept on the host
  std::vector<int> host_kept;         // when not all: decoder indices kept on the host
  std::vector<int> gpu_held;          // decoder indices whose boundary stays on the GPU
  int regenerate_cap = 1;             // regenerated boundaries held on GPU at once
  bool operator==(const BoundaryPolicy&) const = default;
  // Where decoder `layer`'s input lives: on the GPU, on the host, or regenerated.
  enum class Place { kGpu, kHost, kRegenerated };
  Place place(int layer) const;
};

// FLAT's fixed-working-set schedules (reference §6; README "FLAT schedules"). Every default is
// the schedule the project ran before them, so a plan without the "flat" object is unchanged.
enum class ExpertDispatch { kStandard, kPipelinedLlep };
enum class VocabProjection { kChunked, kRingDtp };
struct FlatSchedules {
  // EP: "pipelined_llep" rebalances each dispatch round least-loaded (overloaded experts' tokens
  // spill to the least-loaded ranks, which fetch those experts' weights), caps what each source
  // sends per round at routing_chunk_tokens, and pipelines rounds (dispatch i+1 ‖ experts i).
  ExpertDispatch expert_dispatch = ExpertDispatch::kStandard;
  // "chunked": the logits of vocab_chunk_tokens tokens at a time against the whole head;
  // "ring_dtp": the head sharded over the GPUs, hidden-state blocks (or weight shards, whichever
  // moves fewer bytes) circulating around the ring, logits folded into an online log-sum-exp.
  VocabProjection vocab_projection = VocabProjection::kChunked;
  std::int64_t vocab_chunk_tokens = 1024;  // tokens per logits block; 0 = all of a GPU's tokens at once
  // SCO: every checkpoint boundary's one long-lived tensor (the decoder input) on the host,
  // prefetched one decoder ahead into a second GPU buffer during the backward.
  bool selective_checkpoint_offload = false;
  // OffloadStreamAdamW: gradients to the host, CPU AdamW and weight publication in buckets of this
  // many MiB of gradient, pipelined (D2H of bucket i+1 ‖ AdamW of i ‖ publication of i−1); 0 = one
  // update per parameter group after all its gradients arrived.
  std::int64_t optimizer_bucket_mib = 0;
  bool operator==(const FlatSchedules&) const = default;
  bool is_default() const { return *this == FlatSchedules{}; }
  // Whether Ring-DTP shards the head over `gpus` GPUs (on one GPU the projection is chunked).
  bool ring_dtp(int gpus) const { return vocab_projection == VocabProjection::kRingDtp && gpus > 1; }
  // Tokens whose logits exist at once out of a GPU's `tokens`.
  std::int64_t logits_block_tokens(std::int64_t tokens) const {
    return vocab_chunk_tokens > 0 && vocab_chunk_tokens < tokens ? vocab_chunk_tokens : tokens;
  }
};

struct Plan {
  int version = 1;
  ExpertPath path = ExpertPath::kEp;
  std::vector<int> resident_layers;      // EP: decoders whose expert shards are GPU-resident (R)
  std::vector<int> moe_retained_layers;  // EP: decoders whose MoE backward tensors stay on GPU (K)
  std::int64_t routing_chunk_tokens = 65536;
  // EP: GPUs per expert-parallel group (consecutive ranks); 0 = every GPU of the workload, one
  // group. With G groups every expert shard has G replicas, one per group: its optimizer state is
  // sharded over them (each replica's host updates 1/G), its weights reach each replica as 1/G
  // from its host plus an all-gather over the replicas, and its gradient is reduce-scattered over
  // them before the D2H. A resident shard stays on every replica: its gradient is reduce-scattered
  // over them, each replica's GPU AdamW updates its 1/G slice (holding that slice's FP32 state), and
  // the updated BF16 slices are all-gathered over the replicas. Written only when non-zero.
  int ep_group_gpus = 0;
  // EP: GPUs each sequence is split over (context parallelism: consecutive ranks, each holding an
  // equal piece of the sequence); 0 = whole sequences per GPU. It must be the workload's
  // gpus / global_batch when the workload has fewer sequences than GPUs. Attention runs as ring
  // attention over the group: each piece's K/V (the compressed latent under MLA) passes around
  // the group beside the core, and in backward the K/V again and their gradients back; Gated
  // DeltaNet passes each piece's recurrent state along the group and corrects the pieces. Written
  // only when non-zero.
  int context_parallel_gpus = 0;
  ParamTransfer param_transfer = ParamTransfer::kFull;
  std::int64_t transfer_chunk_mib = 64;
  int cpu_grad_slots = 2;
  SplitSpec split;
  bool keep_attention_results = false;  // O/LSE kept on the host
  BoundaryPolicy boundaries;
  FlatSchedules flat;                   // optional "flat" object; written only when not default
  std::string notes;

  bool is_resident(int layer) const;
  bool is_moe_retained(int layer) const;
  // Over `gpus` GPUs: the GPUs of one EP group, and the groups (replicas of each expert shard).
  // The Local path and ep_group_gpus = 0 are one group of every GPU.
  int ep_group(int gpus) const {
    return path == ExpertPath::kEp && ep_group_gpus > 0 && ep_group_gpus < gpus ? ep_group_gpus : gpus;
  }
  int ep_replicas(int gpus) const { return gpus / std::max(1, ep_group(gpus)); }
  int context_parallel() const { return std::max(1, context_parallel_gpus); }  // GPUs per sequence
  bool operator==(const Plan&) const = default;
};

std::string_view path_name(ExpertPath p);  // "ep" | "local"

// Parses the JSON object: field types, ranges and enum values. Unknown fields are rejected.
// `path` is the object's field path inside the file ("plan" inside a record), for messages.
Plan plan_from_json(const nlohmann::json& j, const std::string& file, const std::string& path = "");
nlohmann::json plan_to_json(const Plan& p);
Plan load_plan(const std::string& path);

// Checks the plan against the model and workload: layer indices within 0..layers−1 without
// duplicates; no field the path would ignore (EP-only fields empty and routing_chunk_tokens at its
// default on the Local path; shard delivery, split.moe_chunk_tokens and split.sub_batch_seqs
// refused on the EP path); an EP group that divides the GPUs and whose GPUs split the experts
// evenly; a head group that divides the query heads
// of each KV group of every attention kind; a GDN chunk that is either part of one sequence or a
// whole number of sequences; a MoE chunk within the tokens per GPU; a sub-batch that divides the
// sequences per GPU; context parallelism on the ep path exactly when the workload splits its
// sequences (its gpus / global_batch). Throws InputError naming `file` and the field.
void validate_plan(const Plan& p, const ModelSpec& m, const Workload& w, const std::string& file,
                   const std::string& path = "");

// The Local path sums every rank's gradients in one node's host memory and runs whole sequences
// per GPU: its ranks must fit on one node of the hardware, each with whole sequences. Throws
// InputError naming "gpus" when the workload spans nodes, "global_batch" when it splits sequences.
void check_local_applies(const WorkloadContext& ctx);

// The schedules of `f` that apply to `p` on this model and workload (what validate_plan accepts):
// PipelinedLLEP only on the EP path over 2+ GPUs, Ring-DTP over 2+ GPUs that split the vocabulary
// evenly, SCO only when every boundary is on the host; the rest as given.
FlatSchedules applicable_flat(const FlatSchedules& f, const Plan& p, const ModelSpec& m, const Workload& w);

}  // namespace oom
