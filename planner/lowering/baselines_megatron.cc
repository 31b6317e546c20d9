// Megatron-LM: configuration, static memory and lowering (planner/lowering/baselines_megatron.h).
#include "planner/lowering/baselines_megatron.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

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

// Megatron-LM keeps an FP32 "main gradient" buffer beside the BF16 weights of every local
// parameter (its default without --grad-reduce-in-bf16); with the CPU optimizer offload the FP32
// masters, both moments and a copy of the gradients live on the host.
constexpr Bytes kMainGradBytesPerParam = kFp32Bytes;
constexpr Bytes kHostBytesPerParam = kCanonicalBytesPerParam + kFp32Bytes;  // 16
// The updated FP32 masters go back to the GPU's BF16 weights as FP32 (4 B/param): the hybrid
// device optimizer copies them with `gpu_param.data.copy_(cpu_fp32_param, non_blocking=True)`
// (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py, param_copy_back_gpu_hook), and
// PyTorch converts the dtype of a non-blocking host-to-device copy on the GPU, after the transfer
// (aten/src/ATen/native/cuda/Copy.cu, copy_kernel_cuda: "If non_blocking is true - type
// conversions are performed on the GPU").
constexpr Bytes kParamH2dBytesPerParam = kFp32Bytes;

// The loss's workset: Megatron's vocabulary-parallel cross entropy takes the BF16 logits of the
// whole micro-batch (each TP rank 1/t of the vocabulary) and computes on an FP32 copy of them,
// which it keeps as the softmax for the backward (megatron/core/tensor_parallel/cross_entropy.py,
// VocabParallelCrossEntropy.calculate_logits_max: `vocab_parallel_logits.float()`; the fused
// variant is off by default, --cross-entropy-loss-fusion): 6 B per logit, not chunked.
Bytes megatron_loss_bytes(const ModelSpec& m, std::int64_t tokens, int t) { return logits_workspace_bytes(m, tokens) / t; }

struct Split {
  ParamCount dense = 0;    // everything but the routed experts
  ParamCount experts = 0;  // the routed expert banks of every decoder
};
Split split_params(const ModelParams& p) {
  Split s;
  s.experts = p.layer_sum().routed_experts;
  s.dense = p.total() - s.experts;
  return s;
}

int expert_parallel_of(const WorkloadContext& ctx) {
  int ep = ctx.workload.gpus;
  while (ep > 1 && (ctx.model.moe.experts % ep != 0 || ctx.workload.gpus % ep != 0)) --ep;
  return std::max(ep, 1);
}

// Tensor parallelism must divide every head count it splits.
bool tp_divides_heads(const ModelSpec& m, int t) {
  for (int l = 0; l < m.layers; ++l) {
    const LayerKind k = m.layer_kinds[static_cast<std::size_t>(l)];
    if (k == LayerKind::kLinearAttention) {
      if (m.gdn.key_heads % t != 0 || m.gdn.value_heads % t != 0) return false;
    } else {
      const AttentionSpec& a = m.attention(k);
      if (a.heads % t != 0 || a.kv_heads % t != 0) return false;
    }
  }
  return true;
}

// Each expert-parallel rank's received load per decoder (relative to the mean; ranks of a group of
// `ep` consecutive ranks hold contiguous expert slices) under the workload's routing.
std::vector<std::vector<double>> ep_loads(const WorkloadContext& ctx, int ep) {
  std::vector<std::vector<double>> out;
  for (LlepBalance& b : ep_layer_balance(ctx.workload.routing, ctx.model.moe.experts, ctx.model.layers, ep, false)) {
    out.push_back(std::move(b.loads));
  }
  return out;
}

// Routed activations and all-to-all buffers of `tokens` tokens on a rank receiving `load` times
// the mean share.
Bytes moe_bytes_at_load(const ModelSpec& m, int layer, std::int64_t tokens, double load) {
  return moe_activation_bytes_at_load(m, layer, tokens, load) + a2a_buffer_bytes_at_load(m, layer, tokens, load);
}

ParamCount rank_params(const Split& s, const MegatronSetup& setup) {
  return s.dense / setup.tensor_parallel + s.experts / setup.expert_parallel;
}

}  // namespace

BaselineMemory megatron_static_memory(const MegatronSetup& setup, const WorkloadContext& ctx, const MemoryConstants& k) {
  const ModelSpec& m = ctx.model;
  const HardwareSpec& hw = ctx.hardware;
  const int P = ctx.workload.gpus, t = setup.tensor_parallel;
  const std::int64_t S = ctx.workload.seq_len, b = setup.micro_batch_seqs, T = b * S;
  const ModelParams params = model_params(m);
  const Split split = split_params(params);
  const ParamCount local = rank_params(split, setup);
  BaselineMemory out;
  const Bytes state = (kBf16Bytes + kMainGradBytesPerParam) * local;
  const Bytes keep = boundary_bytes(m.layers, b, S, m.hidden) / t;  // full recomputation: decoder inputs, sequence-parallel
  Bytes work = 0;
  const auto loads = ep_loads(ctx, setup.expert_parallel);
  for (int l = 0; l < m.layers; ++l) {
    // The rank receiving the largest share under skewed routing sets the peak.
    const double load = max_load(loads[static_cast<std::size_t>(l)]);
    const Bytes w = 3 * boundary_bytes(1, b, S, m.hidden)  // gathered input, output, running gradient
                    + (mixing_activation_bytes(m, l, b, S) + mixing_backward_total_bytes(m, l, b, S)) / t +
                    moe_bytes_at_load(m, l, T / t, load);
    if (w > work) {
      work = w;
      out.gpu_peak_at = fmt::format("decoder {} ({}) recompute and backward, TP {}, micro-batch of {} sequences", l,
                                    layer_kind_name(m.layer_kinds[static_cast<std::size_t>(l)]), t, b);
    }
  }
  const Bytes loss = 2 * boundary_bytes(1, b, S, m.hidden) + megatron_loss_bytes(m, T, t);
  if (loss > work) {
    work = loss;
    out.gpu_peak_at = fmt::format("loss (vocabulary-parallel projection), TP {}, micro-batch of {} sequences", t, b);
  }
  out.gpu_peak_bytes = eq2_gpu_peak(k.gpu_fixed_bytes, state, keep, work, k.gpu_headroom_fraction).total();
  const std::vector<int> ranks_on = hw.ranks_per_numa(P);
  for (std::size_t n = 0; n < ranks_on.size(); ++n) {
    const Bytes r = ranks_on[n];
    out.host_bytes_per_numa.push_back(r > 0 ? kHostBytesPerParam * params.total() * r / P + r * k.host_process_bytes : 0);
  }
  out.host_budget_per_numa = ctx.host_budget_bytes_per_numa();
  return out;
}

MegatronFit configure_megatron(const WorkloadContext& ctx, const MemoryConstants& k) {
  const int P = ctx.workload.gpus;
  const Bytes gpu_budget = ctx.gpu_budget_bytes();
  MegatronFit fit;
  std::optional<OutOfMemory> gpu_oom, host_oom;
  for (int t = 1; t <= P; t *= 2) {
    if (P % t != 0 || !tp_divides_heads(ctx.model, t)) continue;
    MegatronSetup setup;
    setup.tensor_parallel = t;
    setup.expert_parallel = expert_parallel_of(ctx);
    setup.data_parallel = P / t;
    const std::int64_t seqs = ctx.workload.global_batch / setup.data_parallel;
    for (std::int64_t mb = seqs; mb >= 1; --mb) {
      if (seqs % mb != 0) continue;
      setup.micro_batch_seqs = mb;
      setup.accumulation_steps = static_cast<int>(seqs / mb);
      const BaselineMemory mem = megatron_static_memory(setup, ctx, k);
      if (mem.gpu_peak_bytes > gpu_budget) {
        gpu_oom = OutOfMemory{"gpu", 0, mem.gpu_peak_at, mem.gpu_peak_bytes, gpu_budget, ""};
        continue;
      }
      // Host state does not shrink with t or the micro-batch: nothing else can fit.
      if (auto oom = host_out_of_memory(ctx, mem.host_bytes_per_numa, mem.host_budget_per_numa,
                                        fmt::format("CPU optimizer offload state ({} B/param: FP32 masters, moments and gradients)",
                                                    kHostBytesPerParam))) {
        fit.oom = std::move(oom);
        return fit;
      }
      fit.setup = setup;
      return fit;
    }
  }
  fit.oom = host_oom ? host_oom : gpu_oom;
  return fit;
}

namespace {

using PerRank = std::vector<StageId>;

class MegatronLowering : lowering::RankedBuilder {
 public:
  MegatronLowering(const MegatronSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options)
      : RankedBuilder(ctx, options, setup.micro_batch_seqs, ctx.workload.seq_len, ctx.workload.gpus),
        s_(setup),
        split_(split_params(model_params(ctx.model))),
        t_(setup.tensor_parallel) {
    last_.assign(static_cast<std::size_t>(P_), -1);
    loads_ = ep_loads(ctx, s_.expert_parallel);
  }

  StepGraph run() {
    const BaselineMemory mem = megatron_static_memory(s_, ctx_, k_);
    StepGraph& g = b_.graph();
    const ParamCount local = rank_params(split_, s_);
    for (auto& x : g.gpu_base_bytes) x = k_.gpu_fixed_bytes + (kBf16Bytes + kMainGradBytesPerParam) * local;
    for (std::size_t n = 0; n < g.numa_base_bytes.size() && n < mem.host_bytes_per_numa.size(); ++n) {
      g.numa_base_bytes[n] = mem.host_bytes_per_numa[n];
    }
    g.gpu_headroom_fraction = k_.gpu_headroom_fraction;
    for (micro_ = 0; micro_ < s_.accumulation_steps; ++micro_) {
      embedding(Phase::kForward);
      for (int l = 0; l < layers_; ++l) decoder_forward(l);
      head();
      for (int l = layers_ - 1; l >= 0; --l) decoder_backward(l);
      embedding(Phase::kBackward);
    }
    optimizer();
    return b_.take();
  }

 private:
  PerRank compute(const StageWhat& what, OpKind op, Phase phase, int layer, Flops flops, const OpShape& shape,
                  Bytes bytes = 0) {
    last_ = compute_stage(what, op, phase, layer, flops, bytes, shape, {last_});
    return last_;
  }

  // A collective of each rank with the members of its group (`group_size` consecutive ranks, or
  // every `stride`-th rank for the data-parallel group).
  PerRank collective(const StageWhat& what, OpKind op, Phase phase, int layer, Bytes bytes, const PerRank& inputs,
                     bool data_parallel_group) {
    const lowering::RankGroups groups = data_parallel_group      ? lowering::RankGroups{P_, t_, true}
                                        : op == OpKind::kAllToAll ? lowering::RankGroups{P_, s_.expert_parallel, false}
                                                                  : lowering::RankGroups{P_, t_, false};
    last_ = collective_over(groups, what, op, phase, layer, bytes, inputs);
    return last_;
  }

  // Sequence parallelism: gather the hidden states before a sublayer, reduce-scatter after it.
  void tp_exchange(const StageWhat& what, OpKind op, Phase phase, int layer) {
    if (t_ > 1) collective(what, op, phase, layer, boundary() * (t_ - 1) / t_, last_, false);
  }

  void sublayers(int l, Phase phase, double ratio, PerRank& first) {
    const LayerKind kind = m_.layer_kinds[static_cast<std::size_t>(l)];
    const bool attention = kind != LayerKind::kLinearAttention;
    const bool backward = phase == Phase::kBackward;
    const LayerFlops f = layer_flops(m_, l, seqs_, S_);
    // Compute operators run their backward in the backward phase; exchanges keep their names.
    const auto op = [&](StageOp o) { return backward ? backward_op(o) : o; };
    OpShape proj;
    proj.tokens = tokens();
    proj.k = m_.hidden;
    OpShape core;
    core.seqs = seqs_;
    core.seq_len = S_;
    core.tokens = tokens();
    if (attention) {
      const AttentionSpec& a = m_.attention(kind);
      core.heads = a.heads / t_;
      core.head_dim = a.head_dim;
      core.window = a.window_tokens;
    } else {
      core.heads = m_.gdn.value_heads / t_;
      core.head_dim = m_.gdn.value_head_dim;
    }
    OpShape experts;
    experts.tokens = tokens() / t_ * m_.moe.top_k;
    experts.k = m_.hidden;
    experts.experts = m_.moe.experts / s_.expert_parallel;
    const Bytes a2a = ep_a2a_bytes(m_.moe.top_k, tokens() / t_, m_.hidden, kBf16Bytes, s_.expert_parallel) / 2;
    const double core_ratio = backward ? (attention ? kAttentionBackwardRatio : kGdnBackwardRatio) : 1.0;
    // Memory-bound kernels: sequence parallelism gives each rank of the TP group 1/t of the tokens.
    const auto traffic = [&](Bytes forward) { return (backward ? kMemoryBackwardRatio : 1) * forward / t_; };
    const MoeTraffic moe_bytes = moe_hbm_bytes(m_, l, tokens());
    auto mixing = [&] {
      tp_exchange(what(StagePart::kMixing, StageOp::kAllGather), OpKind::kAllGather, phase, l);
      const PerRank p = compute(what(attention ? StagePart::kAttention : StagePart::kGdn, op(StageOp::kProj)), OpKind::kGemm, phase, l, ratio * f.mixing_projection / t_, proj,
                                traffic(mixing_hbm_bytes(m_, l, tokens())));
      if (first.empty()) first = p;
      compute(what(attention ? StagePart::kAttention : StagePart::kGdn, op(StageOp::kCore)), attention ? OpKind::kAttention : OpKind::kGdn, phase, l,
              core_ratio * f.mixing_core.total() / t_, core, mixing_core_hbm_bytes(m_, l, seqs_, S_, backward) / t_);
      tp_exchange(what(StagePart::kMixing, StageOp::kReduceScatter), OpKind::kReduceScatter, phase, l);
    };
    auto moe = [&] {
      tp_exchange(what(StagePart::kMoe, StageOp::kAllGather), OpKind::kAllGather, phase, l);
      compute(what(StagePart::kMoe, op(StageOp::kRouterShared)), OpKind::kGemm, phase, l, ratio * (f.moe.router + f.moe.shared_expert + f.moe.dense_mlp) / t_, proj,
              traffic(moe_bytes.pre + moe_bytes.combine));
      if (!m_.moe_layer(l)) {  // a dense layer: its MLP is the GEMM above
        tp_exchange(what(StagePart::kMoe, StageOp::kReduceScatter), OpKind::kReduceScatter, phase, l);
        return;
      }
      if (s_.expert_parallel > 1) skewed(collective(what(StagePart::kMoe, StageOp::kDispatch), OpKind::kAllToAll, phase, l, a2a, last_, false), l, false);
      skewed(compute(what(StagePart::kMoe, op(StageOp::kExperts)), OpKind::kExpertGemm, phase, l, ratio * f.moe.routed_experts / t_, experts,
                     traffic(moe_bytes.experts)),
             l, true);
      if (s_.expert_parallel > 1) skewed(collective(what(StagePart::kMoe, StageOp::kReturn), OpKind::kAllToAll, phase, l, a2a, last_, false), l, false);
      tp_exchange(what(StagePart::kMoe, StageOp::kReduceScatter), OpKind::kReduceScatter, phase, l);
    };
    if (backward) {
      moe();
      mixing();
    } else {
      mixing();
      moe();
    }
  }

  // Skewed routing: rank r of each expert-parallel group receives loads_[l][r mod ep] times the
  // mean share: its expert GEMMs scale with it (`compute_stage`), its all-to-alls move the larger
  // of what it sends and receives.
  void skewed(const PerRank& stages, int l, bool compute_stage) {
    const auto& load = loads_[static_cast<std::size_t>(l)];
    for (int r = 0; r < P_; ++r) {
      const double f = load[static_cast<std::size_t>(r % s_.expert_parallel)];
      if (f == 1.0) continue;
      Stage& st = b_.graph().stages[static_cast<std::size_t>(stages[static_cast<std::size_t>(r)])];
      if (compute_stage) {
        st.flops *= f;
        st.bytes = static_cast<Bytes>(static_cast<double>(st.bytes) * f);
        st.shape.tokens = static_cast<std::int64_t>(std::llround(static_cast<double>(st.shape.tokens) * f));
      } else {
        st.bytes = std::max(st.bytes, static_cast<Bytes>(static_cast<double>(st.bytes) * f));
      }
    }
  }

  // Every rank is charged the most loaded rank's MoE bytes (the GPU peak is the largest one's).
  Bytes activations(int l) const {
    return mixing_activation_bytes(m_, l, seqs_, S_) / t_ + moe_bytes_at_load(m_, l, tokens() / t_, max_load(loads_[static_cast<std::size_t>(l)]));
  }

  void decoder_forward(int l) {
    PerRank first;
    sublayers(l, Phase::kForward, 1.0, first);
    // Full recomputation: only the decoder's input (1/t of it) stays; the activations live for
    // the forward of this decoder only.
    gpu_mem(first, boundary() / t_ + activations(l), false);
    gpu_mem(last_, -activations(l), true);
  }

  void decoder_backward(int l) {
    PerRank first;
    sublayers(l, Phase::kRecompute, 1.0, first);
    gpu_mem(first, activations(l), false);
    // The mixing core backward's buffers (attention or GDN), each TP rank's 1/t of the heads, held over
    // the decoder's backward.
    const Bytes core_grads = mixing_backward_total_bytes(m_, l, seqs_, S_) / t_;
    PerRank mixing_first;  // the mixing sublayer's first backward stage
    sublayers(l, Phase::kBackward, kMatmulBackwardRatio, mixing_first);
    gpu_mem(mixing_first, core_grads, false);
    gpu_mem(last_, -(activations(l) + boundary() / t_ + core_grads), true);
  }

  void embedding(Phase phase) {
    OpShape shape;
    shape.tokens = tokens();
    const PerRank e = compute(what(StagePart::kEmbedding, phase == Phase::kForward ? StageOp::kGather : StageOp::kScatter), OpKind::kElementwise, phase, -1,
                              0, shape);
    for (int r = 0; r < P_; ++r) b_.graph().stages[static_cast<std::size_t>(e[static_cast<std::size_t>(r)])].bytes = boundary();
  }

  void head() {
    const std::int64_t T = tokens();
    const Bytes logits = megatron_loss_bytes(m_, T, t_);
    const lowering::LossHead h = lowering::loss_head(m_, T, t_);  // the vocabulary-parallel head: 1/t of it
    const PerRank fwd = compute(what(StagePart::kLmHead, StageOp::kLoss), OpKind::kGemm, Phase::kForward, -1, h.forward_flops, h.shape, h.forward_bytes);
    gpu_workspace(fwd, logits);
    const PerRank bwd = compute(what(StagePart::kLmHead, StageOp::kBackward), OpKind::kGemm, Phase::kBackward, -1, h.backward_flops, h.shape,
                                h.backward_bytes);
    gpu_workspace(bwd, logits);
  }

  // Distributed optimizer with CPU offload, after the last micro-batch's backward.
  void optimizer() {
    micro_ = s_.accumulation_steps;  // names: the step's optimizer stages
    const int d = s_.data_parallel;
    const ParamCount dense = split_.dense / t_;
    const ParamCount shard = dense / d + split_.experts / s_.expert_parallel;
    if (d > 1) collective(what(StagePart::kGrads, StageOp::kReduceScatter), OpKind::kReduceScatter, Phase::kOptimizer, -1, kMainGradBytesPerParam * dense * (d - 1) / d, last_, true);
    PerRank d2h(static_cast<std::size_t>(P_)), adam(static_cast<std::size_t>(P_)), h2d(static_cast<std::size_t>(P_));
    for (int r = 0; r < P_; ++r) {
      Stage c = make(what(StagePart::kGrads, StageOp::kD2h), OpKind::kD2h, Phase::kOptimizer, rr(r).d2h, r, -1);
      c.bytes = kMainGradBytesPerParam * shard;
      dep(c, last_, r);
      d2h[static_cast<std::size_t>(r)] = b_.add(std::move(c));
      Stage a = make(what(StagePart::kModel, StageOp::kCpuAdamW), OpKind::kCpuAdamW, Phase::kOptimizer, rr(r).cpu, r, -1);
      a.params = shard;
      a.bytes = canonical_state_bytes(shard);
      dep(a, d2h, r);
      adam[static_cast<std::size_t>(r)] = b_.add(std::move(a));
      Stage h = make(what(StagePart::kWeights, StageOp::kH2d), OpKind::kH2d, Phase::kOptimizer, rr(r).h2d, r, -1);
      h.bytes = kParamH2dBytesPerParam * shard;
      dep(h, adam, r);
      h2d[static_cast<std::size_t>(r)] = b_.add(std::move(h));
    }
    if (d > 1) collective(what(StagePart::kWeights, StageOp::kAllGather), OpKind::kAllGather, Phase::kOptimizer, -1, working_weight_bytes(dense) * (d - 1) / d, h2d, true);
  }

  const MegatronSetup s_;
  const Split split_;
  const int t_;
  PerRank last_;
  std::vector<std::vector<double>> loads_;  // per decoder: each expert-parallel position's received load
};

}  // namespace

StepGraph lower_megatron(const MegatronSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options) {
  OOM_ASSERT(setup.tensor_parallel >= 1 && setup.data_parallel * setup.tensor_parallel == ctx.workload.gpus,
             "tensor x data parallel must cover the GPUs");
  check_graph_size(estimate_megatron_graph(setup, ctx, options), options, "");
  MegatronLowering l(setup, ctx, options);
  StepGraph g = l.run();
  OOM_ASSERT(check_step_graph(g, false).empty(), "Megatron-LM lowering produced a malformed StepGraph");
  return g;
}

}  // namespace oom
