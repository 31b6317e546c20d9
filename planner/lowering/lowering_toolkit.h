// The lowering toolkit: what the baseline lowerings (FSDP2/ZeRO/MegaTrain in lowering_baselines.cc,
// Megatron-LM in baselines_megatron.cc, KT-FT in baselines_ktft.cc) build their StepGraph with, so
// that each builder helper exists once. The plan lowering (Lowering, lowering.h) builds with the
// free functions of lowering.h (keyed_stage, add_dep_once, stages_per_rank, collective_stages,
// add_rank_resources), which these helpers call too, and prices its loss head with loss_head().
//
// RankedBuilder holds the graph builder, each rank's resources and the micro-batch being lowered;
// a lowering derives from it and adds its schedule. Every stage it makes is keyed by the current
// micro-batch (`micro_`). Units: bytes, FLOPs, tokens. Not thread-safe (one lowering per thread).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "costmodel/flops.h"
#include "costmodel/memory.h"
#include "costmodel/workload.h"
#include "planner/lowering/lowering.h"
#include "planner/lowering/step_graph.h"

namespace oom::lowering {

// The loss head's two GEMMs over `tokens` tokens against 1/`vocab_shards` of the vocabulary (a
// tensor-parallel head holds one shard): the forward (logits and loss) and its backward
// (kMatmulBackwardRatio × the forward's FLOPs), with their HBM traffic.
struct LossHead {
  OpShape shape;
  Flops forward_flops = 0, backward_flops = 0;
  Bytes forward_bytes = 0, backward_bytes = 0;
};
LossHead loss_head(const ModelSpec& m, std::int64_t tokens, int vocab_shards = 1);

class RankedBuilder {
 protected:
  // `seqs` sequences of `seq_len` tokens per micro-batch on each of the workload's GPUs; stages of
  // the ranks below `emit` only (the others take their representatives': stages_per_rank).
  RankedBuilder(const WorkloadContext& ctx, const LoweringOptions& options, std::int64_t seqs, std::int64_t seq_len, int emit);

  const RankResources& rr(int r) const { return r_[static_cast<std::size_t>(r)]; }
  std::int64_t tokens() const { return seqs_ * S_; }                           // a micro-batch's tokens per rank
  Bytes boundary() const { return boundary_bytes(1, seqs_, S_, m_.hidden); }  // its hidden states between decoders

  Stage make(const StageWhat& what, OpKind op, Phase phase, ResourceId res, int rank, int layer) const {
    return keyed_stage(what, op, phase, res, rank, layer, micro_);
  }
  static void dep(Stage& s, const PerRank& from, int r) { add_dep_once(s, from, r); }
  // Adds `bytes` of GPU memory on each rank at the start (or the end, `at_end`) of its stage in `at`.
  void gpu_mem(const PerRank& at, Bytes bytes, bool at_end);
  // `bytes` held on each rank's GPU while its stage in `at` runs (a workspace).
  void gpu_workspace(const PerRank& at, Bytes bytes) {
    gpu_mem(at, bytes, false);
    gpu_mem(at, -bytes, true);
  }

  // One stage per rank made by `make_stage(r)`: the emitted ranks' own, the others' their representatives'.
  template <class Make>
  PerRank each_rank(Make make_stage) {
    return stages_per_rank(P_, emit_, make_stage, [this](Stage s) { return b_.add(std::move(s)); });
  }
  // A stage per rank on its compute stream after `deps` (each rank's own), with its work.
  PerRank compute_stage(const StageWhat& what, OpKind op, Phase phase, int layer, Flops flops, Bytes bytes, const OpShape& shape,
                        const std::vector<PerRank>& deps);
  // A collective of `bytes` per rank on every rank's fabric port among the members `groups` names;
  // every member waits for every member's input (collective_stages).
  PerRank collective_over(const RankGroups& groups, const StageWhat& what, OpKind op, Phase phase, int layer, Bytes bytes,
                          const PerRank& inputs);

  const WorkloadContext& ctx_;
  const ModelSpec& m_;
  const MemoryConstants k_;
  StepGraphBuilder b_;
  const int P_;
  const std::int64_t S_, seqs_;
  const int layers_;
  const int emit_;
  std::vector<RankResources> r_;
  int micro_ = 0;
};

}  // namespace oom::lowering
