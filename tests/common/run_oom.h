// The `oom` command run in-process (cli::run) for command tests: exit code, stdout and stderr.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.h"

namespace oom::test_support {

struct OomResult {
  int code;
  std::string out;
  std::string err;
};

inline OomResult run_oom(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = cli::run(args, cli::Io{out, err});
  return {code, out.str(), err.str()};
}

}  // namespace oom::test_support
