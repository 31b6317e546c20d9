// Where named configs live: configs/models/NAME.json, configs/hardware/NAME.json.
//
// The root is $OOM_CONFIG_DIR when set, else the source tree's configs/ recorded at build time.
// $OOM_CONFIG_DIR set to anything that is not a folder is an InputError naming the variable and
// its value (config_root() and everything that calls it), not an empty catalogue.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace oom {

std::string config_root();
// "models" or "hardware" folder under the root.
std::string config_folder(const std::string& kind);
// Names (file stems) of the JSON files in a config folder, sorted.
std::vector<std::string> config_names(const std::string& kind);
// The path of a named config, or nullopt when `name_or_path` is neither an existing file nor a
// known name. A value that names an existing file (or ends in ".json") is taken as a path.
std::optional<std::string> resolve_config(const std::string& kind, const std::string& name_or_path);
// "a, b, c" of the known names, for error messages.
std::string known_config_names(const std::string& kind);

}  // namespace oom
