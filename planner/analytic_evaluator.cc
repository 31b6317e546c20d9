#include "planner/analytic_evaluator.h"

#include <algorithm>
#include <utility>

#include <boost/graph/compressed_sparse_row_graph.hpp>
#include <fmt/format.h>

#include "costmodel/input_error.h"

namespace oom {
namespace {

// Predecessor graph: an edge v → u for every u that v waits for (data, buffer reuse, stream
// order). Sources are sorted by construction (stages in id order), as CSR construction wants.
using PredGraph = boost::compressed_sparse_row_graph<boost::directedS>;

PredGraph predecessor_graph(const StepGraph& g) {
  std::vector<StageId> previous_on_resource(g.stages.size(), -1);
  for (const Resource& r : g.resources) {
    for (std::size_t i = 1; i < r.order.size(); ++i) previous_on_resource[static_cast<std::size_t>(r.order[i])] = r.order[i - 1];
  }
  std::vector<std::pair<std::size_t, std::size_t>> edges;
  edges.reserve(g.stages.size() * 3);
  for (const Stage& s : g.stages) {
    const auto v = static_cast<std::size_t>(s.id);
    for (const StageId u : s.deps) edges.emplace_back(v, static_cast<std::size_t>(u));
    if (previous_on_resource[v] >= 0) edges.emplace_back(v, static_cast<std::size_t>(previous_on_resource[v]));
  }
  return PredGraph(boost::edges_are_sorted, edges.begin(), edges.end(), g.stages.size());
}

}  // namespace

StageTimes analytic_times(const StepGraph& g, const std::vector<Seconds>& duration_s) {
  OOM_ASSERT(duration_s.size() == g.stages.size(), "one duration per stage");
  const PredGraph pred = predecessor_graph(g);
  StageTimes t;
  t.start_s.assign(g.stages.size(), 0.0);
  t.finish_s.assign(g.stages.size(), 0.0);
  // Stage ids are a topological order of data and resource edges (step_graph.h), so one pass
  // in id order evaluates Eq. 3.
  for (std::size_t v = 0; v < g.stages.size(); ++v) {
    Seconds ready = 0;
    auto [e, end] = boost::out_edges(v, pred);
    for (; e != end; ++e) ready = std::max(ready, t.finish_s[boost::target(*e, pred)]);
    t.start_s[v] = ready;
    t.finish_s[v] = ready + duration_s[v];
    t.step_s = std::max(t.step_s, t.finish_s[v]);
  }
  return t;
}

AnalyticSchedule::AnalyticSchedule(const StepGraph& g) {
  std::vector<StageId> previous_on_resource(g.stages.size(), -1);
  for (const Resource& r : g.resources) {
    for (std::size_t i = 1; i < r.order.size(); ++i) previous_on_resource[static_cast<std::size_t>(r.order[i])] = r.order[i - 1];
  }
  first_.reserve(g.stages.size() + 1);
  preds_.reserve(g.stages.size() * 2);
  for (const Stage& s : g.stages) {
    first_.push_back(static_cast<std::int32_t>(preds_.size()));
    for (const StageId u : s.deps) preds_.push_back(u);
    const StageId prev = previous_on_resource[static_cast<std::size_t>(s.id)];
    if (prev >= 0) preds_.push_back(prev);
  }
  first_.push_back(static_cast<std::int32_t>(preds_.size()));
}

Seconds AnalyticSchedule::step_s(const std::vector<Seconds>& duration_s, std::vector<Seconds>& finish_s) const {
  const std::size_t n = first_.size() - 1;
  OOM_ASSERT(duration_s.size() == n, "one duration per stage");
  finish_s.resize(n);
  Seconds step = 0;
  for (std::size_t v = 0; v < n; ++v) {
    Seconds ready = 0;
    for (std::int32_t i = first_[v]; i < first_[v + 1]; ++i) ready = std::max(ready, finish_s[static_cast<std::size_t>(preds_[static_cast<std::size_t>(i)])]);
    finish_s[v] = ready + duration_s[v];
    step = std::max(step, finish_s[v]);
  }
  return step;
}

MemoryPeaks memory_peaks(const StepGraph& g, const StageTimes& times, bool keep_samples) {
  struct Event {
    Seconds time_s;
    Bytes bytes;
    int device;  // GPUs 0..gpus−1, then NUMA nodes
  };
  std::vector<Event> events;
  for (const Stage& s : g.stages) {
    for (const MemoryEvent& m : s.memory) {
      const Seconds at = m.at_end ? times.finish_s[static_cast<std::size_t>(s.id)] : times.start_s[static_cast<std::size_t>(s.id)];
      const int device = m.space == MemorySpace::kGpu ? m.device : g.gpus + m.device;
      events.push_back({at, m.bytes, device});
    }
  }
  // Frees before allocations at equal times: a buffer released at the end of its last consumer
  // is reusable by a stage that starts at that instant.
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    if (a.time_s != b.time_s) return a.time_s < b.time_s;
    return a.bytes < b.bytes;
  });
  const int devices = g.gpus + g.numa_nodes;
  std::vector<Bytes> held(static_cast<std::size_t>(devices), 0);
  std::vector<Bytes> peak(static_cast<std::size_t>(devices), 0);
  MemoryPeaks out;
  out.timelines.resize(static_cast<std::size_t>(devices));
  for (int d = 0; d < devices; ++d) {
    const auto i = static_cast<std::size_t>(d);
    held[i] = d < g.gpus ? g.gpu_base_bytes.at(i) : g.numa_base_bytes.at(static_cast<std::size_t>(d - g.gpus));
    peak[i] = held[i];
    out.timelines[i].device = d < g.gpus ? fmt::format("gpu{}", d) : fmt::format("numa{}", d - g.gpus);
    if (keep_samples) out.timelines[i].samples.push_back({0.0, held[i]});
  }
  for (const Event& e : events) {
    const auto i = static_cast<std::size_t>(e.device);
    held[i] += e.bytes;
    peak[i] = std::max(peak[i], held[i]);
    if (keep_samples) {
      auto& samples = out.timelines[i].samples;
      if (!samples.empty() && samples.back().time_s == e.time_s) {
        samples.back().bytes = held[i];
      } else {
        samples.push_back({e.time_s, held[i]});
      }
    }
  }
  for (int d = 0; d < devices; ++d) {
    const auto i = static_cast<std::size_t>(d);
    if (d < g.gpus) {
      const Bytes with_headroom = peak[i] + static_cast<Bytes>(static_cast<double>(peak[i]) * g.gpu_headroom_fraction);
      out.gpu_peak_bytes.push_back(with_headroom);
      out.timelines[i].peak_bytes = with_headroom;
    } else {
      out.numa_peak_bytes.push_back(peak[i]);
      out.timelines[i].peak_bytes = peak[i];
    }
  }
  return out;
}

Trace AnalyticEngine::execute(const StepGraph& g, const DurationModel& durations) const {
  std::vector<Seconds> d(g.stages.size());
  for (const Stage& s : g.stages) d[static_cast<std::size_t>(s.id)] = durations.duration_s(s, g);
  const StageTimes times = analytic_times(g, d);
  return trace_of_times(g, times, name());
}

Trace trace_of_times(const StepGraph& g, const StageTimes& times, const std::string& engine) {
  MemoryPeaks mem = memory_peaks(g, times);
  Trace t;
  t.engine = engine;
  t.stages.reserve(g.stages.size());
  for (const Stage& s : g.stages) {
    const auto i = static_cast<std::size_t>(s.id);
    t.stages.push_back({s.id, s.name, std::string(op_kind_name(s.op)), g.resource(s.resource).name, times.start_s[i],
                        times.finish_s[i], s.layer, s.bytes, s.flops});
  }
  t.memory = std::move(mem.timelines);
  t.gpu_peak_bytes = std::move(mem.gpu_peak_bytes);
  t.numa_peak_bytes = std::move(mem.numa_peak_bytes);
  finalize_trace(t);
  return t;
}

}  // namespace oom
