// The `oom` Python module (pybind11): specs, plan search, simulation, baselines, validation,
// traces, studies and plots, for notebooks.
//
// Every function takes and returns plain Python values: dicts and lists shaped like the project's
// JSON (workloads, plans, reports), and numpy arrays for stage times. Errors: bad input raises
// ValueError with the project's one-line message (file, field, value); a workload that no plan
// fits raises RuntimeError with the reason. Functions hold the GIL; call from one thread. The step
// engines are built once when the module loads: "analytic", and "simgrid" when the module is built
// with the oom_sim library.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>

#include "costmodel/config_paths.h"
#include "costmodel/hardware_spec.h"
#include "costmodel/input_error.h"
#include "costmodel/model_spec.h"
#include "costmodel/params.h"
#include "costmodel/version.h"
#include "experiments/ablation.h"
#include "experiments/published.h"
#include "experiments/study.h"
#include "planner/calibration/calibration.h"
#include "planner/calibration/validation.h"
#include "planner/engine/step_engine.h"
#include "planner/engine/baseline_run.h"
#include "planner/lowering/baselines.h"
#include "planner/plan/plan.h"
#include "python/plot_bridge.h"
#include "traces/records.h"
#include "traces/trace.h"

#include "experiments/plan_finder.h"
#include "planner/search/plan_search.h"

#if defined(OOM_HAVE_SIMGRID_ENGINE) && __has_include("sim/simgrid_engine.h")
#include "sim/simgrid_engine.h"
#define OOM_PY_SIMGRID 1
#endif

namespace py = pybind11;

namespace oom {
namespace {

// JSON ↔ Python through the json module: exact for every value the project writes.
py::object to_py(const nlohmann::json& j) { return py::module_::import("json").attr("loads")(j.dump()); }
nlohmann::json from_py(const py::handle& o) {
  return nlohmann::json::parse(py::module_::import("json").attr("dumps")(o).cast<std::string>());
}

WorkloadContext context_of(const py::dict& workload) {
  const Workload w = workload_from_json(from_py(workload), "<python>", "workload");
  return resolve_workload(w, "<python>");
}

py::dict stages_of(const Trace& t) {
  const std::size_t n = t.stages.size();
  py::array_t<double> start(static_cast<py::ssize_t>(n)), end(static_cast<py::ssize_t>(n));
  py::list names, kinds, resources, layers;
  auto s = start.mutable_unchecked<1>();
  auto e = end.mutable_unchecked<1>();
  for (std::size_t i = 0; i < n; ++i) {
    const TraceStage& st = t.stages[i];
    s(static_cast<py::ssize_t>(i)) = st.start_s;
    e(static_cast<py::ssize_t>(i)) = st.end_s;
    names.append(st.name);
    kinds.append(st.kind);
    resources.append(st.resource);
    layers.append(st.layer);
  }
  py::dict d;
  d["name"] = names;
  d["kind"] = kinds;
  d["resource"] = resources;
  d["layer"] = layers;
  d["start_s"] = start;
  d["end_s"] = end;
  return d;
}

py::dict model(const std::string& name) {
  const ModelSpec m = load_model_spec(name);
  const ModelParams p = model_params(m);
  py::dict d;
  d["name"] = m.name;
  d["layers"] = m.layers;
  d["hidden"] = m.hidden;
  d["experts"] = m.moe.experts;
  d["top_k"] = m.moe.top_k;
  d["max_position"] = m.max_position;
  py::list kinds;
  for (const auto k : m.layer_kinds) kinds.append(std::string(layer_kind_name(k)));
  d["layer_kinds"] = kinds;
  d["total_params"] = p.total();
  d["active_params"] = p.active();
  return d;
}

// The engines of the module: the simulator's where it is built in.
StepEngines module_engines() {
#ifdef OOM_PY_SIMGRID
  return simulator_engines();
#else
  return StepEngines();
#endif
}

py::dict simulate(const StepEngines& engines, const py::dict& workload, const py::dict& plan_json, const std::string& engine,
                  bool every_rank) {
  const WorkloadContext ctx = context_of(workload);
  const Plan plan = plan_from_json(from_py(plan_json), "<python>", "plan");
  validate_plan(plan, ctx.model, ctx.workload, "<python>", "plan");
  const SimulationResult r = simulate_plan(plan, ctx, engines, engine, load_calibration_for(ctx.hardware), every_rank);
  py::dict d = to_py(simulation_to_json(r));
  d["stages_table"] = stages_of(r.trace);
  d["trace"] = to_py(trace_to_json(r.trace));
  return d;
}

py::dict baseline(const StepEngines& engines, const std::string& system, const py::dict& workload, const std::string& engine) {
  const auto s = baseline_system_from_name(system);
  if (!s) throw InputError("", "system", "\"" + system + "\"", "unknown baseline system (fsdp2-offload, zero-offload, megatrain)");
  const WorkloadContext ctx = context_of(workload);
  const BaselineResult r = run_baseline(*s, ctx, engines, engine, load_calibration_for(ctx.hardware));
  py::dict d = to_py(baseline_result_to_json(r));
  if (r.fits()) d["stages_table"] = stages_of(r.trace);
  return d;
}

py::list records(const std::string& path) {
  const RecordSet set = load_records(path);
  py::list out;
  for (const auto& r : set.steps) out.append(to_py(step_record_to_json(r)));
  for (const auto& r : set.operators) out.append(to_py(operator_record_to_json(r)));
  return out;
}


}  // namespace
}  // namespace oom

PYBIND11_MODULE(_oom, m) {
  using namespace oom;
  m.doc() = "OOM: offload-optimized full-parameter MoE training: specs, plan search, simulation, baselines, validation, studies";
  const StepEngines engines = module_engines();
  py::register_exception<InputError>(m, "InputError", PyExc_ValueError);
  py::register_exception<PlotError>(m, "PlotError", PyExc_RuntimeError);

  m.attr("__version__") = std::string(oom_project_version());
  m.def("version_text", &oom_version_text, "The version and commit every file the project writes carries (\"oom_version\")");
  m.def("_set_data_root", &set_program_data_root, py::arg("folder"),
        "Where the package's shipped data is (configs/, experiments/, traces/paper/); called by oom/__init__.py");
  m.def("data_root", [] {
    const auto root = shipped_data_root();
    if (!root) throw InputError("", "data", "(not found)", "no shipped data folder (an installed package holds oom/share/oom)");
    return root->folder;
  }, "The folder of the shipped data (configs/, experiments/, traces/paper/) and how it was found");
  m.def("config_root", [] { return config_root(); }, "The configs folder in use ($OOM_CONFIG_DIR, else the shipped data's configs/)");

  m.def("model_names", [] { return config_names("models"); }, "Models in configs/models");
  m.def("hardware_names", [] { return config_names("hardware"); }, "Hardware in configs/hardware");
  m.def("model", &model, py::arg("name"), "A model's dimensions and parameter counts");
  m.def("hardware", [](const std::string& name) { return to_py(hardware_spec_to_json(load_hardware_spec(name))); },
        py::arg("name"), "A hardware spec as a dict");
  m.def("calibration", [](const std::string& name) { return to_py(calibration_to_json(load_calibration_for(load_hardware_spec(name)))); },
        py::arg("hardware"), "The calibration constants of a hardware");
  m.def("engines", [engines] { return engines.names(); }, "The step engines this module offers");
  m.def("simulate", [engines](const py::dict& workload, const py::dict& plan, const std::string& engine, bool every_rank) {
    return simulate(engines, workload, plan, engine, every_rank);
  }, py::arg("workload"), py::arg("plan"), py::arg("engine") = "analytic", py::arg("every_rank") = false,
     "Lower a plan and execute it: step time, peaks, breakdown, 'stages_table' (numpy start_s/end_s), 'trace'; "
     "on alike nodes one node's stages stand for all ('ranks_emitted') unless every_rank");
  m.def("baseline", [engines](const std::string& system, const py::dict& workload, const std::string& engine) {
    return baseline(engines, system, workload, engine);
  }, py::arg("system"), py::arg("workload"), py::arg("engine") = "analytic",
     "Run a baseline system (fsdp2-offload, zero-offload, megatrain): step or out-of-memory with where");
  m.def("baseline_systems", [] {
    std::vector<std::string> out;
    for (const auto s : all_baseline_systems()) out.emplace_back(baseline_system_name(s));
    return out;
  });
  m.def("records", &records, py::arg("path"), "The records of a JSON Lines file as dicts");
  m.def("validate", [engines](const std::string& path, const std::string& engine) {
    return to_py(validation_to_json(validate_records(load_records(path), engines, engine)));
  }, py::arg("path"), py::arg("engine") = "analytic", "Predicted vs measured for every step record");
  m.def("chrome_trace", [](const py::dict& trace) { return to_py(trace_to_chrome_json(trace_from_json(from_py(trace), "<python>"))); },
        py::arg("trace"), "A trace dict (simulate()['trace']) as Chrome/Perfetto trace events");
  m.def("default_study", [] { return to_py(study_to_json(default_study())); }, "The default what-if study as a dict");
  m.def("search_plan", [engines](const py::dict& workload, const std::string& path) {
    PlanSearchOptions o;
    o.path = path;
    o.engines = engines;
    const WorkloadContext ctx = context_of(workload);
    try {
      return to_py(plan_search_to_json(search_plan(ctx, load_calibration_for(ctx.hardware), o)));
    } catch (const InfeasibleWorkload& e) {
      throw std::runtime_error(e.what());
    }
  }, py::arg("workload"), py::arg("path") = "auto", "Search the best plan of a workload (raises RuntimeError when nothing fits)");
  m.def("whatif", [engines](const py::object& study, const std::string& published) {
    const StudySpec spec = study.is_none() ? default_study() : study_from_json(from_py(study), "<python>");
    StudyResult r = run_study(spec, engines, &find_plan_by_search);
    if (!published.empty()) attach_published(r, load_records(published), published);
    py::dict d = to_py(study_result_to_json(r));
    d["csv"] = study_csv(r);
    d["table"] = study_table_text(r);
    return d;
  }, py::arg("study") = py::none(), py::arg("published") = "",
     "Run a study (a dict like experiments/*.json; None = the default study); published: a records file to match");
  m.def("ablation", [engines](const py::object& study) {
    const bool is_path = py::isinstance<py::str>(study);
    const std::string file = is_path ? study.cast<std::string>() : std::string("<python>");
    const AblationSpec spec = is_path ? load_ablation(file) : ablation_from_json(from_py(study.cast<py::dict>()), file);
    const AblationResult r = run_ablation(spec, engines, file);
    py::dict d = to_py(ablation_result_to_json(r));
    d["csv"] = ablation_csv(r);
    d["table"] = ablation_table_text(r);
    return d;
  }, py::arg("study"), "Run a matched component study (a path or a dict like experiments/flat-*.json)");
  m.def("plot_png", [](const std::string& kind, const std::string& text, const std::string& sweep, const std::string& title) {
    return py::bytes(render_plot_png(plot_kind_from_name(kind, "kind"), text, sweep, title));
  }, py::arg("kind"), py::arg("text"), py::arg("sweep") = "", py::arg("title") = "",
     "PNG bytes of a plot: kind throughput|memory (study CSV text), timeline (trace JSON text) or ablation (ablation CSV text)");
}
