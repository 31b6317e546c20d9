// ModelSpec: reading Hugging Face configs of every layer kind, multimodal text_config, round trip.
#include "costmodel/model_spec.h"

#include <functional>

#include <gtest/gtest.h>

#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"
#include "costmodel/json_input.h"

namespace oom {
namespace {

TEST(ModelSpec, Qwen36HasThirtyGdnAndTenGatedFullAttentionLayers) {
  const ModelSpec m = load_model_spec("qwen3.6-35b-a3b");
  EXPECT_EQ(m.layers, 40);
  EXPECT_EQ(m.count(LayerKind::kLinearAttention), 30);
  EXPECT_EQ(m.count(LayerKind::kFullAttention), 10);
  for (int l = 3; l < 40; l += 4) EXPECT_EQ(m.layer_kinds[l], LayerKind::kFullAttention) << l;
  EXPECT_TRUE(m.full_attention.output_gate);
  EXPECT_EQ(m.full_attention.kv_heads, 2);
  EXPECT_EQ(m.gdn.value_heads, 32);
  EXPECT_EQ(m.gdn.key_dim(), 16 * 128);
  EXPECT_EQ(m.moe.shared_expert_intermediate, 512);
  EXPECT_DOUBLE_EQ(m.partial_rotary_factor, 0.25);
}

TEST(ModelSpec, MultimodalConfigIsReadFromTextConfig) {
  const ModelSpec m = load_model_spec("qwen3.5-122b-a10b");
  EXPECT_EQ(m.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(m.hidden, 3072);
  EXPECT_EQ(m.layers, 48);
  EXPECT_EQ(m.count(LayerKind::kFullAttention), 12);
  EXPECT_EQ(m.gdn.value_heads, 64);
}

TEST(ModelSpec, Gemma4GlobalLayersHaveTheirOwnKvHeadsHeadDimAndKEqV) {
  const ModelSpec m = load_model_spec("gemma4-26b-a4b");
  EXPECT_EQ(m.count(LayerKind::kSlidingAttention), 25);
  EXPECT_EQ(m.count(LayerKind::kFullAttention), 5);
  EXPECT_EQ(m.layer_kinds[5], LayerKind::kFullAttention);
  EXPECT_EQ(m.sliding_attention.window_tokens, 1024);
  EXPECT_EQ(m.sliding_attention.kv_heads, 8);
  EXPECT_EQ(m.sliding_attention.head_dim, 256);
  EXPECT_FALSE(m.sliding_attention.k_eq_v);
  EXPECT_EQ(m.full_attention.kv_heads, 2);
  EXPECT_EQ(m.full_attention.head_dim, 512);
  EXPECT_TRUE(m.full_attention.k_eq_v);
  EXPECT_EQ(m.full_attention.window_tokens, 0);
  EXPECT_EQ(m.moe.dense_intermediate, 2112);
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_DOUBLE_EQ(m.final_logit_softcap, 30.0);
}

TEST(ModelSpec, MixtralSlidesEveryLayerWithItsWindowAndSizesExpertsByIntermediateSize) {
  const ModelSpec m = load_model_spec("mixtral-8x7b");
  EXPECT_EQ(m.count(LayerKind::kSlidingAttention), 32);
  EXPECT_EQ(m.sliding_attention.window_tokens, 4096);
  EXPECT_EQ(m.moe.experts, 8);
  EXPECT_EQ(m.moe.expert_intermediate, 14336);
  EXPECT_EQ(m.moe.dense_intermediate, 0);
}

TEST(ModelSpec, Qwen3MoeIgnoresDenseIntermediateSizeAndNullWindow) {
  const ModelSpec m = load_model_spec("qwen3-30b-a3b");
  EXPECT_EQ(m.count(LayerKind::kFullAttention), 48);
  EXPECT_EQ(m.moe.expert_intermediate, 768);
  EXPECT_EQ(m.moe.dense_intermediate, 0);
  EXPECT_EQ(m.moe.shared_expert_intermediate, 0);
  EXPECT_FALSE(m.full_attention.output_gate);
}

TEST(ModelSpec, QwenNextDerivesLayerTypesFromTheInterval) {
  const ModelSpec m = load_model_spec("qwen3-next-80b-a3b");
  EXPECT_EQ(m.count(LayerKind::kLinearAttention), 36);
  EXPECT_EQ(m.count(LayerKind::kFullAttention), 12);
  EXPECT_EQ(m.moe.experts, 512);
  EXPECT_EQ(m.moe.top_k, 10);
}

TEST(ModelSpec, TinyMoeHasEveryLayerKind) {
  for (const char* name : {"tiny-moe"}) {
    const ModelSpec m = load_model_spec(name);
    EXPECT_LE(m.hidden, 256);
    EXPECT_GT(m.count(LayerKind::kLinearAttention), 0);
    EXPECT_GT(m.count(LayerKind::kSlidingAttention), 0);
    EXPECT_GT(m.count(LayerKind::kFullAttention), 0);
    EXPECT_GT(m.moe.shared_expert_intermediate, 0);
    EXPECT_GT(m.moe.dense_intermediate, 0);
  }
  EXPECT_TRUE(load_model_spec("tiny-moe-gemma").full_attention.k_eq_v);
  EXPECT_EQ(load_model_spec("tiny-moe-mixtral").count(LayerKind::kSlidingAttention), 2);
}

TEST(ModelSpec, EveryShippedConfigRoundTripsThroughTheHfWriter) {
  for (const char* name : {"qwen3.6-35b-a3b", "qwen3.5-122b-a10b", "qwen3-30b-a3b", "mixtral-8x7b", "gemma4-26b-a4b",
                           "qwen3-next-80b-a3b", "tiny-moe", "tiny-moe-qwen", "tiny-moe-gemma", "tiny-moe-mixtral"}) {
    const ModelSpec m = load_model_spec(name);
    const ModelSpec back = model_spec_from_hf_config(model_spec_to_hf_config(m), "roundtrip", m.name);
    EXPECT_EQ(back, m) << name;
  }
}

// transformers' Gemma4TextConfig defaults (26B-A4B's config names neither rope_parameters nor
// hidden_activation) and the per_layer_config form save_pretrained writes for the global layers.
TEST(ModelSpec, Gemma4ReadsPerLayerTypeRopeAndPerLayerConfigAsTransformersDoes) {
  const ModelSpec m = load_model_spec("gemma4-26b-a4b");
  EXPECT_TRUE(m.gemma4());
  EXPECT_DOUBLE_EQ(m.sliding_attention.rope_theta, 1e4);
  EXPECT_FALSE(m.sliding_attention.rope_proportional);
  EXPECT_DOUBLE_EQ(m.full_attention.rope_theta, 1e6);
  EXPECT_TRUE(m.full_attention.rope_proportional);
  EXPECT_DOUBLE_EQ(m.full_attention.rope_partial_factor, 0.25);
  EXPECT_EQ(m.activation, "gelu_pytorch_tanh");
  EXPECT_DOUBLE_EQ(m.router_aux_loss_coef, 0.0);
  nlohmann::json j = model_spec_to_hf_config(load_model_spec("tiny-moe-gemma"));
  j.erase("global_head_dim");
  j.erase("num_global_key_value_heads");
  j["per_layer_config"] = {{"5", {{"head_dim", 48}, {"num_key_value_heads", 2}}}};
  j["rope_parameters"] = {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 5e3}}},
                          {"full_attention", {{"rope_type", "proportional"}, {"rope_theta", 2e6}, {"partial_rotary_factor", 0.5}}}};
  const ModelSpec t = model_spec_from_hf_config(j, "cfg.json", "x");
  EXPECT_EQ(t.full_attention.head_dim, 48);
  EXPECT_EQ(t.full_attention.kv_heads, 2);
  EXPECT_EQ(t.sliding_attention.head_dim, 16);
  EXPECT_DOUBLE_EQ(t.sliding_attention.rope_theta, 5e3);
  EXPECT_DOUBLE_EQ(t.full_attention.rope_theta, 2e6);
  EXPECT_DOUBLE_EQ(t.full_attention.rope_partial_factor, 0.5);
  // Without attention_k_eq_v transformers gives the global layers num_key_value_heads.
  nlohmann::json no_kv = model_spec_to_hf_config(load_model_spec("tiny-moe-gemma"));
  no_kv["attention_k_eq_v"] = false;
  EXPECT_EQ(model_spec_from_hf_config(no_kv, "cfg.json", "x").full_attention.kv_heads, 2);
  // An override on a sliding layer is refused.
  j["per_layer_config"] = {{"0", {{"head_dim", 48}}}};
  EXPECT_THROW(model_spec_from_hf_config(j, "cfg.json", "x"), InputError);
}

TEST(ModelSpec, Gemma4FeaturesTheBackendDoesNotImplementAreRefusedByField) {
  const nlohmann::json base = model_spec_to_hf_config(load_model_spec("tiny-moe-gemma"));
  const auto refused = [&](const char* field, const nlohmann::json& value, const char* shown) {
    nlohmann::json j = base;
    if (value.is_null()) {
      j.erase(field);
    } else {
      j[field] = value;
    }
    try {
      model_spec_from_hf_config(j, "cfg.json", "x");
      ADD_FAILURE() << field << " accepted";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("'") + field + "'"), std::string::npos) << what;
      EXPECT_NE(what.find(shown), std::string::npos) << what;
    }
  };
  refused("hidden_size_per_layer_input", nullptr, "256");  // transformers' default
  refused("hidden_size_per_layer_input", 128, "128");
  refused("num_kv_shared_layers", 2, "2");
  refused("attention_bias", true, "true");
  refused("use_bidirectional_attention", "all", "all");
  refused("enable_moe_block", false, "false");
  refused("enable_moe_block", nullptr, "false");  // transformers' default
}

TEST(ModelSpec, UnknownLayerTypeNamesTheFieldAndIndex) {
  nlohmann::json j = model_spec_to_hf_config(load_model_spec("tiny-moe"));
  j["layer_types"][2] = "mamba";
  try {
    model_spec_from_hf_config(j, "cfg.json", "x");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "cfg.json: field 'layer_types[2]': value \"mamba\": unknown layer type (expected full_attention, "
              "sliding_attention, linear_attention or latent_attention)");
  }
}

TEST(ModelSpec, DeepSeekV3HasLatentAttentionDenseFirstLayersAndGroupedSigmoidRouting) {
  const ModelSpec m = load_model_spec("deepseek-v3");
  EXPECT_EQ(m.count(LayerKind::kLatentAttention), 61);
  const AttentionSpec& a = m.attention(LayerKind::kLatentAttention);
  EXPECT_TRUE(a.latent());
  EXPECT_EQ(a.heads, 128);
  EXPECT_EQ(a.kv_heads, 128);
  EXPECT_EQ(a.head_dim, 192);  // qk_nope 128 + qk_rope 64
  EXPECT_EQ(a.rope_head_dim, 64);
  EXPECT_EQ(a.value_dim(), 128);
  EXPECT_EQ(a.q_lora_rank, 1536);
  EXPECT_EQ(a.kv_lora_rank, 512);
  EXPECT_EQ(m.first_dense_layers, 3);
  EXPECT_FALSE(m.moe_layer(2));
  EXPECT_TRUE(m.moe_layer(3));
  EXPECT_EQ(m.moe_layers(), 58);
  EXPECT_EQ(m.layer_moe(0).experts, 0);
  EXPECT_EQ(m.layer_moe(0).dense_intermediate, 18432);
  EXPECT_EQ(m.layer_moe(3).experts, 256);
  EXPECT_EQ(m.moe.shared_expert_intermediate, 2048);  // one shared expert of moe_intermediate_size
  EXPECT_FALSE(m.moe.shared_expert_gate);
  EXPECT_EQ(m.moe.scoring, "sigmoid");
  EXPECT_EQ(m.moe.groups, 8);
  EXPECT_EQ(m.moe.topk_groups, 4);
  EXPECT_DOUBLE_EQ(m.moe.routed_scaling, 2.5);
  EXPECT_EQ(m.rope_scaling.type, "yarn");
  EXPECT_DOUBLE_EQ(m.rope_scaling.factor, 40.0);
  // A q_lora_rank of null (DeepSeek-V2-Lite) projects queries straight from the hidden state.
  nlohmann::json j = model_spec_to_hf_config(m);
  j["q_lora_rank"] = nullptr;
  EXPECT_EQ(model_spec_from_hf_config(j, "cfg.json", "x").latent_attention.q_lora_rank, 0);
  // transformers writes DeepSeek-V3 configs without scoring_func: the V3 router is sigmoid.
  j.erase("scoring_func");
  j.erase("topk_method");
  EXPECT_EQ(model_spec_from_hf_config(j, "cfg.json", "x").moe.scoring, "sigmoid");
  j["model_type"] = "deepseek_v2";
  EXPECT_EQ(model_spec_from_hf_config(j, "cfg.json", "x").moe.scoring, "softmax");
  j["topk_method"] = "noaux_tc";
  EXPECT_EQ(model_spec_from_hf_config(j, "cfg.json", "x").moe.scoring, "sigmoid");
}

TEST(ModelSpec, DeepSeekFieldsOutsideTheModelAreRefusedByField) {
  const nlohmann::json base = model_spec_to_hf_config(load_model_spec("kimi-k2"));
  const auto refused = [&](const char* key, const nlohmann::json& value, const std::string& needle) {
    nlohmann::json j = base;
    j[key] = value;
    try {
      model_spec_from_hf_config(j, "cfg.json", "x");
      ADD_FAILURE() << key << " accepted";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("field '") + key + "'"), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
    }
  };
  refused("moe_layer_freq", 2, "only every layer");
  refused("n_group", 5, "must divide the 384 routed experts");
  refused("topk_group", 0, "");
  refused("attention_bias", true, "biases");
  refused("first_k_dense_replace", 61, "");
  refused("scoring_func", "softplus", "");
  nlohmann::json j = base;
  j["n_group"] = 8;
  j["topk_group"] = 1;
  j["num_experts_per_tok"] = 49;  // more than one group of 48 holds
  EXPECT_THROW(model_spec_from_hf_config(j, "cfg.json", "x"), InputError);
}

TEST(ModelSpec, TopKLargerThanExpertsIsRejected) {
  nlohmann::json j = model_spec_to_hf_config(load_model_spec("tiny-moe"));
  j["num_experts_per_tok"] = 99;
  EXPECT_THROW(model_spec_from_hf_config(j, "cfg.json", "x"), InputError);
}

// A Hugging Face config is read by the fields the project uses: the many others a config carries
// (and an oom_version) change nothing and are not refused, at the root or nested.
TEST(ModelSpec, HfConfigKeysTheProjectDoesNotReadAreKept) {
  for (const char* name : {"tiny-moe", "qwen3.5-122b-a10b"}) {
    nlohmann::json j = read_json_file(config_folder("models") + "/" + name + ".json");
    const ModelSpec plain = model_spec_from_hf_config(j, "cfg.json", name);
    j["architectures"] = {"SomethingForCausalLM"};
    j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
    j["transformers_version"] = "4.57.0";
    j[kOomVersionKey] = "0.9.0";
    if (j.contains("text_config")) j["text_config"]["vision_start_token_id"] = 7;
    EXPECT_EQ(model_spec_from_hf_config(j, "cfg.json", name), plain) << name;
  }
}

// Messages name the key the config has: Gemma 4's global KV heads may come from per_layer_config.
TEST(ModelSpec, Gemma4GlobalKvHeadsNotDividingNameTheKeyThatSetThem) {
  nlohmann::json j = model_spec_to_hf_config(load_model_spec("tiny-moe-gemma"));
  j.erase("num_global_key_value_heads");
  j["per_layer_config"] = {{"5", {{"num_key_value_heads", 3}}}};
  try {
    model_spec_from_hf_config(j, "cfg.json", "x");
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "cfg.json: field 'per_layer_config.5.num_key_value_heads': value 3: must divide num_attention_heads = 4");
  }
}

// Families name the expert counts differently: a config with none of the names is told them all,
// not the one tried last (top_k_experts is Gemma 4's, unknown to a Qwen config).
TEST(ModelSpec, AMissingExpertCountNamesEveryKeyThatGivesIt) {
  const auto error = [](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = model_spec_to_hf_config(load_model_spec("tiny-moe-qwen"));
    edit(j);
    try {
      model_spec_from_hf_config(j, "cfg.json", "x");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(error([](nlohmann::json& j) { j["num_experts_per_tok"] = nullptr; }),
            "cfg.json: field 'num_experts_per_tok': value (missing): required field is missing (num_experts_per_tok or top_k_experts)");
  EXPECT_EQ(error([](nlohmann::json& j) { j.erase("num_experts"); }),
            "cfg.json: field 'num_experts': value (missing): required field is missing (num_experts or n_routed_experts or "
            "num_local_experts)");
  EXPECT_EQ(error([](nlohmann::json& j) { j.erase("moe_intermediate_size"); }),
            "cfg.json: field 'moe_intermediate_size': value (missing): required field is missing (moe_intermediate_size or "
            "intermediate_size)");
}

TEST(ModelSpec, UnknownNameListsTheKnownModels) {
  try {
    load_model_spec("no-such-model");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown model"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("mixtral-8x7b"), std::string::npos);
  }
}

}  // namespace
}  // namespace oom
