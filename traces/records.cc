#include "traces/records.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "costmodel/json_input.h"

namespace oom {
namespace {

Measured read_measured(const JsonReader& r) {
  r.reject_unknown_keys({"step_s", "gpu_peak_gib", "host_gib", "compute_s"});
  Measured m;
  m.step_s = r.optional_number("step_s", 1e-9, 1e9);
  m.gpu_peak_gib = r.optional_number("gpu_peak_gib", 0.0, 1e9);
  m.host_gib = r.optional_number("host_gib", 0.0, 1e12);
  if (r.has("compute_s")) {
    const JsonReader c = r.object("compute_s");
    for (const auto& [key, value] : c.raw().items()) {
      if (!parse_compute_key(key)) {
        c.fail(key, "expected \"forward.KIND\" or \"backward.KIND\" with KIND an operator kind such as gemm");
      }
      m.compute_s[key] = c.number(key, 0.0, 1e9);
    }
  }
  return m;
}

}  // namespace

std::string compute_key(bool backward, std::string_view kind) {
  return fmt::format("{}.{}", backward ? "backward" : "forward", kind);
}

std::optional<ComputeKey> parse_compute_key(const std::string& key) {
  const auto dot = key.find('.');
  if (dot == std::string::npos) return std::nullopt;
  const std::string direction = key.substr(0, dot);
  ComputeKey k{direction == "backward", key.substr(dot + 1)};
  if ((direction != "forward" && direction != "backward") || k.kind.empty() ||
      k.kind.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") != std::string::npos) {
    return std::nullopt;
  }
  return k;
}

const std::string& parse_record_line(const std::string& line, const std::string& origin, RecordSet& out) {
  const nlohmann::json j = parse_json_text(line, origin);
  const JsonReader r(j, origin);
  const std::string kind = r.string_or("kind", "step");
  if (kind == "operator") {
    r.reject_unknown_keys({"id", "source", "kind", "model", "hardware", "layer_type", "op", "batch", "seq_len", "measured", "note"});
    OperatorRecord o;
    o.id = r.string("id");
    o.source = r.string_or("source", "");
    o.origin = origin;
    o.model = r.string("model");
    o.hardware = r.string("hardware");
    o.layer_type = r.one_of("layer_type", {"full_attention", "sliding_attention", "linear_attention", "moe"});
    o.op = r.string("op");
    o.batch = r.integer("batch", 1, std::int64_t{1} << 32);
    o.seq_len = r.integer("seq_len", 1, std::int64_t{1} << 32);
    const JsonReader measured = r.object("measured");
    measured.reject_unknown_keys({"time_s"});
    o.time_s = measured.number("time_s", 1e-12, 1e9);
    o.note = r.string_or("note", "");
    out.operators.push_back(std::move(o));
    return out.operators.back().id;
  }
  if (kind != "step") r.fail("kind", "expected \"step\" or \"operator\"");
  r.reject_unknown_keys({"id", "source", "kind", "workload", "plan", "system", "measured", "notes"});
  StepRecord s;
  s.id = r.string("id");
  s.source = r.string_or("source", "");
  s.origin = origin;
  s.workload = workload_from_json(r.object("workload").raw(), origin, r.field("workload"));
  if (r.has("plan") == r.has("system")) r.fail("plan", "a step record names exactly one of \"plan\" and \"system\"");
  if (r.has("plan")) {
    s.plan = r.object("plan").raw();
  } else {
    s.system = r.one_of("system", {"fsdp2-offload", "zero-offload", "megatrain", "megatron-lm", "kt-ft"});
  }
  s.measured = read_measured(r.object("measured"));
  if (!s.measured.step_s && !s.measured.gpu_peak_gib && !s.measured.host_gib) {
    r.fail("measured", "names no measurement (step_s, gpu_peak_gib or host_gib)");
  }
  s.notes = r.string_or("notes", "");
  out.steps.push_back(std::move(s));
  return out.steps.back().id;
}

RecordSet load_records(const std::string& path) {
  std::istringstream in(read_input_file(path, "a JSON Lines file"));
  RecordSet set;
  std::set<std::string> ids;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos || line[line.find_first_not_of(" \t")] == '#') continue;
    const std::string origin = fmt::format("{}:{}", path, number);
    const std::string id = parse_record_line(line, origin, set);
    if (!ids.insert(id).second) throw InputError(origin, "id", "\"" + id + "\"", "duplicate record id");
  }
  if (number == 0 || set.steps.size() + set.operators.size() == 0) throw InputError(path, "empty, expected JSON Lines records");
  return set;
}

RecordSet load_records(const std::vector<std::string>& paths) {
  RecordSet set;
  std::map<std::string, std::string> origin_of;  // id → "FILE:LINE" of its first record
  for (const std::string& path : paths) {
    RecordSet one = load_records(path);
    for (auto& r : one.steps) {
      if (auto [it, added] = origin_of.emplace(r.id, r.origin); !added) {
        throw InputError(r.origin, "id", "\"" + r.id + "\"", "duplicate record id (also " + it->second + ")");
      }
      set.steps.push_back(std::move(r));
    }
    for (auto& o : one.operators) {
      if (auto [it, added] = origin_of.emplace(o.id, o.origin); !added) {
        throw InputError(o.origin, "id", "\"" + o.id + "\"", "duplicate record id (also " + it->second + ")");
      }
      set.operators.push_back(std::move(o));
    }
  }
  return set;
}

nlohmann::json step_record_to_json(const StepRecord& r) {
  nlohmann::json j = {{"id", r.id}, {"source", r.source}, {"workload", workload_to_json(r.workload)}};
  if (r.system.empty()) {
    j["plan"] = r.plan;
  } else {
    j["system"] = r.system;
  }
  nlohmann::json m = nlohmann::json::object();
  if (r.measured.step_s) m["step_s"] = *r.measured.step_s;
  if (r.measured.gpu_peak_gib) m["gpu_peak_gib"] = *r.measured.gpu_peak_gib;
  if (r.measured.host_gib) m["host_gib"] = *r.measured.host_gib;
  if (!r.measured.compute_s.empty()) m["compute_s"] = r.measured.compute_s;
  j["measured"] = m;
  if (!r.notes.empty()) j["notes"] = r.notes;
  return j;
}

nlohmann::json operator_record_to_json(const OperatorRecord& r) {
  return {{"id", r.id}, {"source", r.source}, {"kind", "operator"}, {"model", r.model}, {"hardware", r.hardware},
          {"layer_type", r.layer_type}, {"op", r.op}, {"batch", r.batch}, {"seq_len", r.seq_len},
          {"measured", {{"time_s", r.time_s}}}, {"note", r.note}};
}

}  // namespace oom
