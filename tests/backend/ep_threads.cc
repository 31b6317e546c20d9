#include "tests/backend/ep_threads.h"

#include <filesystem>
#include <thread>

#include "backend/dist/process_group.h"

namespace oom::backend::testing {

EpThreadsStep ep_step_in_threads(const HostState& init, const at::Tensor& tokens, const at::Tensor& targets,
                                 const dist::EpConfig& config, int ranks, const std::string& dir) {
  const auto n = static_cast<std::size_t>(ranks);
  EpThreadsStep out;
  out.losses.resize(n);
  out.norms.resize(n);
  out.slots_used.resize(n);
  out.resident_bytes.resize(n);
  out.errors.resize(n);
  std::filesystem::create_directories(dir);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      try {
        dist::CommOptions co;
        co.rank = r;
        co.world_size = ranks;
        co.store_path = (std::filesystem::path(dir) / "store").string();
        co.timeout_s = 60;
        dist::Communicator comm(co);
        dist::EpTrainer trainer(init, config, comm);
        const auto st = trainer.step(tokens, targets);
        out.losses[i] = st.loss;
        out.norms[i] = st.grad_norm;
        out.slots_used[i] = trainer.host_grad_slots_used();
        out.resident_bytes[i] = trainer.device_expert_bytes_between_steps();
        auto g = trainer.gather_flat_grads();
        if (r == 0) out.grads = std::move(g);
      } catch (const std::exception& e) {
        out.errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace oom::backend::testing
