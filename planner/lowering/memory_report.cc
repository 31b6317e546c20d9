#include "planner/lowering/memory_report.h"

#include <algorithm>

#include <fmt/format.h>

#include "costmodel/host_placement.h"
#include "costmodel/params.h"
#include "costmodel/routing.h"

namespace oom {
namespace {

Bytes sum(const std::vector<MemoryItem>& items) {
  Bytes total = 0;
  for (const auto& i : items) total += i.bytes;
  return total;
}

void add(std::vector<MemoryItem>& items, std::string name, Bytes bytes, bool per_step = false) {
  if (bytes > 0) items.push_back({std::move(name), bytes, per_step});
}

struct WorkPhase {
  std::string where;
  std::vector<MemoryItem> items;
};

}  // namespace

Bytes HostNumaReport::total() const { return sum(items); }

Bytes MemoryReport::host_total() const {
  Bytes total = 0;
  for (const auto& h : host) total += h.total();
  return total;
}

MemoryReport static_memory(const WorkloadContext& ctx, const Plan& plan, const MemoryConstants& k) {
  const ModelSpec& m = ctx.model;
  const Workload& w = ctx.workload;
  const HardwareSpec& hw = ctx.hardware;
  const ModelParams params = model_params(m);
  const int P = w.gpus;
  const bool ep = plan.path == ExpertPath::kEp;
  const int E = plan.ep_group(P), D = plan.ep_replicas(P);  // EP groups: each shard on D replicas
  // S: the tokens of each sequence (or, with context parallelism, of each piece) on one GPU.
  const std::int64_t seqs = w.seqs_per_gpu(), S = w.local_seq_len(), N = w.tokens_per_gpu();
  const int C = ep ? plan.context_parallel() : 1;
  // Sequences and tokens live at once on one GPU (Local sub-batches hold complete sequences).
  const std::int64_t live_seqs = (!ep && plan.split.sub_batch_seqs > 0) ? plan.split.sub_batch_seqs : seqs;
  const std::int64_t live_tokens = live_seqs * S;

  // Expert parameters this GPU streams per layer: its shard (EP) or the whole bank (Local).
  auto experts_on_gpu = [&](int l) { return ep ? params.layers[l].routed_experts / E : params.layers[l].routed_experts; };
  ParamCount largest_layer = params.embedding;  // the LM head / embedding also passes the window
  for (int l = 0; l < m.layers; ++l) largest_layer = std::max(largest_layer, params.layers[l].common() + experts_on_gpu(l));
  const Bytes window = 2 * working_weight_bytes(largest_layer);  // two-slot parameter window
  // Skewed routing: the rank receiving the largest share holds that share of the routed
  // activations and the receive buffers (after PipelinedLLEP's rebalancing when the plan runs it).
  const bool llep = ep && E > 1 && plan.flat.expert_dispatch == ExpertDispatch::kPipelinedLlep;
  double load = 1.0;
  Bytes llep_weights = 0, llep_grads = 0;
  if (ep) {
    const std::vector<LlepBalance> routing = ep_layer_balance(w.routing, m.moe.experts, m.layers, E, llep);
    for (int l = m.first_dense_layers; l < m.layers; ++l) {
      const LlepBalance& b = routing[static_cast<std::size_t>(l)];
      load = std::max(load, max_load(b.loads));
      const int most = *std::max_element(b.fetched.begin(), b.fetched.end());
      if (most > 0) {
        const ParamCount per_expert = params.layers[l].routed_experts / m.moe.experts;
        llep_weights = std::max(llep_weights, most * working_weight_bytes(per_expert));
        llep_grads = std::max(llep_grads, most * gradient_bytes(per_expert));
      }
    }
  }
  const auto moe_on_worst_rank = [&](int l, std::int64_t tokens) {
    return ep && E > 1 ? moe_activation_bytes_at_load(m, l, tokens, load) : moe_activation_bytes(m, l, tokens);
  };

  MemoryReport report;
  GpuMemoryReport& gpu = report.gpu;

  // M_state: resident expert shards keep FP32 master + moments on their GPU; their BF16 weights
  // are refreshed into the parameter window. With replicas (EP groups) each keeps the state of its
  // 1/D slice and the whole shard's BF16 weights (the replicas' all-gather refreshes them).
  ParamCount resident = 0, resident_slices = 0;
  for (int l : plan.resident_layers) {
    resident += experts_on_gpu(l);
    resident_slices += experts_on_gpu(l) / D;
  }
  add(gpu.state,
      D > 1 ? fmt::format("resident expert shards, {} layers (BF16 weights; FP32 master + 2 moments of a 1/{} slice)",
                          plan.resident_layers.size(), D)
            : fmt::format("resident expert shards, {} layers (FP32 master + 2 moments)", plan.resident_layers.size()),
      resident_shard_state_bytes(resident, resident_slices, ep ? D : 1));

  // M_keep: MoE backward tensors of retained layers, boundaries held on the GPU.
  const std::int64_t moe_tokens_live =
      ep ? std::min(plan.routing_chunk_tokens, N) : (plan.split.moe_chunk_tokens > 0 ? std::min(plan.split.moe_chunk_tokens, live_tokens) : live_tokens);
  Bytes retained = 0;
  for (int l : plan.moe_retained_layers) retained += moe_on_worst_rank(l, N);
  add(gpu.keep, fmt::format("MoE-retained activations, {} layers", plan.moe_retained_layers.size()), retained);
  add(gpu.keep, fmt::format("boundaries held on GPU, {} layers", plan.boundaries.gpu_held.size()),
      boundary_bytes(static_cast<std::int64_t>(plan.boundaries.gpu_held.size()), seqs, S, m.hidden));

  // M_work: the largest workset over the decoders' backward phases and the loss phase.
  bool any_regenerated = false;
  for (int l = 0; l < m.layers; ++l) any_regenerated = any_regenerated || plan.boundaries.place(l) == BoundaryPolicy::Place::kRegenerated;
  std::vector<WorkPhase> phases;
  for (int l = 0; l < m.layers; ++l) {
    const LayerKind kind = m.layer_kinds[l];
    // A decoder's backward holds `held` and `tail` throughout; its MoE backward adds `moe`, and
    // after that has freed its buffers the mixing core's backward (attention or GDN) adds its own.
    std::vector<MemoryItem> held, moe, tail;
    add(held, "parameter window (2 slots, BF16)", window);
    if (!ep && plan.param_transfer == ParamTransfer::kShard) {
      add(held, "expert shard staging for AllGather (BF16)", working_weight_bytes(params.layers[l].routed_experts / P));
    }
    if (ep && D > 1 && !plan.is_resident(l)) {
      add(held, fmt::format("expert shard slice staging for the replicas' AllGather (BF16, 1/{})", D),
          working_weight_bytes(experts_on_gpu(l) / D));
    }
    add(held, "layer gradients (BF16)", gradient_bytes(params.layers[l].common() + experts_on_gpu(l)));
    // The decoder's input is released once its last sub-batch's replayed mixing forward has read it
    // (lowering_layers.cc); earlier sub-batches' backward still holds the whole input.
    add(held, "decoder output gradient (BF16)", boundary_bytes(1, live_seqs, S, m.hidden));
    if (live_seqs < seqs) add(held, "decoder input, until its last sub-batch's replay (BF16)", boundary_bytes(1, seqs, S, m.hidden));
    if (plan.flat.selective_checkpoint_offload) add(held, "SCO prefetched boundary (BF16)", boundary_bytes(1, seqs, S, m.hidden));
    add(held, "mixing recompute activations",
        mixing_activation_bytes(m, l, live_seqs, S, plan.split.attention_head_group, plan.split.gdn_chunk_tokens));
    if (C > 1 && kind != LayerKind::kLinearAttention) {
      add(held, fmt::format("ring attention K/V pieces and their gradients (BF16, sequence over {} GPUs)", C),
          ring_attention_buffer_bytes(m.attention(kind), N, true));
    }
    if (!plan.is_moe_retained(l)) add(moe, "MoE recompute activations", moe_on_worst_rank(l, moe_tokens_live));
    if (ep && E > 1) add(moe, "all-to-all buffers", a2a_buffer_bytes_at_load(m, l, moe_tokens_live, load));
    add(moe, "MoE backward gradients (normalized input, the largest expert's activations)",
        moe_input_grad_bytes(m, moe_tokens_live) +
            expert_grad_workspace_bytes(m, l, moe_tokens_live, ep ? E : 1, largest_expert_share(w.routing, m.moe.experts, l)));
    add(moe, "LLEP fetched expert weights (BF16)", llep_weights);
    add(moe, "LLEP fetched experts' gradients", llep_grads);
    if (any_regenerated) {
      // The run's starting boundary, kept for its own backward, and the regenerated ones past the
      // decoder's own (released by its replay): cap boundaries.
      add(tail, fmt::format("regeneration run: its start and the regenerated boundaries held (cap {})", plan.boundaries.regenerate_cap),
          boundary_bytes(plan.boundaries.regenerate_cap, live_seqs, S, m.hidden));
    }
    WorkPhase ph{fmt::format("decoder {} ({}) backward", l, layer_kind_name(kind)), held};
    ph.items.insert(ph.items.end(), moe.begin(), moe.end());
    ph.items.insert(ph.items.end(), tail.begin(), tail.end());
    {
      const bool gdn = kind == LayerKind::kLinearAttention;
      WorkPhase core{fmt::format("decoder {} ({}) {} backward", l, layer_kind_name(kind), gdn ? "GDN core" : "attention"), std::move(held)};
      core.items.insert(core.items.end(), tail.begin(), tail.end());
      // Two gradient buffers take turns: the next decoder's (backward before this one) may still
      // be draining to the host.
      if (l + 1 < m.layers) {
        add(core.items, "next decoder's gradients, still draining (BF16)", gradient_bytes(params.layers[l + 1].common() + experts_on_gpu(l + 1)));
      }
      // The decoder before's input loads from the host beside the mixing backward (after the MoE
      // backward, planner/lowering/lowering_layers.cc), for itself or to start its regeneration;
      // SCO's second buffer is in `held` already.
      if (l > 0 && !plan.flat.selective_checkpoint_offload && plan.boundaries.place(l - 1) != BoundaryPolicy::Place::kGpu) {
        add(core.items, "decoder input before, loading (BF16)", boundary_bytes(1, seqs, S, m.hidden));
      }
      if (gdn) {
        add(core.items, "GDN core backward workspace (recomputed WY factors and chunk states, their gradients, the saved normalized q/k and A)",
            gdn_backward_bytes(m.gdn, live_seqs, S, plan.split.gdn_chunk_tokens));
      } else {
        const AttentionBackwardBytes grads = attention_backward_bytes(m.attention(kind), m.hidden, live_seqs, S, plan.split.attention_head_group);
        const bool grouped = attention_head_groups(m.attention(kind), plan.split.attention_head_group) > 1 && !m.attention(kind).latent();
        add(core.items,
            grouped ? "attention gradient sums over head groups: normalized input's, one KV head's dK, dV (BF16)"
                    : "attention gradients dO, dQ, dK, dV (BF16)",
            grads.held);
        add(core.items,
            grouped ? "attention head group's backward: its dO, gate gradient, dQ, FP32 dQ accumulator, GQA-expanded dK/dV"
                    : "attention core backward workspace (FP32 dQ accumulator, GQA-expanded dK/dV)",
            grads.per_call);
      }
      phases.push_back(std::move(core));
    }
    phases.push_back(std::move(ph));
  }
  {
    WorkPhase ph{"loss (vocabulary projection)", {}};
    add(ph.items, "parameter window (2 slots, BF16)", window);
    const ParamCount head = params.lm_head > 0 ? params.lm_head : params.embedding;
    const std::int64_t chunk = plan.flat.logits_block_tokens(N);
    add(ph.items, "final hidden states + gradient (BF16)", 2 * boundary_bytes(1, seqs, S, m.hidden));
    if (plan.flat.ring_dtp(P)) {
      add(ph.items, "LM head shard gradient (BF16)", gradient_bytes(head / P));
      const RingDtpHops hops = ring_dtp_hops(m, N, P);
      add(ph.items,
          fmt::format("Ring-DTP circulating {} (2, with their FP32 gradient partials)", hops.weights_move ? "head shards" : "hidden-state blocks"),
          2 * hops.backward);
      add(ph.items, fmt::format("logits block ({} tokens × 1/{} of the vocabulary)", chunk, P),
          sharded_logits_workspace_bytes(m, chunk, P));
    } else {
      add(ph.items, "LM head gradient (BF16)", gradient_bytes(head));
      if (chunk < N) add(ph.items, "LM head gradient sum over logits blocks (FP32)", head_accumulator_bytes(head));
      add(ph.items, fmt::format("logits chunk ({} tokens)", chunk), logits_workspace_bytes(m, chunk));
    }
    phases.push_back(std::move(ph));
  }
  const auto peak = std::max_element(phases.begin(), phases.end(),
                                     [](const WorkPhase& a, const WorkPhase& b) { return sum(a.items) < sum(b.items); });
  gpu.work = peak->items;
  gpu.work_peak_at = peak->where;
  gpu.eq2 = eq2_gpu_peak(k.gpu_fixed_bytes, sum(gpu.state), sum(gpu.keep), sum(gpu.work), k.gpu_headroom_fraction);

  // Host, per NUMA node of the nodes in use: each rank's CPU work runs on its GPU's socket.
  const std::vector<int> ranks_on = hw.ranks_per_numa(P);
  const int used_nodes = static_cast<int>(std::count_if(ranks_on.begin(), ranks_on.end(), [](int n) { return n > 0; }));
  ParamCount shared_streamed = params.embedding + params.lm_head + params.final_norm;  // split over used nodes
  ParamCount per_rank_streamed = 0;                                                  // each rank's expert shards
  ParamCount largest_common = params.embedding;
  for (int l = 0; l < m.layers; ++l) {
    shared_streamed += params.layers[l].common();
    largest_common = std::max(largest_common, params.layers[l].common());
    if (ep) {
      // With replicas each rank's host keeps its 1/D slice of its shard's state.
      per_rank_streamed += plan.is_resident(l) ? 0 : params.layers[l].routed_experts / E / D;
    } else {
      shared_streamed += params.layers[l].routed_experts;
    }
  }
  std::int64_t host_boundaries = 0;
  for (int l = 0; l < m.layers; ++l) host_boundaries += plan.boundaries.place(l) == BoundaryPolicy::Place::kHost ? 1 : 0;
  Bytes olse_per_rank = 0;
  if (plan.keep_attention_results) {
    for (int l = 0; l < m.layers; ++l) {
      if (m.layer_kinds[l] != LayerKind::kLinearAttention) olse_per_rank += attention_result_bytes(m.attention(m.layer_kinds[l]), seqs, S);
    }
  }
  for (std::size_t n = 0; n < ranks_on.size(); ++n) {
    HostNumaReport h;
    h.numa = static_cast<int>(n);
    h.label = hw.numa_label(h.numa);
    h.ranks = ranks_on[n];
    h.capacity = hw.numa_spec(h.numa).dram_bytes;
    if (h.ranks > 0) {
      const Bytes r = h.ranks;
      add(h.items, "canonical state, shared layers (FP32 master + 2 moments)", canonical_state_bytes(shared_streamed) / used_nodes);
      add(h.items, "canonical state, streamed expert shards", r * canonical_state_bytes(per_rank_streamed));
      add(h.items, "pinned weight staging (2 transfer chunks per rank)", r * 2 * plan.transfer_chunk_mib * kMiB);
      if (ep) {
        // A slot holds one gradient: a whole parameter group, or one bucket under OffloadStreamAdamW.
        const Bytes slot = plan.flat.optimizer_bucket_mib > 0 ? std::min(gradient_bytes(largest_layer), plan.flat.optimizer_bucket_mib * kMiB)
                                                              : gradient_bytes(largest_layer);
        add(h.items, fmt::format("CPU gradient slots ({} per rank, BF16)", plan.cpu_grad_slots), r * plan.cpu_grad_slots * slot);
      } else {
        // Local: BF16 partials of all ranks accumulate in FP32 in shared host memory.
        const ParamCount slot = plan.flat.optimizer_bucket_mib > 0
                                    ? std::min(largest_layer, plan.flat.optimizer_bucket_mib * kMiB / kBf16Bytes)
                                    : largest_layer;
        add(h.items, fmt::format("FP32 gradient accumulation slots ({})", plan.cpu_grad_slots),
            plan.cpu_grad_slots * kFp32Bytes * slot);
        // Full delivery: each rank's BF16 partial lands in its own slot before it is added.
        if (plan.param_transfer == ParamTransfer::kFull) {
          add(h.items, fmt::format("BF16 partial landing slots ({} per rank)", plan.cpu_grad_slots),
              r * plan.cpu_grad_slots * kBf16Bytes * slot);
        }
      }
      add(h.items, fmt::format("boundaries kept on host, {} layers", host_boundaries), r * boundary_bytes(host_boundaries, seqs, S, m.hidden),
          /*per_step=*/true);
      add(h.items, "attention O/LSE kept on host", r * olse_per_rank, /*per_step=*/true);
      add(h.items, "process memory", r * k.host_process_bytes);
    }
    report.host.push_back(std::move(h));
  }
  std::vector<Bytes> demand, capacity;
  for (const auto& h : report.host) demand.push_back(h.total()), capacity.push_back(h.capacity);
  const HostPlacement placed = place_host_memory(demand, capacity, std::max<int>(1, static_cast<int>(hw.numa.size())));
  for (std::size_t n = 0; n < report.host.size(); ++n) report.host[n].spilled = placed.spilled[n];
  return report;
}

nlohmann::json memory_report_to_json(const MemoryReport& r) {
  auto items = [](const std::vector<MemoryItem>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& i : v) a.push_back({{"name", i.name}, {"bytes", i.bytes}, {"gib", to_gib(i.bytes)}});
    return a;
  };
  const GpuPeakTerms& e = r.gpu.eq2;
  nlohmann::json j;
  j["gpu"] = {{"peak_bytes", e.total()},
              {"peak_gib", to_gib(e.total())},
              {"eq2", {{"fixed_bytes", e.fixed}, {"state_bytes", e.state}, {"keep_bytes", e.keep}, {"work_bytes", e.work}, {"headroom_bytes", e.headroom}}},
              {"state", items(r.gpu.state)},
              {"keep", items(r.gpu.keep)},
              {"work", items(r.gpu.work)},
              {"work_peak_at", r.gpu.work_peak_at}};
  nlohmann::json host = nlohmann::json::array();
  for (const auto& h : r.host) {
    host.push_back({{"numa", h.numa}, {"name", h.label}, {"ranks", h.ranks}, {"bytes", h.total()}, {"gib", to_gib(h.total())},
                    {"capacity_gib", to_gib(h.capacity)}, {"spilled_gib", to_gib(h.spilled)}, {"items", items(h.items)}});
  }
  j["host"] = host;
  j["host_total_bytes"] = r.host_total();
  j["host_total_gib"] = to_gib(r.host_total());
  return j;
}

std::string memory_report_text(const MemoryReport& r) {
  std::string out;
  const GpuPeakTerms& e = r.gpu.eq2;
  out += fmt::format("GPU memory per GPU (Eq. 2): {:.1f} GiB\n", to_gib(e.total()));
  out += fmt::format("  M_0     fixed occupancy            {:9.2f} GiB\n", to_gib(e.fixed));
  out += fmt::format("  M_state resident state             {:9.2f} GiB\n", to_gib(e.state));
  for (const auto& i : r.gpu.state) out += fmt::format("            {:<44} {:9.2f} GiB\n", i.name, to_gib(i.bytes));
  out += fmt::format("  M_keep  retained activations       {:9.2f} GiB\n", to_gib(e.keep));
  for (const auto& i : r.gpu.keep) out += fmt::format("            {:<44} {:9.2f} GiB\n", i.name, to_gib(i.bytes));
  out += fmt::format("  M_work  largest workset            {:9.2f} GiB  at {}\n", to_gib(e.work), r.gpu.work_peak_at);
  for (const auto& i : r.gpu.work) out += fmt::format("            {:<44} {:9.2f} GiB\n", i.name, to_gib(i.bytes));
  out += fmt::format("  ε       headroom                   {:9.2f} GiB\n", to_gib(e.headroom));
  out += fmt::format("Host memory: {:.1f} GiB\n", to_gib(r.host_total()));
  for (const auto& h : r.host) {
    out += fmt::format("  {} ({} ranks): {:.1f} of {:.0f} GiB{}\n", h.label.empty() ? fmt::format("NUMA node {}", h.numa) : h.label, h.ranks,
                       to_gib(h.total()), to_gib(h.capacity),
                       h.spilled > 0 ? fmt::format(" ({:.1f} GiB of it on the node's other sockets)", to_gib(h.spilled)) : "");
    for (const auto& i : h.items) out += fmt::format("    {:<56} {:9.2f} GiB\n", i.name, to_gib(i.bytes));
  }
  return out;
}

}  // namespace oom
