// StepEngine: something that executes a StepGraph and returns its Trace.
//
// Engines are the interchangeable middle of DESIGN.md's picture: the analytic evaluator
// (planner/engine/analytic_evaluator.h, name "analytic") and the SimGrid simulator (sim/, name
// "simgrid") take the same graph and the same DurationModel. Engines register themselves by name
// so that commands can pick one with `--engine NAME`:
//   - "analytic" is always registered;
//   - the sim/ library provides `sim/simgrid_engine.h` declaring
//       namespace oom { std::unique_ptr<StepEngine> make_simgrid_engine(); }
//     and the `oom` command registers it under "simgrid" when that header and the oom_sim
//     library exist.
// Contract of execute(): the Trace has one TraceStage per graph stage (same id, name, kind =
// op_kind_name, resource = the resource's name, layer, bytes, flops), memory timelines for every
// GPU ("gpu<i>") and NUMA node ("numa<n>") starting from the graph's base bytes, per-device peaks
// (GPU peaks include the graph's headroom fraction), and step_s = the last stage's end.
// Engines are deterministic. The registry is not thread-safe to modify; register at start-up.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "planner/engine/duration_model.h"
#include "planner/lowering/step_graph.h"
#include "traces/trace.h"

namespace oom {

class StepEngine {
 public:
  virtual ~StepEngine() = default;
  virtual std::string name() const = 0;
  virtual Trace execute(const StepGraph& g, const DurationModel& durations) const = 0;
};

using StepEngineFactory = std::function<std::unique_ptr<StepEngine>()>;

// Adds (or replaces) the factory for `name`.
void register_step_engine(const std::string& name, StepEngineFactory factory);
// A new engine by name, or nullptr when no engine of that name is registered.
std::unique_ptr<StepEngine> make_step_engine(const std::string& name);
// Registered names, sorted ("analytic" always among them).
std::vector<std::string> step_engine_names();

}  // namespace oom
