#include "tests/backend/torchrun_nodes.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace oom::backend::testing {

namespace fs = std::filesystem;

bool have_torchrun() {
  if (fs::exists(OOM_TORCHRUN)) return true;
  if (const char* ci = std::getenv("CI"); ci != nullptr && std::string(ci) == "true") {
    ADD_FAILURE() << "torchrun not found at " << OOM_TORCHRUN << " (scripts/install-deps.sh installs torch into .venv)";
  }
  return false;
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

nlohmann::json last_json_line(const std::string& out) {
  std::istringstream in(out);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '{') last = line;
  }
  return last.empty() ? nlohmann::json() : nlohmann::json::parse(last);
}

int run_two_launches(const std::string& first, const std::string& second, int timeout_s) {
  const std::string script = second + " & p=$!; " + first + "; s=$?; wait $p; exit $((s | $?))";
  return std::system(fmt::format("timeout {} sh -c '{}'", timeout_s, script).c_str());
}

int run_two_torchrun_nodes(const std::string& args, const fs::path& dir, int port, const std::string& suffix, int timeout_s) {
  const auto node = [&](int n) {
    return fmt::format("{0} --nnodes 2 --nproc-per-node 2 --node-rank {1} --master-addr 127.0.0.1 --master-port {2} --no-python {3}{4} "
                       "> {5}/out{1}{6} 2> {5}/err{1}{6}",
                       OOM_TORCHRUN, n, port, OOM_BINARY, args, dir.string(), suffix);
  };
  return run_two_launches(node(0), node(1), timeout_s);
}

}  // namespace oom::backend::testing
