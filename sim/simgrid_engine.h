// SimGridEngine: executes a StepGraph on the SimGrid platform of its hardware (the "simgrid"
// StepEngine of planner/engine/step_engine.h).
//
// Shape (DESIGN.md "Simulator shape"): one S4U actor per graph resource (each GPU's compute
// stream, H2D and D2H copy engines, expert-gradient D2H stream and fabric port; each rank's CPU
// update executor and host preparation worker) walks the resource's issue order; a dependency on
// another resource's stage waits on that stage's s4u::Semaphore (the simulated CUDA event),
// released once per waiting edge when the stage ends. Nothing is built up front as an actor-free
// DAG (quadratic in SimGrid 3.32).
//
// A stage costs what the DurationModel says when it runs alone: its fixed part is a sleep, then
// its work runs on the SimGrid element of its resource, sized so that alone it takes
// work / exclusive_rate; concurrent work shares the element, which is where the engines differ:
//   - compute stream: an execution on the GPU host;
//   - H2D / D2H / expert-gradient D2H: a flow between the socket's memory host and the GPU
//     across DRAM, the host bridge and the GPU's PCIe direction;
//   - fabric port (collectives): one flow to every other member of `peers`, the stage's bytes
//     split evenly, over the NVLink ports and switch, the PCIe peer path or the nodes' NICs;
//   - CPU update executor / host preparation worker: a parallel execution over all cores of the
//     rank's socket (executors on one socket share its cores) together with the task's DRAM
//     traffic, a flow over the socket's DRAM link capped at the rate the task alone would draw;
//     the stage ends when both are done. DRAM traffic is the stage's `bytes` when the lowering
//     sets them, else params · (28 B AdamW, 10 B host accumulation, 6 B BF16 staging).
// Memory peaks come from the graph's own allocation events at the simulated times (SimGrid does
// not model capacity): planner/engine/analytic_evaluator.h's memory_peaks().
//
// Repeatability: every execute() runs SimGrid in a forked child process (sim/isolated_run.h) and
// brings back the stage times bit for bit, so one process can simulate any number of times and
// equal inputs give identical Traces. Units: seconds, bytes, FLOPs, parameters.
// Thread-safety: execute() is const and keeps no state, but forks: call it from one thread at a time
// (a fork while other threads run can deadlock the child on a lock they held).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "costmodel/hardware_spec.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/duration_model.h"
#include "planner/engine/step_engine.h"
#include "planner/lowering/step_graph.h"
#include "sim/platform.h"
#include "traces/trace.h"

namespace oom {

// The "simgrid" engine: hardware and calibration come from the CalibratedDurationModel that
// execute() receives.
std::unique_ptr<StepEngine> make_simgrid_engine();
// The engines of a program built with the simulator: "analytic" and "simgrid".
StepEngines simulator_engines();

}  // namespace oom

namespace oom::sim {

class SimGridEngine : public StepEngine {
 public:
  // Takes the hardware and calibration from the CalibratedDurationModel passed to execute().
  SimGridEngine() = default;
  // Simulates on `hardware` with the calibration's achieved rates (default_calibration(hardware)
  // when none): for duration models that are not a CalibratedDurationModel (tests, fakes).
  explicit SimGridEngine(HardwareSpec hardware, std::optional<Calibration> calibration = std::nullopt);

  std::string name() const override { return "simgrid"; }
  // Simulates `g` and returns its Trace (planner/engine/step_engine.h's contract). Throws
  // std::invalid_argument when no hardware is known (default-constructed engine and a duration
  // model that is not a CalibratedDurationModel), the graph has more ranks than the hardware
  // has GPUs or a resource names a rank or NUMA node it does not have; std::runtime_error when the simulation fails (e.g. a dependency cycle deadlocks).
  Trace execute(const StepGraph& g, const DurationModel& durations) const override;
  Seconds step_s(const StepGraph& g, const DurationModel& durations) const override { return simulate_times(g, durations).step_s; }
  // Each simulation runs in a process of its own (sim/isolated_run.h).
  EngineConcurrency concurrency() const override { return EngineConcurrency::kInProcess; }

  // The stage times alone (indexed by stage id), as execute() computes them.
  StageTimes simulate_times(const StepGraph& g, const DurationModel& durations) const;

 private:
  std::optional<HardwareSpec> hardware_;
  std::optional<Calibration> calibration_;
};

// Starts the simulation server (sim/isolated_run.h) of this process: from then on every
// simulation runs in a child of that small process instead of a child forked from the caller,
// with the same stage times. For a program that simulates many times from a large or
// multithreaded process (`oom calibrate --engine simgrid`, whose cross-validation runs over a
// thousand simulations from several threads); call it early, before anything large is loaded.
// Returns false (simulations then fork from the caller, as without it) when it cannot start.
bool start_simulation_server();

// The global GPU index each rank of a `ranks`-rank step runs on: HardwareSpec::rank_gpus()
// within a node, ranks beyond one node on the next nodes.
std::vector<int> rank_global_gpus(const HardwareSpec& h, int ranks);

}  // namespace oom::sim
