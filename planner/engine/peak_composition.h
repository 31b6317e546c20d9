// What a GPU's memory peak is made of, and which of FLAT's four peaks binds a plan.
//
// gpu_peak_composition() sweeps one GPU's allocation events in time order (as memory_peaks()
// does) keeping the bytes held per MemoryUse, and returns the parts at the peak instant with the
// stage whose allocation reached it. binding_peak() names the largest of the parts a plan bounds —
// FLAT's four, "dispatch" (MoE all-to-all buffers and routed activations), "vocabulary" (logits),
// "boundaries" (checkpoint boundaries on the GPU), "optimizer" (gradients awaiting their update
// and resident optimizer state), and "activations" (the mixing sublayers' saved tensors and the
// cores' backward buffers, attention or GDN, bounded by the operator partitions) — and what in the plan
// bounds it. Pure functions.
#pragma once

#include <array>
#include <string>

#include <nlohmann/json.hpp>

#include "planner/engine/analytic_evaluator.h"
#include "planner/lowering/step_graph.h"
#include "traces/trace.h"

namespace oom {

struct PeakComposition {
  int gpu = 0;
  Bytes base = 0;                          // fixed occupancy, resident state, the window slots
  std::array<Bytes, kMemoryUses> by_use{};  // bytes held per MemoryUse at the peak
  Bytes total = 0;                         // base + Σ by_use (headroom not included)
  std::string stage;                       // the stage whose allocation reached the peak
  Bytes of(MemoryUse u) const { return by_use[static_cast<std::size_t>(u)]; }
};

// The composition of GPU `gpu`'s peak when `g` runs at `times`. Resident optimizer state (part of
// the graph's base) is counted under "optimizer" when `resident_state_bytes` says how much.
PeakComposition gpu_peak_composition(const StepGraph& g, const StageTimes& times, int gpu,
                                     Bytes resident_state_bytes = 0);

struct BindingPeak {
  std::string peak;     // "activations" | "dispatch" | "vocabulary" | "boundaries" | "optimizer"
  Bytes bytes = 0;      // its bytes at the GPU peak
  std::string bounded_by;  // the schedule that bounds it in the plan, or "unbounded"
};
BindingPeak binding_peak(const PeakComposition& c, const Plan& plan);

nlohmann::json peak_composition_to_json(const PeakComposition& c);

// The most bytes of each use held at once on any one GPU over the step (each use's own peak,
// which need not fall at the GPU's peak): FLAT's per-peak figures ("dispatch peak", ...).
std::array<Bytes, kMemoryUses> use_peaks(const StepGraph& g, const StageTimes& times);
// The same as {"dispatch": GiB, ...}.
nlohmann::json use_peaks_to_json(const std::array<Bytes, kMemoryUses>& peaks);

// Stage times read back from an engine's Trace of `g` (same stage ids).
StageTimes times_of_trace(const Trace& t);

}  // namespace oom
