// This build of oom: the project's version (CMake's project()), the git commit it was built from,
// and the compiler. The value of kOomVersionKey (costmodel/json_input.h) that every file the
// project writes carries at its root, so a figure names the build that produced it.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace oom {

// "0.1.0".
std::string_view oom_project_version();
// Twelve hex digits, with "-dirty" when the tree had uncommitted changes to tracked files at
// build time; "unknown" when built without git or outside a repository.
std::string_view oom_git_commit();
// "0.1.0+04ebad5c1234" (PEP 440's local-version form; "0.1.0+unknown" without a commit).
std::string oom_version_text();
// "GCC 12.2.0", "Clang 16.0.6".
std::string_view oom_compiler();
// Sets `root`'s kOomVersionKey to oom_version_text(). `root` must be a JSON object (or null,
// which becomes one); every reader accepts the key at the root of every format.
void stamp_oom_version(nlohmann::json& root);
// `root` with its kOomVersionKey set: what every writer of a project format passes on.
nlohmann::json with_oom_version(nlohmann::json root);

}  // namespace oom
