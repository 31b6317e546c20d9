// backend/layout.h: the flat per-block layout agrees with the parameter counts of costmodel/params.h.
#include "backend/layout.h"

#include <gtest/gtest.h>

#include "costmodel/input_error.h"

#include "costmodel/config_paths.h"
#include "costmodel/params.h"

namespace oom::backend {
namespace {

TEST(ModelLayout, BlockSizesEqualCostModelParameterCountsForEveryShippedModel) {
  for (const auto& name : config_names("models")) {
    const ModelSpec spec = load_model_spec(name);
    if (spec.count(LayerKind::kLatentAttention) > 0) continue;  // not built by the backend (next test)
    const ModelLayout layout = model_layout(spec);
    const ModelParams p = model_params(spec);
    ASSERT_EQ(static_cast<int>(layout.blocks.size()), spec.layers + 1) << name;
    EXPECT_EQ(layout.blocks[0].numel, p.embedding + p.lm_head + p.final_norm) << name;
    for (int l = 0; l < spec.layers; ++l) {
      EXPECT_EQ(layout.blocks[static_cast<std::size_t>(1 + l)].numel, p.layers[static_cast<std::size_t>(l)].total())
          << name << " layer " << l;
    }
    EXPECT_EQ(layout.total_numel(), p.total()) << name;
  }
}

// DeepSeek-V3 and Kimi-K2 are cost-model models: the backend refuses them in one line naming
// the model and the first feature it lacks, before allocating anything.
TEST(ModelLayout, DeepSeekStyleDecodersAreRefusedNamingTheField) {
  for (const char* name : {"deepseek-v3", "kimi-k2"}) {
    try {
      model_layout(load_model_spec(name));
      ADD_FAILURE() << name << " built";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string(name) + ": field 'kv_lora_rank': value 512: latent attention (MLA) is not implemented in the LibTorch backend"),
                std::string::npos) << what;
    }
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
