// `oom model show NAME|PATH [--json]` and `oom model list`.
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "costmodel/config_paths.h"
#include "costmodel/params.h"

namespace oom::cli {
namespace {

nlohmann::json layer_params_json(const LayerParams& p) {
  return {{"mixing", p.mixing}, {"norms", p.norms}, {"router", p.router}, {"routed_experts", p.routed_experts},
          {"shared_expert", p.shared_expert}, {"dense_mlp", p.dense_mlp}, {"total", p.total()}};
}

nlohmann::json model_json(const ModelSpec& m) {
  const ModelParams p = model_params(m);
  nlohmann::json j;
  j["name"] = m.name;
  j["model_type"] = m.model_type;
  j["layers"] = m.layers;
  j["hidden"] = m.hidden;
  j["vocab"] = m.vocab;
  j["layer_kinds"] = {{"full_attention", m.count(LayerKind::kFullAttention)},
                      {"sliding_attention", m.count(LayerKind::kSlidingAttention)},
                      {"linear_attention", m.count(LayerKind::kLinearAttention)},
                      {"latent_attention", m.count(LayerKind::kLatentAttention)}};
  j["dense_layers"] = m.first_dense_layers;
  j["experts"] = m.moe.experts;
  j["top_k"] = m.moe.top_k;
  j["total_params"] = p.total();
  j["active_params"] = p.active();
  nlohmann::json by = layer_params_json(p.layer_sum());
  by["embedding"] = p.embedding;
  by["lm_head"] = p.lm_head;
  by["final_norm"] = p.final_norm;
  j["params_by_component"] = by;
  auto& layers = j["params_per_layer"] = nlohmann::json::array();
  for (int l = 0; l < m.layers; ++l) {
    nlohmann::json lj = layer_params_json(p.layers[l]);
    lj["layer"] = l;
    lj["kind"] = std::string(layer_kind_name(m.layer_kinds[l]));
    layers.push_back(lj);
  }
  j["config"] = model_spec_to_hf_config(m);
  return j;
}

std::string billions(ParamCount n) {
  return n >= 1'000'000'000 ? fmt::format("{:.2f}B", static_cast<double>(n) / 1e9) : fmt::format("{:.2f}M", static_cast<double>(n) / 1e6);
}
std::string millions(ParamCount n) { return fmt::format("{:.2f}M", static_cast<double>(n) / 1e6); }

std::string attention_text(const AttentionSpec& a) {
  std::string s = fmt::format("{} heads, {} KV heads, head dim {}", a.heads, a.kv_heads, a.head_dim);
  if (a.output_gate) s += ", output gate";
  if (a.k_eq_v) s += ", V = K";
  if (a.window_tokens > 0) s += fmt::format(", window {}", a.window_tokens);
  if (a.latent()) {
    s = fmt::format("{} heads, Q/K head dim {} ({} rotated), V head dim {}, KV latent {}", a.heads, a.head_dim, a.rope_head_dim,
                    a.value_dim(), a.kv_lora_rank);
    s += a.q_lora_rank > 0 ? fmt::format(", Q latent {}", a.q_lora_rank) : std::string(", no Q latent");
  }
  return s;
}

std::string model_text(const ModelSpec& m) {
  const ModelParams p = model_params(m);
  const LayerParams sum = p.layer_sum();
  std::string out;
  out += fmt::format("{} ({})\n", m.name, m.model_type);
  out += fmt::format("  layers {}: {} full attention, {} sliding attention, {} Gated DeltaNet, {} latent attention\n", m.layers,
                     m.count(LayerKind::kFullAttention), m.count(LayerKind::kSlidingAttention),
                     m.count(LayerKind::kLinearAttention), m.count(LayerKind::kLatentAttention));
  out += fmt::format("  hidden {}, vocab {}, embeddings {}\n", m.hidden, m.vocab, m.tied_embeddings ? "tied" : "untied");
  if (m.count(LayerKind::kFullAttention) > 0) out += "  full attention: " + attention_text(m.full_attention) + "\n";
  if (m.count(LayerKind::kSlidingAttention) > 0) out += "  sliding attention: " + attention_text(m.sliding_attention) + "\n";
  if (m.count(LayerKind::kLatentAttention) > 0) out += "  latent attention: " + attention_text(m.latent_attention) + "\n";
  if (m.count(LayerKind::kLinearAttention) > 0) {
    out += fmt::format("  Gated DeltaNet: {} key heads × {}, {} value heads × {}, conv {}\n", m.gdn.key_heads,
                       m.gdn.key_head_dim, m.gdn.value_heads, m.gdn.value_head_dim, m.gdn.conv_kernel);
  }
  out += fmt::format("  experts {} (top-{}), expert intermediate {}", m.moe.experts, m.moe.top_k, m.moe.expert_intermediate);
  if (m.moe.shared_expert_intermediate > 0) out += fmt::format(", shared expert {}", m.moe.shared_expert_intermediate);
  if (m.moe.shared_expert_intermediate > 0 && !m.moe.shared_expert_gate) out += " (ungated)";
  if (m.moe.dense_intermediate > 0) out += fmt::format(", dense MLP {}", m.moe.dense_intermediate);
  if (m.moe.scoring != "softmax" || m.moe.groups > 1) {
    out += fmt::format("; {} routing, top-{} of {} groups, scale {}", m.moe.scoring, m.moe.topk_groups, m.moe.groups, m.moe.routed_scaling);
  }
  if (m.first_dense_layers > 0) {
    out += fmt::format("\n  first {} layers dense: MLP intermediate {}", m.first_dense_layers, m.dense_layer.dense_intermediate);
  }
  out += "\n  parameters:\n";
  out += fmt::format("    {:<28} {:>12}\n", "embedding", millions(p.embedding));
  out += fmt::format("    {:<28} {:>12}\n", "lm head", millions(p.lm_head));
  out += fmt::format("    {:<28} {:>12}\n", "attention / GDN mixing", millions(sum.mixing));
  out += fmt::format("    {:<28} {:>12}\n", "norms", millions(sum.norms + p.final_norm));
  out += fmt::format("    {:<28} {:>12}\n", "routers", millions(sum.router));
  out += fmt::format("    {:<28} {:>12}\n", "routed experts", millions(sum.routed_experts));
  out += fmt::format("    {:<28} {:>12}\n", "shared experts", millions(sum.shared_expert));
  out += fmt::format("    {:<28} {:>12}\n", "dense MLPs", millions(sum.dense_mlp));
  out += fmt::format("    {:<28} {:>12}\n", "total", billions(p.total()));
  out += fmt::format("    {:<28} {:>12}\n", "active per token", billions(p.active()));
  return out;
}

}  // namespace

void add_model_commands(CLI::App& app, Io io) {
  auto* model = app.add_subcommand(
      "model",
      "Model specs: dimensions and parameter counts. A model is a name in configs/models or the path of a Hugging Face "
      "config.json (any model the project's layer kinds cover: its fields are read, others ignored)");
  model->require_subcommand(1);

  auto name = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto* show = model->add_subcommand("show", "Dimensions, parameters by component, total and active");
  show->add_option("model", *name, "A name in configs/models (e.g. qwen3.6-35b-a3b) or a path to a config.json")->required();
  show->add_flag("--json", *json, "Print one JSON object (total_params and active_params are integers)");
  show->callback([=] {
    const ModelSpec m = load_model_spec(*name);
    if (*json) {
      io.out << model_json(m).dump(2) << "\n";
    } else {
      io.out << model_text(m);
    }
  });

  auto* list = model->add_subcommand("list", "The models in configs/models");
  list->callback([=] {
    for (const auto& n : config_names("models")) {
      const ModelSpec m = load_model_spec(n);
      const ModelParams p = model_params(m);
      io.out << fmt::format("{:<22} {:>9} total {:>9} active  {}\n", n, billions(p.total()), billions(p.active()), m.model_type);
    }
  });
}

}  // namespace oom::cli
