// `oom calibrate --backend [--name local-cpu] [--quick]`: measures this machine with short
// executions of the LibTorch backend, records plan-driven steps of tiny models, and fits the cost
// model's constants to them (backend/measure/local_calibration.h). Writes, atomically:
//   configs/hardware/NAME.json      the measured HardwareSpec (every number names its measurement)
//   traces/recorded/NAME.jsonl      the recorded step records (model, shape, plan, measured step)
//   configs/calibration/NAME.json   the fitted Calibration (every third record held out)
// and prints the fit: constants and each record's measured and predicted step. `--refit` fits
// again from the files already written, without measuring.
#include <functional>
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "backend/measure/local_calibration.h"
#include "cli/cli.h"
#include "costmodel/atomic_file.h"
#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"
#include "costmodel/output_path.h"
#include "costmodel/version.h"
#include "planner/calibration/calibrate.h"
#include "traces/records.h"

namespace oom::cli {
namespace {

struct BackendCalibrationArgs {
  bool backend = false, quick = false, refit = false;
  std::string name = "local-cpu", hardware_out, records_out, calibration_out;
  int steps = 16, threads = 1;
  bool wall = false;
};

void run_backend_calibration(const BackendCalibrationArgs& a, Io io) {
  if (a.name.empty() || a.name.find('/') != std::string::npos) {
    throw InputError("", "--name", a.name, "expected a plain hardware name such as local-cpu");
  }
  if (a.steps < 1) throw InputError("", "--steps", std::to_string(a.steps), "must be ≥ 1");
  const std::string hw_path = a.hardware_out.empty() ? config_folder("hardware") + "/" + a.name + ".json" : a.hardware_out;
  const std::string cal_path = a.calibration_out.empty() ? config_root() + "/calibration/" + a.name + ".json" : a.calibration_out;
  const std::string rec_path = a.records_out.empty() ? config_root() + "/../traces/recorded/" + a.name + ".jsonl" : a.records_out;
  // Checked before the machine is measured: with --refit the hardware and records are inputs.
  if (a.refit) {
    check_output_files({cal_path}, {hw_path, rec_path});
  } else {
    check_output_files({hw_path, rec_path, cal_path}, {});
  }

  RecordSet records;
  HardwareSpec hw;
  if (a.refit) {
    hw = load_hardware_spec(hw_path);
    records = load_records(rec_path);
  } else {
    backend::LocalMeasureOptions mo;
    mo.name = a.name;
    mo.threads = a.threads;
    mo.cpu_time = !a.wall;
    if (a.quick) mo.seconds_per_probe = 0.05;
    hw = backend::measure_local_hardware(mo);
    write_file_atomically(hw_path, with_oom_version(hardware_spec_to_json(hw)).dump(2) + "\n");
    io.out << fmt::format("{}: {:.3g} GFLOP/s GEMM, {:.3g} GB/s memory, {:.3g} M AdamW params/s -> {}\n", hw.name,
                          hw.gpu.bf16_flops_per_s * 1e-9, hw.gpu.hbm_Bps * 1e-9, hw.numa[0].adamw_params_per_s * 1e-6,
                          hw_path);
    io.out.flush();
    auto runs = backend::default_local_runs();
    if (a.quick) std::erase_if(runs, [](const backend::LocalRun& r) { return r.seq > 64 || r.model != "tiny-moe"; });
    records = backend::record_local_steps(runs, hw_path, a.steps, a.threads, !a.wall);
    std::string lines;
    for (const auto& r : records.steps) {
      StepRecord named = r;
      named.workload.hardware = hw.name;  // validated later by name
      lines += with_oom_version(step_record_to_json(named)).dump() + "\n";
    }
    write_file_atomically(rec_path, lines);
    io.out << fmt::format("{} step records -> {}\n", records.steps.size(), rec_path);
  }

  RecordSet named = records;
  for (auto& r : named.steps) r.workload.hardware = hw_path;
  HardwareSpec by_path = hw;
  by_path.name = hw_path;  // the records name the file just written, so the fit resolves it
  FitOptions fo;
  fo.held_out_ids.clear();
  for (const auto& run : backend::default_local_runs()) {
    if (run.held_out) fo.held_out_ids.push_back(run.id);
  }
  use_measured_device(fo);  // the probes measured this device: the GPU ranges and attention ramp do not apply
  CalibrationFit fit = fit_calibration(named, by_path, fo);
  fit.calibration.hardware = hw.name;
  write_file_atomically(cal_path, with_oom_version(calibration_to_json(fit.calibration)).dump(2) + "\n");
  io.out << calibration_fit_text(fit) << fmt::format("-> {}\n", cal_path);
}

}  // namespace

std::function<bool()> add_backend_calibration_options(CLI::App& calibrate, Io io) {
  auto a = std::make_shared<BackendCalibrationArgs>();
  calibrate.add_flag("--backend", a->backend,
                     "Measure this machine with the LibTorch backend, record plan-driven steps, fit (no --records)");
  calibrate.add_option("--name", a->name, "With --backend: hardware name to write")->capture_default_str();
  calibrate.add_flag("--refit", a->refit, "With --backend: fit again from the records and hardware files already written");
  calibrate.add_flag("--quick", a->quick, "With --backend: short probes and only the small tiny-moe runs");
  calibrate.add_option("--steps", a->steps, "With --backend: measured rounds (each runs every record once; a record's time is its fastest round)")->capture_default_str();
  calibrate.add_option("--threads", a->threads, "With --backend: LibTorch threads (0 = leave as is)")->capture_default_str();
  calibrate.add_flag("--wall", a->wall, "With --backend: time by wall clock (default: process CPU time, robust to other load)");
  calibrate.add_option("--hardware-out", a->hardware_out, "With --backend: hardware file (default configs/hardware/NAME.json)");
  calibrate.add_option("--records-out", a->records_out, "With --backend: records file (default traces/recorded/NAME.jsonl)");
  calibrate.add_option("--calibration-out", a->calibration_out,
                       "With --backend: calibration file (default configs/calibration/NAME.json)");
  return [a, io] {
    if (!a->backend) return false;
    run_backend_calibration(*a, io);
    return true;
  };
}

}  // namespace oom::cli
