#include "planner/lowering/baselines.h"

#include <algorithm>

#include <fmt/format.h>

#include "costmodel/host_placement.h"
#include "costmodel/input_error.h"
#include "costmodel/params.h"
#include "planner/lowering/baselines_ktft.h"
#include "planner/lowering/baselines_megatron.h"

namespace oom {
namespace {

std::string gib(Bytes b) { return fmt::format("{:.1f} GiB", to_gib(b)); }

}  // namespace

std::string_view baseline_system_name(BaselineSystem s) {
  switch (s) {
    case BaselineSystem::kFsdp2Offload: return "fsdp2-offload";
    case BaselineSystem::kZeroOffload: return "zero-offload";
    case BaselineSystem::kMegaTrain: return "megatrain";
    case BaselineSystem::kMegatronLm: return "megatron-lm";
    case BaselineSystem::kKtFt: return "kt-ft";
  }
  return "?";
}

std::optional<BaselineSystem> baseline_system_from_name(std::string_view name) {
  for (const BaselineSystem s : known_baseline_systems()) {
    if (baseline_system_name(s) == name) return s;
  }
  return std::nullopt;
}

std::vector<BaselineSystem> all_baseline_systems() {
  return {BaselineSystem::kFsdp2Offload, BaselineSystem::kZeroOffload, BaselineSystem::kMegaTrain};
}

std::vector<BaselineSystem> known_baseline_systems() {
  std::vector<BaselineSystem> all = all_baseline_systems();
  all.push_back(BaselineSystem::kMegatronLm);
  all.push_back(BaselineSystem::kKtFt);
  return all;
}

BaselineTraits baseline_traits(BaselineSystem s, int gpus) {
  BaselineTraits t;
  switch (s) {
    case BaselineSystem::kFsdp2Offload:
      // FP32 shards on the host are copied as they are and cast on the GPU; FP32 gradients.
      t.sharded_params = true;
      t.h2d_bytes_per_param = kFp32Bytes;
      t.grad_bytes_per_param = kFp32Bytes;
      t.optimizer_overlaps_backward = false;
      t.publishes_bf16 = false;
      t.accumulates_gradients = true;
      t.host_bytes_per_param = 4 * kFp32Bytes;  // FP32 parameter (the master), gradient and two moments
      // optimizer.step() of torch.optim.AdamW over the CPU DTensor shards once the backward is done
      // (FSDP2's CPUOffloadPolicy keeps parameters, gradients and optimizer state on the host).
      t.optimizer = OpKind::kTorchCpuAdamW;
      break;
    case BaselineSystem::kZeroOffload:
      // BF16 parameter copy on the host, BF16 communication, FP32 gradient + master + moments.
      t.sharded_params = true;
      t.h2d_bytes_per_param = kBf16Bytes;
      t.grad_bytes_per_param = kBf16Bytes;
      t.optimizer_overlaps_backward = false;
      t.publishes_bf16 = false;
      t.accumulates_gradients = true;
      t.host_bytes_per_param = kBf16Bytes + kFp32Bytes + kCanonicalBytesPerParam;  // 18
      break;
    case BaselineSystem::kMegaTrain:
      // Whole BF16 layers per GPU; canonical state + a BF16 copy on the host; no accumulation on
      // several GPUs.
      t.sharded_params = false;
      t.h2d_bytes_per_param = kBf16Bytes;
      t.grad_bytes_per_param = kBf16Bytes;
      t.optimizer_overlaps_backward = true;
      t.publishes_bf16 = true;
      t.accumulates_gradients = gpus == 1;
      // FP32 master and moments, the BF16 layer copies the GPUs read, and an FP32 gradient of
      // every parameter that the ranks' slabs are summed into (MegaTrain's SharedState:
      // `layer_shared_flats`, `torch.zeros_like(p.data)` per parameter, shared by the ranks).
      t.host_bytes_per_param = kCanonicalBytesPerParam + kBf16Bytes + kFp32Bytes;  // 18
      break;
    case BaselineSystem::kMegatronLm:
    case BaselineSystem::kKtFt:
      break;  // modelled apart: planner/lowering/baselines_megatron.h, planner/lowering/baselines_ktft.h
  }
  return t;
}

std::string OutOfMemory::message() const {
  const std::string what = space == "gpu" ? fmt::format("GPU {}", device)
                                              : "host " + (device_label.empty() ? fmt::format("NUMA node {}", device) : device_label);
  return fmt::format("{} out of memory: {} needed > {} available at {}", what, gib(needed_bytes), gib(available_bytes), where);
}

std::optional<OutOfMemory> host_out_of_memory(const WorkloadContext& ctx, const std::vector<Bytes>& bytes,
                                              const std::vector<Bytes>& budget, const std::string& where) {
  const int per_node = std::max<int>(1, static_cast<int>(ctx.hardware.numa.size()));
  const auto over = host_overflow(bytes, budget, per_node);
  if (!over) return std::nullopt;
  return OutOfMemory{"host", over->node * per_node, where, over->needed, over->capacity, ctx.hardware.node_numa_label(over->node)};
}

DecoderUnits decoder_units(const LayerParams& layer, int expert_units) {
  DecoderUnits u;
  if (expert_units <= 1 || layer.routed_experts == 0) {
    u.outer = layer.total();
    return u;
  }
  u.outer = layer.common();
  u.expert_unit = layer.routed_experts / expert_units;
  u.expert_units = expert_units;
  return u;
}

std::vector<int> expert_unit_options(BaselineSystem s, const ModelSpec& m, int gpus) {
  std::vector<int> out = {1};
  if (!baseline_traits(s, gpus).sharded_params || m.moe_layers() == 0) return out;
  for (int u = 2; u <= m.moe.experts; ++u) {
    if (m.moe.experts % u == 0) out.push_back(u);
  }
  return out;
}

Bytes megatrain_pinned_buffer_bytes(const ModelParams& params, int gpus) {
  ParamCount largest = 0;
  for (const auto& l : params.layers) largest = std::max(largest, l.total());
  const Bytes layer = pinned_host_block_bytes(kBf16Bytes * largest);
  const ParamCount head = (params.lm_head > 0 ? params.lm_head : params.embedding) + params.final_norm;
  Bytes bytes = kMegaTrainGradSlabs * layer + pinned_host_block_bytes(kBf16Bytes * head) +
                pinned_host_block_bytes(kBf16Bytes * params.embedding);
  if (gpus <= 1) {
    // One GPU: two pinned staging buffers, and each layer's BF16 copy pinned on its own.
    bytes += 2 * layer;
    for (const auto& l : params.layers) bytes += pinned_host_block_bytes(kBf16Bytes * l.total()) - kBf16Bytes * l.total();
  }
  return bytes;
}

Bytes fsdp2_pinned_rounding_bytes(const ModelSpec& m, int gpus) {
  // Each routed expert's gate and up projections [I, h] and down projection [h, I], sharded on
  // dim 0 and padded to ⌈dim 0 / P⌉ rows (the per-expert modules of Qwen3-MoE's and Mixtral's
  // Hugging Face checkpoints; the fused [E, 2I, h] and [E, h, I] tensors of newer ones round
  // alike wherever E/P is a power of two). FP32 shards, each the parameter's and its gradient's.
  const std::int64_t P = std::max(1, gpus), h = m.hidden;
  Bytes extra = 0;
  for (int l = m.first_dense_layers; l < m.layers; ++l) {
    const MoeSpec& moe = m.layer_moe(l);
    const std::int64_t I = moe.expert_intermediate;
    if (moe.experts == 0 || I == 0) continue;
    const auto rounding = [&](std::int64_t rows, std::int64_t cols) {
      const Bytes padded = kFp32Bytes * ((rows + P - 1) / P) * cols;
      return pinned_host_block_bytes(padded) - kFp32Bytes * rows * cols / P;
    };
    extra += std::int64_t{moe.experts} * (2 * rounding(I, h) + rounding(h, I));
  }
  return 2 * extra;  // the parameter shards and the gradient shards
}

BaselineMemory baseline_static_memory(const BaselineSetup& setup, const WorkloadContext& ctx, const MemoryConstants& k) {
  const ModelSpec& m = ctx.model;
  const HardwareSpec& hw = ctx.hardware;
  const int P = ctx.workload.gpus;
  // S: the tokens of each sequence on one GPU (its piece under context parallelism).
  const std::int64_t S = ctx.workload.local_seq_len(), b = setup.micro_batch_seqs, T = b * S;
  const bool ring = ctx.workload.gpus_per_seq() > 1;
  const BaselineTraits t = baseline_traits(setup.system, P);
  const ModelParams params = model_params(m);
  const ParamCount head = (params.lm_head > 0 ? params.lm_head : params.embedding) + params.final_norm;
  std::vector<DecoderUnits> units;
  for (const auto& l : params.layers) units.push_back(decoder_units(l, t.sharded_params ? setup.expert_units : 1));
  ParamCount largest = std::max(params.embedding, head), largest_unit = 0;
  for (const auto& u : units) {
    largest = std::max(largest, u.outer);
    largest_unit = std::max(largest_unit, u.expert_unit);
  }
  const ParamCount shard = t.sharded_params ? (std::max(largest, largest_unit) + P - 1) / P : largest;

  BaselineMemory out;
  // GPU: M_0, the two-slot windows of unsharded BF16 units (decoders, and expert units when the
  // experts are apart), the staging of the copied shards, then the largest workset (one decoder's
  // backward or the loss).
  const Bytes fixed = k.gpu_fixed_bytes;
  out.window_bytes = 2 * working_weight_bytes(largest) + 2 * working_weight_bytes(largest_unit);
  out.staging_bytes = t.sharded_params && P > 1 ? 2 * t.h2d_bytes_per_param * shard : 0;
  Bytes work = 0;
  // A tied table's gradient is held from the head's backward to the embeddings' (one gradient).
  const Bytes tied_table = m.tied_embeddings ? t.grad_bytes_per_param * params.embedding : 0;
  // Gradients take two GPU buffers in turn, in backward order: the head's, then per decoder its
  // expert units' (last first) and its outer unit's, then the embedding's. While one is written the
  // one before it may still be draining.
  ParamCount before = m.tied_embeddings ? params.final_norm : head;
  for (int l = m.layers - 1; l >= 0; --l) {
    const DecoderUnits& u = units[static_cast<std::size_t>(l)];
    ParamCount pair = 0;
    ParamCount prev = before;
    for (int e = 0; e < u.expert_units; ++e) {
      pair = std::max(pair, u.expert_unit + prev);
      prev = u.expert_unit;
    }
    pair = std::max(pair, u.outer + prev);
    before = u.outer;
    // Input, next input and the running hidden gradient; the next checkpoint may already be
    // loaded beside this one.
    // Under context parallelism, ring attention's K/V pieces and their gradients.
    const LayerKind kind = m.layer_kinds[static_cast<std::size_t>(l)];
    const Bytes ring_buffers = ring && kind != LayerKind::kLinearAttention ? ring_attention_buffer_bytes(m.attention(kind), T, true) : 0;
    // A mixing core's backward (attention or GDN) adds its buffers (held over the core's stage).
    const Bytes core_grads = mixing_backward_total_bytes(m, l, b, S);
    const Bytes w = 3 * boundary_bytes(1, b, S, m.hidden) + mixing_activation_bytes(m, l, b, S) + ring_buffers + core_grads +
                    moe_activation_bytes(m, l, T) + tied_table + t.grad_bytes_per_param * pair;
    if (w >= work) {
      work = w;
      out.gpu_peak_at = fmt::format("decoder {} ({}) backward, micro-batch of {} sequences", l,
                                    layer_kind_name(m.layer_kinds[static_cast<std::size_t>(l)]), b);
      if (ring) out.gpu_peak_at += fmt::format(" (pieces of {} tokens, each sequence over {} GPUs)", S, ctx.workload.gpus_per_seq());
    }
  }
  const Bytes loss = 2 * boundary_bytes(1, b, S, m.hidden) + logits_workspace_bytes(m, std::min(k.loss_chunk_tokens, T)) +
                     t.grad_bytes_per_param * head;
  if (loss > work) {
    work = loss;
    out.gpu_peak_at = fmt::format("loss (vocabulary projection), micro-batch of {} sequences", b);
  }
  // The embedding's gradient, written by the scatter while decoder 0's may still be draining, beside
  // the running hidden gradient the scatter reads.
  const Bytes embedding = boundary_bytes(1, b, S, m.hidden) + t.grad_bytes_per_param * (params.embedding + before);
  if (embedding > work) {
    work = embedding;
    out.gpu_peak_at = fmt::format("embedding backward, micro-batch of {} sequences", b);
  }
  if (t.sharded_params && setup.expert_units > 1) out.gpu_peak_at += fmt::format(", experts in {} units", setup.expert_units);
  out.gpu_peak_bytes = eq2_gpu_peak(fixed, 0, 0, out.window_bytes + out.staging_bytes + work, k.gpu_headroom_fraction).total();

  // Host, per NUMA node: the state split over the nodes in use by ranks, then per-rank items.
  const std::vector<int> ranks_on = hw.ranks_per_numa(P);
  for (std::size_t n = 0; n < ranks_on.size(); ++n) {
    const Bytes r = ranks_on[n];
    Bytes bytes = 0;
    if (r > 0) {
      bytes += t.host_bytes_per_param * params.total() * r / P;
      if (setup.system == BaselineSystem::kFsdp2Offload) bytes += r * fsdp2_pinned_rounding_bytes(m, P);
      bytes += r * boundary_bytes(m.layers, b, S, m.hidden);  // offloaded decoder checkpoints
      if (t.sharded_params) {
        bytes += r * 2 * t.h2d_bytes_per_param * shard;  // pinned copy buffers
      } else {
        bytes += r * megatrain_pinned_buffer_bytes(params, P);  // gradient slabs, staging
      }
      bytes += r * k.host_process_bytes;
    }
    out.host_bytes_per_numa.push_back(bytes);
  }
  out.host_budget_per_numa = ctx.host_budget_bytes_per_numa();
  return out;
}

std::string whole_sequences_only(BaselineSystem s, const Workload& w) {
  if (w.gpus_per_seq() <= 1 || s == BaselineSystem::kFsdp2Offload) return {};
  return fmt::format("{} runs whole sequences per GPU; the workload splits each of its {} sequences over {} GPUs",
                     baseline_system_name(s), w.global_batch, w.gpus_per_seq());
}

BaselineFit configure_baseline(BaselineSystem s, const WorkloadContext& ctx, const MemoryConstants& k) {
  if (const std::string why = whole_sequences_only(s, ctx.workload); !why.empty()) {
    throw InputError("", "global_batch", std::to_string(ctx.workload.global_batch), why);
  }
  if (s == BaselineSystem::kMegatronLm) {
    const MegatronFit m = configure_megatron(ctx, k);
    BaselineFit fit;
    if (m.setup) fit.setup = BaselineSetup{s, m.setup->micro_batch_seqs, m.setup->accumulation_steps};
    fit.oom = m.oom;
    return fit;
  }
  if (s == BaselineSystem::kKtFt) return configure_ktft(ctx, k);
  const std::int64_t seqs = ctx.workload.seqs_per_gpu();
  const BaselineTraits t = baseline_traits(s, ctx.workload.gpus);
  std::vector<std::int64_t> candidates;
  for (std::int64_t mb = seqs; mb >= 1; --mb) {
    if (seqs % mb == 0 && (t.accumulates_gradients || mb == seqs)) candidates.push_back(mb);
  }
  const Bytes gpu_budget = ctx.gpu_budget_bytes();
  BaselineFit fit;
  std::optional<OutOfMemory> gpu_oom, host_oom;
  const std::vector<int> units = expert_unit_options(s, ctx.model, ctx.workload.gpus);
  for (const std::int64_t mb : candidates) {
    for (const int u : units) {
      BaselineSetup setup{s, mb, static_cast<int>(seqs / mb), u};
      const BaselineMemory mem = baseline_static_memory(setup, ctx, k);
      if (mem.gpu_peak_bytes > gpu_budget) {
        gpu_oom = OutOfMemory{"gpu", 0, mem.gpu_peak_at, mem.gpu_peak_bytes, gpu_budget, ""};
        continue;
      }
      if (auto oom = host_out_of_memory(ctx, mem.host_bytes_per_numa, mem.host_budget_per_numa,
                                        fmt::format("host state, checkpoints and buffers ({} B/param of state, micro-batch of {} sequences)",
                                                    t.host_bytes_per_param, mb))) {
        host_oom = std::move(oom);
        continue;  // finer units pin smaller copy buffers; a smaller micro-batch offloads fewer checkpoints
      }
      fit.setup = setup;
      return fit;
    }
  }
  // The GPU fitted at some micro-batch but the host never did: host out of memory; else the GPU
  // at the smallest micro-batch allowed.
  fit.oom = host_oom ? host_oom : gpu_oom;
  return fit;
}

BaselineGraph baseline_step_graph(BaselineSystem s, const WorkloadContext& ctx, const MemoryConstants& k, bool symmetric_nodes) {
  if (s == BaselineSystem::kMegatronLm || s == BaselineSystem::kKtFt) {
    throw InputError("", "system", std::string(baseline_system_name(s)), "lowered apart from the offload baselines (no single step graph here)");
  }
  BaselineGraph out;
  const BaselineFit fit = configure_baseline(s, ctx, k);
  out.setup = fit.setup;
  out.oom = fit.oom;
  if (!fit.setup) return out;
  LoweringOptions options;
  options.memory = k;
  options.symmetric_nodes = symmetric_nodes;
  out.graph = lower_baseline(*fit.setup, ctx, options);
  return out;
}

}  // namespace oom
