// KT-FT: configuration, static memory and lowering (its CPU expert pricing and run:
// planner/engine/baseline_run.h) (planner/lowering/baselines_ktft.h).
#include "planner/lowering/baselines_ktft.h"

#include <algorithm>

#include <fmt/format.h>

#include "costmodel/flops.h"
#include "costmodel/input_error.h"
#include "costmodel/params.h"
#include "costmodel/traffic.h"
#include "planner/lowering/graph_size_estimate.h"
#include "planner/lowering/lowering.h"
#include "planner/lowering/lowering_toolkit.h"

namespace oom {
namespace {

constexpr Bytes kDenseHostBytesPerParam = 4 * kFp32Bytes;                             // FSDP2: FP32 param, grad, moments
constexpr Bytes kExpertHostBytesPerParam = kBf16Bytes + kFp32Bytes + kCanonicalBytesPerParam;  // 18

ParamCount dense_params(const LayerParams& l) { return l.common(); }

}  // namespace

BaselineMemory ktft_static_memory(const BaselineSetup& setup, const WorkloadContext& ctx, const MemoryConstants& k) {
  const ModelSpec& m = ctx.model;
  const HardwareSpec& hw = ctx.hardware;
  const int P = ctx.workload.gpus;
  const std::int64_t S = ctx.workload.seq_len, b = setup.micro_batch_seqs;
  const ModelParams params = model_params(m);
  ParamCount largest = std::max(params.embedding, params.lm_head + params.final_norm);
  for (const auto& l : params.layers) largest = std::max(largest, dense_params(l));
  BaselineMemory out;
  const Bytes window = 2 * working_weight_bytes(largest) + (P > 1 ? 2 * kFp32Bytes * ((largest + P - 1) / P) : 0);
  const Bytes keep = boundary_bytes(m.layers, b, S, m.hidden);
  Bytes work = 0;
  for (int l = 0; l < m.layers; ++l) {
    // Input, output and running gradient, the mixing activations, the hidden states sent to the
    // CPU experts and their outputs, the decoder's dense FP32 gradient.
    // With a mixing core's backward buffers, attention or GDN (held over the decoder's backward).
    // Rank 0 (every rank's experts run through it) also holds the other ranks' gathered hidden
    // states and their expert outputs, 2 (P − 1) boundaries more.
    const Bytes w = (5 + 2 * (P - 1)) * boundary_bytes(1, b, S, m.hidden) + mixing_activation_bytes(m, l, b, S) +
                    mixing_backward_total_bytes(m, l, b, S) + kFp32Bytes * dense_params(params.layers[static_cast<std::size_t>(l)]);
    if (w > work) {
      work = w;
      out.gpu_peak_at = fmt::format("decoder {} ({}) backward, micro-batch of {} sequences", l,
                                    layer_kind_name(m.layer_kinds[static_cast<std::size_t>(l)]), b);
    }
  }
  const Bytes loss = 2 * boundary_bytes(1, b, S, m.hidden) + logits_workspace_bytes(m, std::min(k.loss_chunk_tokens, b * S));
  if (loss > work) {
    work = loss;
    out.gpu_peak_at = fmt::format("loss (vocabulary projection), micro-batch of {} sequences", b);
  }
  out.gpu_peak_bytes = eq2_gpu_peak(k.gpu_fixed_bytes, 0, keep, window + work, k.gpu_headroom_fraction).total();
  const ParamCount experts = params.layer_sum().routed_experts;
  const ParamCount dense = params.total() - experts;
  const std::vector<int> ranks_on = hw.ranks_per_numa(P);
  for (std::size_t n = 0; n < ranks_on.size(); ++n) {
    const Bytes r = ranks_on[n];
    Bytes bytes = 0;
    if (r > 0) {
      bytes = (kDenseHostBytesPerParam * dense + kExpertHostBytesPerParam * experts) * r / P;
      bytes += r * (2 * kFp32Bytes * ((largest + P - 1) / P) + 2 * boundary_bytes(1, b, S, m.hidden) + k.host_process_bytes);
    }
    out.host_bytes_per_numa.push_back(bytes);
  }
  out.host_budget_per_numa = ctx.host_budget_bytes_per_numa();
  return out;
}

BaselineFit configure_ktft(const WorkloadContext& ctx, const MemoryConstants& k) {
  const std::int64_t seqs = ctx.workload.seqs_per_gpu();
  const Bytes gpu_budget = ctx.gpu_budget_bytes();
  BaselineFit fit;
  std::optional<OutOfMemory> gpu_oom;
  for (std::int64_t mb = seqs; mb >= 1; --mb) {
    if (seqs % mb != 0) continue;
    const BaselineSetup setup{BaselineSystem::kKtFt, mb, static_cast<int>(seqs / mb)};
    const BaselineMemory mem = ktft_static_memory(setup, ctx, k);
    if (mem.gpu_peak_bytes > gpu_budget) {
      gpu_oom = OutOfMemory{"gpu", 0, mem.gpu_peak_at, mem.gpu_peak_bytes, gpu_budget, ""};
      continue;
    }
    // The state dominates and does not shrink with the micro-batch.
    if (auto oom = host_out_of_memory(ctx, mem.host_bytes_per_numa, mem.host_budget_per_numa,
                                      fmt::format("dense FSDP2 state ({} B/param) and CPU expert banks ({} B/param)",
                                                  kDenseHostBytesPerParam, kExpertHostBytesPerParam))) {
      fit.oom = std::move(oom);
      return fit;
    }
    fit.setup = setup;
    return fit;
  }
  fit.oom = gpu_oom;
  return fit;
}

namespace {

using PerRank = std::vector<StageId>;

class KtFtLowering : lowering::RankedBuilder {
 public:
  KtFtLowering(const BaselineSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options)
      : RankedBuilder(ctx, options, setup.micro_batch_seqs, ctx.workload.seq_len, ctx.workload.gpus), s_(setup), params_(model_params(ctx.model)) {
    last_.assign(static_cast<std::size_t>(P_), -1);
  }

  StepGraph run() {
    const BaselineMemory mem = ktft_static_memory(s_, ctx_, k_);
    StepGraph& g = b_.graph();
    ParamCount largest = 0;
    for (const auto& l : params_.layers) largest = std::max(largest, dense_params(l));
    largest = std::max({largest, params_.embedding, params_.lm_head + params_.final_norm});
    for (auto& x : g.gpu_base_bytes) {
      x = k_.gpu_fixed_bytes + 2 * working_weight_bytes(largest) + (P_ > 1 ? 2 * kFp32Bytes * ((largest + P_ - 1) / P_) : 0);
    }
    for (std::size_t n = 0; n < g.numa_base_bytes.size() && n < mem.host_bytes_per_numa.size(); ++n) {
      g.numa_base_bytes[n] = mem.host_bytes_per_numa[n];
    }
    g.gpu_headroom_fraction = k_.gpu_headroom_fraction;
    for (micro_ = 0; micro_ < s_.accumulation_steps; ++micro_) {
      for (int l = 0; l < layers_; ++l) decoder(l, Phase::kForward);
      head();
      for (int l = layers_ - 1; l >= 0; --l) {
        decoder(l, Phase::kRecompute);
        decoder(l, Phase::kBackward);
      }
    }
    optimizer();
    return b_.take();
  }

 private:
  // One stage per rank on `res(r)`, after `after` (the data it needs) and the rank's previous
  // stage of the chain when `chain`.
  template <typename Res>
  PerRank each(const StageWhat& what, OpKind op, Phase phase, int layer, Res res, Flops flops, Bytes bytes, ParamCount params,
               const OpShape& shape, const PerRank& after) {
    return each_rank([&](int r) {
      Stage st = make(what, op, phase, res(r), r, layer);
      st.flops = flops;
      st.bytes = bytes;
      st.params = params;
      st.shape = shape;
      dep(st, after, r);
      return st;
    });
  }
  // One stage of rank 0 on `res`, after `after` (any rank's stages).
  StageId one(const StageWhat& what, OpKind op, Phase phase, int layer, ResourceId res, Flops flops, Bytes bytes, ParamCount params,
              const OpShape& shape, const std::vector<StageId>& after) {
    Stage st = make(what, op, phase, res, 0, layer);
    st.flops = flops;
    st.bytes = bytes;
    st.params = params;
    st.shape = shape;
    for (const StageId u : after) {
      if (u >= 0 && std::find(st.deps.begin(), st.deps.end(), u) == st.deps.end()) st.deps.push_back(u);
    }
    return b_.add(std::move(st));
  }
  void rank0_mem(StageId at, Bytes bytes, bool at_end) {
    b_.graph().stages[static_cast<std::size_t>(at)].memory.push_back({MemorySpace::kGpu, 0, bytes, at_end});
  }
  PerRank gpu(const StageWhat& what, OpKind op, Phase phase, int layer, Flops flops, const OpShape& shape, Bytes bytes = 0) {
    last_ = each(what, op, phase, layer, [&](int r) { return rr(r).compute; }, flops, bytes, 0, shape, last_);
    return last_;
  }
  PerRank collective(const StageWhat& what, OpKind op, Phase phase, int layer, Bytes bytes, const PerRank& inputs) {
    return collective_over(lowering::RankGroups{P_, P_}, what, op, phase, layer, bytes, inputs);
  }

  // The FSDP2 delivery of a dense parameter group: the rank's FP32 shard, then the BF16 all-gather.
  PerRank deliver(Phase phase, int layer, ParamCount params, StagePart part = StagePart::kWeights) {
    PerRank ready = each(what(part, StageOp::kH2d), OpKind::kH2d, phase, layer, [&](int r) { return rr(r).h2d; }, 0,
                         kFp32Bytes * (params / P_), 0, {}, slot_free_[uses_ % 2]);
    if (P_ > 1) ready = collective(what(part, StageOp::kAllGather), OpKind::kAllGather, phase, layer, working_weight_bytes(params - params / P_), ready);
    return ready;
  }

  void decoder(int l, Phase phase) {
    const LayerKind kind = m_.layer_kinds[static_cast<std::size_t>(l)];
    const bool attention = kind != LayerKind::kLinearAttention;
    const bool backward = phase == Phase::kBackward;
    const ParamCount dense = dense_params(params_.layers[static_cast<std::size_t>(l)]);
    const LayerFlops f = layer_flops(m_, l, seqs_, S_);
    const int slot = uses_ % 2;
    const PerRank ready = deliver(phase, l, dense);
    ++uses_;
    // Compute waits for its weights and for the rank's previous compute.
    PerRank joined = each(what(StagePart::kWeights, StageOp::kReady), OpKind::kSync, phase, l, [&](int r) { return rr(r).compute; }, 0, 0, 0, {}, ready);
    for (int r = 0; r < P_; ++r) {
      Stage& st = b_.graph().stages[static_cast<std::size_t>(joined[static_cast<std::size_t>(r)])];
      dep(st, last_, r);
    }
    last_ = joined;
    OpShape proj;
    proj.tokens = tokens();
    proj.k = m_.hidden;
    OpShape core;
    core.seqs = seqs_;
    core.seq_len = S_;
    core.tokens = tokens();
    if (attention) {
      const AttentionSpec& a = m_.attention(kind);
      core.heads = a.heads;
      core.head_dim = a.head_dim;
      core.window = a.window_tokens;
    } else {
      core.heads = m_.gdn.value_heads;
      core.head_dim = m_.gdn.value_head_dim;
    }
    OpShape experts;
    experts.tokens = tokens() * m_.moe.top_k;
    experts.k = m_.hidden;
    experts.experts = m_.moe.experts;
    const double ratio = backward ? kMatmulBackwardRatio : 1.0;
    const double core_ratio = backward ? (attention ? kAttentionBackwardRatio : kGdnBackwardRatio) : 1.0;
    const Bytes act = mixing_activation_bytes(m_, l, seqs_, S_) + 2 * boundary();
    const auto traffic = [&](Bytes forward) { return (backward ? kMemoryBackwardRatio : 1) * forward; };
    auto mixing = [&] {
      const PerRank p = gpu(what(attention ? StagePart::kAttention : StagePart::kGdn, backward ? StageOp::kProjBwd : StageOp::kProj), OpKind::kGemm, phase, l,
                            ratio * f.mixing_projection, proj, traffic(mixing_hbm_bytes(m_, l, tokens())));
      gpu(what(attention ? StagePart::kAttention : StagePart::kGdn, backward ? StageOp::kCoreBwd : StageOp::kCore), attention ? OpKind::kAttention : OpKind::kGdn,
          phase, l, core_ratio * f.mixing_core.total(), core, mixing_core_hbm_bytes(m_, l, seqs_, S_, backward));
      return p;
    };
    auto moe = [&] {
      gpu(what(StagePart::kMoe, backward ? StageOp::kRouterSharedBwd : StageOp::kRouterShared), OpKind::kGemm, phase, l,
          ratio * (f.moe.router + f.moe.shared_expert + f.moe.dense_mlp), proj, traffic(moe_hbm_bytes(m_, l, tokens()).pre));
      if (!m_.moe_layer(l)) return;  // a dense layer: no experts on the host
      // Rank 0 owns the experts: every rank's hidden states (or their gradient) gathered to it, to
      // the host, the experts of all of them on the CPU, back, and scattered to their ranks.
      const Bytes others = boundary() * (P_ - 1);
      PerRank in = last_;
      if (P_ > 1) {
        in = collective(what(StagePart::kExperts, StageOp::kDispatch), OpKind::kAllGather, phase, l, others, last_);
        rank0_mem(in[0], 2 * others, false);  // the gathered inputs and, later, the outputs to scatter
      }
      const StageId out = one(what(StagePart::kExperts, backward ? StageOp::kGradD2h : StageOp::kInputD2h), OpKind::kD2h, phase, l, rr(0).d2h, 0,
                              boundary() * P_, 0, {}, in);
      OpShape all = experts;
      all.tokens *= P_;
      const StageId cpu = one(what(StagePart::kExperts, backward ? StageOp::kCpuBwd : StageOp::kCpu), OpKind::kExpertGemm, phase, l, rr(0).cpu,
                              ratio * f.moe.routed_experts * P_, 0, params_.layers[static_cast<std::size_t>(l)].routed_experts, all, {out});
      const StageId back = one(what(StagePart::kExperts, backward ? StageOp::kGradH2d : StageOp::kOutputH2d), OpKind::kH2d, phase, l, rr(0).h2d, 0,
                               boundary() * P_, 0, {}, {cpu});
      last_.assign(static_cast<std::size_t>(P_), back);
      if (P_ > 1) {
        last_ = collective(what(StagePart::kExperts, StageOp::kReturn), OpKind::kAllGather, phase, l, others, last_);
        rank0_mem(last_[0], -2 * others, true);
      }
      if (backward) expert_grads_.push_back(cpu);
    };
    PerRank first;
    if (backward) {
      moe();
      first = last_;
      mixing();
    } else {
      first = mixing();
      moe();
    }
    if (phase == Phase::kForward) {
      gpu_mem(first, boundary() + act, false);  // the kept input and the decoder's activations
      gpu_mem(last_, -act, true);
    } else if (phase == Phase::kRecompute) {
      gpu_mem(first, act, false);
    } else {
      // The dense FP32 gradient, and a mixing core's backward buffers (attention or GDN).
      const Bytes core_grads = mixing_backward_total_bytes(m_, l, seqs_, S_);
      gpu_mem(first, kFp32Bytes * dense + core_grads, false);
      gpu_mem(last_, -(act + boundary() + core_grads), true);
      PerRank grads = last_;
      if (P_ > 1) grads = collective(what(StagePart::kGrads, StageOp::kReduceScatter), OpKind::kReduceScatter, phase, l, kFp32Bytes * dense * (P_ - 1) / P_, grads);
      const PerRank d2h = each(what(StagePart::kGrads, StageOp::kD2h), OpKind::kD2h, phase, l, [&](int r) { return rr(r).d2h; }, 0, kFp32Bytes * (dense / P_), 0,
                               {}, grads);
      gpu_mem(d2h, -kFp32Bytes * dense, true);
      dense_grads_.push_back(d2h);
    }
    slot_free_[slot] = last_;
  }

  void head() {
    const std::int64_t T = tokens();
    const ParamCount head = params_.lm_head + params_.final_norm;
    deliver(Phase::kForward, -1, head, StagePart::kLmHead);
    ++uses_;
    const Bytes logits = logits_workspace_bytes(m_, std::min(k_.loss_chunk_tokens, T));
    const lowering::LossHead h = lowering::loss_head(m_, T);
    const PerRank fwd = gpu(what(StagePart::kLmHead, StageOp::kLoss), OpKind::kGemm, Phase::kForward, -1, h.forward_flops, h.shape, h.forward_bytes);
    gpu_workspace(fwd, logits);
    const PerRank bwd = gpu(what(StagePart::kLmHead, StageOp::kBackward), OpKind::kGemm, Phase::kBackward, -1, h.backward_flops, h.shape, h.backward_bytes);
    gpu_workspace(bwd, logits);
  }

  // After the last backward: each rank's CPU Adam over its 1/P of the dense shards; rank 0's
  // over every expert besides (it owns them: their gradients are summed in its own buffers over
  // the micro-batches, no host reduction over ranks).
  void optimizer() {
    micro_ = s_.accumulation_steps;
    const ParamCount experts = params_.layer_sum().routed_experts;
    const ParamCount dense = params_.total() - experts;
    PerRank all = each(what(StagePart::kGrads, StageOp::kDone), OpKind::kSync, Phase::kOptimizer, -1, [&](int r) { return rr(r).cpu; }, 0, 0, 0, {}, last_);
    for (int r = 0; r < P_; ++r) {
      Stage& st = b_.graph().stages[static_cast<std::size_t>(all[static_cast<std::size_t>(r)])];
      for (const auto& g : dense_grads_) dep(st, g, r);
      if (r == 0) {
        for (const StageId g : expert_grads_) {
          if (std::find(st.deps.begin(), st.deps.end(), g) == st.deps.end()) st.deps.push_back(g);
        }
      }
    }
    // FSDP2's optimizer.step(): torch.optim.AdamW over the host shards.
    const PerRank adam = each(what(StagePart::kModel, StageOp::kCpuAdamW), OpKind::kTorchCpuAdamW, Phase::kOptimizer, -1, [&](int r) { return rr(r).cpu; }, 0,
                              canonical_state_bytes(dense / P_), dense / P_, {}, all);
    Stage& owner = b_.graph().stages[static_cast<std::size_t>(adam[0])];
    owner.params += experts;
    owner.bytes = canonical_state_bytes(owner.params);
  }

  const BaselineSetup s_;
  const ModelParams params_;
  PerRank last_;
  PerRank slot_free_[2];
  int uses_ = 0;
  std::vector<PerRank> dense_grads_;
  std::vector<StageId> expert_grads_;  // rank 0's CPU expert backward stages
};

}  // namespace

StepGraph lower_ktft(const BaselineSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options) {
  OOM_ASSERT(setup.micro_batch_seqs >= 1 && setup.accumulation_steps >= 1, "a micro-batch of at least one sequence");
  check_graph_size(estimate_ktft_graph(setup, ctx, options), options, "");
  KtFtLowering l(setup, ctx, options);
  StepGraph g = l.run();
  OOM_ASSERT(check_step_graph(g, false).empty(), "KT-FT lowering produced a malformed StepGraph");
  return g;
}

double ktft_backward_core_s(const HardwareSpec& hw, std::int64_t routes, std::int64_t hidden, std::int64_t experts, ParamCount params) {
  const auto n = static_cast<double>(hw.numa.size());
  if (n == 0 || routes <= 0 || hidden <= 0 || experts <= 0 || params <= 0) return 0.0;
  const double h = static_cast<double>(hidden);
  const double i = static_cast<double>(params) / (3.0 * static_cast<double>(experts) * h);  // the experts' intermediate size
  const double cycles = static_cast<double>(routes) * (2 * h + 3 * i / n) * kKtFtDwPackCyclesPerElement +
                        static_cast<double>(params) / n * kKtFtGradClearCyclesPerParam;
  double slowest = 0;  // each socket packs and clears its own TP slice; the pass waits for the last
  for (const NumaSpec& socket : hw.numa) slowest = std::max(slowest, cycles / (socket.amx_bf16_flops_per_s / kAmxBf16FlopsPerCoreCycle));
  return slowest;
}

}  // namespace oom
