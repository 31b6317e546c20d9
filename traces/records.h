// Recorded measurements (JSON Lines): published step times and our own measured runs.
//
// One record per line (DESIGN.md). A step record is {"id", "source", "workload": {...},
// "plan": {...} | "system": "fsdp2-offload" | ..., "measured": {"step_s", "gpu_peak_gib",
// "host_gib", "compute_s"}}; an operator record has "kind": "operator" and names a model, hardware, layer type,
// operator, batch and sequence length with "measured": {"time_s"}. Blank lines and lines starting
// with '#' are skipped. The plan stays JSON here (traces/ sits below planner/); planner's
// plan_from_json() reads it, naming "FILE:LINE" as its origin.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/workload.h"

namespace oom {

struct Measured {
  std::optional<double> step_s;
  std::optional<double> gpu_peak_gib;
  std::optional<double> host_gib;
  // Rank 0's compute-stream busy seconds of a traced step by direction and operator kind, keyed
  // "forward.KIND" (forward and recompute stages) or "backward.KIND", KIND a Trace stage kind
  // ("gemm", "attention", ...): the measured breakdown `oom calibrate --backend` records beside a
  // step. The fit matches its shares of the compute stream (planner/calibration/calibrate.h).
  std::map<std::string, double> compute_s;
  bool operator==(const Measured&) const = default;
};

// A Measured::compute_s key: "forward.KIND" (forward and recompute stages) or "backward.KIND".
std::string compute_key(bool backward, std::string_view kind);
struct ComputeKey {
  bool backward = false;
  std::string kind;  // a Trace stage kind: lower-case letters and '_'
};
std::optional<ComputeKey> parse_compute_key(const std::string& key);  // nullopt when malformed

struct StepRecord {
  std::string id;
  std::string source;
  std::string origin;          // "FILE:LINE", for error messages
  Workload workload;
  nlohmann::json plan;         // null when the record names a system instead
  std::string system;          // baseline system name, empty when a plan is given
  Measured measured;
  std::string notes;
  bool operator==(const StepRecord&) const = default;
};

struct OperatorRecord {
  std::string id;
  std::string source;
  std::string origin;
  std::string model;
  std::string hardware;
  std::string layer_type;  // "full_attention", "sliding_attention", "linear_attention", "moe"
  std::string op;          // e.g. "attention_forward", "attention_replay", "gdn_forward", "moe_forward"
  std::int64_t batch = 1;
  std::int64_t seq_len = 1;
  double time_s = 0;
  std::string note;
  bool operator==(const OperatorRecord&) const = default;
};

struct RecordSet {
  std::vector<StepRecord> steps;
  std::vector<OperatorRecord> operators;
};

// Parses one record line. Throws InputError naming `origin` ("FILE:LINE") and the field.
// Appends the record to `out` (a step or an operator record) and returns its id.
const std::string& parse_record_line(const std::string& line, const std::string& origin, RecordSet& out);
// Loads a JSON Lines file; the first bad line throws InputError. Duplicate ids are errors.
RecordSet load_records(const std::string& path);
// Loads several JSON Lines files as one set (steps, then operators, each in file order across the
// files). An id in two files is an error naming both.
RecordSet load_records(const std::vector<std::string>& paths);

nlohmann::json step_record_to_json(const StepRecord& r);
nlohmann::json operator_record_to_json(const OperatorRecord& r);

}  // namespace oom
