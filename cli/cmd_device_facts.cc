// `oom device-facts` (hidden, in the backend plugin): the GPUs LibTorch sees, as one JSON object
// {"devices": [{"name", "memory_bytes"}]} for `oom hardware probe` (cli/cmd_hardware.cc). No GPU,
// or a LibTorch without CUDA: an empty list.
#include <torch/cuda.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#ifdef OOM_BACKEND_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "cli/cli.h"

namespace oom::cli {

void add_device_facts_command(CLI::App& app, Io io) {
  auto* c = app.add_subcommand("device-facts", "");  // no description: hidden from help
  c->callback([io] {
    nlohmann::json j;
    auto& devices = j["devices"] = nlohmann::json::array();
#ifdef OOM_BACKEND_CUDA
    const int n = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
    for (int i = 0; i < n; ++i) {
      const cudaDeviceProp* p = at::cuda::getDeviceProperties(i);
      devices.push_back({{"name", std::string(p->name)}, {"memory_bytes", static_cast<std::int64_t>(p->totalGlobalMem)}});
    }
#endif
    io.out << j.dump() << "\n";
  });
}

}  // namespace oom::cli
