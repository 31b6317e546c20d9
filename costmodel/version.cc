#include "costmodel/version.h"

#include <nlohmann/json.hpp>

#include "costmodel/json_input.h"
#include "oom_git_commit.h"  // generated at build time (cmake/git_commit.cmake)

#ifndef OOM_PROJECT_VERSION
#define OOM_PROJECT_VERSION "unknown"
#endif

namespace oom {

std::string_view oom_project_version() { return OOM_PROJECT_VERSION; }

std::string_view oom_git_commit() { return OOM_GIT_COMMIT; }

std::string oom_version_text() {
  std::string commit(oom_git_commit());
  for (char& c : commit) {
    if (c == '-') c = '.';  // "abc-dirty" -> "abc.dirty": a valid local version
  }
  return std::string(oom_project_version()) + "+" + commit;
}

std::string_view oom_compiler() {
#if defined(__clang__)
  return "Clang " __clang_version__;
#elif defined(__GNUC__)
  return "GCC " __VERSION__;
#else
  return "unknown compiler";
#endif
}

void stamp_oom_version(nlohmann::json& root) { root[kOomVersionKey] = oom_version_text(); }

nlohmann::json with_oom_version(nlohmann::json root) {
  stamp_oom_version(root);
  return root;
}

}  // namespace oom
