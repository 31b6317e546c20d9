#include "costmodel/config_paths.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string_view>

#include <fmt/format.h>

#include "costmodel/input_error.h"

#ifndef OOM_SOURCE_DIR
#define OOM_SOURCE_DIR "."
#endif

namespace oom {
namespace {

namespace fs = std::filesystem;

std::mutex& program_root_mutex() {
  static std::mutex m;
  return m;
}
std::string& program_root() {
  static std::string root;
  return root;
}

bool holds_configs(const fs::path& root) {
  std::error_code ec;
  return fs::is_directory(root / "configs", ec);
}

bool env_is_one(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string_view(v) == "1";
}

}  // namespace

std::string_view data_origin_text(DataOrigin origin) {
  switch (origin) {
    case DataOrigin::kEnvironment: return "OOM_CONFIG_DIR";
    case DataOrigin::kProgram: return "set by the program: the Python package's data";
    case DataOrigin::kInstall: return "beside the program: its install's share/oom";
    case DataOrigin::kBuildTree: return "the build's source tree";
  }
  return "?";
}

void set_program_data_root(const std::string& folder) {
  std::lock_guard lock(program_root_mutex());
  program_root() = folder;
}

std::optional<DataLocation> shipped_data_root() {
  {
    std::lock_guard lock(program_root_mutex());
    if (!program_root().empty()) return DataLocation{program_root(), DataOrigin::kProgram};
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / "share" / "oom";
    if (holds_configs(installed)) return DataLocation{installed.lexically_normal().string(), DataOrigin::kInstall};
  }
  if (!env_is_one("OOM_NO_BUILD_TREE_FALLBACK") && holds_configs(OOM_SOURCE_DIR)) {
    return DataLocation{OOM_SOURCE_DIR, DataOrigin::kBuildTree};
  }
  return std::nullopt;
}

std::string shipped_data_path(const std::string& relative) {
  const std::optional<DataLocation> root = shipped_data_root();
  if (!root) {
    throw InputError("", relative, "(not found)",
                     "no shipped data folder: share/oom beside the program's folder holds no configs/ (set OOM_CONFIG_DIR for "
                     "configs, or name the file)");
  }
  return (fs::path(root->folder) / relative).string();
}

DataLocation config_location() {
  if (const char* env = std::getenv("OOM_CONFIG_DIR"); env != nullptr && *env != '\0') {
    // Pointing nowhere would make every name unknown and every list empty, without a word.
    std::error_code ec;
    if (!fs::is_directory(env, ec)) {
      throw InputError("", "OOM_CONFIG_DIR", fmt::format("\"{}\"", env),
                       "no such folder (the environment variable names the configs folder, which holds models/ and hardware/)");
    }
    return {env, DataOrigin::kEnvironment};
  }
  const std::optional<DataLocation> root = shipped_data_root();
  if (!root) {
    throw InputError("", "OOM_CONFIG_DIR", "(unset)",
                     "no configs folder found (none in share/oom beside the program's folder): set OOM_CONFIG_DIR to the "
                     "folder that holds models/ and hardware/");
  }
  return {(fs::path(root->folder) / "configs").string(), root->origin};
}

std::string config_root() { return config_location().folder; }

std::string config_folder(const std::string& kind) { return config_root() + "/" + kind; }

std::vector<std::string> config_names(const std::string& kind) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(config_folder(kind), ec)) {
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::optional<std::string> resolve_config(const std::string& kind, const std::string& name_or_path) {
  std::error_code ec;
  const bool looks_like_path = name_or_path.find('/') != std::string::npos ||
                               (name_or_path.size() > 5 && name_or_path.ends_with(".json"));
  if (looks_like_path) return name_or_path;  // the file loader reports a missing file
  if (name_or_path.empty()) return std::nullopt;
  const std::string path = config_folder(kind) + "/" + name_or_path + ".json";
  if (fs::is_regular_file(path, ec)) return path;
  return std::nullopt;
}

std::string known_config_names(const std::string& kind) {
  std::string out;
  for (const auto& n : config_names(kind)) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "(none found in " + config_folder(kind) + ")" : out;
}

}  // namespace oom
