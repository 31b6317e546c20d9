// Loading the LibTorch backend plugin (cli/cli.h): the `oom` program links no LibTorch, so the
// simulator's commands start in milliseconds and run where PyTorch is not installed.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string_view>

#include <CLI/CLI.hpp>

#include "cli/cli.h"

namespace oom::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLibraryName = "liboom_torch.so";
constexpr const char* kEntryName = "oom_backend_main";
constexpr const char* kHowToGetBackend =
    "build with LibTorch (scripts/install-deps.sh, then cmake --preset default), or with pip install PyTorch first and "
    "then `pip install --no-build-isolation .` from the checkout (scikit-build-core and pybind11 installed), or set "
    "OOM_BACKEND_LIBRARY";
using Entry = int (*)(const std::vector<std::string>*, std::ostream*, std::ostream*);

std::vector<std::string> candidates() {
  if (const char* env = std::getenv("OOM_BACKEND_LIBRARY"); env != nullptr && *env != '\0') return {env};
  std::vector<std::string> out;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / kLibraryName).string());
    out.push_back((exe.parent_path().parent_path() / "lib" / "oom" / kLibraryName).string());  // cmake --install
    out.push_back((exe.parent_path().parent_path() / "lib" / kLibraryName).string());          // the Python package
  }
  // The library this build made, for a build tree's programs and tests; an install test turns it
  // off to prove the install is whole (costmodel/config_paths.h).
  if (const char* off = std::getenv("OOM_NO_BUILD_TREE_FALLBACK"); off != nullptr && std::string_view(off) == "1") {
    return out;
  }
#ifdef OOM_BACKEND_BUILD_PATH
  out.push_back(OOM_BACKEND_BUILD_PATH);
#endif
  return out;
}

}  // namespace

std::string backend_install_hint() { return kHowToGetBackend; }

std::string backend_library_path() {
  const auto c = candidates();
  for (const auto& p : c) {
    std::error_code ec;
    if (fs::exists(p, ec)) return p;
  }
  return c.empty() ? kLibraryName : c.front();
}

bool is_torch_compare(const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "plan") return false;
  for (std::size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--compare-engine=torch" || (args[i] == "--compare-engine" && i + 1 < args.size() && args[i + 1] == "torch")) return true;
  }
  return false;
}

bool is_backend_command(const std::vector<std::string>& args) {
  if (args.empty()) return false;
  if (args[0] == "train" || args[0] == "eval" || args[0] == "rank-worker" || args[0] == "device-facts" || is_torch_compare(args)) {
    return true;
  }
  return args[0] == "calibrate" && std::find(args.begin(), args.end(), "--backend") != args.end();
}

int run_backend(const std::vector<std::string>& args, Io io) {
  // Loaded once per process and never unloaded (LibTorch does not support being unloaded).
  static std::mutex mutex;
  static Entry entry = nullptr;
  std::string path;
  {
    std::lock_guard lock(mutex);
    if (entry == nullptr) {
      path = backend_library_path();
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        const char* why = dlerror();
        io.err << "error: the LibTorch backend " << path << " cannot be loaded (" << (why ? why : "unknown reason") << "); `oom "
               << args[0] << "` needs it: " << kHowToGetBackend << "\n";
        return kExitInternal;
      }
      entry = reinterpret_cast<Entry>(dlsym(handle, kEntryName));
      if (entry == nullptr) {
        io.err << "error: the LibTorch backend " << path << " has no " << kEntryName << " (not an oom backend library)\n";
        return kExitInternal;
      }
    }
  }
  return entry(&args, &io.out, &io.err);
}

void add_backend_command_stubs(CLI::App& app) {
  app.add_subcommand("train", "Train a model with the LibTorch backend (one process, --ranks P, or under torchrun); `oom train --help` lists its options");
  app.add_subcommand("eval", "Mean next-token loss of a Hugging Face checkpoint over a token file; `oom eval --help` lists its options");
}

std::function<bool()> add_backend_calibration(CLI::App& calibrate, Io) {
  static const std::string what =
      "Measure this machine with the LibTorch backend and fit it; `oom calibrate --backend --help` lists its options";
  calibrate.add_flag("--backend", what);
  return [] { return false; };
}

}  // namespace oom::cli
