// Where named configs and the other shipped data live: configs/models/NAME.json,
// configs/hardware/NAME.json, experiments/, traces/paper/, backend/data/.
//
// The shipped data root is the folder that holds configs/, experiments/ and traces/paper/:
//  1. the folder the embedding program set (set_program_data_root: the Python package's data);
//  2. share/oom beside the running program's folder (an install: P/bin/oom reads P/share/oom),
//     found through /proc/self/exe, when it holds configs/;
//  3. the source tree this build was made from (a build tree), unless
//     $OOM_NO_BUILD_TREE_FALLBACK is set to 1 (the install tests set it, so an install that lacks
//     its data fails instead of reading the checkout).
// The configs folder is $OOM_CONFIG_DIR when set, else the data root's configs/.
// $OOM_CONFIG_DIR set to anything that is not a folder is an InputError naming the variable and
// its value (config_root() and everything that calls it), not an empty catalogue; so is finding
// no data root at all. Thread-safety: set_program_data_root before other threads read the paths.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace oom {

// How a folder of shipped data was found, in the order looked up.
enum class DataOrigin { kEnvironment, kProgram, kInstall, kBuildTree };
// "OOM_CONFIG_DIR", "set by the program: ...", "beside the program: ...", "the build's source tree".
std::string_view data_origin_text(DataOrigin origin);

struct DataLocation {
  std::string folder;
  DataOrigin origin = DataOrigin::kBuildTree;
};

// The root of the shipped data under the lookup order above; nullopt when none is found.
std::optional<DataLocation> shipped_data_root();
// Makes `folder` the data root (lookup step 1), or clears it when empty. The Python package
// calls it with the data it ships.
void set_program_data_root(const std::string& folder);
// `relative` (e.g. "experiments/paper") under the data root; InputError naming `relative` when no
// data root is found.
std::string shipped_data_path(const std::string& relative);

// The configs folder and how it was found. InputError when $OOM_CONFIG_DIR is no folder, or when
// it is unset and no data root is found.
DataLocation config_location();
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
