// `oom calibrate --backend`: measure this machine with short executions, record plan-driven steps
// of tiny models, and fit the cost model's physical constants to them.
//
// measure_local_hardware() times a large FP32 GEMM (the compute peak: the CPU's, or the GPU's
// BF16 GEMM with CUDA), a large copy (memory bandwidth; on a CPU also the "link" rate, since a
// transfer there is a copy within DRAM; with CUDA pinned H2D/D2H copies) and the CPU AdamW kernel
// on a large buffer, and returns a HardwareSpec named `name` whose every number names its source
// (the measurement). record_local_steps() runs each (model, batch, seq, plan) with TorchExecutor
// and returns step records: `measured_steps` rounds, each running every record once (two warm-up
// steps, then the median of three measured steps; on the CPU in a child process of its own, so
// that no record's steps depend on the records run before it), and the fastest round (interference
// from other load only adds time). The fit itself is
// planner/calibration/calibrate.h's fit_calibration(): the same few constants for every record, some records
// held out to check it. No LibTorch types in this header. Not thread-safe.
#pragma once

#include <string>
#include <vector>

#include "costmodel/hardware_spec.h"
#include "planner/plan/plan.h"
#include "traces/records.h"

namespace oom::backend {

struct LocalMeasureOptions {
  std::string name = "local-cpu";
  double seconds_per_probe = 0.3;  // time budget of each micro-measurement
  bool use_cuda = true;            // measure the first CUDA device when present
  // CPU probes: time by process CPU time (robust to other load on a shared machine; meant for
  // one LibTorch thread), else wall time.
  bool cpu_time = true;
  int threads = 0;  // LibTorch intra-op threads for the probes and the runs; 0 = leave as is
};
HardwareSpec measure_local_hardware(const LocalMeasureOptions& options = {});

struct LocalRun {
  std::string id;      // record id
  std::string model;   // model name
  std::int64_t batch = 1, seq = 1;
  Plan plan;
  // Predicted but not fitted by `oom calibrate --backend`: every third run along a diagonal of the
  // (model, shape) × plan grid, so that each plan kind is both fitted and held out.
  bool held_out = false;
};
// The recorded set: tiny models (GDN + attention hybrids, GQA, K = V, Mixtral-style) at a small
// and a larger shape, several plans each (plain, sub-batches + head groups, GDN/MoE chunks,
// kept O/LSE + regenerated boundaries, boundaries held on the device, the EP path on one rank).
std::vector<LocalRun> default_local_runs();

// Runs each plan (in `measured_steps` interleaved rounds) and returns one step record per run on `hardware` (which must be loadable by
// name when the records are validated later). Throws InputError, before any run, for a plan that
// cannot run; std::runtime_error naming the record when a run fails.
// With `cpu_time`, a step's time is the process CPU time it used (TorchExecutorOptions::Clock).
RecordSet record_local_steps(const std::vector<LocalRun>& runs, const std::string& hardware, int measured_steps = 5,
                             int threads = 0, bool cpu_time = true);

}  // namespace oom::backend
