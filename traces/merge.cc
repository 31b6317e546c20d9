#include "traces/merge.h"

#include <algorithm>
#include <map>
#include <string>

namespace oom {

Trace merge_rank_traces(const std::vector<Trace>& ranks) {
  Trace t;
  std::map<std::string, MemoryTimeline> memory;
  std::int64_t id = 0;
  for (const Trace& r : ranks) {
    if (t.engine.empty()) t.engine = r.engine;
    t.host_syncs = std::max(t.host_syncs, r.host_syncs);  // the most any rank's driving thread made
    for (TraceStage s : r.stages) {
      s.id = id++;
      t.stages.push_back(std::move(s));
    }
    for (const MemoryTimeline& m : r.memory) {
      MemoryTimeline& into = memory[m.device];
      into.device = m.device;
      into.samples.insert(into.samples.end(), m.samples.begin(), m.samples.end());
      into.peak_bytes = std::max(into.peak_bytes, m.peak_bytes);
    }
  }
  // GPUs by index, then NUMA nodes by index ("gpu10" after "gpu9").
  std::vector<MemoryTimeline> gpus, numa;
  for (auto& [name, m] : memory) {
    std::sort(m.samples.begin(), m.samples.end(), [](const auto& a, const auto& b) { return a.time_s < b.time_s; });
    (name.rfind("gpu", 0) == 0 ? gpus : numa).push_back(std::move(m));
  }
  const auto by_index = [](const MemoryTimeline& a, const MemoryTimeline& b) {
    return a.device.size() != b.device.size() ? a.device.size() < b.device.size() : a.device < b.device;
  };
  std::sort(gpus.begin(), gpus.end(), by_index);
  std::sort(numa.begin(), numa.end(), by_index);
  for (auto& m : gpus) {
    t.gpu_peak_bytes.push_back(m.peak_bytes);
    t.memory.push_back(std::move(m));
  }
  for (auto& m : numa) {
    t.numa_peak_bytes.push_back(m.peak_bytes);
    t.memory.push_back(std::move(m));
  }
  finalize_trace(t);
  return t;
}

}  // namespace oom
