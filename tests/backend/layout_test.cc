// backend/model/layout.h: the flat per-block layout agrees with the parameter counts of costmodel/params.h.
#include "backend/model/layout.h"

#include <gtest/gtest.h>

#include "costmodel/input_error.h"

#include "costmodel/config_paths.h"
#include "costmodel/params.h"

namespace oom::backend {
namespace {

TEST(ModelLayout, BlockSizesEqualCostModelParameterCountsForEveryShippedModel) {
  for (const auto& name : config_names("models")) {
    const ModelSpec spec = load_model_spec(name);
    const ModelLayout layout = model_layout(spec);
    const ModelParams p = model_params(spec);
    ASSERT_EQ(static_cast<int>(layout.blocks.size()), spec.layers + 1) << name;
    EXPECT_EQ(layout.blocks[0].numel, p.embedding + p.lm_head + p.final_norm) << name;
    std::int64_t buffers = 0;
    for (int l = 0; l < spec.layers; ++l) {
      // Sigmoid routing's selection bias [E] is a checkpoint buffer the cost model does not count.
      const std::int64_t bias = spec.moe_layer(l) && spec.moe.scoring == "sigmoid" ? spec.moe.experts : 0;
      buffers += bias;
      EXPECT_EQ(layout.blocks[static_cast<std::size_t>(1 + l)].numel, p.layers[static_cast<std::size_t>(l)].total() + bias)
          << name << " layer " << l;
    }
    EXPECT_EQ(layout.total_numel(), p.total() + buffers) << name;
  }
}

// DeepSeek-V3: latent attention with the query latent, dense first layers (their MLP and empty
// expert banks), the selection bias and an ungated shared expert in the MoE layers. Kimi-K2 alike.
TEST(ModelLayout, DeepSeekStyleDecodersHaveLatentAttentionDenseFirstLayersAndTheSelectionBias) {
  for (const char* name : {"deepseek-v3", "kimi-k2"}) {
    const ModelSpec spec = load_model_spec(name);
    ASSERT_GT(spec.first_dense_layers, 0) << name;
    const ModelLayout layout = model_layout(spec);
    const BlockLayout& dense = layout.blocks[1];
    const BlockLayout& moe = layout.blocks[static_cast<std::size_t>(1 + spec.first_dense_layers)];
    const AttentionSpec& a = spec.latent_attention;
    EXPECT_EQ(dense.at("attn.kv_b_proj").shape,
              (std::vector<std::int64_t>{std::int64_t{a.heads} * (a.head_dim - a.rope_head_dim + a.value_dim()), a.kv_lora_rank}))
        << name;
    EXPECT_TRUE(dense.has("attn.q_a_proj") && dense.has("attn.q_a_layernorm") && !dense.has("attn.q_proj")) << name;
    EXPECT_EQ(dense.at("dense.gate").shape, (std::vector<std::int64_t>{spec.dense_layer.dense_intermediate, spec.hidden})) << name;
    EXPECT_FALSE(dense.has("router")) << name;
    EXPECT_EQ(dense.at("experts.gate").numel(), 0) << name;
    EXPECT_EQ(moe.at("router.bias").shape, (std::vector<std::int64_t>{spec.moe.experts})) << name;
    EXPECT_EQ(moe.at("router.bias").init, InitKind::kZeros) << name;
    EXPECT_TRUE(moe.has("shared.gate") && !moe.has("shared.expert_gate") && !moe.has("dense.gate")) << name;
  }
}

// Routing the backend does not implement is refused in one line naming the field.
TEST(ModelLayout, GroupLimitedSoftmaxRoutingIsRefusedNamingTheField) {
  ModelSpec spec = load_model_spec("deepseek-v3");
  spec.moe.scoring = "softmax";
  try {
    model_layout(spec);
    ADD_FAILURE() << "built";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("deepseek-v3: field 'n_group': value 8: group-limited softmax routing is not implemented in the LibTorch backend"),
              std::string::npos) << what;
  }
}

TEST(ModelLayout, EntriesTileTheBlockWithoutGapsOrOverlap) {
  const ModelLayout layout = model_layout(load_model_spec("tiny-moe"));
  for (const auto& block : layout.blocks) {
    std::int64_t next = 0;
    for (const auto& e : block.entries) {
      EXPECT_EQ(e.offset, next) << block.name << " " << e.name;
      next += e.numel();
    }
    EXPECT_EQ(next, block.numel) << block.name;
  }
  EXPECT_TRUE(layout.blocks[1].has("gdn.conv"));   // layer 0 is Gated DeltaNet
  EXPECT_TRUE(layout.blocks[2].has("attn.q_proj"));  // layer 1 slides
  EXPECT_TRUE(layout.blocks[1].has("dense.gate"));
  EXPECT_TRUE(layout.blocks[1].has("shared.expert_gate"));
}

TEST(ModelLayout, TiedEmbeddingsHaveNoLmHeadAndKEqVHasNoVProjection) {
  const ModelSpec spec = load_model_spec("tiny-moe-gemma");
  const ModelLayout layout = model_layout(spec);
  EXPECT_FALSE(layout.blocks[0].has("lm_head"));
  EXPECT_FALSE(layout.blocks[6].has("attn.v_proj"));  // layer 5 is global with K = V
  EXPECT_TRUE(layout.blocks[1].has("attn.v_proj"));
}

}  // namespace
}  // namespace oom::backend
