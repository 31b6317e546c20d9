#include "planner/calibration/cross_validation.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <set>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "planner/calibration/validation.h"
#include "planner/engine/step_engine.h"
#include "planner/lowering/baselines.h"

namespace oom {

std::string_view cv_grouping_name(CvGrouping g) {
  switch (g) {
    case CvGrouping::kModel: return "model";
    case CvGrouping::kHardware: return "hardware";
    case CvGrouping::kGpus: return "gpus";
    case CvGrouping::kPath: return "path";
    case CvGrouping::kRecord: return "record";
    case CvGrouping::kClass: return "class";
  }
  return "record";
}

std::optional<CvGrouping> cv_grouping_from_name(std::string_view name) {
  for (const CvGrouping g : {CvGrouping::kModel, CvGrouping::kHardware, CvGrouping::kGpus, CvGrouping::kPath, CvGrouping::kRecord,
                               CvGrouping::kClass}) {
    if (cv_grouping_name(g) == name) return g;
  }
  return std::nullopt;
}

std::string record_experiment(const std::string& source) {
  std::string s = source;
  // Remarks in parentheses go: "§7.3 (22.4K tokens/s)".
  for (std::size_t open = s.find('('); open != std::string::npos; open = s.find('(')) {
    const std::size_t close = s.find(')', open);
    s.erase(open, close == std::string::npos ? std::string::npos : close - open + 1);
  }
  // The first of several: "Table 4, §7.4".
  s = s.substr(0, s.find(','));
  // From the first word that names a table, figure, section or appendix.
  std::size_t from = std::string::npos;
  for (const char* word : {"Table", "Figure", "Fig.", "Appendix", "§"}) {
    const std::size_t at = s.find(word);
    if (at != std::string::npos) from = std::min(from, at);
  }
  if (from != std::string::npos) s = s.substr(from);
  const auto first = s.find_first_not_of(' ');
  const auto last = s.find_last_not_of(' ');
  return first == std::string::npos ? source : s.substr(first, last - first + 1);
}

std::string cv_group_of(const StepRecord& r, CvGrouping g) {
  switch (g) {
    case CvGrouping::kModel: return r.workload.model;
    case CvGrouping::kHardware: return r.workload.hardware;
    case CvGrouping::kGpus: return std::to_string(r.workload.gpus);
    case CvGrouping::kPath:
      if (!r.system.empty()) return r.system;
      if (r.plan.is_object() && r.plan.contains("path") && r.plan["path"].is_string()) return r.plan["path"].get<std::string>();
      return "unknown";
    case CvGrouping::kRecord: return r.id;
    case CvGrouping::kClass: return record_experiment(r.source) + " " + r.workload.model;
  }
  return r.id;
}

std::string cv_group_of(const OperatorRecord& r, CvGrouping g) {
  switch (g) {
    case CvGrouping::kModel: return r.model;
    case CvGrouping::kHardware: return r.hardware;
    case CvGrouping::kGpus: return "1";
    case CvGrouping::kPath: return "operator";
    case CvGrouping::kRecord: return r.id;
    case CvGrouping::kClass: return record_experiment(r.source) + " " + r.model;
  }
  return r.id;
}

ErrorSummary summarize_errors(const std::vector<double>& rel_errors) {
  ErrorSummary s;
  std::vector<double> a;
  a.reserve(rel_errors.size());
  for (const double e : rel_errors) a.push_back(std::abs(e));
  s.count = static_cast<int>(a.size());
  s.median_abs_rel_error = median(a);
  s.max_abs_rel_error = a.empty() ? 0 : *std::max_element(a.begin(), a.end());
  return s;
}

namespace {

// Error lists of one set of predictions.
struct Errors {
  std::vector<double> step, baseline, op, gpu_peak, host;
  void add(const CvPrediction& p) {
    if (p.rel_error) (p.kind == RecordKind::kStep ? step : p.kind == RecordKind::kBaseline ? baseline : op).push_back(*p.rel_error);
    if (p.gpu_peak_rel_error) gpu_peak.push_back(*p.gpu_peak_rel_error);
    if (p.host_rel_error) host.push_back(*p.host_rel_error);
  }
};

// Plan records and the records of the offload baselines (lowered by lower_baseline()) join the
// fit; Megatron-LM and KT-FT records are predicted only.
bool fittable(const StepRecord& r) {
  if (!r.measured.step_s) return false;
  if (r.system.empty()) return true;
  const auto s = baseline_system_from_name(r.system);
  return s && *s != BaselineSystem::kMegatronLm && *s != BaselineSystem::kKtFt;
}

}  // namespace

CrossValidation cross_validate(const RecordSet& records, const HardwareSpec& hw, const CvOptions& options) {
  return cross_validate(records, std::vector<HardwareSpec>{hw}, options);
}

CrossValidation cross_validate(const RecordSet& records, const std::vector<HardwareSpec>& hws, const CvOptions& options) {
  if (!options.engines.has(options.engine)) {
    throw InputError("", "--engine", "\"" + options.engine + "\"", "unknown engine");
  }
  CrossValidation cv;
  cv.grouping = options.grouping;
  cv.engine = options.engine;
  cv.fit_engine = options.fit.engine;
  cv.hardware = hardware_names(hws);
  std::set<std::string> names;
  for (const HardwareSpec& hw : hws) names.insert(hw.name);

  // The records of this hardware, by group, in file order.
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::string>> members, fitted_members;
  auto join = [&](const std::string& group, const std::string& id, bool fits) {
    if (!members.count(group)) order.push_back(group);
    members[group].push_back(id);
    if (fits) fitted_members[group].push_back(id);
  };
  RecordSet scope;
  for (const auto& r : records.steps) {
    if (!names.count(r.workload.hardware) || !r.measured.step_s) continue;
    scope.steps.push_back(r);
    join(cv_group_of(r, options.grouping), r.id, fittable(r));
  }
  for (const auto& o : records.operators) {
    if (!names.count(o.hardware)) continue;
    scope.operators.push_back(o);
    join(cv_group_of(o, options.grouping), o.id, true);
  }
  if (order.empty()) {
    throw InputError("", "--hardware", cv.hardware, "no record with a measurement names this hardware (nothing to cross-validate)");
  }

  // One fit per distinct set of left-out fitted records, on parallel threads as the fit's engine
  // allows (each fit single-threaded). The analytic part of every fit is pure; a fit through the
  // SimGrid engine forks a process per simulation (sim/isolated_run.h), which each thread may do
  // at once.
  std::map<std::vector<std::string>, std::optional<CalibrationFit>> fits;
  std::map<std::vector<std::string>, std::string> fit_errors;
  for (const std::string& group : order) {
    std::vector<std::string> left_out = fitted_members[group];
    std::sort(left_out.begin(), left_out.end());
    fits.emplace(left_out, std::nullopt);
  }
  std::vector<std::pair<const std::vector<std::string>*, std::optional<CalibrationFit>*>> jobs;
  for (auto& [left_out, fit] : fits) jobs.emplace_back(&left_out, &fit);
  std::vector<std::string> errors(jobs.size());
  std::vector<std::exception_ptr> failures(jobs.size());
  // Every fold fits the same records: lowered once, shared by the folds.
  const std::shared_ptr<const FitRecords> prepared = prepare_fit_records(scope, hws, options.fit);
  const int workers = engine_workers(options.engines, options.fit.engine, jobs.size());
  run_jobs(jobs.size(), workers, [&](std::size_t j) {
    FitOptions fo = options.fit;
    fo.held_out_ids = *jobs[j].first;
    fo.engines = options.engines;
    fo.engine_held_out_rows = false;  // the left-out records are predicted below
    fo.engine_fitted_rows = false;    // and the fitted ones are not read
    if (workers > 1) fo.threads = 1;
    try {
      *jobs[j].second = fit_calibration(*prepared, fo);
    } catch (const InputError& e) {
      errors[j] = e.what();  // nothing left to fit: the group is reported, not predicted
    } catch (...) {
      failures[j] = std::current_exception();  // rethrown on the calling thread
    }
  });
  for (const auto& f : failures) {
    if (f) std::rethrow_exception(f);
  }
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    if (*jobs[j].second) ++cv.fits;
    else fit_errors[*jobs[j].first] = errors[j];
  }
  auto fit_without = [&](std::vector<std::string> left_out) -> const std::optional<CalibrationFit>& {
    std::sort(left_out.begin(), left_out.end());
    return fits.at(left_out);
  };

  // Step and baseline records, each predicted by the engine with its fold's calibration: one job
  // per record, on parallel threads as the engine allows (a simulation each).
  std::vector<const std::vector<Calibration>*> fold_of(scope.steps.size(), nullptr);
  for (std::size_t i = 0; i < scope.steps.size(); ++i) {
    const std::optional<CalibrationFit>& fit = fit_without(fitted_members[cv_group_of(scope.steps[i], options.grouping)]);
    if (fit) fold_of[i] = &fit->calibrations;
  }
  std::vector<std::vector<RecordPrediction>> step_predictions(scope.steps.size());
  std::vector<std::exception_ptr> step_failures(scope.steps.size());
  run_jobs(scope.steps.size(), engine_workers(options.engines, options.engine, scope.steps.size()), [&](std::size_t i) {
    if (fold_of[i] == nullptr) return;
    try {
      RecordSet one;
      one.steps.push_back(scope.steps[i]);
      step_predictions[i] = validate_records(one, options.engines, options.engine, *fold_of[i]).records;
    } catch (...) {
      step_failures[i] = std::current_exception();  // rethrown on the calling thread
    }
  });
  for (const auto& f : step_failures) {
    if (f) std::rethrow_exception(f);
  }

  std::set<std::string> operator_ids;
  for (const auto& o : scope.operators) operator_ids.insert(o.id);
  std::map<std::string, CvPrediction> by_id;
  for (const std::string& group : order) {
    CvGroupResult result;
    result.group = group;
    result.ids = members[group];
    const std::vector<std::string>& left_out = fitted_members[group];
    const std::optional<CalibrationFit>& fit = fit_without(left_out);
    std::vector<std::string> sorted = left_out;
    std::sort(sorted.begin(), sorted.end());
    if (!fit) {
      result.not_predicted = fmt::format("nothing left to fit without this group ({})", fit_errors[sorted]);
    } else {
      for (const FitRow& row : fit->rows) result.fitted_records += row.held_out ? 0 : 1;
      result.calibration = fit->calibration;
      result.calibrations = fit->calibrations;
    }
    const std::set<std::string> ids(result.ids.begin(), result.ids.end());
    // Step and baseline records of the group, as the fold's calibration predicted them above.
    std::vector<CvPrediction> predicted;
    for (std::size_t r = 0; r < scope.steps.size(); ++r) {
      if (!fit || !ids.count(scope.steps[r].id)) continue;
      for (const RecordPrediction& p : step_predictions[r]) {
        CvPrediction c;
        c.id = p.id;
        c.kind = p.system.empty() ? RecordKind::kStep : RecordKind::kBaseline;
        c.status = p.status;
        c.reason = p.reason;
        c.measured_s = p.measured_step_s;
        c.predicted_s = p.predicted_step_s;
        c.rel_error = p.rel_error;
        c.measured_gpu_peak_gib = p.measured_gpu_peak_gib;
        c.predicted_gpu_peak_gib = p.predicted_gpu_peak_gib;
        c.gpu_peak_rel_error = p.gpu_peak_rel_error;
        c.measured_host_gib = p.measured_host_gib;
        c.predicted_host_gib = p.predicted_host_gib;
        c.host_rel_error = p.host_rel_error;
        predicted.push_back(std::move(c));
      }
    }
    if (fit) {
      for (const FitRow& row : fit->rows) {
        if (row.kind != RecordKind::kOperator || !ids.count(row.id)) continue;
        // The fit must not have used the record it predicts.
        OOM_ASSERT(row.held_out, "a cross-validation fold fitted the record it predicts");
        CvPrediction c;
        c.id = row.id;
        c.kind = RecordKind::kOperator;
        c.status = "ok";
        c.measured_s = row.measured_s;
        c.predicted_s = row.predicted_s;
        c.rel_error = row.rel_error();
        predicted.push_back(std::move(c));
      }
      for (const std::string& s : fit->skipped) {
        const std::string id = s.substr(0, s.find(':'));
        // A step record the fit could not lower (Megatron-LM and KT-FT, lowered apart) was
        // predicted above by its own lowering; only an operator record fails here.
        if (!ids.count(id) || !operator_ids.count(id)) continue;
        CvPrediction c;
        c.id = id;
        c.kind = RecordKind::kOperator;
        c.status = "failed";
        c.reason = s.substr(std::min(s.size(), id.size() + 2));
        predicted.push_back(std::move(c));
      }
    }
    Errors errors;
    for (auto& p : predicted) {
      p.group = group;
      errors.add(p);
      by_id[p.id] = std::move(p);
    }
    for (const std::string& id : result.ids) {
      if (by_id.count(id)) continue;
      CvPrediction c;
      c.id = id;
      c.group = group;
      c.kind = RecordKind::kStep;
      c.status = "not_predicted";
      c.reason = result.not_predicted;
      by_id[id] = std::move(c);
    }
    result.step = summarize_errors(errors.step);
    result.baseline = summarize_errors(errors.baseline);
    result.op = summarize_errors(errors.op);
    result.gpu_peak = summarize_errors(errors.gpu_peak);
    result.host = summarize_errors(errors.host);
    cv.groups.push_back(std::move(result));
  }
  Errors all;
  auto emit = [&](const std::string& id) {
    auto it = by_id.find(id);
    if (it == by_id.end()) return;
    all.add(it->second);
    cv.predictions.push_back(it->second);
  };
  for (const auto& r : scope.steps) emit(r.id);
  for (const auto& o : scope.operators) emit(o.id);
  cv.step = summarize_errors(all.step);
  cv.baseline = summarize_errors(all.baseline);
  cv.op = summarize_errors(all.op);
  cv.gpu_peak = summarize_errors(all.gpu_peak);
  cv.host = summarize_errors(all.host);
  return cv;
}

namespace {

nlohmann::json summary_json(const ErrorSummary& s) {
  return {{"count", s.count}, {"median_abs_rel_error", s.median_abs_rel_error}, {"max_abs_rel_error", s.max_abs_rel_error}};
}

std::string summary_text(const ErrorSummary& s) {
  if (s.count == 0) return "-";
  return fmt::format("{:.1f}% / {:.1f}% ({})", 100 * s.median_abs_rel_error, 100 * s.max_abs_rel_error, s.count);
}

}  // namespace

nlohmann::json cross_validation_to_json(const CrossValidation& cv) {
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  nlohmann::json groups = nlohmann::json::array(), records = nlohmann::json::array();
  for (const auto& g : cv.groups) {
    nlohmann::json j = {{"group", g.group},
                        {"ids", g.ids},
                        {"fitted_records", g.fitted_records},
                        {"step", summary_json(g.step)},
                        {"baseline", summary_json(g.baseline)},
                        {"operator", summary_json(g.op)},
                        {"gpu_peak", summary_json(g.gpu_peak)},
                        {"host", summary_json(g.host)}};
    if (!g.not_predicted.empty()) j["not_predicted"] = g.not_predicted;
    if (g.calibration) j["calibration"] = calibration_to_json(*g.calibration);
    if (g.calibrations.size() > 1) {
      j["calibrations"] = nlohmann::json::array();
      for (const Calibration& c : g.calibrations) j["calibrations"].push_back(calibration_to_json(c));
    }
    groups.push_back(std::move(j));
  }
  for (const auto& p : cv.predictions) {
    nlohmann::json j = {{"id", p.id},
                        {"group", p.group},
                        {"kind", std::string(record_kind_name(p.kind))},
                        {"status", p.status},
                        {"measured_s", opt(p.measured_s)},
                        {"predicted_s", opt(p.predicted_s)},
                        {"rel_error", opt(p.rel_error)},
                        {"measured_gpu_peak_gib", opt(p.measured_gpu_peak_gib)},
                        {"predicted_gpu_peak_gib", opt(p.predicted_gpu_peak_gib)},
                        {"gpu_peak_rel_error", opt(p.gpu_peak_rel_error)},
                        {"measured_host_gib", opt(p.measured_host_gib)},
                        {"predicted_host_gib", opt(p.predicted_host_gib)},
                        {"host_rel_error", opt(p.host_rel_error)}};
    if (!p.reason.empty()) j["reason"] = p.reason;
    records.push_back(std::move(j));
  }
  return {{"grouping", cv_grouping_name(cv.grouping)},
          {"engine", cv.engine},
          {"fit_engine", cv.fit_engine},
          {"hardware", cv.hardware},
          {"fits", cv.fits},
          {"step", summary_json(cv.step)},
          {"baseline", summary_json(cv.baseline)},
          {"operator", summary_json(cv.op)},
          {"gpu_peak", summary_json(cv.gpu_peak)},
          {"host", summary_json(cv.host)},
          {"groups", groups},
          {"records", records}};
}

std::string cross_validation_text(const CrossValidation& cv) {
  std::string out = fmt::format("Cross-validation on {}: leave one {} out ({} fits; fitted with the {} engine, predicted with the {} engine)\n",
                                cv.hardware, cv_grouping_name(cv.grouping), cv.fits, cv.fit_engine, cv.engine);
  out += fmt::format("{:<24} {:>6}  {:<22} {:<22} {:<22} {:<22} {:<22}\n", "left out", "fitted", "step median/max (n)",
                     "baseline", "operator", "GPU peak", "host");
  for (const auto& g : cv.groups) {
    if (!g.not_predicted.empty()) {
      out += fmt::format("{:<24} {:>6}  not predicted: {}\n", g.group, g.fitted_records, g.not_predicted);
      continue;
    }
    out += fmt::format("{:<24} {:>6}  {:<22} {:<22} {:<22} {:<22} {:<22}\n", g.group, g.fitted_records, summary_text(g.step),
                       summary_text(g.baseline), summary_text(g.op), summary_text(g.gpu_peak), summary_text(g.host));
  }
  out += fmt::format("{:<22} {:>11} {:>11} {:>8}   {:>8} {:>8} {:>7}   {:>8} {:>8} {:>7}\n", "record", "predicted_s", "measured_s",
                     "error", "gpu_pred", "gpu_meas", "error", "host_prd", "host_mea", "error");
  auto num = [](const std::optional<double>& v, const char* f, double scale = 1) {
    return v ? fmt::format(fmt::runtime(f), scale * *v) : std::string("-");
  };
  for (const auto& p : cv.predictions) {
    if (p.status != "ok") {
      out += fmt::format("{:<22} {}: {}\n", p.id, p.status, p.reason);
      continue;
    }
    out += fmt::format("{:<22} {:>11} {:>11} {:>8}   {:>8} {:>8} {:>7}   {:>8} {:>8} {:>7}\n", p.id, num(p.predicted_s, "{:.3f}"),
                       num(p.measured_s, "{:.3f}"), num(p.rel_error, "{:+.1f}%", 100), num(p.predicted_gpu_peak_gib, "{:.1f}"),
                       num(p.measured_gpu_peak_gib, "{:.1f}"), num(p.gpu_peak_rel_error, "{:+.1f}%", 100),
                       num(p.predicted_host_gib, "{:.1f}"), num(p.measured_host_gib, "{:.1f}"), num(p.host_rel_error, "{:+.1f}%", 100));
  }
  out += fmt::format("Out of group, step time (plan records): median |error| {:.1f}%, max {:.1f}% over {}\n",
                     100 * cv.step.median_abs_rel_error, 100 * cv.step.max_abs_rel_error, cv.step.count);
  if (cv.baseline.count > 0) {
    out += fmt::format("Out of group, baseline systems: median |error| {:.1f}%, max {:.1f}% over {}\n",
                       100 * cv.baseline.median_abs_rel_error, 100 * cv.baseline.max_abs_rel_error, cv.baseline.count);
  }
  if (cv.op.count > 0) {
    out += fmt::format("Out of group, operator times: median |error| {:.1f}%, max {:.1f}% over {}\n",
                       100 * cv.op.median_abs_rel_error, 100 * cv.op.max_abs_rel_error, cv.op.count);
  }
  if (cv.gpu_peak.count > 0) {
    out += fmt::format("Out of group, GPU peak: median |error| {:.1f}%, max {:.1f}% over {}\n", 100 * cv.gpu_peak.median_abs_rel_error,
                       100 * cv.gpu_peak.max_abs_rel_error, cv.gpu_peak.count);
  }
  if (cv.host.count > 0) {
    out += fmt::format("Out of group, host memory: median |error| {:.1f}%, max {:.1f}% over {}\n", 100 * cv.host.median_abs_rel_error,
                       100 * cv.host.max_abs_rel_error, cv.host.count);
  }
  return out;
}

}  // namespace oom
