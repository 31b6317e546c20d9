#include "tests/backend/plain_runs.h"

#include <algorithm>
#include <fstream>
#include <iostream>

#include <gtest/gtest.h>

#include "backend/data/data.h"
#include "backend/runtime/state.h"
#include "backend/train/plain_trainer.h"

namespace oom::backend::testing {

std::pair<std::vector<double>, std::vector<at::Tensor>> plain_run(const TrainOptions& o) {
  HostState state(load_model_spec(o.model));
  state.init_from_seed(o.seed);
  TrainerConfig cfg;
  cfg.adam.lr = o.lr;
  cfg.adam.weight_decay = o.weight_decay;
  cfg.max_grad_norm = o.max_grad_norm;
  cfg.model.gdn_chunk_tokens = o.gdn_chunk_tokens;
  PlainTrainer plain(state, cfg);
  ByteCorpus data(default_corpus_path(), o.seq);
  data.seed(o.seed);
  std::vector<double> losses;
  for (int i = 0; i < o.steps; ++i) {
    const Batch b = data.next(o.batch);
    losses.push_back(plain.step(b.tokens, b.targets).loss);
  }
  return {losses, plain.flat_params()};
}

ReferenceGradients first_step_gradients(const TrainOptions& o) {
  HostState init(load_model_spec(o.model));
  init.init_from_seed(o.seed);
  ByteCorpus data(default_corpus_path(), o.seq);
  data.seed(o.seed);
  const Batch b = data.next(o.batch);
  ModelOptions mo;
  mo.gdn_chunk_tokens = o.gdn_chunk_tokens;
  return reference_gradients(init, b.tokens, b.targets, mo);
}

void expect_weights_match(const std::string& model, const std::string& file, const std::vector<at::Tensor>& params,
                          const std::string& tag, double max_tol, double l2_tol) {
  HostState trained(load_model_spec(model));
  trained.load_safetensors(file);
  double worst_max = 0, worst_l2 = 0;
  for (int b = 0; b < trained.blocks(); ++b) {
    const auto& ref = params[static_cast<std::size_t>(b)];
    const double dmax = rel_diff(trained.master(b), ref), dl2 = rel_l2(trained.master(b), ref);
    EXPECT_LE(dmax, max_tol) << tag << " block " << b;
    EXPECT_LE(dl2, l2_tol) << tag << " block " << b;
    worst_max = std::max(worst_max, dmax);
    worst_l2 = std::max(worst_l2, dl2);
  }
  std::cout << tag << ": weights against the plain trainer, worst block max-relative " << worst_max << ", relative L2 "
            << worst_l2 << "\n";
}

std::string write_ep_plan(const std::filesystem::path& dir, const std::string& name, const nlohmann::json& fields) {
  nlohmann::json plan = {{"version", 1}, {"path", "ep"}, {"resident_layers", nlohmann::json::array()},
                         {"moe_retained_layers", nlohmann::json::array()}, {"routing_chunk_tokens", 65536},
                         {"param_transfer", "full"}, {"transfer_chunk_mib", 64}, {"cpu_grad_slots", 2},
                         {"split", {{"attention_head_group", 0}, {"gdn_chunk_tokens", 0}, {"moe_chunk_tokens", 0},
                                    {"sub_batch_seqs", 0}}},
                         {"keep_attention_results", false},
                         {"boundaries", {{"host_kept", "all"}, {"gpu_held", nlohmann::json::array()}, {"regenerate_cap", 1}}}};
  if (fields.is_object()) plan.update(fields);
  const auto path = (dir / name).string();
  std::ofstream(path) << plan.dump(2);
  return path;
}

}  // namespace oom::backend::testing
