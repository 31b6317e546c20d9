#include "planner/engine/analytic_evaluator.h"

#include <algorithm>
#include <cmath>
#include <limits>
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
  finish_s.resize(first_.size() - 1);
  return step_s_from(duration_s, finish_s, 0);
}

Seconds AnalyticSchedule::step_s_from(const std::vector<Seconds>& duration_s, std::vector<Seconds>& finish_s,
                                      std::size_t from) const {
  const std::size_t n = first_.size() - 1;
  OOM_ASSERT(duration_s.size() == n && finish_s.size() == n && from <= n, "one duration and finish time per stage");
  // Raw pointers: the stores into finish_s cannot alias the predecessor arrays.
  const std::int32_t* first = first_.data();
  const std::int32_t* preds = preds_.data();
  const Seconds* d = duration_s.data();
  Seconds* f = finish_s.data();
  Seconds step = 0;
  for (std::size_t v = 0; v < from; ++v) step = std::max(step, f[v]);
  for (std::size_t v = from; v < n; ++v) {
    Seconds ready = 0;
    for (std::int32_t i = first[v]; i < first[v + 1]; ++i) ready = std::max(ready, f[static_cast<std::size_t>(preds[i])]);
    f[v] = ready + d[v];
    step = std::max(step, f[v]);
  }
  return step;
}

HostSharing::HostSharing(const StepGraph& g, const DurationModel& durations) {
  std::vector<int> rank_link;
  for (int r = 0; r < g.gpus; ++r) rank_link.push_back(durations.pcie_link_of_rank(r, g.gpus));
  int nodes = g.numa_nodes;
  for (const Resource& r : g.resources) nodes = std::max(nodes, r.numa + 1);
  std::vector<std::vector<const Resource*>> per(static_cast<std::size_t>(std::max(0, nodes)));
  for (const Resource& r : g.resources) {
    const bool cpu = r.kind == ResourceKind::kCpuUpdate || r.kind == ResourceKind::kHostPrep;
    const bool dma = r.kind == ResourceKind::kH2d || r.kind == ResourceKind::kD2h || r.kind == ResourceKind::kExpertGradD2h;
    if (r.numa >= 0 && (cpu || dma) && !r.order.empty()) per[static_cast<std::size_t>(r.numa)].push_back(&r);
  }
  node_first_.push_back(0);
  for (const auto& lanes : per) {
    std::vector<std::pair<int, int>> channels;  // (link, direction) of this node's copy lanes
    for (const Resource* r : lanes) {
      Lane lane;
      lane.cpu = r->kind == ResourceKind::kCpuUpdate || r->kind == ResourceKind::kHostPrep;
      if (!lane.cpu) {
        const int link = r->gpu >= 0 && static_cast<std::size_t>(r->gpu) < rank_link.size() ? rank_link[static_cast<std::size_t>(r->gpu)] : r->gpu;
        const std::pair<int, int> key{link, r->kind == ResourceKind::kH2d ? 0 : 1};
        auto it = std::find(channels.begin(), channels.end(), key);
        if (it == channels.end()) it = channels.insert(channels.end(), key);
        lane.channel = channels_ + static_cast<std::int32_t>(it - channels.begin());
      }
      lane.first = static_cast<std::int32_t>(stages_.size());
      stages_.insert(stages_.end(), r->order.begin(), r->order.end());
      lane.last = static_cast<std::int32_t>(stages_.size());
      lanes_.push_back(lane);
    }
    channel_first_.push_back(channels_);
    channels_ += static_cast<std::int32_t>(channels.size());
    node_first_.push_back(static_cast<std::int32_t>(lanes_.size()));
    dram_Bps_.push_back(durations.host_dram_Bps(static_cast<int>(dram_Bps_.size())));
  }
  channel_first_.push_back(channels_);
  for (const std::int32_t v : stages_) dram_bytes_.push_back(static_cast<double>(host_dram_bytes(g.stage(v))));
}

Seconds HostSharing::settle(const AnalyticSchedule& schedule, const std::vector<StageCost>& lane_costs,
                            std::vector<Seconds>& duration_s, std::vector<Seconds>& finish_s) const {
  const std::size_t n = stages_.size();
  OOM_ASSERT(lane_costs.size() == n, "one cost per sharing stage");
  std::vector<Seconds> alone(n), demand(n), progress(n);
  // Per stage: its last correction and the fraction of a correction it takes (halved each time
  // the correction turns back, doubled up to all of it while it keeps its direction).
  std::vector<Seconds> last_correction(n, 0.0);
  std::vector<double> gain(n, 1.0);
  for (std::size_t i = 0; i < n; ++i) {
    alone[i] = lane_costs[i].alone_s();
    demand[i] = alone[i] > 0 ? dram_bytes_[i] / alone[i] : 0.0;
  }
  auto work_s = [&](std::size_t i) {
    const auto v = static_cast<std::size_t>(stages_[i]);
    return alone[i] > 0 ? duration_s[v] - lane_costs[i].fixed_s : 0.0;
  };
  // Per lane: the participant it is at, whether that one's work has begun, the time of its next
  // edge, and the value of its progress integral when the work began.
  const std::size_t lanes = lanes_.size();
  std::vector<std::int32_t> at(lanes);
  std::vector<char> begun(lanes);
  std::vector<Seconds> edge(lanes);
  std::vector<double> since(lanes);
  // Per PCIe channel (a link or switch uplink, one direction): copies running on it, the DRAM
  // they ask alone, and the progress integral of one copy on it (each of k gets 1/k of it).
  const auto channels = static_cast<std::size_t>(channels_);
  std::vector<int> on_channel(channels);
  std::vector<double> channel_asks(channels), channel_integral(channels);
  std::vector<std::pair<double, std::size_t>> asks;
  Seconds step = 0;
  bool settled = false;
  for (int pass = 0;; ++pass) {
    step = schedule.step_s(duration_s, finish_s);
    if (settled || pass == kHostSharingPasses) break;
    std::fill(progress.begin(), progress.end(), 0.0);
    for (std::size_t node = 0; node + 1 < node_first_.size(); ++node) {
      const double capacity = dram_Bps_[node];
      const auto l0 = static_cast<std::size_t>(node_first_[node]), l1 = static_cast<std::size_t>(node_first_[node + 1]);
      const auto c0 = static_cast<std::size_t>(channel_first_[node]), c1 = static_cast<std::size_t>(channel_first_[node + 1]);
      // Each lane's stages run one after another, so its begin/end edges come in time order:
      // merge the lanes (a few per node) instead of sorting.
      // The lane's next stage with work, and its begin edge (+∞ past the lane's last stage).
      auto seek = [&](std::size_t l) {
        auto& i = at[l];
        while (i < lanes_[l].last && work_s(static_cast<std::size_t>(i)) <= 0) ++i;
        if (i < lanes_[l].last) {
          const auto u = static_cast<std::size_t>(i);
          edge[l] = finish_s[static_cast<std::size_t>(stages_[u])] - work_s(u);
        } else {
          edge[l] = std::numeric_limits<Seconds>::infinity();
        }
      };
      for (std::size_t l = l0; l < l1; ++l) {
        at[l] = lanes_[l].first;
        begun[l] = 0;
        seek(l);
      }
      for (std::size_t c = c0; c < c1; ++c) {
        on_channel[c] = 0;
        channel_asks[c] = channel_integral[c] = 0;
      }
      // While DRAM is not oversubscribed a CPU stage advances at its core share and a copy at its
      // channel share; a contended interval adds each running stage's shortfall directly.
      double cpu_integral = 0, cpu_asks = 0;
      int cpus = 0;
      Seconds previous = 0;
      for (;;) {
        // The next edge: the earliest; ends before beginnings at one instant (a stage that ends
        // as another begins shares nothing with it).
        std::size_t next = l0;
        for (std::size_t l = l0 + 1; l < l1; ++l) {
          if (edge[l] < edge[next] || (edge[l] == edge[next] && begun[l] > begun[next])) next = l;
        }
        if (next == l1 || edge[next] == std::numeric_limits<Seconds>::infinity()) break;
        const Seconds when = edge[next];
        const Seconds span = when - previous;
        if (span > 0) {
          const double core_share = cpus > 0 ? 1.0 / cpus : 1.0;
          cpu_integral += span * core_share;
          double asked = cpu_asks * core_share;
          for (std::size_t c = c0; c < c1; ++c) {
            if (on_channel[c] == 0) continue;
            channel_integral[c] += span / on_channel[c];
            asked += channel_asks[c] / on_channel[c];
          }
          if (capacity > 0 && asked > capacity * (1 + 1e-12)) {
            // A max-min fair split of the capacity over what each running stage asks.
            asks.clear();
            for (std::size_t l = l0; l < l1; ++l) {
              if (!begun[l]) continue;
              const auto i = static_cast<std::size_t>(at[l]);
              const double share = lanes_[l].cpu ? core_share : 1.0 / on_channel[static_cast<std::size_t>(lanes_[l].channel)];
              asks.emplace_back(demand[i] * share, l);
            }
            std::sort(asks.begin(), asks.end());
            double left = capacity;
            auto waiting = static_cast<double>(asks.size());
            for (const auto& [ask, l] : asks) {
              const auto i = static_cast<std::size_t>(at[l]);
              const double granted = std::min(ask, left / waiting);
              left -= granted;
              waiting -= 1;
              if (demand[i] > 0) progress[i] += span * (granted - ask) / demand[i];
            }
          }
        }
        previous = when;
        const auto i = static_cast<std::size_t>(at[next]);
        const Lane& lane = lanes_[next];
        const auto c = static_cast<std::size_t>(std::max(0, lane.channel));
        if (!begun[next]) {
          begun[next] = 1;
          edge[next] = finish_s[static_cast<std::size_t>(stages_[i])];
          if (lane.cpu) {
            since[next] = cpu_integral;
            cpu_asks += demand[i];
            ++cpus;
          } else {
            since[next] = channel_integral[c];
            channel_asks[c] += demand[i];
            ++on_channel[c];
          }
        } else {
          begun[next] = 0;
          if (lane.cpu) {
            progress[i] += cpu_integral - since[next];
            cpu_asks -= demand[i];
            --cpus;
          } else {
            progress[i] += channel_integral[c] - since[next];
            channel_asks[c] -= demand[i];
            --on_channel[c];
          }
          ++at[next];
          seek(next);
        }
      }
    }
    // Each stage's work takes its alone time at the mean progress rate it saw: move towards it.
    double largest = 0;  // the largest correction, relative to the work time it corrects
    for (std::size_t i = 0; i < n; ++i) {
      const auto v = static_cast<std::size_t>(stages_[i]);
      const Seconds w = work_s(i);
      if (w <= 0 || progress[i] <= 0) continue;
      const Seconds correction = alone[i] * w / progress[i] - w;
      largest = std::max(largest, std::abs(correction) / w);
      gain[i] = correction * last_correction[i] < 0 ? 0.5 * gain[i] : std::min(1.0, 2 * gain[i]);
      last_correction[i] = correction;
      duration_s[v] = lane_costs[i].fixed_s + w + gain[i] * correction;
    }
    settled = largest < kHostSharingTolerance;
  }
  return step;
}

StageTimes analytic_step_times(const StepGraph& g, const DurationModel& durations, std::vector<Seconds>* duration_s) {
  std::vector<StageCost> costs;
  costs.reserve(g.stages.size());
  std::vector<Seconds> d;
  d.reserve(g.stages.size());
  for (const Stage& s : g.stages) {
    costs.push_back(durations.cost(s, g));
    d.push_back(costs.back().duration_s());
  }
  const HostSharing sharing(g, durations);
  if (!sharing.empty()) {
    std::vector<StageCost> lane_costs;
    lane_costs.reserve(sharing.stages().size());
    for (const std::int32_t v : sharing.stages()) lane_costs.push_back(costs[static_cast<std::size_t>(v)]);
    std::vector<Seconds> finish;
    sharing.settle(AnalyticSchedule(g), lane_costs, d, finish);
  }
  StageTimes t = analytic_times(g, d);
  if (duration_s) *duration_s = std::move(d);
  return t;
}

MemoryPeaks memory_peaks(const StepGraph& g, const StageTimes& times, bool keep_samples) {
  struct Event {
    Seconds time_s;
    Bytes bytes;
    int device;  // GPUs 0..gpus−1, then NUMA nodes
  };
  // One node's stages standing for every node's (StepGraph::ranks_emitted): every node's memory
  // is node 0's, whose stages carry every node's events at the same times, so node 0's GPUs and
  // NUMA nodes are followed and the others take their timelines (when the bases agree).
  const int emit = g.ranks_emitted;
  const int nodes = emit > 0 && g.gpus % emit == 0 ? g.gpus / emit : 0;
  const int numa_per_node = nodes > 1 && g.numa_nodes % nodes == 0 ? g.numa_nodes / nodes : 0;
  const auto representative = [&](int d) {
    return numa_per_node == 0 ? d : d < g.gpus ? d % emit : g.gpus + (d - g.gpus) % numa_per_node;
  };
  const auto base_of = [&](int d) {
    return d < g.gpus ? g.gpu_base_bytes.at(static_cast<std::size_t>(d)) : g.numa_base_bytes.at(static_cast<std::size_t>(d - g.gpus));
  };
  bool mirror = numa_per_node > 0;
  for (int d = 0; mirror && d < g.gpus + g.numa_nodes; ++d) mirror = base_of(d) == base_of(representative(d));
  const auto followed = [&](int d) { return !mirror || representative(d) == d; };
  std::vector<Event> events;
  for (const Stage& s : g.stages) {
    for (const MemoryEvent& m : s.memory) {
      const int device = m.space == MemorySpace::kGpu ? m.device : g.gpus + m.device;
      if (!followed(device)) continue;
      const Seconds at = m.at_end ? times.finish_s[static_cast<std::size_t>(s.id)] : times.start_s[static_cast<std::size_t>(s.id)];
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
    if (!followed(d)) {  // a mirrored node's device: its representative's timeline
      const auto from = static_cast<std::size_t>(representative(d));
      peak[i] = peak[from];
      out.timelines[i].samples = out.timelines[from].samples;
    }
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
  return trace_of_times(g, analytic_step_times(g, durations), name());
}

Trace trace_of_times(const StepGraph& g, const StageTimes& times, const std::string& engine) {
  MemoryPeaks mem = memory_peaks(g, times);
  Trace t;
  t.engine = engine;
  t.stages.reserve(g.stages.size());
  for (const Stage& s : g.stages) {
    const auto i = static_cast<std::size_t>(s.id);
    t.stages.push_back({s.id, s.name, s.key, std::string(op_kind_name(s.op)), g.resource(s.resource).name, times.start_s[i],
                        times.finish_s[i], s.layer, s.bytes, s.flops, s.ops});
  }
  t.memory = std::move(mem.timelines);
  t.gpu_peak_bytes = std::move(mem.gpu_peak_bytes);
  t.numa_peak_bytes = std::move(mem.numa_peak_bytes);
  finalize_trace(t);
  return t;
}

}  // namespace oom
