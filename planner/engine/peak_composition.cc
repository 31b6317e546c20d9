#include "planner/engine/peak_composition.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "costmodel/token_text.h"

namespace oom {
namespace {

struct GpuEvent {
  Seconds time_s;
  Bytes bytes;
  int gpu;
  MemoryUse use;
  StageId stage;
};

// The GPU memory events of `g` at `times` (of one GPU, or all when `gpu` < 0) in the order
// memory_peaks() sweeps them: by time, frees before allocations.
std::vector<GpuEvent> gpu_events(const StepGraph& g, const StageTimes& times, int gpu) {
  std::vector<GpuEvent> events;
  for (const Stage& s : g.stages) {
    for (const MemoryEvent& m : s.memory) {
      if (m.space != MemorySpace::kGpu || (gpu >= 0 && m.device != gpu)) continue;
      const auto i = static_cast<std::size_t>(s.id);
      events.push_back({m.at_end ? times.finish_s[i] : times.start_s[i], m.bytes, m.device, m.use, s.id});
    }
  }
  std::stable_sort(events.begin(), events.end(), [](const GpuEvent& a, const GpuEvent& b) {
    if (a.time_s != b.time_s) return a.time_s < b.time_s;
    return a.bytes < b.bytes;
  });
  return events;
}

}  // namespace

PeakComposition gpu_peak_composition(const StepGraph& g, const StageTimes& times, int gpu, Bytes resident_state_bytes) {
  const std::vector<GpuEvent> events = gpu_events(g, times, gpu);
  PeakComposition c;
  c.gpu = gpu;
  c.base = g.gpu_base_bytes.at(static_cast<std::size_t>(gpu));
  std::array<Bytes, kMemoryUses> held{};
  Bytes total = c.base, peak = c.base;
  for (const GpuEvent& e : events) {
    held[static_cast<std::size_t>(e.use)] += e.bytes;
    total += e.bytes;
    if (total > peak) {
      peak = total;
      c.by_use = held;
      c.stage = g.stages[static_cast<std::size_t>(e.stage)].name;
    }
  }
  // Parts that rise and fall under different tags can dip below zero between events; a part of
  // the peak is never negative (the difference stays in the total).
  for (auto& b : c.by_use) b = std::max<Bytes>(0, b);
  const Bytes state = std::min(resident_state_bytes, c.base);
  c.by_use[static_cast<std::size_t>(MemoryUse::kOptimizer)] += state;
  c.base -= state;
  c.total = peak;
  return c;
}

BindingPeak binding_peak(const PeakComposition& c, const Plan& plan) {
  MemoryUse binding = MemoryUse::kDispatch;
  for (const MemoryUse u : {MemoryUse::kActivations, MemoryUse::kVocabulary, MemoryUse::kBoundaries, MemoryUse::kOptimizer}) {
    if (c.of(u) > c.of(binding)) binding = u;
  }
  BindingPeak b;
  b.peak = std::string(memory_use_name(binding));
  b.bytes = c.of(binding);
  const FlatSchedules& f = plan.flat;
  switch (binding) {
    case MemoryUse::kDispatch:
      if (f.expert_dispatch == ExpertDispatch::kPipelinedLlep) {
        b.bounded_by = fmt::format("PipelinedLLEP, rounds of {} tokens per source", tokens_text(plan.routing_chunk_tokens));
      } else if (plan.path == ExpertPath::kEp) {
        b.bounded_by = fmt::format("dispatch rounds of {} tokens (no rebalancing)", tokens_text(plan.routing_chunk_tokens));
      } else {
        b.bounded_by = plan.split.moe_chunk_tokens > 0 ? fmt::format("MoE chunks of {} tokens", tokens_text(plan.split.moe_chunk_tokens))
                                                       : std::string("nothing: each MoE call takes all its tokens at once");
      }
      break;
    case MemoryUse::kActivations: {
      // The mixing sublayers' saved tensors and their cores' backward buffers: the operator
      // partitions bound them.
      std::vector<std::string> parts;
      const SplitSpec& s = plan.split;
      if (s.attention_head_group > 0) parts.push_back(fmt::format("attention head groups of {}", s.attention_head_group));
      if (s.gdn_chunk_tokens > 0) parts.push_back(fmt::format("GDN pieces of {} tokens", tokens_text(s.gdn_chunk_tokens)));
      if (plan.path == ExpertPath::kLocal && s.sub_batch_seqs > 0) parts.push_back(fmt::format("sub-batches of {} sequences", s.sub_batch_seqs));
      b.bounded_by = parts.empty() ? "nothing: the mixing sublayers run unsplit" : fmt::format("{}", fmt::join(parts, ", "));
      break;
    }
    case MemoryUse::kVocabulary:
      b.bounded_by = f.vocab_projection == VocabProjection::kRingDtp
                         ? fmt::format("Ring-DTP, blocks of {} tokens", tokens_text(f.vocab_chunk_tokens))
                         : (f.vocab_chunk_tokens > 0 ? fmt::format("logits chunks of {} tokens", tokens_text(f.vocab_chunk_tokens)) : "unbounded");
      break;
    case MemoryUse::kBoundaries:
      b.bounded_by = f.selective_checkpoint_offload ? "SCO (boundaries on the host, one prefetched)"
                     : plan.boundaries.gpu_held.empty() ? "boundaries on the host or regenerated"
                                                        : fmt::format("{} boundaries held on the GPU", plan.boundaries.gpu_held.size());
      break;
    default: {
      const std::string updates = f.optimizer_bucket_mib > 0 ? fmt::format("OffloadStreamAdamW, buckets of {} MiB", f.optimizer_bucket_mib)
                                                             : std::string("per-layer CPU updates");
      b.bounded_by = plan.resident_layers.empty()
                         ? updates
                         : fmt::format("the resident expert state of {} decoders, sized to the budget; {}", plan.resident_layers.size(), updates);
    }
  }
  return b;
}

nlohmann::json peak_composition_to_json(const PeakComposition& c) {
  nlohmann::json parts = nlohmann::json::object();
  parts["base"] = to_gib(c.base);
  for (int u = 0; u < kMemoryUses; ++u) parts[std::string(memory_use_name(static_cast<MemoryUse>(u)))] = to_gib(c.by_use[static_cast<std::size_t>(u)]);
  return {{"gpu", c.gpu}, {"peak_gib", to_gib(c.total)}, {"parts_gib", parts}, {"at", c.stage}};
}

std::array<Bytes, kMemoryUses> use_peaks(const StepGraph& g, const StageTimes& times) {
  std::vector<std::array<Bytes, kMemoryUses>> held(static_cast<std::size_t>(g.gpus), std::array<Bytes, kMemoryUses>{});
  std::array<Bytes, kMemoryUses> peak{};
  for (const GpuEvent& e : gpu_events(g, times, -1)) {
    Bytes& h = held[static_cast<std::size_t>(e.gpu)][static_cast<std::size_t>(e.use)];
    h += e.bytes;
    peak[static_cast<std::size_t>(e.use)] = std::max(peak[static_cast<std::size_t>(e.use)], h);
  }
  return peak;
}

nlohmann::json use_peaks_to_json(const std::array<Bytes, kMemoryUses>& peaks) {
  nlohmann::json j = nlohmann::json::object();
  for (int u = 0; u < kMemoryUses; ++u) j[std::string(memory_use_name(static_cast<MemoryUse>(u)))] = to_gib(peaks[static_cast<std::size_t>(u)]);
  return j;
}

StageTimes times_of_trace(const Trace& t) {
  StageTimes out;
  out.start_s.resize(t.stages.size());
  out.finish_s.resize(t.stages.size());
  for (const auto& s : t.stages) {
    out.start_s[static_cast<std::size_t>(s.id)] = s.start_s;
    out.finish_s[static_cast<std::size_t>(s.id)] = s.end_s;
  }
  out.step_s = t.step_s;
  return out;
}

}  // namespace oom
