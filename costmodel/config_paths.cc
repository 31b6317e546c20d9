#include "costmodel/config_paths.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "costmodel/input_error.h"

#ifndef OOM_SOURCE_CONFIG_DIR
#define OOM_SOURCE_CONFIG_DIR "configs"
#endif

namespace oom {

std::string config_root() {
  if (const char* env = std::getenv("OOM_CONFIG_DIR"); env != nullptr && *env != '\0') {
    // Pointing nowhere would make every name unknown and every list empty, without a word.
    std::error_code ec;
    if (!std::filesystem::is_directory(env, ec)) {
      throw InputError("", "OOM_CONFIG_DIR", fmt::format("\"{}\"", env),
                       "no such folder (the environment variable names the configs folder, which holds models/ and hardware/)");
    }
    return env;
  }
  return OOM_SOURCE_CONFIG_DIR;
}

std::string config_folder(const std::string& kind) { return config_root() + "/" + kind; }

std::vector<std::string> config_names(const std::string& kind) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(config_folder(kind), ec)) {
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::optional<std::string> resolve_config(const std::string& kind, const std::string& name_or_path) {
  namespace fs = std::filesystem;
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
