// Parity with the reference implementation (transformers): tiny random models of every
// architecture the backend reads, made and saved by transformers (tests/backend/hf_reference.py,
// run by CTest as a fixture into $OOM_HF_FIXTURES), loaded by backend/io/hf_weights.h and run in
// FP32 on CPU on the same tokens, against transformers' values in FP64. Checked: the logits and
// the loss within 1e-5 relative, the load-balancing loss, and every parameter's gradient within
// 1e-4 relative — for autograd over the whole model (with the auxiliary loss; the plain reference
// trainer's loss), and through the graph runner (with it too) the default plan, a plan with every
// split, and an EP plan over two ranks. A gradient that transformers itself
// gets wrong by more than 1e-5 in FP32 (reference.json "fp32_grad_error": the GDN decay
// parameters A_log and dt_bias, sums of many cancelling terms) is held to 10× that error instead.
// Also: the weights written back under transformers' names equal the file.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "backend/io/hf_checkpoint.h"
#include "backend/io/hf_weights.h"
#include "backend/model/model.h"
#include "backend/train/plan_runtime.h"
#include "backend/runtime/runtime.h"
#include "planner/plan/plan.h"
#include "backend/io/safetensors.h"
#include "backend/runtime/state.h"
#include "costmodel/json_input.h"
#include "tests/backend/ep_threads.h"
#include "tests/backend/reference_ops.h"

namespace oom::backend {
namespace {

namespace fs = std::filesystem;
using testing::rel_diff;

constexpr double kOutTol = 1e-5;
constexpr double kGradTol = 1e-4;

// $OOM_HF_FIXTURES, else the build tree's folder that CTest's fixture writes.
fs::path fixtures() {
  const char* dir = std::getenv("OOM_HF_FIXTURES");
  return dir != nullptr ? fs::path(dir) : fs::path(OOM_HF_FIXTURES_DIR);
}

// One architecture's fixture: the checkpoint, its spec, and the reference outputs.
struct Fixture {
  std::string arch;
  ModelSpec spec;
  std::map<std::string, at::Tensor> weights, reference;
  nlohmann::json fp32_error;  // transformers' own FP32 error per gradient ("grad.NAME")

  HfTensorSource source(const std::map<std::string, at::Tensor>& m, const std::string& prefix = "") const {
    return [&m, prefix](const std::string& name) -> std::optional<at::Tensor> {
      const auto it = m.find(prefix + name);
      if (it == m.end()) return std::nullopt;
      return it->second;
    };
  }
  // The reference gradient (grad. or aux_grad.) in our layout, one flat FP32 buffer per block.
  std::vector<at::Tensor> grads(const std::string& prefix) const {
    const ModelLayout layout = model_layout(spec);
    std::vector<at::Tensor> blocks;
    for (const auto& b : layout.blocks) blocks.push_back(at::zeros({b.numel}));
    load_hf_blocks(spec, layout, source(reference, prefix), blocks, arch + "/reference.safetensors");
    return blocks;
  }
  double ref(const char* name) const { return reference.at(name).item<double>(); }
};

Fixture load_fixture(const std::string& arch) {
  const fs::path dir = fixtures() / arch;
  Fixture f;
  f.arch = arch;
  f.spec = model_spec_from_hf_config(read_json_file((dir / "config.json").string()), (dir / "config.json").string(), arch);
  f.weights = read_safetensors((dir / "model.safetensors").string());
  f.reference = read_safetensors((dir / "reference.safetensors").string());
  f.fp32_error = read_json_file((dir / "reference.json").string()).at("fp32_grad_error");
  return f;
}

// transformers' loss and gradients of the training objective: the language-model loss plus, where
// the config asks for it, router_aux_loss_coef × the load-balancing loss.
double objective(const Fixture& f) { return f.ref("loss") + f.spec.router_aux_loss_coef * f.ref("aux_loss"); }
std::vector<at::Tensor> objective_grads(const Fixture& f) {
  auto g = f.grads("grad.");
  const auto a = f.grads("aux_grad.");
  for (std::size_t b = 0; b < g.size(); ++b) g[b] = g[b] + f.spec.router_aux_loss_coef * a[b];
  return g;
}

void load_state(const Fixture& f, HostState& state) {
  std::vector<at::Tensor> masters;
  for (int b = 0; b < state.blocks(); ++b) masters.push_back(state.master(b));
  load_hf_blocks(f.spec, state.layout(), f.source(f.weights), masters, f.arch);
  for (int b = 0; b < state.blocks(); ++b) state.publish(b);
}

ModelOptions model_options() {
  ModelOptions o;
  o.gdn_chunk_tokens = 8;
  o.attention_query_block = 8;
  o.loss_chunk_tokens = 10;  // 48 tokens: chunks of 10 and a last one of 8
  return o;
}

// The tolerance of each layout entry's gradient: 1e-4, or 10× transformers' own FP32 error of the
// Hugging Face tensors it is made of, where that is larger.
std::vector<std::vector<double>> grad_tolerances(const Fixture& f, const HostState& state, const std::string& prefix) {
  std::vector<std::vector<double>> tol;
  for (int b = 0; b < state.blocks(); ++b) {
    const auto& layout = state.layout().blocks[static_cast<std::size_t>(b)];
    tol.emplace_back(layout.entries.size(), kGradTol);
    // Which HF tensors feed each entry: mark each entry's values and look at the written names.
    for (std::size_t i = 0; i < layout.entries.size(); ++i) {
      auto marked = at::zeros({layout.numel});
      marked.narrow(0, layout.entries[i].offset, layout.entries[i].numel()).fill_(1);
      for (const auto& [name, t] : hf_tensors_of_block(f.spec, state.layout(), b, marked)) {
        if (t.abs().sum().item<double>() == 0) continue;
        for (const auto& [key, err] : f.fp32_error.items()) {
          // Fused expert tensors have other names than the per-expert ones written; match the module.
          const std::string stem = key.substr(prefix.size());
          if (key.rfind(prefix, 0) == 0 && (stem == name || (name.find(".experts.") != std::string::npos &&
                                                            stem.find(".experts.") != std::string::npos &&
                                                            name.substr(0, name.find(".experts.")) ==
                                                                stem.substr(0, stem.find(".experts."))))) {
            tol.back()[i] = std::max(tol.back()[i], 10 * err.get<double>());
          }
        }
      }
    }
  }
  return tol;
}

void expect_grads(const Fixture& f, const HostState& state, const std::vector<at::Tensor>& got,
                  const std::vector<at::Tensor>& want, const std::string& what, const std::string& prefix = "grad.") {
  const auto tol = grad_tolerances(f, state, prefix);
  double worst = 0;
  std::string worst_name;
  for (int b = 0; b < state.blocks(); ++b) {
    const auto& layout = state.layout().blocks[static_cast<std::size_t>(b)];
    for (std::size_t i = 0; i < layout.entries.size(); ++i) {
      const auto& e = layout.entries[i];
      if (e.numel() == 0) continue;  // a dense layer's empty expert banks
      const auto g = got[static_cast<std::size_t>(b)].narrow(0, e.offset, e.numel());
      const auto w = want[static_cast<std::size_t>(b)].narrow(0, e.offset, e.numel());
      const double d = rel_diff(g, w);
      EXPECT_LE(d, tol[static_cast<std::size_t>(b)][i]) << what << ": gradient of " << layout.name << "." << e.name;
      if (d > worst) {
        worst = d;
        worst_name = layout.name + "." + e.name;
      }
    }
  }
  std::cout << f.arch << " " << what << ": worst gradient " << worst << " relative (" << worst_name << ")\n";
}

// The measured relative difference of an output, printed beside the check.
void report(const Fixture& f, const std::string& what, double got, double want) {
  std::cout << f.arch << " " << what << ": " << std::abs(got - want) / std::abs(want) << " relative\n";
}

class HfParity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(fixtures() / GetParam() / "reference.safetensors")) << "no fixture for " << GetParam() << " in " << fixtures()
                                                                          << " (CTest runs tests/backend/hf_reference.py first)";
  }
};

TEST_P(HfParity, LogitsLossAuxLossAndGradientsOfAutogradOverTheWholeModel) {
  const Fixture f = load_fixture(GetParam());
  // Every fixture's config asks for the load-balancing loss, except Gemma 4's and DeepSeek-V3's
  // (transformers has none for them).
  if (!f.spec.gemma4() && f.spec.moe.scoring == "softmax") {
    ASSERT_GT(f.spec.router_aux_loss_coef, 0.0) << "the fixture's config asks for the load-balancing loss";
  }
  HostState state(f.spec);
  load_state(f, state);
  const auto& tokens = f.reference.at("tokens");
  const auto& targets = f.reference.at("targets");
  std::vector<at::Tensor> leaves;
  std::vector<BlockWeights> w;
  for (int b = 0; b < state.blocks(); ++b) {
    leaves.push_back(state.master(b).clone().requires_grad_(true));
    w.push_back(block_views(state.layout().blocks[static_cast<std::size_t>(b)], leaves.back()));
  }
  const ModelOptions opt = model_options();
  {
    at::NoGradGuard no_grad;
    const double d = rel_diff(model_logits(tokens, w, f.spec, opt), f.reference.at("logits"));
    EXPECT_LE(d, kOutTol) << "logits";
    std::cout << f.arch << " logits: " << d << " relative\n";
  }
  const auto loss = model_loss(tokens, targets, w, f.spec, opt);
  const double want = objective(f);
  EXPECT_NEAR(loss.item<double>(), want, kOutTol * want);
  report(f, "autograd loss", loss.item<double>(), want);
  loss.backward();
  std::vector<at::Tensor> got;
  for (const auto& leaf : leaves) got.push_back(leaf.grad());
  expect_grads(f, state, got, objective_grads(f), "autograd");
}

TEST_P(HfParity, DefaultPlanAndPlanWithEverySplitGradientsEqualTheReference) {
  Fixture f = load_fixture(GetParam());
  const auto& tokens = f.reference.at("tokens");
  const auto& targets = f.reference.at("targets");
  const auto g = objective_grads(f);
  const double want = objective(f);
  TrainerConfig cfg;
  cfg.model = model_options();
  cfg.max_grad_norm = 0.0;
  // One step of `plan` from the checkpoint: the loss and the gradients the runner sends to the host.
  const auto check = [&](const Plan& plan, const std::string& what) {
    HostState state(f.spec);
    load_state(f, state);
    PlanTrainer trainer(state, cfg, plan);
    std::vector<at::Tensor> got;
    trainer.capture_gradients(&got);
    const auto st = trainer.step(tokens, targets);
    EXPECT_NEAR(st.loss, want, kOutTol * want) << what;
    report(f, what + " loss", st.loss, want);
    ASSERT_EQ(got.size(), static_cast<std::size_t>(state.blocks()));
    expect_grads(f, state, got, g, what);
  };
  // What `oom train --weights` runs without --plan.
  check(default_run_plan(f.spec, tokens.size(0), tokens.size(1), 1, "local-cpu"), "default plan");
  Plan p;
  p.path = ExpertPath::kLocal;
  p.keep_attention_results = true;
  p.split = {1, 8, 20, 1};  // head group, GDN chunk, MoE token chunk, sub-batch
  p.boundaries.host_kept_all = false;
  p.boundaries.host_kept = {0};
  p.boundaries.regenerate_cap = 1;
  p.cpu_grad_slots = 1;
  check(p, "plan");
}

// Two ranks (threads) running an EP plan through the graph runner: a replayed and a retained
// decoder, routing rounds of 10 tokens and one host gradient buffer per kind. DeepSeek-V3's dense
// first decoder is data-parallel over the ranks (and retained here: decoder 1 is its first MoE one,
// decoder 0 the dense one).
using HfParityEp = HfParity;
TEST_P(HfParityEp, EpPlanOverTwoRanksGradientsEqualTheReference) {
  const Fixture f = load_fixture(GetParam());
  HostState init(f.spec);
  load_state(f, init);
  TrainerConfig cfg;
  cfg.model = model_options();
  cfg.max_grad_norm = 0.0;
  Plan plan;
  plan.path = ExpertPath::kEp;
  plan.routing_chunk_tokens = 10;
  plan.moe_retained_layers = f.spec.first_dense_layers > 0 ? std::vector<int>{0, 1} : std::vector<int>{1};
  plan.cpu_grad_slots = 1;
  const auto dir = fs::temp_directory_path() / ("oom_hf_ep_" + GetParam() + "_" + std::to_string(::getpid()));
  const auto run = testing::ep_step_in_threads(init, f.reference.at("tokens"), f.reference.at("targets"), cfg, plan, 2,
                                               dir.string());
  fs::remove_all(dir);
  ASSERT_EQ(run.errors[0], "");
  ASSERT_EQ(run.errors[1], "");
  const double want = objective(f);
  EXPECT_NEAR(run.losses[0], want, kOutTol * want) << "EP";
  report(f, "EP loss", run.losses[0], want);
  expect_grads(f, init, run.grads, objective_grads(f), "EP plan over two ranks");
}

// Writing the loaded weights under transformers' names gives back every tensor of the file.
TEST_P(HfParity, WeightsWrittenBackUnderTransformersNamesEqualTheCheckpoint) {
  const Fixture f = load_fixture(GetParam());
  HostState state(f.spec);
  load_state(f, state);
  std::size_t n = 0;
  for (int b = 0; b < state.blocks(); ++b) {
    for (const auto& [name, t] : hf_tensors_of_block(f.spec, state.layout(), b, state.master(b))) {
      ASSERT_TRUE(f.weights.count(name)) << name << " is not a tensor of the saved checkpoint";
      EXPECT_TRUE(at::equal(t.reshape(f.weights.at(name).sizes()), f.weights.at(name).to(at::kFloat))) << name;
      ++n;
    }
  }
  EXPECT_EQ(n, f.weights.size()) << "every tensor of the checkpoint is written";
}

// Saved in BF16, DeepSeek-V3's router weight and selection bias stay FP32 (transformers keeps
// them so) and equal the loaded ones; every other tensor is BF16.
TEST(HfParityDeepSeek, Bf16CheckpointKeepsTheRouterAndItsBiasInFp32) {
  const Fixture f = load_fixture("deepseek_v3");
  HostState state(f.spec);
  load_state(f, state);
  const auto dir = fs::temp_directory_path() / ("oom_hf_bf16_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  SaveHfOptions o;
  o.bf16 = true;
  save_hf_checkpoint(dir.string(), state, nlohmann::json(), o);
  const auto saved = read_safetensors((dir / "model.safetensors").string());
  ASSERT_EQ(saved.size(), f.weights.size());
  int fp32 = 0;
  for (const auto& [name, t] : saved) {
    const bool router = name.find(".mlp.gate.") != std::string::npos;
    EXPECT_EQ(t.scalar_type(), router ? at::kFloat : at::kBFloat16) << name;
    if (router) {
      EXPECT_TRUE(at::equal(t, f.weights.at(name))) << name;
    }
    fp32 += router ? 1 : 0;
  }
  EXPECT_EQ(fp32, 2 * f.spec.moe_layers());
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Architectures, HfParity,
                         ::testing::Values("qwen3_5_moe", "qwen3_next", "qwen3_moe", "mixtral", "qwen3_moe_yarn",
                                           "gemma4", "deepseek_v3", "deepseek_v3_yarn"));
INSTANTIATE_TEST_SUITE_P(Architectures, HfParityEp,
                         ::testing::Values("qwen3_5_moe", "qwen3_next", "qwen3_moe", "mixtral", "qwen3_moe_yarn",
                                           "gemma4", "deepseek_v3", "deepseek_v3_yarn"));

}  // namespace
}  // namespace oom::backend
