// Cross-validation of the calibration: how well the model predicts records it was not fitted on
// (`oom calibrate --cross-validate GROUPING`).
//
// The records of one hardware (or of several, fitted together) are split into groups by a key (the model, the hardware, the GPU
// count, the expert path, or each record alone). For every group the calibration is refitted
// (planner/calibration/calibrate.h) on all the other records and the group's records are predicted with that
// fit: step records (a plan) by the chosen engine, baseline-system records by their lowering
// (planner/lowering/baselines.h), operator records by the summed durations of their stages. A record is
// never part of the fit that predicts it. Errors are (predicted − measured) / measured; the
// summaries are median and maximum |error| per group and over all groups, for step time (plan
// records; baseline systems and operators apart) and for GPU peak and host memory where records
// have them. A group whose removal leaves nothing to fit is reported as not predicted, with why.
// Folds that leave out the same fitted records share one fit. Deterministic.
// Analytic fits run on one thread per core (fit_calibration is pure for the analytic engine).
// Not thread-safe to call concurrently (forked SimGrid runs).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/hardware_spec.h"
#include "planner/calibration/calibrate.h"
#include "traces/records.h"

namespace oom {

enum class CvGrouping { kModel, kHardware, kGpus, kPath, kRecord, kClass };
// "model", "hardware", "gpus", "path", "record", "class"
std::string_view cv_grouping_name(CvGrouping g);
// The grouping of a name, or nullopt for an unknown name.
std::optional<CvGrouping> cv_grouping_from_name(std::string_view name);

// The group a record belongs to. Step records: the workload's model, hardware, GPU count, the
// plan's path ("ep", "local") or the baseline system's name, the id, or the class. Operator
// records: their model, hardware, 1 GPU (one-sequence, one-GPU measurements), path "operator", the
// id, or the class. A class is one experiment of one model: the rows a what-if on an unmeasured
// configuration resembles, since leaving it out leaves out every sibling batch, context, policy
// and node size of that experiment (record_experiment() names the experiment).
// The experiment a record's `source` names: its first table, figure or section, without the
// publication's name and without remarks in parentheses ("OOM arXiv 2611.11364 Table 4, §7.4" →
// "Table 4"; "… §7.3 (22.4K tokens/s)" → "§7.3"); the whole source when it names none.
std::string record_experiment(const std::string& source);
std::string cv_group_of(const StepRecord& r, CvGrouping g);
std::string cv_group_of(const OperatorRecord& r, CvGrouping g);

struct CvOptions {
  CvGrouping grouping = CvGrouping::kRecord;
  std::string engine = "analytic";  // predicts the left-out step records; FitOptions::engine fits
  StepEngines engines;              // where both engines are found (default: "analytic" only)
  FitOptions fit;                   // held_out_ids is replaced by each fold's group, engines by `engines`
};

// One record predicted by the fit that left its group out.
struct CvPrediction {
  std::string id;
  std::string group;
  RecordKind kind = RecordKind::kStep;  // a plan's step, a baseline system's, or an operator
  std::string status;  // "ok", "oom" (baseline predicted out of memory), "failed", "not_predicted"
  std::string reason;
  std::optional<double> measured_s, predicted_s, rel_error;
  std::optional<double> measured_gpu_peak_gib, predicted_gpu_peak_gib, gpu_peak_rel_error;
  std::optional<double> measured_host_gib, predicted_host_gib, host_rel_error;
};

// Median and maximum |relative error| over `count` records (0 when none).
struct ErrorSummary {
  int count = 0;
  double median_abs_rel_error = 0;
  double max_abs_rel_error = 0;
};
ErrorSummary summarize_errors(const std::vector<double>& rel_errors);

struct CvGroupResult {
  std::string group;
  std::vector<std::string> ids;  // the records left out
  int fitted_records = 0;        // records the fold's fit used
  std::string not_predicted;     // why the group could not be predicted ("" when it was)
  std::optional<Calibration> calibration;  // the fold's fit (none when not predicted)
  std::vector<Calibration> calibrations;   // every hardware's, when several were fitted together
  ErrorSummary step, baseline, op, gpu_peak, host;
};

struct CrossValidation {
  CvGrouping grouping = CvGrouping::kRecord;
  std::string engine;
  std::string fit_engine;
  std::string hardware;
  std::vector<CvGroupResult> groups;
  std::vector<CvPrediction> predictions;  // every record, in file order (steps, then operators)
  ErrorSummary step, baseline, op, gpu_peak, host;  // over every predicted record
  int fits = 0;                                     // distinct fits run
};

// Runs the cross-validation over the records of `hardware`. Throws InputError when no record
// names the hardware or options.engines does not offer the engine.
CrossValidation cross_validate(const RecordSet& records, const HardwareSpec& hardware, const CvOptions& options);
// Over the records of every hardware given, fitted together (fit_calibration() over several
// hardware): each fold leaves its group out of one joint fit, whatever hardware its records name.
CrossValidation cross_validate(const RecordSet& records, const std::vector<HardwareSpec>& hardware, const CvOptions& options);

nlohmann::json cross_validation_to_json(const CrossValidation& cv);
std::string cross_validation_text(const CrossValidation& cv);

}  // namespace oom
