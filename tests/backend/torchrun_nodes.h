// Launching `oom` as a cluster launches it, for the multi-rank tests: the virtual environment's
// torchrun started once per node on this machine (--nnodes 2 --node-rank N, c10d over TCP on
// 127.0.0.1, a host state per node), and reading what rank 0 printed.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace oom::backend::testing {

// Whether the virtual environment's torchrun is there; under CI=true its absence is a failure
// (the caller skips either way).
bool have_torchrun();

// The whole of `file` ("" when it cannot be read).
std::string read_text(const std::filesystem::path& file);

// The last line of `out` that is a JSON object (null when there is none).
nlohmann::json last_json_line(const std::string& out);

// Two launches of one job, `second` in the background and `first` in front, under `timeout_s`:
// the exit status is nonzero when either fails.
int run_two_launches(const std::string& first, const std::string& second, int timeout_s = 120);

// `oom` with `args` on two torchrun nodes of two ranks each meeting at 127.0.0.1:`port` (node 1 in
// the background): node N's stdout and stderr go to dir/out<N><suffix> and dir/err<N><suffix>.
// The exit status is nonzero when either node fails.
int run_two_torchrun_nodes(const std::string& args, const std::filesystem::path& dir, int port, const std::string& suffix = "",
                           int timeout_s = 120);

}  // namespace oom::backend::testing
