// Calibration fit: the physical constants of one hardware from recorded measurements (`oom calibrate`).
//
// Fits the Calibration constants (planner/calibration/calibration.h) of one HardwareSpec by nonlinear least
// squares (Levenberg–Marquardt with Eigen) on log(predicted / measured) over
//   - step records with a plan on that hardware: predicted by lowering the plan and running the
//     analytic evaluator (the graph is lowered once; only durations change during the fit);
//   - operator records on that hardware: predicted as the summed durations of the matching
//     stages of a one-GPU, one-sequence lowering (attention_forward: attention projections +
//     core + output projection; gdn_mixing_forward: GDN projections + core + output projection;
//     moe_forward: router/shared + experts; attention_replay_reuse_o: the attention projections,
//     the output one included), each without the per-stage cost of
//     a running step (compute_overhead_s), which an operator timed alone does not pay;
// Constants are shared by every record of the hardware: nothing is fitted per record. A weak
// prior (log distance to the uncalibrated estimate) keeps constants that no record exercises at
// their estimate. Records named in `held_out_ids` are predicted but not fitted, to check the fit.
// Deterministic (the Jacobian's columns run on up to four threads, each column computed the same way).
// Safe to call from several threads with the analytic engine; another engine may fork (the SimGrid
// one does: sim/simgrid_engine.h), so with it one call at a time.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/hardware_spec.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/step_engine.h"
#include "traces/records.h"

namespace oom {

struct FitOptions {
  // Records predicted but not fitted. Default: the held-out set documented in traces/paper/README.md.
  std::vector<std::string> held_out_ids = default_held_out_ids();
  int max_iterations = 60;        // per start
  int starts = 8;                 // deterministic starting points (the first is the estimate)
  // Every start runs `screen_iterations` iterations (a start that converges sooner stops there);
  // the `finalists` with the lowest cost then run on to convergence (screen_iterations 0: every
  // start runs to convergence). The model's kinks give the fit local minima, which is why it
  // starts from several points; the starts that end lowest are among the lowest after a few
  // iterations. On the H100 records this takes a fold of the cross-validation a third less time
  // than running all eight to convergence, with out-of-sample errors as low (traces/paper/README.md).
  int screen_iterations = 8;
  int finalists = 2;
  double prior_weight = 0.02;     // weight of log(constant / estimate) residuals
  // Soft-L1 scale of a record's log error (robust_residual): a record within about this error
  // weighs as in least squares, one far past it in proportion to its error instead of its
  // square. A record that a mechanism the model lacks puts 20 % off then no longer pulls the
  // constants it barely depends on to the edges of their ranges (on the H100 records it did:
  // attention's backward to its floor, dense GEMMs to their ceiling). 0.1: the error the
  // mechanisms are meant to explain (the targets' 5 % median and 15 % maximum lie around it).
  // 0: plain least squares.
  double robust_scale = 0.1;
  double operator_weight = 0.5;   // weight of an operator record against a step record (1)
  // The engine whose step times the fit matches ("analytic" or another engine of `engines` such
  // as "simgrid"). Another engine than "analytic" is fitted by defect correction: the analytic
  // prediction of each step record times that record's engine/analytic ratio at the current
  // constants, refreshed `engine_passes` times, so the constants fit the engine that will predict;
  // the first refresh is at the estimate and the first refit runs from every start (the basin
  // chosen on the engine's step times).
  std::string engine = "analytic";
  StepEngines engines;  // where `engine` is found (default: "analytic" only)
  // At least one (0 counts as one): the first refresh is at the estimate. Two: on the H100 records
  // a third refresh moved no cross-validated error by more than 0.1 point and cost a quarter of a
  // SimGrid cross-validation's time (traces/paper/README.md, seventeenth refit).
  int engine_passes = 2;
  // Refreshing stops early once no step record's engine/analytic ratio moved by more than this
  // (relative) since the refresh before: the constants fitted to those ratios would barely move.
  double engine_ratio_tolerance = 2e-3;
  // Held-out step records' rows predicted through that engine too (one simulation each at the
  // fitted constants; they take no part in the fit). A cross-validation, which predicts its
  // left-out records itself, turns it off.
  bool engine_held_out_rows = true;
  // The fitted step records' rows at the final constants: after the last refit, one more refresh
  // (a simulation per fitted step record) that only re-prices those rows. Off, they keep the
  // ratios of the refresh before; the constants are the same either way. A cross-validation, which
  // reads only its left-out records, turns it off.
  bool engine_fitted_rows = true;
  int threads = 0;  // threads for the Jacobian's columns (0: the machine's cores, at most 4)
  // Published compute time of a step record (record id → seconds rank 0's compute stream is busy,
  // replay included: "compute_with_replay_s" of traces/paper/published-breakdowns.json). Each is
  // one more residual, log(predicted busy / published), weighted `anchor_weight`, fitted with its
  // record (a held-out or left-out record's anchor is left out too). It separates what the step
  // time alone cannot: compute from the non-compute time the step exposes beside it.
  std::map<std::string, double> compute_anchors_s;
  double anchor_weight = 1.0;
  // A step record's measured breakdown (Measured::compute_s: rank 0's compute-stream busy time by
  // direction and operator kind, e.g. from the traced step `oom calibrate --backend` records):
  // each kind's share of the stream (forward and backward; kinds under 3 % left out) is one more
  // residual, log(predicted share / measured share), weighted breakdown_weight / √(the record's
  // shares), so a record's breakdown weighs about as much as its step. Shares, not seconds: a
  // traced step's clock and tracing overhead scale every kind alike. They separate what the step
  // time alone cannot, e.g. an attention core's forward from its backward. 0 (default): step times
  // only. (On the recorded local runs the breakdowns showed each kind's time to be mostly
  // per-operator dispatch, now priced per operator (Stage::ops); fitted to both, the out-of-sample
  // step errors barely move: backend/README.md.)
  double breakdown_weight = 0.0;
  // The attention key-span ramp to keep (Calibration::attention_half_keys); < 0: the estimate's.
  // Devices whose attention kernels have no GPU tile-fill ramp (the CPU backend) set 0.
  double attention_half_keys = -1;
  // The constants' ranges: around their datasheet estimates, each within what published GPU
  // kernels reach (default); or, for a device measured by its own probes (`oom calibrate
  // --backend`: a CPU, whose efficiencies against its measured GEMM peak have no GPU figure to
  // bound them), within a factor `measured_device_range` of the estimate both ways, efficiencies ≤ 1.
  double measured_device_range = 0;  // 0: the published ranges
  // The estimate of Calibration::operator_overhead_s (dispatch per operator a compute stage
  // issues); 0 (default): not fitted, held at 0 (a GPU's host runs ahead of its stream).
  double operator_overhead_s = 0;
  static std::vector<std::string> default_held_out_ids();
};

// A record's residual under the soft-L1 loss of scale `scale` (FitOptions::robust_scale): its
// square is 2·scale²·(√(1 + (e/scale)²) − 1), e² near 0 and 2·scale·|e| far out; the sign of e.
// scale ≤ 0: e itself (least squares).
double robust_residual(double e, double scale);

// A device measured by its own probes (`oom calibrate --backend`, `--measured-device`): constants
// within ×100 of their probe-based estimates, no attention key-span ramp (LibTorch's CPU
// attention kernels have no GPU tile fill), and a dispatch cost per operator fitted from 5 µs.
void use_measured_device(FitOptions& o);

// What a record is to the fit and its reports: the step of a plan, the step of a baseline system,
// or one operator timed alone. record_kind_name() spells it in JSON and tables ("step",
// "baseline", "operator").
enum class RecordKind { kStep, kBaseline, kOperator };
std::string_view record_kind_name(RecordKind k);

struct FitRow {
  std::string id;
  RecordKind kind = RecordKind::kStep;  // kStep or kOperator (the fit uses no baseline record)
  bool held_out = false;
  double measured_s = 0;
  double predicted_s = 0;  // with the fitted constants
  std::optional<double> compute_anchor_s;  // step records: the published compute time the fit matched
  double predicted_compute_s = 0;          // step records: rank 0's compute-stream busy time
  double rel_error() const { return (predicted_s - measured_s) / measured_s; }
};

struct CalibrationFit {
  Calibration calibration;  // of the first hardware fitted (the only one, unless fitted together)
  std::vector<Calibration> calibrations;  // one per hardware fitted, in the order they were given
  std::vector<std::string> fitted;   // names of the constants the records exercised and the fit moved
  std::vector<FitRow> rows;          // every record of the hardware that could be predicted
  std::vector<std::string> skipped;  // "id: reason" for records that could not be used
  int iterations = 0;
  // The run the constants come from ended converged (the cost stopped falling or the constants
  // stopped moving), not at FitOptions::max_iterations.
  bool converged = false;
};

// Fits `hardware`'s constants to the records that name it (by HardwareSpec name). Throws
// InputError when no usable record names the hardware or options.engines does not offer options.engine.
CalibrationFit fit_calibration(const RecordSet& records, const HardwareSpec& hardware, const FitOptions& options = {});
// Fits several hardware together, one calibration each (CalibrationFit::calibrations): a GPU
// constant is shared by the hardware of one GPU architecture, a collective's by those of one
// fabric kind, and the link and CPU rates are one fraction of each hardware's datasheet rate for
// all of them (the records of one hardware then inform the others'). With one hardware, the same
// fit as above.
CalibrationFit fit_calibration(const RecordSet& records, const std::vector<HardwareSpec>& hardware, const FitOptions& options = {});
// The hardware's names, in order, between `separator`s: how messages and reports name a joint fit.
std::string hardware_names(const std::vector<HardwareSpec>& hardware, std::string_view separator = ", ");

// The records of one hardware lowered for fitting (each plan lowered once). A caller that fits the
// same records many times (a cross-validation's folds, on several threads) prepares them once:
// fit_calibration(prepare_fit_records(r, h, o), o') equals fit_calibration(r, h, o') for any o'
// with o's breakdown_weight (> 0 or not). Shared by concurrent fits; immutable but for the step
// times another engine gave, which the fits share (each simulated once).
struct FitRecords;
std::shared_ptr<const FitRecords> prepare_fit_records(const RecordSet& records, const HardwareSpec& hardware, const FitOptions& options);
std::shared_ptr<const FitRecords> prepare_fit_records(const RecordSet& records, const std::vector<HardwareSpec>& hardware,
                                                      const FitOptions& options);
CalibrationFit fit_calibration(const FitRecords& records, const FitOptions& options);

nlohmann::json calibration_fit_to_json(const CalibrationFit& fit);
std::string calibration_fit_text(const CalibrationFit& fit);

}  // namespace oom
