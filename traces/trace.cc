#include "traces/trace.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "costmodel/input_limits.h"
#include "costmodel/json_input.h"
#include "traces/records.h"

namespace oom {
namespace {

constexpr std::int64_t kMaxBytes = std::int64_t{1} << 62;

// "gpu0.compute" → "gpu0"; a name without a dot is its own group.
std::string device_group(const std::string& resource) {
  const auto dot = resource.find('.');
  return dot == std::string::npos ? resource : resource.substr(0, dot);
}

std::vector<Bytes> read_bytes_list(const JsonReader& r, const std::string& key) {
  std::vector<Bytes> out;
  for (const auto v : r.integer_list(key, 0, kMaxBytes)) out.push_back(v);
  return out;
}

}  // namespace

nlohmann::json trace_to_json(const Trace& t) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : t.stages) {
    stages.push_back({{"id", s.id}, {"name", s.name}, {"kind", s.kind}, {"resource", s.resource},
                      {"start_s", s.start_s}, {"end_s", s.end_s}, {"layer", s.layer},
                      {"bytes", s.bytes}, {"flops", s.flops}});
    if (s.ops > 0) stages.back()["ops"] = s.ops;
    if (s.syncs > 0) stages.back()["syncs"] = s.syncs;
  }
  nlohmann::json memory = nlohmann::json::array();
  for (const auto& m : t.memory) {
    nlohmann::json samples = nlohmann::json::array();
    for (const auto& x : m.samples) samples.push_back({x.time_s, x.bytes});
    memory.push_back({{"device", m.device}, {"peak_bytes", m.peak_bytes}, {"samples", samples}});
  }
  nlohmann::json out = {{"engine", t.engine},
                        {"step_s", t.step_s},
                        {"gpu_peak_bytes", t.gpu_peak_bytes},
                        {"numa_peak_bytes", t.numa_peak_bytes},
                        {"stages", stages},
                        {"memory", memory}};
  if (t.host_syncs >= 0) out["host_syncs"] = t.host_syncs;
  return out;
}

Trace trace_from_json(const nlohmann::json& j, const std::string& file) {
  const JsonReader r(j, file);
  r.reject_unknown_keys({"engine", "step_s", "gpu_peak_bytes", "numa_peak_bytes", "stages", "memory", "host_syncs"});
  Trace t;
  t.engine = r.string_or("engine", "");
  t.step_s = r.number("step_s", 0.0, kMaxTraceSeconds);
  t.gpu_peak_bytes = read_bytes_list(r, "gpu_peak_bytes");
  t.numa_peak_bytes = read_bytes_list(r, "numa_peak_bytes");
  t.host_syncs = r.integer_or("host_syncs", -1, 0, kMaxBytes);
  const auto& stages = r.array("stages");
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const JsonReader s(stages[i], file, fmt::format("{}[{}]", r.field("stages"), i));
    s.reject_unknown_keys({"id", "name", "kind", "resource", "start_s", "end_s", "layer", "bytes", "flops", "ops", "syncs"});
    TraceStage st;
    st.id = s.integer("id", 0, kMaxBytes);
    st.name = s.string("name");
    const auto key = parse_stage_key(st.name);
    if (!key) s.fail_value(s.field("name"), st.name, kNotAStageKey);
    st.key = *key;
    st.kind = s.string("kind");
    st.resource = s.string("resource");
    st.start_s = s.number("start_s", 0.0, kMaxTraceSeconds);
    st.end_s = s.number("end_s", 0.0, kMaxTraceSeconds);
    if (st.end_s < st.start_s) s.fail("end_s", "ends before it starts");
    st.layer = static_cast<int>(s.integer_or("layer", -1, -1, 1 << 20));
    st.bytes = s.integer_or("bytes", 0, 0, kMaxBytes);
    st.flops = s.number_or("flops", 0.0, 0.0, 1e30);
    st.ops = s.integer_or("ops", 0, 0, kMaxBytes);
    st.syncs = s.integer_or("syncs", 0, 0, kMaxBytes);
    t.stages.push_back(std::move(st));
  }
  if (r.has("memory")) {
    const auto& memory = r.array("memory");
    for (std::size_t i = 0; i < memory.size(); ++i) {
      const std::string path = fmt::format("{}[{}]", r.field("memory"), i);
      const JsonReader m(memory[i], file, path);
      m.reject_unknown_keys({"device", "peak_bytes", "samples"});
      MemoryTimeline tl;
      tl.device = m.string("device");
      tl.peak_bytes = m.integer("peak_bytes", 0, kMaxBytes);
      const auto& samples = m.array("samples");
      for (std::size_t k = 0; k < samples.size(); ++k) {
        const auto& x = samples[k];
        if (!x.is_array() || x.size() != 2 || !x[0].is_number() || !x[1].is_number_integer()) {
          m.fail_value(fmt::format("{}[{}]", m.field("samples"), k), x, "expected [time_s, bytes]");
        }
        if (!(x[0].get<double>() >= 0 && x[0].get<double>() <= kMaxTraceSeconds)) {
          m.fail_value(fmt::format("{}[{}][0]", m.field("samples"), k), x[0], fmt::format("a time out of range 0..{:g} s", kMaxTraceSeconds));
        }
        tl.samples.push_back({x[0].get<double>(), x[1].get<Bytes>()});
      }
      t.memory.push_back(std::move(tl));
    }
  }
  return t;
}

nlohmann::json trace_to_chrome_json(const Trace& t) {
  // Processes are device groups, threads are resources; ids are assigned in first-seen order
  // over a sorted list so the output is deterministic.
  std::map<std::string, int> pid_of;
  std::map<std::string, std::pair<int, int>> tid_of;  // resource → (pid, tid)
  std::vector<std::string> resources;
  for (const auto& s : t.stages) resources.push_back(s.resource);
  for (const auto& m : t.memory) pid_of.emplace(m.device, 0);
  std::sort(resources.begin(), resources.end());
  resources.erase(std::unique(resources.begin(), resources.end()), resources.end());
  for (const auto& r : resources) pid_of.emplace(device_group(r), 0);
  int next_pid = 1;
  for (auto& [name, pid] : pid_of) pid = next_pid++;
  std::map<int, int> next_tid;
  for (const auto& r : resources) {
    const int pid = pid_of.at(device_group(r));
    tid_of[r] = {pid, ++next_tid[pid]};
  }

  nlohmann::json events = nlohmann::json::array();
  for (const auto& [name, pid] : pid_of) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", name}}}});
  }
  for (const auto& [name, ids] : tid_of) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", ids.first}, {"tid", ids.second},
                      {"args", {{"name", name}}}});
  }
  for (const auto& s : t.stages) {
    const auto [pid, tid] = tid_of.at(s.resource);
    events.push_back({{"ph", "X"}, {"name", s.name}, {"cat", s.kind}, {"pid", pid}, {"tid", tid},
                      {"ts", s.start_s * 1e6}, {"dur", (s.end_s - s.start_s) * 1e6},
                      {"args", {{"id", s.id}, {"layer", s.layer}, {"bytes", s.bytes}, {"flops", s.flops}}}});
    if (s.ops > 0) events.back()["args"]["ops"] = s.ops;
    if (s.syncs > 0) events.back()["args"]["syncs"] = s.syncs;
  }
  for (const auto& m : t.memory) {
    const int pid = pid_of.at(m.device);
    for (const auto& x : m.samples) {
      events.push_back({{"ph", "C"}, {"name", "memory_gib"}, {"pid", pid}, {"tid", 0}, {"ts", x.time_s * 1e6},
                        {"args", {{m.device, to_gib(x.bytes)}}}});
    }
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"},
          {"otherData", t.host_syncs >= 0 ? nlohmann::json{{"engine", t.engine}, {"step_s", t.step_s}, {"host_syncs", t.host_syncs}}
                                          : nlohmann::json{{"engine", t.engine}, {"step_s", t.step_s}}}};
}

void finalize_trace(Trace& t) {
  std::sort(t.stages.begin(), t.stages.end(), [](const TraceStage& a, const TraceStage& b) {
    return a.start_s != b.start_s ? a.start_s < b.start_s : a.id < b.id;
  });
  t.step_s = 0;
  for (const auto& s : t.stages) t.step_s = std::max(t.step_s, s.end_s);
  for (auto& m : t.memory) {
    for (const auto& x : m.samples) m.peak_bytes = std::max(m.peak_bytes, x.bytes);
  }
}

Bytes allocated_gpu_peak_bytes(const Trace& t) {
  Bytes peak = 0;
  bool sampled = false;
  for (const auto& m : t.memory) {
    if (m.device.rfind("gpu", 0) != 0) continue;
    for (const auto& x : m.samples) {
      peak = std::max(peak, x.bytes);
      sampled = true;
    }
  }
  if (sampled) return peak;
  for (const Bytes b : t.gpu_peak_bytes) peak = std::max(peak, b);
  return peak;
}

std::map<std::string, double> busy_by_direction_and_kind(const Trace& t, const std::string& resource) {
  std::map<std::string, double> out;
  for (const TraceStage& s : t.stages) {
    if (s.resource != resource || s.key.phase == Phase::kOptimizer) continue;
    out[compute_key(s.key.phase == Phase::kBackward, s.kind)] += s.duration_s();
  }
  return out;
}

}  // namespace oom
