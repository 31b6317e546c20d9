// Plan: JSON round trip of DESIGN.md's format, validation against model and workload.
#include "planner/plan/plan.h"

#include <gtest/gtest.h>

#include "costmodel/input_error.h"
#include "traces/records.h"

namespace oom {
namespace {

const char* kDesignExample = R"({ "version": 1, "path": "ep", "resident_layers": [0,1,3,7], "moe_retained_layers": [],
  "routing_chunk_tokens": 65536, "param_transfer": "full", "transfer_chunk_mib": 64, "cpu_grad_slots": 2,
  "split": {"attention_head_group": 0, "gdn_chunk_tokens": 0, "moe_chunk_tokens": 0, "sub_batch_seqs": 0},
  "keep_attention_results": false,
  "boundaries": {"host_kept": "all", "gpu_held": [], "regenerate_cap": 1}, "notes": "" })";

Workload workload(std::int64_t batch, std::int64_t seq) {
  Workload w;
  w.model = "qwen3.6-35b-a3b";
  w.hardware = "h100-sxm-node";
  w.gpus = 4;
  w.global_batch = batch;
  w.seq_len = seq;
  return w;
}

std::string validation_error(const nlohmann::json& j, const Workload& w) {
  try {
    validate_plan(plan_from_json(j, "p.json"), load_model_spec(w.model), w, "p.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Plan, DesignExampleParsesAndRoundTrips) {
  const Plan p = plan_from_json(nlohmann::json::parse(kDesignExample), "p.json");
  EXPECT_EQ(p.path, ExpertPath::kEp);
  EXPECT_EQ(p.resident_layers, (std::vector<int>{0, 1, 3, 7}));
  EXPECT_TRUE(p.boundaries.host_kept_all);
  EXPECT_TRUE(p.is_resident(3));
  EXPECT_FALSE(p.is_resident(2));
  EXPECT_EQ(plan_to_json(p), nlohmann::json::parse(kDesignExample));
  EXPECT_EQ(plan_from_json(plan_to_json(p), "rt"), p);
}

TEST(Plan, HostKeptListAndBoundaryPlaces) {
  nlohmann::json j = nlohmann::json::parse(kDesignExample);
  j["path"] = "local";
  j["resident_layers"] = nlohmann::json::array();
  j["boundaries"] = {{"host_kept", {0, 4}}, {"gpu_held", {1}}, {"regenerate_cap", 2}};
  const Plan p = plan_from_json(j, "p.json");
  EXPECT_EQ(p.boundaries.place(0), BoundaryPolicy::Place::kHost);
  EXPECT_EQ(p.boundaries.place(1), BoundaryPolicy::Place::kGpu);
  EXPECT_EQ(p.boundaries.place(2), BoundaryPolicy::Place::kRegenerated);
  EXPECT_EQ(plan_from_json(plan_to_json(p), "rt"), p);
}

TEST(Plan, EveryPaperRecordPlanIsValidForItsWorkload) {
  const RecordSet set = load_records(std::string(OOM_SOURCE_DIR) + "/traces/paper/paper-calibration.jsonl");
  int plans = 0;
  for (const auto& r : set.steps) {
    if (r.plan.is_null()) continue;
    const Plan p = plan_from_json(r.plan, r.origin);
    const ModelSpec m = load_model_spec(r.workload.model);
    EXPECT_NO_THROW(validate_plan(p, m, r.workload, r.origin)) << r.id;
    EXPECT_EQ(plan_from_json(plan_to_json(p), "rt"), p) << r.id;
    ++plans;
  }
  EXPECT_GE(plans, 15);
}

TEST(Plan, OutOfRangeLayerNamesFieldIndexAndRange) {
  nlohmann::json j = nlohmann::json::parse(kDesignExample);
  j["resident_layers"] = {0, 1, 52};
  EXPECT_EQ(validation_error(j, workload(32, 4096)),
            "p.json: field 'resident_layers[2]': value 52: layer index out of range 0..39 of qwen3.6-35b-a3b");
  j["resident_layers"] = {0, 1, 1};
  EXPECT_EQ(validation_error(j, workload(32, 4096)), "p.json: field 'resident_layers[2]': value 1: duplicate layer index");
}

TEST(Plan, HeadGroupMustDivideQueryHeadsPerKvGroup) {
  nlohmann::json j = nlohmann::json::parse(kDesignExample);
  j["split"]["attention_head_group"] = 3;  // 16 heads / 2 KV heads = 8 per group
  EXPECT_EQ(validation_error(j, workload(32, 4096)),
            "p.json: field 'split.attention_head_group': value 3: must divide the 8 query heads per KV group of "
            "qwen3.6-35b-a3b full_attention layers");
  j["split"]["attention_head_group"] = 4;
  EXPECT_EQ(validation_error(j, workload(32, 4096)), "");
}

TEST(Plan, LocalPathRejectsEpOnlyFieldsAndEpRejectsShardDelivery) {
  nlohmann::json j = nlohmann::json::parse(kDesignExample);
  j["path"] = "local";
  EXPECT_EQ(validation_error(j, workload(32, 4096)),
            "p.json: field 'resident_layers': value [0,1,3,7]: the local path has no resident expert shards");
  j = nlohmann::json::parse(kDesignExample);
  j["param_transfer"] = "shard";
  EXPECT_NE(validation_error(j, workload(32, 4096)).find("shard delivery is a local-path option"), std::string::npos);
}

TEST(Plan, ChunksAndSubBatchesMustFitTheWorkload) {
  nlohmann::json j = nlohmann::json::parse(kDesignExample);
  j["split"]["gdn_chunk_tokens"] = 8192;  // two whole sequences
  EXPECT_EQ(validation_error(j, workload(32, 4096)), "");
  j["split"]["gdn_chunk_tokens"] = 6000;
  EXPECT_EQ(validation_error(j, workload(32, 4096)),
            "p.json: field 'split.gdn_chunk_tokens': value 6000: above seq_len 4096 it must be a whole number of sequences");
  j = nlohmann::json::parse(kDesignExample);
  j["path"] = "local";
  j["resident_layers"] = nlohmann::json::array();
  j["split"]["sub_batch_seqs"] = 3;
  EXPECT_EQ(validation_error(j, workload(32, 4096)),
            "p.json: field 'split.sub_batch_seqs': value 3: must divide the 8 sequences per GPU");
}

TEST(Plan, FieldsThePathWouldIgnoreAreRefused) {
  nlohmann::json j = nlohmann::json::parse(kDesignExample);
  j["split"]["moe_chunk_tokens"] = 1024;
  EXPECT_EQ(validation_error(j, workload(32, 4096)),
            "p.json: field 'split.moe_chunk_tokens': value 1024: the ep path chunks MoE work by its dispatch rounds "
            "(routing_chunk_tokens)");
  j = nlohmann::json::parse(kDesignExample);
  j["split"]["sub_batch_seqs"] = 2;
  EXPECT_EQ(validation_error(j, workload(32, 4096)),
            "p.json: field 'split.sub_batch_seqs': value 2: sub-batches are a local-path partition");
  j = nlohmann::json::parse(kDesignExample);
  j["path"] = "local";
  j["resident_layers"] = nlohmann::json::array();
  EXPECT_EQ(validation_error(j, workload(32, 4096)), "");
  j["routing_chunk_tokens"] = 4096;
  EXPECT_EQ(validation_error(j, workload(32, 4096)),
            "p.json: field 'routing_chunk_tokens': value 4096: the local path routes no tokens between GPUs; it chunks "
            "MoE work by split.moe_chunk_tokens");
}

TEST(Plan, TypeAndEnumErrorsAreCaughtWhileParsing) {
  nlohmann::json j = nlohmann::json::parse(kDesignExample);
  j["path"] = "tensor";
  EXPECT_THROW(plan_from_json(j, "p.json"), InputError);
  j = nlohmann::json::parse(kDesignExample);
  j["boundaries"]["host_kept"] = "some";
  EXPECT_THROW(plan_from_json(j, "p.json"), InputError);
  j = nlohmann::json::parse(kDesignExample);
  j["routing_chunk"] = 5;  // misspelled field
  EXPECT_THROW(plan_from_json(j, "p.json"), InputError);
  j = nlohmann::json::parse(kDesignExample);
  j["version"] = 2;
  EXPECT_THROW(plan_from_json(j, "p.json"), InputError);
}

}  // namespace
}  // namespace oom
