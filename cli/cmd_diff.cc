// `oom diff PREDICTED.json MEASURED.json [--summary] [--json]`: a predicted step (`oom simulate
// --trace`) against a measured one (`oom train --plan P --trace`), stage by stage.
//
// Both files are traces: the Chrome trace JSON the commands write, or the Trace JSON form
// (traces/trace.h); a key neither writes is refused where it would be read (kChromeTraceKeys:
// the document, stage events and their args; the other events are free-form). Stages are
// matched by their key (traces/stage_key.h: the StepGraph's, which the LibTorch runtime records
// too) without its sub-batch and repeat: the stages of one operator over several sub-batches, or
// repeated for several regenerations, are summed. Then totals per operator kind and per phase
// (fwd, recompute, bwd, opt), and the step. Where the traces count
// operators (TraceStage::ops: the lowering's Stage::ops predicted, the ATen calls a traced step
// made measured), each row also sets the predicted operators beside the measured ones.
// Ratios are measured / predicted; errors (predicted − measured) / measured.
#include <algorithm>
#include <map>
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "costmodel/input_error.h"
#include "costmodel/input_limits.h"
#include "costmodel/json_input.h"
#include "costmodel/output_path.h"
#include "costmodel/version.h"
#include "traces/trace.h"

namespace oom::cli {
namespace {

struct StageSum {
  Phase phase = Phase::kForward;
  std::string kind;
  double seconds = 0;
  std::int64_t ops = 0;
  int count = 0;
  double first_start_s = 0;
};

struct StepTimes {
  std::map<std::string, StageSum> stages;
  double step_s = 0;
};

void add_stage(StepTimes& t, StageKey key, const std::string& kind, double start_s, double dur_s, std::int64_t ops) {
  key.sub_batch = -1;
  key.repeat = -1;
  auto [it, fresh] = t.stages.try_emplace(format_stage_key(key));
  if (fresh) it->second.first_start_s = start_s;
  it->second.phase = key.phase;
  it->second.kind = kind;
  it->second.seconds += dur_s;
  it->second.ops += ops;
  it->second.count += 1;
  it->second.first_start_s = std::min(it->second.first_start_s, start_s);
}

StepTimes load_step(const std::string& path) {
  const nlohmann::json j = read_json_file(path);
  StepTimes t;
  if (j.is_object() && j.contains("traceEvents")) {
    JsonReader(j, path).reject_unknown_keys(kChromeTraceKeys);
    const auto& ev = j["traceEvents"];
    if (!ev.is_array()) throw InputError(path, "traceEvents", json_value_text(ev), "expected an array of events");
    for (std::size_t i = 0; i < ev.size(); ++i) {
      const auto& e = ev[i];
      if (!e.is_object() || e.value("ph", "") != "X") continue;
      const JsonReader er(e, path, fmt::format("traceEvents[{}]", i));
      er.reject_unknown_keys(kChromeStageEventKeys);
      if (er.has("args")) er.object("args").reject_unknown_keys(kChromeStageArgKeys);
      const auto key = parse_stage_key(er.string("name"));
      if (!key) er.fail("name", kNotAStageKey);
      // Microseconds from the start of the step, each a finite number within a trace's times.
      const double ts = er.number("ts", 0.0, kMaxTraceSeconds * 1e6);
      const double dur = er.number("dur", 0.0, kMaxTraceSeconds * 1e6);
      std::int64_t ops = 0;
      if (e.contains("args") && e["args"].is_object() && e["args"].contains("ops")) {
        const auto& o = e["args"]["ops"];
        if (!o.is_number_integer() || o.get<std::int64_t>() < 0) {
          throw InputError(path, er.field("args.ops"), json_value_text(o), "expected an operator count ≥ 0");
        }
        ops = o.get<std::int64_t>();
      }
      add_stage(t, *key, e.value("cat", ""), ts * 1e-6, dur * 1e-6, ops);
      t.step_s = std::max(t.step_s, (ts + dur) * 1e-6);
    }
  } else {
    const Trace tr = trace_from_json(j, path);
    for (const auto& s : tr.stages) add_stage(t, s.key, s.kind, s.start_s, s.duration_s(), s.ops);
    t.step_s = tr.step_s;
  }
  if (t.stages.empty()) throw InputError(path, "no stages: expected a trace written by oom simulate or oom train --trace");
  return t;
}

struct Row {
  std::string key, kind;
  Phase phase = Phase::kForward;
  double predicted_s = 0, measured_s = 0;
  std::int64_t predicted_ops = 0, measured_ops = 0;
  bool in_predicted = false, in_measured = false;
  double order = 0;
};

nlohmann::json row_json(const Row& r) {
  nlohmann::json j{{"name", r.key}, {"kind", r.kind}, {"predicted_s", r.predicted_s}, {"measured_s", r.measured_s}};
  if (r.in_predicted && r.in_measured && r.predicted_s > 0) j["ratio"] = r.measured_s / r.predicted_s;
  if (r.predicted_ops > 0) j["predicted_ops"] = r.predicted_ops;
  if (r.measured_ops > 0) j["measured_ops"] = r.measured_ops;
  if (!r.in_predicted) j["only"] = "measured";
  if (!r.in_measured) j["only"] = "predicted";
  return j;
}

std::string ratio_text(const Row& r) {
  if (!r.in_predicted) return "only measured";
  if (!r.in_measured) return "only predicted";
  return r.predicted_s > 0 ? fmt::format("{:.2f}x", r.measured_s / r.predicted_s) : "-";
}

struct DiffArgs {
  std::string predicted, measured, output;
  bool summary = false, json = false;
};

}  // namespace

void add_diff_commands(CLI::App& app, Io io) {
  auto a = std::make_shared<DiffArgs>();
  auto* d = app.add_subcommand("diff", "Compare a predicted step trace with a measured one, stage by stage");
  d->add_option("predicted", a->predicted, "Predicted trace (oom simulate --trace)")->required();
  d->add_option("measured", a->measured, "Measured trace (oom train --plan P --trace)")->required();
  d->add_flag("--summary", a->summary, "Only the totals per kind and phase and the step");
  d->add_flag("--json", a->json, "Print one JSON object");
  d->add_option("-o,--output", a->output, "Write the output to this file (atomically) instead of stdout");
  d->callback([=] {
    check_output_files({a->output}, {a->predicted, a->measured});
    const StepTimes p = load_step(a->predicted), m = load_step(a->measured);
    std::map<std::string, Row> rows;
    for (const auto& [name, s] : p.stages) {
      Row& r = rows[name];
      r.key = name, r.kind = s.kind, r.phase = s.phase, r.predicted_s = s.seconds, r.in_predicted = true, r.order = s.first_start_s;
      r.predicted_ops = s.ops;
    }
    for (const auto& [name, s] : m.stages) {
      Row& r = rows[name];
      if (!r.in_predicted) r.key = name, r.kind = s.kind, r.phase = s.phase, r.order = 1e30 + s.first_start_s;
      r.measured_s = s.seconds, r.measured_ops = s.ops, r.in_measured = true;
    }
    std::vector<Row> ordered;
    for (auto& [_, r] : rows) ordered.push_back(r);
    std::stable_sort(ordered.begin(), ordered.end(), [](const Row& x, const Row& y) { return x.order < y.order; });
    // Totals over the stages both sides have, per kind and per phase.
    std::map<std::string, Row> kinds, phases;
    int only_p = 0, only_m = 0;
    for (const auto& r : ordered) {
      only_p += r.in_predicted && !r.in_measured;
      only_m += r.in_measured && !r.in_predicted;
      if (!(r.in_predicted && r.in_measured)) continue;
      auto add_to = [&r](std::map<std::string, Row>& totals, const std::string& key) {
        Row& t = totals[key];
        t.key = key, t.kind = key, t.in_predicted = t.in_measured = true;
        t.predicted_s += r.predicted_s;
        t.measured_s += r.measured_s;
        t.predicted_ops += r.predicted_ops;
        t.measured_ops += r.measured_ops;
      };
      add_to(kinds, r.kind);
      add_to(phases, std::string(phase_name(r.phase)));
    }
    const double step_error = m.step_s > 0 ? (p.step_s - m.step_s) / m.step_s : 0.0;
    if (a->json) {
      nlohmann::json j;
      j["predicted_step_s"] = p.step_s;
      j["measured_step_s"] = m.step_s;
      j["step_rel_error"] = step_error;
      j["only_predicted"] = only_p;
      j["only_measured"] = only_m;
      for (const auto& [k, r] : kinds) j["kinds"].push_back(row_json(r));
      for (const auto& [k, r] : phases) j["phases"].push_back(row_json(r));
      if (!a->summary) {
        j["stages"] = nlohmann::json::array();
        for (const auto& r : ordered) j["stages"].push_back(row_json(r));
      }
      emit(a->output, with_oom_version(j).dump(2) + "\n", io);
      return;
    }
    std::string out;
    const bool counted = std::any_of(ordered.begin(), ordered.end(), [](const Row& r) { return r.predicted_ops > 0 || r.measured_ops > 0; });
    auto table = [&out, counted](const std::string& title, const std::vector<Row>& rs) {
      std::size_t w = title.size();
      for (const auto& r : rs) w = std::max(w, r.key.size());
      out += fmt::format("{:<{}}  {:>13}  {:>13}  {:>14}", title, w, "predicted ms", "measured ms", "measured/pred");
      out += counted ? fmt::format("  {:>9}  {:>9}\n", "pred ops", "meas ops") : "\n";
      for (const auto& r : rs) {
        out += fmt::format("{:<{}}  {:>13.3f}  {:>13.3f}  {:>14}", r.key, w, r.predicted_s * 1e3, r.measured_s * 1e3, ratio_text(r));
        out += counted ? fmt::format("  {:>9}  {:>9}\n", r.predicted_ops, r.measured_ops) : "\n";
      }
      out += "\n";
    };
    if (!a->summary) table("stage", ordered);
    std::vector<Row> k, ph;
    for (const auto& [_, r] : kinds) k.push_back(r);
    for (const auto& [_, r] : phases) ph.push_back(r);
    table("kind (stages on both sides)", k);
    table("phase (stages on both sides)", ph);
    out += fmt::format("step: predicted {:.3f} ms, measured {:.3f} ms, error {:+.1f}%\n", p.step_s * 1e3, m.step_s * 1e3,
                       100 * step_error);
    out += fmt::format("stages only predicted: {}, only measured: {}\n", only_p, only_m);
    emit(a->output, out, io);
  });
}

}  // namespace oom::cli
