#include "planner/calibration/calibration.h"

#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"
#include "costmodel/json_input.h"

namespace oom {
namespace {

// A probed device (a measured GEMM ramp: the CPU backend) is priced by its own ramp, which replaces
// the GPU tile-fill estimates (grouped expert GEMMs run the same kernels per expert on it), and
// runs one attention kernel for windowed and full cores alike.
void price_as_probed_device(Calibration& c, const HardwareSpec& h) {
  if (h.gpu.gemm_half_rows <= 0) return;
  c.gemm_half_rows = c.expert_half_rows = h.gpu.gemm_half_rows;
  c.windowed_attention_efficiency = c.attention_efficiency;
}

}  // namespace

Calibration default_calibration(const HardwareSpec& h) {
  Calibration c;
  c.hardware = h.name;
  c.fitted_from = "uncalibrated: HardwareSpec rates and default efficiencies";
  c.h2d_Bps = h.pcie.h2d_Bps;
  c.d2h_Bps = h.pcie.d2h_Bps;
  c.cpu_adamw_params_per_s = h.numa.empty() ? 0 : h.numa.front().adamw_params_per_s;
  c.host_prep_params_per_s = 4 * c.cpu_adamw_params_per_s;
  c.host_accumulate_params_per_s = accumulate_rate_of(c.cpu_adamw_params_per_s);
  c.torch_adamw_params_per_s = c.cpu_adamw_params_per_s;
  price_as_probed_device(c, h);
  return c;
}

nlohmann::json calibration_to_json(const Calibration& c) {
  nlohmann::json j = {{"hardware", c.hardware},
          {"fitted_from", c.fitted_from},
          {"gemm_efficiency", c.gemm_efficiency},
          {"gemm_half_rows", c.gemm_half_rows},
          {"expert_gemm_efficiency", c.expert_gemm_efficiency},
          {"expert_half_rows", c.expert_half_rows},
          {"attention_efficiency", c.attention_efficiency},
          {"attention_backward_efficiency", c.attention_backward_efficiency},
          {"wide_attention_efficiency", c.wide_attention_efficiency},
          {"windowed_attention_efficiency", c.windowed_attention_efficiency},
          {"attention_half_keys", c.attention_half_keys},
          {"gdn_efficiency", c.gdn_efficiency},
          {"hbm_efficiency", c.hbm_efficiency},
          {"h2d_Bps", c.h2d_Bps},
          {"d2h_Bps", c.d2h_Bps},
          {"fabric_efficiency", c.fabric_efficiency},
          {"cpu_adamw_params_per_s", c.cpu_adamw_params_per_s},
          {"host_prep_params_per_s", c.host_prep_params_per_s},
          {"host_accumulate_params_per_s", c.host_accumulate_params_per_s},
          {"torch_adamw_params_per_s", c.torch_adamw_params_per_s},
          {"compute_overhead_s", c.compute_overhead_s},
          {"expert_overhead_s", c.expert_overhead_s},
          {"transfer_overhead_s", c.transfer_overhead_s},
          {"collective_overhead_s", c.collective_overhead_s},
          {"cpu_task_overhead_s", c.cpu_task_overhead_s}};
  if (c.operator_overhead_s > 0) j["operator_overhead_s"] = c.operator_overhead_s;
  return j;
}

Calibration calibration_from_json(const nlohmann::json& j, const std::string& file) {
  const JsonReader r(j, file);
  r.reject_unknown_keys({"hardware", "fitted_from", "gemm_efficiency", "gemm_half_rows", "expert_gemm_efficiency",
                         "expert_half_rows", "attention_efficiency", "attention_backward_efficiency", "wide_attention_efficiency", "windowed_attention_efficiency", "attention_half_keys", "gdn_efficiency",
                         "hbm_efficiency", "h2d_Bps", "d2h_Bps", "fabric_efficiency", "cpu_adamw_params_per_s",
                         "host_prep_params_per_s", "host_accumulate_params_per_s", "torch_adamw_params_per_s", "compute_overhead_s", "expert_overhead_s",
                         "transfer_overhead_s", "collective_overhead_s", "cpu_task_overhead_s", "operator_overhead_s"});
  Calibration c;
  c.hardware = r.string("hardware");
  c.fitted_from = r.string_or("fitted_from", "");
  auto eff = [&](const char* key, double fallback) { return r.number_or(key, fallback, 1e-6, 1.0); };
  c.gemm_efficiency = eff("gemm_efficiency", c.gemm_efficiency);
  c.gemm_half_rows = r.number_or("gemm_half_rows", c.gemm_half_rows, 0.0, 1e9);
  c.expert_gemm_efficiency = eff("expert_gemm_efficiency", c.expert_gemm_efficiency);
  c.expert_half_rows = r.number_or("expert_half_rows", c.expert_half_rows, 0.0, 1e9);
  c.attention_efficiency = eff("attention_efficiency", c.attention_efficiency);
  c.attention_backward_efficiency = eff("attention_backward_efficiency", c.attention_backward_efficiency);
  c.wide_attention_efficiency = eff("wide_attention_efficiency", c.wide_attention_efficiency);
  c.windowed_attention_efficiency = eff("windowed_attention_efficiency", c.attention_efficiency);
  c.attention_half_keys = r.number_or("attention_half_keys", c.attention_half_keys, 0.0, 1e9);
  c.gdn_efficiency = eff("gdn_efficiency", c.gdn_efficiency);
  c.hbm_efficiency = eff("hbm_efficiency", c.hbm_efficiency);
  c.h2d_Bps = r.number_or("h2d_Bps", 0.0, 0.0, 1e15);
  c.d2h_Bps = r.number_or("d2h_Bps", 0.0, 0.0, 1e15);
  c.fabric_efficiency = eff("fabric_efficiency", c.fabric_efficiency);
  c.cpu_adamw_params_per_s = r.number_or("cpu_adamw_params_per_s", 0.0, 0.0, 1e15);
  c.host_prep_params_per_s = r.number_or("host_prep_params_per_s", 0.0, 0.0, 1e15);
  c.host_accumulate_params_per_s = r.number_or("host_accumulate_params_per_s", 0.0, 0.0, 1e15);
  c.torch_adamw_params_per_s = r.number_or("torch_adamw_params_per_s", 0.0, 0.0, 1e15);
  c.compute_overhead_s = r.number_or("compute_overhead_s", c.compute_overhead_s, 0.0, 10.0);
  c.expert_overhead_s = r.number_or("expert_overhead_s", c.expert_overhead_s, 0.0, 10.0);
  c.transfer_overhead_s = r.number_or("transfer_overhead_s", c.transfer_overhead_s, 0.0, 10.0);
  c.collective_overhead_s = r.number_or("collective_overhead_s", c.collective_overhead_s, 0.0, 10.0);
  c.cpu_task_overhead_s = r.number_or("cpu_task_overhead_s", c.cpu_task_overhead_s, 0.0, 10.0);
  c.operator_overhead_s = r.number_or("operator_overhead_s", c.operator_overhead_s, 0.0, 1.0);
  return c;
}

std::string calibration_path(const std::string& hardware_name, const std::string& engine) {
  const std::string suffix = engine.empty() || engine == "analytic" ? "" : "." + engine;
  return config_folder("calibration") + "/" + hardware_name + suffix + ".json";
}

Calibration load_calibration_file(const std::string& path, const HardwareSpec& h) {
  Calibration c = calibration_from_json(read_json_file(path), path);
  if (!c.hardware.empty() && c.hardware != h.name && c.hardware != h.node_name) {
    throw InputError(path, "hardware", "\"" + c.hardware + "\"",
                     "the calibration was fitted for other hardware than the workload's \"" + h.name + "\"");
  }
  // Rates left at 0 in the file fall back to the hardware's.
  const Calibration d = default_calibration(h);
  if (c.h2d_Bps <= 0) c.h2d_Bps = d.h2d_Bps;
  if (c.d2h_Bps <= 0) c.d2h_Bps = d.d2h_Bps;
  if (c.cpu_adamw_params_per_s <= 0) c.cpu_adamw_params_per_s = d.cpu_adamw_params_per_s;
  if (c.host_prep_params_per_s <= 0) c.host_prep_params_per_s = 4 * c.cpu_adamw_params_per_s;
  if (c.host_accumulate_params_per_s <= 0) c.host_accumulate_params_per_s = accumulate_rate_of(c.cpu_adamw_params_per_s);
  if (c.torch_adamw_params_per_s <= 0) c.torch_adamw_params_per_s = c.cpu_adamw_params_per_s;
  return c;
}

Calibration transfer_calibration(const Calibration& fitted, const HardwareSpec& from, const HardwareSpec& to) {
  const Calibration estimate = default_calibration(to);
  Calibration c = fitted;
  c.hardware = to.name;
  c.fitted_from = fmt::format(
      "transferred from the calibration of {} (GPU architecture {}): efficiencies, ramps and fixed costs as fitted there, "
      "link and CPU rates as the same fractions of this hardware's datasheet rates",
      from.name, from.gpu.architecture);
  // `rate` fitted against `from_rate` of the source spec, carried to `to_rate`.
  auto scaled = [](double rate, double from_rate, double to_rate, double fallback) {
    return rate > 0 && from_rate > 0 && to_rate > 0 ? rate * (to_rate / from_rate) : fallback;
  };
  c.h2d_Bps = scaled(fitted.h2d_Bps, from.pcie.h2d_Bps, to.pcie.h2d_Bps, estimate.h2d_Bps);
  c.d2h_Bps = scaled(fitted.d2h_Bps, from.pcie.d2h_Bps, to.pcie.d2h_Bps, estimate.d2h_Bps);
  const double from_socket = from.numa.empty() ? 0 : from.numa.front().adamw_params_per_s;
  const double to_socket = to.numa.empty() ? 0 : to.numa.front().adamw_params_per_s;
  c.cpu_adamw_params_per_s = scaled(fitted.cpu_adamw_params_per_s, from_socket, to_socket, estimate.cpu_adamw_params_per_s);
  c.host_prep_params_per_s = scaled(fitted.host_prep_params_per_s, from_socket, to_socket, estimate.host_prep_params_per_s);
  c.host_accumulate_params_per_s =
      scaled(fitted.host_accumulate_params_per_s, from_socket, to_socket, estimate.host_accumulate_params_per_s);
  c.torch_adamw_params_per_s = scaled(fitted.torch_adamw_params_per_s, from_socket, to_socket, estimate.torch_adamw_params_per_s);
  if (from.fabric.kind != to.fabric.kind) {
    c.fabric_efficiency = estimate.fabric_efficiency;
    c.collective_overhead_s = estimate.collective_overhead_s;
  }
  price_as_probed_device(c, to);  // as default_calibration() prices it
  return c;
}

namespace {

// configs/calibration/NAME.ENGINE.json when it exists, else NAME.json when it exists.
std::optional<std::string> existing_calibration_path(const std::string& name, const std::string& engine) {
  std::error_code ec;
  for (const std::string& path : {calibration_path(name, engine), calibration_path(name)}) {
    if (std::filesystem::is_regular_file(path, ec)) return path;
  }
  return std::nullopt;
}

// The calibration of another hardware in configs/ whose GPUs share h's architecture, transferred
// to h; nullopt when h states no architecture or no such hardware is calibrated. Candidates are
// the analytic calibrations' names (configs/calibration/NAME.json) that name a hardware spec;
// one of h's GPU model wins, then the first by name. A calibration or spec that exists but is
// malformed throws InputError.
std::optional<Calibration> transferred_calibration_for(const HardwareSpec& h, const std::string& engine, std::string& source) {
  if (h.gpu.architecture.empty()) return std::nullopt;
  std::optional<HardwareSpec> best;
  for (const std::string& name : config_names("calibration")) {
    if (name.find('.') != std::string::npos || name == h.name || name == h.node_name) continue;
    if (!resolve_config("hardware", name)) continue;
    HardwareSpec from = load_hardware_spec(name);
    if (from.gpu.architecture != h.gpu.architecture) continue;
    if (!best || (from.gpu.name == h.gpu.name && best->gpu.name != h.gpu.name)) best = std::move(from);
  }
  if (!best) return std::nullopt;
  const std::string path = existing_calibration_path(best->name, engine).value_or(calibration_path(best->name));
  source = fmt::format("{} transferred (same GPU architecture, {})", path, h.gpu.architecture);
  return transfer_calibration(load_calibration_file(path, *best), *best, h);
}

}  // namespace

Calibration load_calibration_for(const HardwareSpec& h, const std::string& engine, std::string* source) {
  std::string ignored;
  std::string& said = source ? *source : ignored;
  // The spec's own files, then (a cluster without calibrations of its own) its node's: same GPUs,
  // links and sockets. Each name's file for the engine comes before its analytic one.
  std::vector<std::string> names{h.name};
  if (!h.node_name.empty() && h.node_name != h.name) names.push_back(h.node_name);
  for (const std::string& name : names) {
    if (std::optional<std::string> path = existing_calibration_path(name, engine)) {
      said = *path;
      return load_calibration_file(*path, h);
    }
  }
  if (std::optional<Calibration> transferred = transferred_calibration_for(h, engine, said)) return *transferred;
  said = "uncalibrated estimate (no calibration of this hardware, its node or its GPU architecture)";
  return default_calibration(h);
}

}  // namespace oom
