// StageRecorder: the measured timeline of one training step, stage by stage, as an oom::Trace.
//
// The plan-driven runtime (backend/train/plan_runtime.h) wraps each piece of work it does in a stage
// keyed exactly as the StepGraph lowering keys it (traces/stage_key.h: "g0.fwd.L3.attn.proj",
// "g0.bwd.L3.moe.c1.experts_bwd", "g0.opt.L3.layer.cpu_adamw", ...), with the lowering's operator
// kind ("gemm", "attention", "cpu_adamw", ...) and resource ("gpu0.compute", "gpu0.h2d",
// "numa0.cpu_update.r0"), so a measured step can be held against its prediction stage by stage
// (`oom diff`). Sub-batches run one by one carry their index in the key; several stages may carry
// the same key (a projection that runs before and after the core); comparisons sum them. Memory samples: the host's resident set
// ("numa0", from /proc/self/statm) and the compute device's allocator bytes ("gpu0", from a
// callback the runtime supplies; a rank names its own) at the end of every stage, the device's also
// with the most it held during a stage on a GPU resource (two samples at the stage's end: its peak,
// then what it holds after).
//
// Operators: while a step records, every ATen operator call is counted on the thread that makes
// it (an at::RecordFunction callback, nested calls included: each is one dispatch), and a stage
// keeps the calls its thread made between its start and end (TraceStage::ops). On the CPU the
// autograd engine runs a backward on the calling thread, so a backward stage's operators count
// too; on a GPU they run on the engine's device thread and are not counted.
//
// Host synchronisations (backend/measure/host_syncs.h): counted like the operators, per thread; a
// stage keeps its thread's (TraceStage::syncs), the trace the driving thread's from start_step()
// to finish(), which is called on the thread that started the step (Trace::host_syncs).
//
// Times are seconds from start_step() on a steady clock. A `sync` callback (CUDA: synchronize the
// device) runs before every time stamp so that asynchronous device work is attributed to its
// stage; recording therefore serializes the device streams and measures the work, not the overlap.
// Thread-safe: stages may be recorded from the update worker while the driving thread records others.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "costmodel/units.h"
#include "traces/trace.h"

namespace oom::backend {

// Process resident set size in bytes (Linux /proc/self/statm); 0 where unavailable.
Bytes process_rss_bytes();

class StageRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  struct Callbacks {
    std::function<void()> sync;           // wait for queued device work (may be empty)
    std::function<Bytes()> device_bytes;  // allocator bytes in use on the compute device (may be empty)
    // The most the device held since the last device_mark (may be empty); device_mark starts a new
    // peak from what it holds now. A GPU stage marks at its start and samples its own peak at its
    // end, so the timeline keeps the transients inside stages.
    std::function<Bytes()> device_peak;
    std::function<void()> device_mark;
    std::string device_name = "gpu0";     // the memory timelines' devices (a rank's GPU and NUMA node)
    std::string host_name = "numa0";
  };

  StageRecorder() = default;
  explicit StageRecorder(Callbacks cb) : cb_(std::move(cb)) {}
  StageRecorder(const StageRecorder&) = delete;
  StageRecorder& operator=(const StageRecorder&) = delete;
  ~StageRecorder();

  bool enabled() const { return enabled_; }
  // Starts a new step's timeline (clears the previous one) when `enabled`; otherwise records nothing.
  void start_step(bool enabled);
  // The memory timelines' device names (before start_step).
  void set_names(std::string device, std::string host) {
    cb_.device_name = std::move(device);
    cb_.host_name = std::move(host);
  }

  // A running stage; ends (and is recorded) when destroyed or at end().
  class Scope {
   public:
    Scope() = default;
    Scope(StageRecorder* r, TraceStage s);
    Scope(Scope&& o) noexcept;
    Scope& operator=(Scope&&) = delete;
    ~Scope() { end(); }
    void end();

   private:
    StageRecorder* r_ = nullptr;
    TraceStage s_;
    std::int64_t ops_at_start_ = 0;  // the thread's operator count when the stage started
    std::int64_t syncs_at_start_ = 0;  // and its host synchronisations
  };

  // Starts the stage `key` (its name is format_stage_key(key)) on `resource`, named as the
  // lowering names it (the graph's Resource: "gpu2.compute" on rank 2): no default, so that no
  // rank's stage lands on another's stream.
  Scope stage(const StageKey& key, const std::string& kind, const std::string& resource, Flops flops = 0, Bytes bytes = 0);

  // The recorded step: stages in start order, step_s, memory timelines and peaks (engine "torch").
  Trace finish();

 private:
  double now_s();
  void record(TraceStage s);

  void count_operators(bool on);

  Callbacks cb_;
  bool enabled_ = false;
  std::uint64_t operator_callback_ = 0;  // the at::RecordFunction callback while a step records (0: none)
  Clock::time_point t0_{};
  std::int64_t syncs_at_start_ = 0;  // the driving thread's host synchronisations at start_step()
  std::mutex mu_;
  std::vector<TraceStage> stages_;
  std::vector<MemorySample> host_samples_, device_samples_;
};

}  // namespace oom::backend
