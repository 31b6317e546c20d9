// `oom simulate --workload W.json --plan P.json [--engine analytic|simgrid] [--calibration C.json] [--trace out.json] [--json]`,
// `oom validate FILE.jsonl [--engine ...] [--json] [--explain ID [--published FILE]]` and
// `oom calibrate --records FILE --hardware NAME [--engine E] [--hold-out ID,...|none] -o configs/calibration/NAME.json` and
// `oom calibrate --records FILE --hardware NAME --cross-validate model|hardware|gpus|path|record [--engine E]
// [--measured-device] [--breakdown-weight W] [--starts N] [--screen-iterations N] [--finalists N]
// [--prior-weight W] [--robust-scale S] [--json]`.
#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>

#include <CLI/CLI.hpp>
#include <fmt/ranges.h>
#include <fmt/format.h>

#include "cli/cli.h"
#include "costmodel/input_error.h"
#include "costmodel/atomic_file.h"
#include "costmodel/config_paths.h"
#include "costmodel/output_path.h"
#include "costmodel/version.h"
#include "planner/calibration/calibrate.h"
#include "planner/calibration/cross_validation.h"
#include "planner/calibration/validation.h"
#include "planner/calibration/explain.h"
#include "planner/engine/step_engine.h"
#include "planner/lowering/graph_size_estimate.h"
#include "traces/records.h"

namespace oom::cli {
namespace {

struct SimulateArgs {
  std::string workload_path, plan_path, engine = "analytic", trace_path, output, calibration_path;
  std::optional<int> nodes;
  bool json = false, every_rank = false;
};

struct ValidateArgs {
  std::vector<std::string> records_paths;
  std::string engine = "analytic", output, explain, published;
  bool json = false;
};

struct CalibrateArgs {
  std::vector<std::string> records_paths, hardware;
  std::string output, cross_validate, published, engine = "analytic";
  bool measured_device = false;
  double breakdown_weight = 0.0;
  // The fit's search (FitOptions): starting points, screening, finalists, the prior's pull.
  int starts = FitOptions{}.starts;
  int screen_iterations = FitOptions{}.screen_iterations;
  int finalists = FitOptions{}.finalists;
  double prior_weight = FitOptions{}.prior_weight;
  double robust_scale = FitOptions{}.robust_scale;
  // Records predicted but not fitted (comma-separated ids, or "none"); not given: the default set.
  std::string hold_out;
  bool json = false;
};

// The ids `--hold-out` names: "none" holds out nothing; otherwise comma-separated ids, each of a
// record of `hw` in `records` (a misspelt id would silently fit the record it meant to check).
std::vector<std::string> held_out_ids(const std::string& value, const RecordSet& records, const std::vector<HardwareSpec>& hws,
                                      const std::string& records_path) {
  if (value == "none") return {};
  std::set<std::string> known, names;
  for (const HardwareSpec& hw : hws) names.insert(hw.name);
  for (const auto& r : records.steps) {
    if (names.count(r.workload.hardware)) known.insert(r.id);
  }
  for (const auto& o : records.operators) {
    if (names.count(o.hardware)) known.insert(o.id);
  }
  std::vector<std::string> ids;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t end = std::min(value.find(',', begin), value.size());
    const std::string id = value.substr(begin, end - begin);
    if (id.empty()) throw InputError("", "--hold-out", "\"" + value + "\"", "an empty id (comma-separated ids, or none)");
    if (!known.count(id)) {
      throw InputError("", "--hold-out", "\"" + id + "\"", fmt::format("no record of {} in {} has this id", hardware_names(hws), records_path));
    }
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    if (end == value.size()) break;
    begin = end + 1;
  }
  return ids;
}

// The fit's search options from the command line, each checked against its range.
void apply_search_options(const CalibrateArgs& a, FitOptions& o) {
  auto check = [](bool ok, const char* flag, const std::string& value, const std::string& reason) {
    if (!ok) throw InputError("", flag, value, reason);
  };
  check(a.starts >= 1 && a.starts <= 64, "--starts", std::to_string(a.starts), "out of range [1, 64]");
  check(a.screen_iterations >= 0 && a.screen_iterations <= o.max_iterations, "--screen-iterations",
        std::to_string(a.screen_iterations), fmt::format("out of range [0, {}]", o.max_iterations));
  // As many finalists as starts or more: every start runs to convergence.
  check(a.finalists >= 1 && a.finalists <= 64, "--finalists", std::to_string(a.finalists), "out of range [1, 64]");
  check(a.prior_weight >= 0 && a.prior_weight <= 10, "--prior-weight", fmt::format("{}", a.prior_weight), "out of range [0, 10]");
  check(a.robust_scale >= 0 && a.robust_scale <= 10, "--robust-scale", fmt::format("{}", a.robust_scale), "out of range [0, 10]");
  // (Written so that NaN fails too: CLI11's Range lets it through.)
  check(a.breakdown_weight >= 0 && a.breakdown_weight <= 100, "--breakdown-weight", fmt::format("{}", a.breakdown_weight),
        "out of range [0, 100]");
  o.starts = a.starts;
  o.screen_iterations = a.screen_iterations;
  o.finalists = a.finalists;
  o.prior_weight = a.prior_weight;
  o.robust_scale = a.robust_scale;
}

// The file of the published breakdowns: `explicit_path`, else published-breakdowns.json beside
// the records file when there is one, else "" (none).
std::string published_breakdowns_path(const std::string& records_path, const std::string& explicit_path) {
  if (!explicit_path.empty()) return explicit_path;
  const auto beside = std::filesystem::path(records_path).parent_path() / "published-breakdowns.json";
  std::error_code ec;
  return std::filesystem::is_regular_file(beside, ec) ? beside.string() : std::string();
}

std::vector<PublishedBreakdown> published_breakdowns(const std::string& records_path, const std::string& explicit_path) {
  const std::string path = published_breakdowns_path(records_path, explicit_path);
  return path.empty() ? std::vector<PublishedBreakdown>{} : load_published_breakdowns(path);
}

// The records files as one name for messages ("a.jsonl, b.jsonl").
std::string joined(const std::vector<std::string>& paths) { return fmt::format("{}", fmt::join(paths, ", ")); }

// The hardware `--hardware` names: names or paths, or "all": every hardware the records name, in
// the order they first appear (step records with a measured time, then operator records).
std::vector<HardwareSpec> hardware_to_fit(const std::vector<std::string>& given, const RecordSet& records) {
  std::vector<std::string> names;
  auto add = [&](const std::string& n) {
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  };
  for (const std::string& g : given) {
    if (g != "all") {
      add(g);
      continue;
    }
    for (const auto& r : records.steps) {
      if (r.measured.step_s) add(r.workload.hardware);
    }
    for (const auto& o : records.operators) add(o.hardware);
  }
  std::vector<HardwareSpec> out;
  for (const std::string& n : names) {
    HardwareSpec h = load_hardware_spec(n);
    const bool twice = std::any_of(out.begin(), out.end(), [&](const HardwareSpec& o) { return o.name == h.name; });
    if (twice) throw InputError("", "--hardware", "\"" + n + "\"", "names a hardware given already (" + h.name + ")");
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace

void add_simulate_commands(CLI::App& app, Io io, const StepEngines& engines) {
  const std::string engine_help = fmt::format("Step engine: {}", fmt::join(engines.names(), " | "));

  auto sim = std::make_shared<SimulateArgs>();
  auto* s = app.add_subcommand("simulate", "Lower a plan to a StepGraph and execute it: step time, memory peaks, breakdown, trace");
  add_max_stages_option(s);
  s->add_option("--workload", sim->workload_path, "Workload JSON")->required();
  s->add_option("--plan", sim->plan_path, "Plan JSON")->required();
  add_nodes_option(s, sim->nodes);
  s->add_option("--engine", sim->engine, engine_help);
  s->add_option("--trace", sim->trace_path, "Write the Chrome/Perfetto trace JSON to this file");
  s->add_option("--calibration", sim->calibration_path,
                "Calibration JSON (default: configs/calibration/<hardware>.<engine>.json, else <hardware>.json, else its node's, else one of its GPU architecture's, transferred; else uncalibrated)");
  s->add_flag("--every-rank", sim->every_rank,
              "Lower every rank's stages even when every node runs the same schedule (by default one node's stand for all: same step and peaks)");
  s->add_flag("--json", sim->json, "Print one JSON object");
  s->add_option("-o,--output", sim->output, "Write the report to this file (atomically) instead of stdout");
  s->callback([=] {
    check_output_files({sim->output, sim->trace_path}, {sim->workload_path, sim->plan_path, sim->calibration_path});
    Workload w = load_workload(sim->workload_path);
    apply_nodes_option(w, sim->nodes);
    const WorkloadContext ctx = resolve_workload(w, sim->workload_path);
    const Plan plan = load_plan(sim->plan_path);
    validate_plan(plan, ctx.model, ctx.workload, sim->plan_path);
    LoweringOptions sized;
    sized.symmetric_nodes = !sim->every_rank;  // as simulate_plan lowers it
    check_step_graph_size(plan, ctx, sized, sim->plan_path, sim->workload_path);
    std::string source = sim->calibration_path;
    const Calibration calibration = source.empty() ? load_calibration_for(ctx.hardware, sim->engine, &source)
                                                   : load_calibration_file(source, ctx.hardware);
    const SimulationResult r = simulate_plan(plan, ctx, engines, sim->engine, calibration, sim->every_rank);
    if (!sim->trace_path.empty()) emit(sim->trace_path, with_oom_version(trace_to_chrome_json(r.trace)).dump() + "\n", io);
    if (sim->json) {
      nlohmann::json j = simulation_to_json(r);
      j["workload"] = workload_to_json(ctx.workload);
      j["calibration"] = source;
      emit(sim->output, with_oom_version(j).dump(2) + "\n", io);
    } else {
      emit(sim->output, simulation_text(r) + "calibration: " + source + "\n", io);
    }
  });

  auto val = std::make_shared<ValidateArgs>();
  auto* v = app.add_subcommand("validate", "Predict every step record of a JSON Lines file and compare with the measurement");
  add_max_stages_option(v);
  v->add_option("records", val->records_paths, "Recorded measurements (JSON Lines; several files are read as one set)")->required();
  v->add_option("--engine", val->engine, engine_help);
  v->add_flag("--json", val->json, "Print one JSON object (count, median/max |relative error|, records)");
  v->add_option("-o,--output", val->output, "Write the output to this file (atomically) instead of stdout");
  v->add_option("--explain", val->explain,
                "Explain one record's prediction: busy time per resource, exposed time per mechanism, beside the published breakdown");
  v->add_option("--published", val->published,
                "Published breakdowns (default: published-breakdowns.json beside the records file, when present)");
  v->callback([=] {
    std::vector<std::string> inputs = val->records_paths;
    inputs.push_back(published_breakdowns_path(val->records_paths.front(), val->published));
    check_output_files({val->output}, inputs);
    if (!engines.has(val->engine)) {
      throw InputError("", "--engine", "\"" + val->engine + "\"", "unknown engine");
    }
    const RecordSet records = load_records(val->records_paths);
    if (!val->explain.empty()) {
      const std::vector<PublishedBreakdown> breakdowns = published_breakdowns(val->records_paths.front(), val->published);
      const StepExplanation e = explain_record(records, joined(val->records_paths), val->explain, engines, val->engine, breakdowns);
      emit(val->output, val->json ? with_oom_version(explanation_to_json(e)).dump(2) + "\n" : explanation_text(e), io);
      return;
    }
    const ValidationReport r = validate_records(records, engines, val->engine);
    emit(val->output, val->json ? with_oom_version(validation_to_json(r)).dump(2) + "\n" : validation_text(r), io);
  });

  auto cal = std::make_shared<CalibrateArgs>();
  auto* c = app.add_subcommand("calibrate", "Fit a hardware's physical constants to recorded measurements (least squares)");
  add_max_stages_option(c);
  c->add_option("--records", cal->records_paths, "Recorded measurements (JSON Lines; several files are read as one set)");
  c->add_option("--hardware", cal->hardware,
                "Hardware names or paths (configs/hardware), or all: every hardware the records name. Several are fitted "
                "together: GPU constants per GPU architecture, collectives per fabric kind, link and CPU rates as one fraction of "
                "each datasheet's");
  c->add_option("-o,--output", cal->output,
                "Calibration file to write (e.g. configs/calibration/NAME.json); with several hardware, the folder that takes "
                "NAME.json (NAME.ENGINE.json for another engine than analytic) of each");
  c->add_flag("--json", cal->json, "Print the fit summary (or the cross-validation) as JSON");
  c->add_option("--engine", cal->engine, "Engine the fit matches and that predicts: " + fmt::format("{}", fmt::join(engines.names(), " | ")));
  c->add_option("--published", cal->published,
                "Published breakdowns whose compute times the fit also matches (default: published-breakdowns.json beside the records file, when present)");
  c->add_option("--cross-validate", cal->cross_validate,
                "Refit leaving each group out and predict it: model | hardware | gpus | path | record (-o then writes the report)");
  c->add_flag("--measured-device", cal->measured_device,
              "The hardware was measured by its own probes (oom calibrate --backend, e.g. local-cpu): constants within ×100 of "
              "their estimates instead of the published GPU kernel ranges, no attention tile-fill ramp (as that command fits)");
  c->add_option("--breakdown-weight", cal->breakdown_weight,
                "Weight of the records' measured compute breakdowns (measured.compute_s: each kind's share of the compute "
                "stream) against their step times; 0 (default) fits step times only");
  c->add_option("--starts", cal->starts,
                fmt::format("Deterministic starting points of the fit (the estimate, then perturbations of it within ×3; default {})",
                            FitOptions{}.starts));
  c->add_option("--screen-iterations", cal->screen_iterations,
                fmt::format("Iterations every start runs before the lowest go on to convergence; 0: every start to convergence "
                            "(default {})",
                            FitOptions{}.screen_iterations));
  c->add_option("--finalists", cal->finalists,
                fmt::format("Starts that run on to convergence after screening; as many as --starts or more: every start (default {})",
                            FitOptions{}.finalists));
  c->add_option("--prior-weight", cal->prior_weight,
                fmt::format("Weight of each constant's pull to its estimate, per unit of log(constant / estimate) (default {})",
                            FitOptions{}.prior_weight));
  c->add_option("--robust-scale", cal->robust_scale,
                fmt::format("Soft-L1 scale of a record's log error: records far past it weigh in proportion to their error, not its "
                            "square; 0: plain least squares (default {})",
                            FitOptions{}.robust_scale));
  const CLI::Option* hold_out = c->add_option("--hold-out", cal->hold_out,
                fmt::format("Records predicted but not fitted, to check the fit: comma-separated ids, or none (default: {}; not with "
                            "--cross-validate, whose folds hold out their own groups)",
                            fmt::join(FitOptions::default_held_out_ids(), ",")));
  const std::function<bool()> backend = add_backend_calibration(*c, io);  // `oom calibrate --backend` (plugin)
  c->callback([=] {
    if (backend()) return;
    const bool cross = !cal->cross_validate.empty();
    for (const auto& [flag, given] : {std::pair{"--records", !cal->records_paths.empty()}, std::pair{"--hardware", !cal->hardware.empty()},
                                      std::pair{"--output", cross || !cal->output.empty()}}) {
      if (!given) throw InputError("", flag, "missing", "required (or --backend to measure this machine)");
    }
    const std::optional<CvGrouping> grouping = cv_grouping_from_name(cal->cross_validate);
    if (cross && !grouping) {
      throw InputError("", "--cross-validate", "\"" + cal->cross_validate + "\"",
                       "unknown grouping (model, hardware, gpus, path, record, class)");
    }
    if (!engines.has(cal->engine)) {
      throw InputError("", "--engine", "\"" + cal->engine + "\"", "unknown engine");
    }
    // Given at all, even empty ("--hold-out ''" is a value, and no id), it is checked.
    const bool hold_out_given = hold_out->count() > 0;
    if (hold_out_given && cal->hold_out.empty()) {
      throw InputError("", "--hold-out", "\"\"", "empty: give comma-separated record ids, or none");
    }
    if (cross && hold_out_given) {
      throw InputError("", "--hold-out", "\"" + cal->hold_out + "\"", "not with --cross-validate (each fold holds out its own group)");
    }
    std::vector<std::string> inputs = cal->records_paths;
    for (const std::string& h : cal->hardware) inputs.push_back(resolve_config("hardware", h).value_or(h));
    inputs.push_back(published_breakdowns_path(cal->records_paths.front(), cal->published));
    // One hardware: -o is its calibration file, checked before anything is loaded. Several (or
    // "all", which the records resolve): -o is the folder of their files.
    const bool maybe_several = !cross && (cal->hardware.size() > 1 || cal->hardware.front() == "all");
    if (!maybe_several) check_output_files({cal->output}, inputs);
    FitOptions search;  // the fit's search options, checked before anything is loaded
    apply_search_options(*cal, search);
    const RecordSet records = load_records(cal->records_paths);
    const std::vector<HardwareSpec> hws = hardware_to_fit(cal->hardware, records);
    if (hws.empty()) throw InputError(joined(cal->records_paths), "--hardware all: no record names a hardware");
    const bool several = hws.size() > 1 && !cross;
    std::vector<std::string> files;
    for (const HardwareSpec& h : hws) files.push_back(h.name + (cal->engine == "analytic" ? "" : "." + cal->engine) + ".json");
    if (several) check_output_folder(cal->output, files, inputs);
    else if (maybe_several) check_output_files({cal->output}, inputs);
    const std::map<std::string, double> anchors =
        published_compute_times_s(published_breakdowns(cal->records_paths.front(), cal->published));
    if (cross) {
      CvOptions options;
      options.fit = search;
      options.grouping = *grouping;
      options.engine = cal->engine;
      options.engines = engines;
      options.fit.engine = cal->engine;
      options.fit.compute_anchors_s = anchors;
      if (cal->measured_device) use_measured_device(options.fit);
      options.fit.breakdown_weight = cal->breakdown_weight;
      const CrossValidation cv = cross_validate(records, hws, options);
      emit(cal->output, cal->json ? with_oom_version(cross_validation_to_json(cv)).dump(2) + "\n" : cross_validation_text(cv), io);
      return;
    }
    FitOptions options = search;
    if (hold_out_given) options.held_out_ids = held_out_ids(cal->hold_out, records, hws, joined(cal->records_paths));
    options.engine = cal->engine;
    options.engines = engines;
    options.compute_anchors_s = anchors;
    if (cal->measured_device) use_measured_device(options);
    options.breakdown_weight = cal->breakdown_weight;
    const CalibrationFit fit = fit_calibration(records, hws, options);
    if (several) {
      std::filesystem::create_directories(cal->output);
      for (std::size_t h = 0; h < hws.size(); ++h) {
        write_file_atomically((std::filesystem::path(cal->output) / files[h]).string(),
                              with_oom_version(calibration_to_json(fit.calibrations[h])).dump(2) + "\n");
      }
    } else {
      emit(cal->output, with_oom_version(calibration_to_json(fit.calibration)).dump(2) + "\n", io);
    }
    io.out << (cal->json ? with_oom_version(calibration_fit_to_json(fit)).dump(2) + "\n" : calibration_fit_text(fit));
  });
}

}  // namespace oom::cli
