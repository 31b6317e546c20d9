// The lowering toolkit (planner/lowering/lowering_toolkit.h).
#include "planner/lowering/lowering_toolkit.h"

#include <algorithm>

#include "costmodel/traffic.h"

namespace oom::lowering {

LossHead loss_head(const ModelSpec& m, std::int64_t tokens, int vocab_shards) {
  LossHead h;
  h.shape.tokens = tokens;
  h.shape.k = m.hidden;
  h.shape.n = m.vocab / vocab_shards;
  h.forward_flops = lm_head_flops(m, tokens) / vocab_shards;
  h.backward_flops = kMatmulBackwardRatio * h.forward_flops;
  h.forward_bytes = loss_forward_hbm_bytes(m, tokens) / vocab_shards;
  h.backward_bytes = loss_backward_hbm_bytes(m, tokens) / vocab_shards;
  return h;
}

RankedBuilder::RankedBuilder(const WorkloadContext& ctx, const LoweringOptions& options, std::int64_t seqs, std::int64_t seq_len, int emit)
    : ctx_(ctx),
      m_(ctx.model),
      k_(options.memory),
      b_(ctx.workload.gpus, ctx.hardware.host_numa_count(ctx.workload.gpus)),
      P_(ctx.workload.gpus),
      S_(seq_len),
      seqs_(seqs),
      layers_(options.decoder_layers > 0 ? std::min(options.decoder_layers, ctx.model.layers) : ctx.model.layers),
      emit_(emit) {
  for (int r = 0; r < P_; ++r) r_.push_back(add_rank_resources(b_, ctx.hardware, r, P_, /*expert_grad_stream=*/false));
}

void RankedBuilder::gpu_mem(const PerRank& at, Bytes bytes, bool at_end) {
  if (bytes == 0) return;
  for (int r = 0; r < P_; ++r) {
    b_.graph().stages[static_cast<std::size_t>(at[static_cast<std::size_t>(r)])].memory.push_back({MemorySpace::kGpu, r, bytes, at_end});
  }
}

PerRank RankedBuilder::compute_stage(const StageWhat& what, OpKind op, Phase phase, int layer, Flops flops, Bytes bytes,
                                     const OpShape& shape, const std::vector<PerRank>& deps) {
  return each_rank([&](int r) {
    Stage s = make(what, op, phase, rr(r).compute, r, layer);
    s.flops = flops;
    s.bytes = bytes;
    s.shape = shape;
    for (const auto& d : deps) dep(s, d, r);
    return s;
  });
}

PerRank RankedBuilder::collective_over(const RankGroups& groups, const StageWhat& what, OpKind op, Phase phase, int layer, Bytes bytes,
                                       const PerRank& inputs) {
  return collective_stages(
      groups, emit_, ctx_.hardware.gpus_per_node, inputs,
      [&](int r) {
        Stage s = make(what, op, phase, rr(r).fabric, r, layer);
        s.bytes = bytes;
        return s;
      },
      [this](Stage s) { return b_.add(std::move(s)); });
}

}  // namespace oom::lowering
