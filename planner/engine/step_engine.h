// StepEngine: something that executes a StepGraph and returns its Trace; StepEngines: the engines
// a program offers, by name.
//
// Engines are the interchangeable middle of DESIGN.md's picture: the analytic evaluator
// (planner/engine/analytic_evaluator.h, name "analytic") and the SimGrid simulator (sim/, name
// "simgrid") take the same graph and the same DurationModel. A program builds its StepEngines once
// where it starts (the `oom` command, the Python module, a test) and passes it to what picks an
// engine by name (`--engine NAME`):
//   - a default-constructed StepEngines offers "analytic" only;
//   - the sim/ library's `simulator_engines()` (sim/simgrid_engine.h) adds "simgrid"; the `oom`
//     command and the Python module use it when they are built with the oom_sim library;
//   - a test adds its own engines to its own table.
// There is no process-wide table: two tables never see each other's engines.
// Contract of execute(): the Trace has one TraceStage per graph stage (same id, name, kind =
// op_kind_name, resource = the resource's name, layer, bytes, flops), memory timelines for every
// GPU ("gpu<i>") and NUMA node ("numa<n>") starting from the graph's base bytes, per-device peaks
// (GPU peaks include the graph's headroom fraction), and step_s = the last stage's end.
// Engines are deterministic.
// Thread-safety: a StepEngines is not modified once built, and its const members may be called
// from several threads (each make() calls the factory, which must allow that: the two above do);
// add() is for building it, on one thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "planner/engine/duration_model.h"
#include "planner/lowering/step_graph.h"
#include "traces/trace.h"

namespace oom {

// How an engine's runs may share the machine, which is what decides how many a caller runs at once.
enum class EngineConcurrency {
  kInThread,   // computes on the calling thread, pure: one run per core at once
  kInProcess,  // each run in a process of its own (its thread waits): one more run than cores
  kExclusive,  // one run at a time (an engine that times its runs, or one that says nothing)
};

class StepEngine {
 public:
  virtual ~StepEngine() = default;
  virtual std::string name() const = 0;
  virtual Trace execute(const StepGraph& g, const DurationModel& durations) const = 0;
  // The step time execute() would report, for callers that need nothing else (the calibration
  // fit asks it thousands of times). An engine overrides it where it can skip building the Trace.
  virtual Seconds step_s(const StepGraph& g, const DurationModel& durations) const { return execute(g, durations).step_s; }
  virtual EngineConcurrency concurrency() const { return EngineConcurrency::kExclusive; }
};

using StepEngineFactory = std::function<std::unique_ptr<StepEngine>()>;

class StepEngines {
 public:
  // "analytic" only.
  StepEngines();

  // Offers `factory`'s engines under `name`, replacing an engine of that name. Returns *this, so
  // that a table is built in one expression: StepEngines().add("simgrid", make_simgrid_engine).
  StepEngines& add(std::string name, StepEngineFactory factory);
  // A new engine of that name, or nullptr when this table offers none.
  std::unique_ptr<StepEngine> make(const std::string& name) const;
  bool has(const std::string& name) const;
  // The names offered, sorted ("analytic" always among them).
  std::vector<std::string> names() const;

 private:
  std::map<std::string, StepEngineFactory> factories_;
};

}  // namespace oom
