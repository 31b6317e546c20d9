#include "tests/backend/ep_threads.h"

#include <filesystem>
#include <thread>

#include "backend/dist/process_group.h"
#include "backend/runtime/shared_state.h"
#include "backend/train/plan_runtime.h"

namespace oom::backend::testing {

EpThreadsStep ep_step_in_threads(const HostState& init, const at::Tensor& tokens, const at::Tensor& targets,
                                 const TrainerConfig& config, const Plan& plan, int ranks, const std::string& dir) {
  const auto n = static_cast<std::size_t>(ranks);
  EpThreadsStep out;
  out.losses.resize(n);
  out.norms.resize(n);
  out.host_buffers.resize(n);
  out.errors.resize(n);
  std::vector<std::vector<at::Tensor>> sent(n);
  std::filesystem::create_directories(dir);
  const std::string shared = (std::filesystem::path(dir) / "state").string();
  std::filesystem::remove(shared);
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
        HostState state(init.spec());
        if (r == 0) {
          for (int b = 0; b < state.blocks(); ++b) {
            state.master(b).copy_(init.master(b));
            state.publish(b);
          }
          share_host_state(state, shared, /*create=*/true);
        }
        comm.barrier();
        if (r != 0) share_host_state(state, shared, /*create=*/false);
        comm.barrier();
        PlanTrainer trainer(state, config, plan, at::kCPU, &comm);
        trainer.capture_gradients(&sent[i]);
        const auto st = trainer.step(tokens, targets);
        out.losses[i] = st.loss;
        out.norms[i] = st.grad_norm;
        out.host_buffers[i] = trainer.host_gradient_buffers().first;
      } catch (const std::exception& e) {
        out.errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::filesystem::remove(shared);
  for (int b = 0; b < init.blocks(); ++b) {
    at::Tensor sum = at::zeros({init.layout().blocks[static_cast<std::size_t>(b)].numel}, at::kFloat);
    for (const auto& blocks : sent) {
      if (static_cast<std::size_t>(b) < blocks.size() && blocks[static_cast<std::size_t>(b)].defined()) {
        sum += blocks[static_cast<std::size_t>(b)];
      }
    }
    out.grads.push_back(sum);
  }
  return out;
}

}  // namespace oom::backend::testing
