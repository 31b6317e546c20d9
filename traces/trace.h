// Trace: what one executed (or simulated) training step did, stage by stage, and the memory it held.
//
// Every executor (analytic evaluator, SimGrid simulator, LibTorch backend) returns a Trace with the
// same stage names, so predicted, simulated and measured steps can be held against each other
// stage by stage (DESIGN.md "Trace"). A stage is {id, name, kind, resource, start_s, end_s, layer,
// bytes, flops}; memory is a list of samples per device ("gpu0", "numa1", ...), each sample the
// bytes held on that device from its time on. Times are seconds from the start of the step; bytes
// are exact. `kind` is the operator kind of the stage (e.g. "gemm", "h2d", "cpu_adamw": the names of
// planner/lowering/step_graph.h's OpKind), `resource` the name of the stream or executor that ran it
// (e.g. "gpu0.compute", "gpu1.h2d", "numa0.cpu_update"). Plain value type; not thread-safe to
// mutate from several threads.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/units.h"
#include "traces/stage_key.h"

namespace oom {

struct TraceStage {
  std::int64_t id = 0;
  std::string name;      // format_stage_key(key), e.g. "g0.fwd.L3.moe.c0.a2a_dispatch"
  StageKey key;          // the stage's identity; read it instead of taking the name apart
  std::string kind;      // operator kind, e.g. "attention", "h2d"
  std::string resource;  // e.g. "gpu0.compute"
  Seconds start_s = 0;
  Seconds end_s = 0;
  int layer = -1;        // decoder index, −1 when the stage belongs to no decoder
  Bytes bytes = 0;       // bytes moved (transfers) or touched (updates); 0 for pure compute
  Flops flops = 0;       // floating-point work; 0 for transfers
  // Operators the stage dispatches: predicted, the lowering's Stage::ops; measured, the ATen
  // operator calls the recording thread made during the stage (StageRecorder). 0: not counted.
  std::int64_t ops = 0;
  // Host synchronisations the stage made (measured: backend/measure/host_syncs.h says what counts;
  // the step keeps 0 in every stage). 0 in predictions.
  std::int64_t syncs = 0;
  Seconds duration_s() const { return end_s - start_s; }
  bool operator==(const TraceStage&) const = default;
};

// Bytes held on a device from `time_s` on (until the next sample).
struct MemorySample {
  Seconds time_s = 0;
  Bytes bytes = 0;
  bool operator==(const MemorySample&) const = default;
};

// The memory timeline of one device: a GPU ("gpu<i>") or a NUMA node's DRAM ("numa<n>").
struct MemoryTimeline {
  std::string device;
  std::vector<MemorySample> samples;  // in time order
  Bytes peak_bytes = 0;               // the largest sample (plus any headroom the executor adds)
  bool operator==(const MemoryTimeline&) const = default;
};

struct Trace {
  std::string engine;                     // "analytic", "simgrid", "torch", ...
  Seconds step_s = 0;                     // end of the last stage
  std::vector<TraceStage> stages;         // in start-time order (ties by id)
  std::vector<MemoryTimeline> memory;     // one per device, GPUs first then NUMA nodes
  std::vector<Bytes> gpu_peak_bytes;      // per GPU of the step
  std::vector<Bytes> numa_peak_bytes;     // per NUMA node of the first node
  // Measured: the host synchronisations of the step's driving thread, in its stages and between
  // them (the loss and the clipping norm it reads); over ranks (merge_rank_traces) the most any
  // rank's made; −1 where not counted (predictions).
  std::int64_t host_syncs = -1;
  bool operator==(const Trace&) const = default;
};

// Serializes every field. trace_from_json(trace_to_json(t)) == t.
nlohmann::json trace_to_json(const Trace& t);
// Parses the form trace_to_json() writes; each stage's key is read from its name (a name that is
// not a stage key is an error). Throws InputError naming `file` and the field.
Trace trace_from_json(const nlohmann::json& j, const std::string& file);

// Chrome trace event JSON (opens in Perfetto and chrome://tracing): one process per device group
// ("gpu<i>", "numa<n>", "fabric"), one thread per resource, one complete ("X") event per stage with
// microsecond times and its layer, bytes and flops as args, plus one counter ("C") track per
// memory timeline in GiB.
nlohmann::json trace_to_chrome_json(const Trace& t);
// The keys trace_to_chrome_json() writes that `oom diff` reads back, each refused when unknown:
// the document's, a stage ("X") event's and its args'. The other events (process and thread
// names "M", memory counters "C") and "otherData" are free-form: nothing reads them.
inline constexpr std::array<const char*, 3> kChromeTraceKeys = {"traceEvents", "displayTimeUnit", "otherData"};
inline constexpr std::array<const char*, 8> kChromeStageEventKeys = {"ph", "name", "cat", "pid", "tid", "ts", "dur", "args"};
inline constexpr std::array<const char*, 6> kChromeStageArgKeys = {"id", "layer", "bytes", "flops", "ops", "syncs"};

// Busy seconds of one resource's stages (e.g. "gpu0.compute") by direction and operator kind:
// "forward.KIND" for forward and recompute stages, "backward.KIND" for backward ones (optimizer
// stages left out); the form of a step record's measured breakdown (Measured::compute_s).
std::map<std::string, double> busy_by_direction_and_kind(const Trace& t, const std::string& resource);

// The most bytes any GPU holds allocated at once: the largest sample of the "gpu<i>" timelines.
// A predicted GPU peak (gpu_peak_bytes, MemoryTimeline::peak_bytes) adds the allocator's
// fragmentation headroom ε of Eq. 2 to this, which is what the caching allocator reserves; a
// measured peak (torch.cuda.max_memory_allocated, the backend's allocated bytes) is the allocated
// one and compares with this. A trace without GPU samples gives its largest gpu_peak_bytes.
Bytes allocated_gpu_peak_bytes(const Trace& t);

// Sorts stages by (start_s, id), sets step_s to the latest end and each timeline's peak to at
// least its largest sample. Executors call it before returning a Trace.
void finalize_trace(Trace& t);

}  // namespace oom
