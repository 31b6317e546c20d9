#include "planner/engine/cost_report.h"

#include <algorithm>

#include <fmt/format.h>

#include "costmodel/flops.h"
#include "costmodel/memory.h"
#include "costmodel/params.h"

namespace oom {

Seconds StaticCost::lower_bound_s() const { return std::max({compute_s, h2d_s, d2h_s, fabric_s, cpu_update_s}); }
Seconds StaticCost::serial_s() const { return compute_s + h2d_s + d2h_s + fabric_s + cpu_update_s; }

StaticCost static_cost(const WorkloadContext& ctx, const Plan& plan) {
  const ModelSpec& m = ctx.model;
  const Workload& w = ctx.workload;
  const HardwareSpec& hw = ctx.hardware;
  const ModelParams params = model_params(m);
  const bool ep = plan.path == ExpertPath::kEp;
  const int P = w.gpus;
  const int E = plan.ep_group(P), D = plan.ep_replicas(P);  // EP groups: each shard on D replicas
  // Context parallelism: each of a sequence's C GPUs does 1/C of its work (ring attention balances
  // the core) on its piece of S / C tokens.
  const int C = ep ? plan.context_parallel() : 1;
  const double share = 1.0 / C;
  const std::int64_t B = w.seqs_per_gpu(), S = w.seq_len, N = w.tokens_per_gpu(), piece = S / C;

  StaticCost c;
  const Eq1Flops eq1 = model_forward_flops(m, B, S);
  c.eq1_linear_flops = share * eq1.linear;
  c.eq1_quadratic_flops = share * eq1.quadratic;
  const Flops head = lm_head_flops(m, N);
  c.forward_flops = share * eq1.total();
  c.backward_flops = kMatmulBackwardRatio * head;
  c.recompute_flops = head;  // the loss keeps no logits: its backward computes them again
  for (int l = 0; l < m.layers; ++l) {
    const LayerFlops f = layer_flops(m, l, B, S);
    c.backward_flops += share * f.backward();
    // Replay: a MoE-retained decoder replays only its mixing sublayer; with O/LSE kept, attention
    // replay rebuilds only the projections.
    const bool attention = m.layer_kinds[l] != LayerKind::kLinearAttention;
    const Flops mixing = f.mixing_projection + ((attention && plan.keep_attention_results) ? 0.0 : f.mixing_core.total());
    c.recompute_flops += share * (mixing + (plan.is_moe_retained(l) ? 0.0 : f.moe.total()));
    if (attention && C > 1) {
      // Ring attention: C − 1 pieces' K/V per pass (forward, replay without kept O/LSE), twice in backward.
      const int passes = (plan.keep_attention_results ? 1 : 2) + 2;
      const AttentionSpec& a = m.attention(m.layer_kinds[l]);
      c.allgather_bytes += passes * (C - 1) * ring_kv_bytes(a, N);
      // Under MLA the core expands the other pieces' latents wherever it runs.
      const Flops expansion = latent_expansion_flops(a, (C - 1) * N);
      c.forward_flops += expansion;
      c.backward_flops += kAttentionBackwardRatio * expansion;
      if (!plan.keep_attention_results) c.recompute_flops += expansion;
    }
  }

  // Weight and gradient traffic: every streamed layer crosses PCIe for forward and again for
  // backward; resident expert shards never do.
  Bytes weights_per_pass = working_weight_bytes(params.embedding + params.lm_head);
  Bytes grads = gradient_bytes(params.embedding + params.lm_head);
  for (int l = 0; l < m.layers; ++l) {
    const LayerParams& lp = params.layers[l];
    ParamCount experts = 0;
    if (ep) {
      // With replicas, each copies its 1/D of the shard and all-gathers the rest (forward, backward).
      experts = plan.is_resident(l) ? 0 : lp.routed_experts / E / D;
      if (D > 1 && !plan.is_resident(l)) c.allgather_bytes += 2 * working_weight_bytes(lp.routed_experts / E - experts);
    } else if (plan.param_transfer == ParamTransfer::kShard) {
      experts = lp.routed_experts / P;
      c.allgather_bytes += 2 * working_weight_bytes(lp.routed_experts - lp.routed_experts / P);
    } else {
      experts = lp.routed_experts;
    }
    weights_per_pass += working_weight_bytes(lp.common() + experts);
    grads += gradient_bytes(lp.common() + (ep ? experts : lp.routed_experts / P));
    if (ep && E > 1) {
      const int passes = plan.is_moe_retained(l) ? 2 : 3;  // forward, (replay), backward
      c.a2a_bytes += passes * ep_a2a_bytes(m.layer_moe(l).top_k, N, m.hidden, kBf16Bytes, E);
    }
    if (plan.keep_attention_results && m.layer_kinds[l] != LayerKind::kLinearAttention) {
      c.activation_offload_bytes += 2 * attention_result_bytes(m.attention(m.layer_kinds[l]), B, piece);  // save + load
    }
    if (plan.boundaries.place(l) == BoundaryPolicy::Place::kHost) {
      c.activation_offload_bytes += 2 * boundary_bytes(1, B, piece, m.hidden);  // save + load
    }
  }
  c.h2d_bytes = 2 * weights_per_pass;
  c.d2h_bytes = grads;

  // Updates: resident shards on the GPU; the rest on the CPU, shared layers split over ranks.
  // With replicas (EP groups) each updates 1/D of its resident shards and all-gathers the rest
  // (D = 1: the whole shard, nothing to gather).
  ParamCount resident = 0;
  for (int l : plan.resident_layers) {
    const ParamCount shard = params.layers[l].routed_experts / E;
    resident += shard;
    c.gpu_updated_params += shard / D;
    c.allgather_bytes += working_weight_bytes(shard - shard / D);
  }
  c.cpu_updated_params = (params.total() - (ep ? resident * E : 0)) / P;  // E ranks hold one copy of each resident bank

  c.compute_s = (c.forward_flops + c.recompute_flops + c.backward_flops) / hw.gpu.bf16_flops_per_s;
  const Bytes pcie_activation = c.activation_offload_bytes / 2;
  c.h2d_s = static_cast<double>(c.h2d_bytes + pcie_activation) / hw.pcie.h2d_Bps;
  c.d2h_s = static_cast<double>(c.d2h_bytes + pcie_activation) / hw.pcie.d2h_Bps;
  c.fabric_s = static_cast<double>(c.a2a_bytes + c.allgather_bytes) / hw.fabric.per_gpu_Bps;
  // Ranks on one socket share its update rate.
  const int numa = hw.numa_of_rank(0, P);
  const int ranks_on_numa = hw.ranks_per_numa(P)[static_cast<std::size_t>(numa)];
  c.cpu_update_s = static_cast<double>(c.cpu_updated_params) * ranks_on_numa / hw.numa_spec(numa).adamw_params_per_s;
  return c;
}

nlohmann::json static_cost_to_json(const StaticCost& c) {
  return {{"forward_flops", c.forward_flops},
          {"recompute_flops", c.recompute_flops},
          {"backward_flops", c.backward_flops},
          {"eq1_linear_flops", c.eq1_linear_flops},
          {"eq1_quadratic_flops", c.eq1_quadratic_flops},
          {"h2d_bytes", c.h2d_bytes},
          {"d2h_bytes", c.d2h_bytes},
          {"a2a_bytes", c.a2a_bytes},
          {"allgather_bytes", c.allgather_bytes},
          {"activation_offload_bytes", c.activation_offload_bytes},
          {"cpu_updated_params", c.cpu_updated_params},
          {"gpu_updated_params", c.gpu_updated_params},
          {"compute_s", c.compute_s},
          {"h2d_s", c.h2d_s},
          {"d2h_s", c.d2h_s},
          {"fabric_s", c.fabric_s},
          {"cpu_update_s", c.cpu_update_s},
          {"lower_bound_s", c.lower_bound_s()},
          {"serial_s", c.serial_s()}};
}

std::string static_cost_text(const StaticCost& c, const WorkloadContext& ctx) {
  const HardwareSpec& hw = ctx.hardware;
  std::string out;
  out += "Work and traffic per GPU and step (resource time at rated speed):\n";
  out += fmt::format("  compute   {:8.1f} TFLOP (forward {:.1f}, replay {:.1f}, backward {:.1f}; Eq. 1 forward a·B·S {:.1f}, b·B·S² {:.1f})  {:7.3f} s at {:.0f} TFLOP/s\n",
                     (c.forward_flops + c.recompute_flops + c.backward_flops) / 1e12, c.forward_flops / 1e12,
                     c.recompute_flops / 1e12, c.backward_flops / 1e12, c.eq1_linear_flops / 1e12,
                     c.eq1_quadratic_flops / 1e12, c.compute_s, hw.gpu.bf16_flops_per_s / 1e12);
  out += fmt::format("  PCIe H2D  {:8.2f} GiB weights, {:.2f} GiB activations                    {:7.3f} s at {:.1f} GB/s\n",
                     to_gib(c.h2d_bytes), to_gib(c.activation_offload_bytes / 2), c.h2d_s, hw.pcie.h2d_Bps / 1e9);
  out += fmt::format("  PCIe D2H  {:8.2f} GiB gradients, {:.2f} GiB activations                  {:7.3f} s at {:.1f} GB/s\n",
                     to_gib(c.d2h_bytes), to_gib(c.activation_offload_bytes / 2), c.d2h_s, hw.pcie.d2h_Bps / 1e9);
  out += fmt::format("  fabric    {:8.2f} GiB all-to-all (Eq. 6), {:.2f} GiB all-gather             {:7.3f} s at {:.0f} GB/s\n",
                     to_gib(c.a2a_bytes), to_gib(c.allgather_bytes), c.fabric_s, hw.fabric.per_gpu_Bps / 1e9);
  out += fmt::format("  CPU AdamW {:8.2f} B params on the CPU, {:.2f} B resident on the GPU        {:7.3f} s (ranks share a socket)\n",
                     c.cpu_updated_params / 1e9, c.gpu_updated_params / 1e9, c.cpu_update_s);
  out += fmt::format("  step time bounds: ≥ {:.3f} s with perfect overlap, ≤ {:.3f} s with none\n", c.lower_bound_s(), c.serial_s());
  return out;
}

Workload default_workload() {
  Workload w;
  w.model = "qwen3.6-35b-a3b";
  w.hardware = "h100-sxm-node";
  w.gpus = 4;
  w.global_batch = 32;
  w.seq_len = 4096;
  return w;
}

Plan default_plan() {
  Plan p;
  p.path = ExpertPath::kEp;
  p.resident_layers = {0, 1, 3, 5, 6, 8, 10, 12, 14, 15, 17, 19, 20, 22, 24, 26, 28, 29, 31, 33, 34, 36, 38};
  p.routing_chunk_tokens = 65536;
  p.notes = "R23/K0, 64K routing chunk (OOM Table 4, global batch 32)";
  return p;
}

}  // namespace oom
