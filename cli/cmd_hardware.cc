// `oom hardware probe [-o FILE] [--name NAME]`: a HardwareSpec of this machine from what the OS
// reports (costmodel/hardware_probe.h) and, where the backend plugin is present, the GPUs
// LibTorch sees (its hidden `device-facts` command, cli/cmd_device_facts.cc). The spec is read
// back through the hardware reader before it is written, so what is written loads.
#include <filesystem>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "costmodel/hardware_probe.h"
#include "costmodel/hardware_spec.h"
#include "costmodel/output_path.h"
#include "costmodel/version.h"

namespace oom::cli {
namespace {

struct ProbeArgs {
  std::string output, name = "this-machine";
  bool no_backend = false;
};

// The backend's GPUs, or none when the plugin is absent or reports none (a line on `err` says which).
std::vector<ProbedDevice> backend_devices(Io io) {
  std::error_code ec;
  if (!std::filesystem::exists(backend_library_path(), ec)) {
    io.err << "hardware probe: no backend plugin (" << backend_library_path() << "): GPUs are not probed, a CPU-only spec\n";
    return {};
  }
  std::ostringstream out, err;
  if (run_backend({"device-facts"}, {out, err}) != kExitOk) {
    io.err << "hardware probe: the backend could not list GPUs (" << err.str().substr(0, err.str().find('\n')) << "): a CPU-only spec\n";
    return {};
  }
  std::vector<ProbedDevice> devices;
  const nlohmann::json j = nlohmann::json::parse(out.str(), nullptr, false);
  if (j.is_object() && j.contains("devices") && j["devices"].is_array()) {
    for (const auto& d : j["devices"]) {
      if (!d.is_object() || !d.contains("name") || !d.contains("memory_bytes")) continue;
      devices.push_back({d["name"].get<std::string>(), d["memory_bytes"].get<Bytes>()});
    }
  }
  if (devices.empty()) io.err << "hardware probe: the backend sees no GPU: a CPU-only spec\n";
  return devices;
}

}  // namespace

void add_hardware_commands(CLI::App& app, Io io) {
  auto* hardware = app.add_subcommand("hardware", "Hardware specs of this machine");
  hardware->require_subcommand(1);
  auto a = std::make_shared<ProbeArgs>();
  auto* probe = hardware->add_subcommand(
      "probe",
      "Write a hardware spec of this machine from /sys and /proc (NUMA nodes, cores, memory, sockets, PCIe) and the "
      "backend's GPUs, each field marked measured or assumed in \"provenance\"; a CPU-only spec where no GPU is found");
  probe->add_option("-o,--output", a->output, "Spec file to write (default: standard output)");
  probe->add_option("--name", a->name, "The spec's name (default: this-machine)");
  probe->add_flag("--no-backend", a->no_backend, "Do not load the backend plugin to list GPUs (a CPU-only spec)");
  probe->callback([=] {
    check_output_files({a->output}, {});
    const HostFacts host = read_host_facts("/");
    const std::vector<ProbedDevice> devices = a->no_backend ? std::vector<ProbedDevice>{} : backend_devices(io);
    nlohmann::json spec = probed_hardware_json(host, devices, a->name);
    stamp_oom_version(spec);
    hardware_spec_from_json(spec, a->output.empty() ? "<probed spec>" : a->output);  // what is written loads
    emit(a->output, spec.dump(2) + "\n", io);
  });
}

}  // namespace oom::cli
