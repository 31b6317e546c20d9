// `oom --version`: what a bug report needs to name the build that produced a figure. One
// "key: value" line per fact: the version and commit, the compiler, the backend plugin (and the
// CUDA and NCCL code paths it was built with), SimGrid, the plotting bridge, and the configs and
// shipped data folders with how each was found (costmodel/config_paths.h).
#include <filesystem>
#include <functional>

#include <fmt/format.h>

#include "cli/cli.h"
#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"
#include "costmodel/version.h"

namespace oom::cli {
namespace {

std::string backend_line() {
  const std::string path = backend_library_path();
  std::error_code ec;
  std::string line = std::filesystem::exists(path, ec)
                         ? fmt::format("backend: present ({})", path)
                         : fmt::format("backend: absent (no {}; `oom train` needs it: {})", path, backend_install_hint());
#if defined(OOM_BUILT_BACKEND) && defined(OOM_BUILT_TORCH_VERSION)
#ifdef OOM_BUILT_BACKEND_CUDA
  constexpr bool kCuda = true;
#else
  constexpr bool kCuda = false;
#endif
#ifdef OOM_BUILT_BACKEND_NCCL
  constexpr bool kNccl = true;
#else
  constexpr bool kNccl = false;
#endif
  line += fmt::format("\nbackend build: LibTorch {}, CUDA {}, NCCL {}", OOM_BUILT_TORCH_VERSION, kCuda ? "yes" : "no", kNccl ? "yes" : "no");
#else
  line += "\nbackend build: none (configured without LibTorch)";
#endif
  return line;
}

std::string location_line(const std::string& what, const std::function<DataLocation()>& find) {
  try {
    const DataLocation l = find();
    return fmt::format("{}: {} ({})", what, l.folder, data_origin_text(l.origin));
  } catch (const InputError& e) {
    return fmt::format("{}: none ({})", what, e.what());
  }
}

}  // namespace

std::string version_text() {
  std::string out = fmt::format("oom {}\n", oom_version_text());
  out += fmt::format("version: {}\ncommit: {}\ncompiler: {}\n", oom_project_version(), oom_git_commit(), oom_compiler());
  out += backend_line() + "\n";
#ifdef OOM_BUILT_SIMGRID_VERSION
  out += fmt::format("simgrid: yes ({}, --engine simgrid)\n", OOM_BUILT_SIMGRID_VERSION);
#else
  out += "simgrid: no (the analytic engine only)\n";
#endif
#ifdef OOM_HAVE_PLOT
  out += "plots: yes (matplotlib through the embedded Python)\n";
#else
  out += "plots: no (built without the Python plotting bridge)\n";
#endif
  out += location_line("configs", [] { return config_location(); }) + "\n";
  out += location_line("data", [] {
           const auto root = shipped_data_root();
           if (!root) throw InputError("", "data", "(not found)", "no share/oom beside the program and no source tree");
           return *root;
         }) +
         "\n";
  return out;
}

}  // namespace oom::cli
