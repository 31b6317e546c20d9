// Workload: JSON round trip, per-GPU shares, resolution against model and hardware.
#include "costmodel/workload.h"

#include <gtest/gtest.h>

#include "costmodel/input_error.h"

namespace oom {
namespace {

nlohmann::json default_json() {
  return {{"model", "qwen3.6-35b-a3b"}, {"hardware", "h100-sxm-node"}, {"gpus", 4}, {"global_batch", 32},
          {"seq_len", 4096}, {"gpu_budget_gib", nullptr}, {"host_budget_gib", nullptr}};
}

std::string error_of(const nlohmann::json& j) {
  try {
    resolve_workload(workload_from_json(j, "w.json"), "w.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Workload, RoundTripAndPerGpuShares) {
  const Workload w = workload_from_json(default_json(), "w.json");
  EXPECT_EQ(w.seqs_per_gpu(), 8);
  EXPECT_EQ(w.tokens_per_gpu(), 8 * 4096);
  EXPECT_DOUBLE_EQ(w.yarn_factor, 1.0);
  EXPECT_FALSE(w.gpu_budget_gib.has_value());
  EXPECT_EQ(workload_from_json(workload_to_json(w), "rt"), w);
}

TEST(Workload, NullBudgetsMeanTheHardwareCapacity) {
  const WorkloadContext c = resolve_workload(workload_from_json(default_json(), "w.json"), "w.json");
  EXPECT_EQ(c.gpu_budget_bytes(), 80 * kGiB);
  EXPECT_EQ(c.host_budget_bytes(), 2 * 1008 * kGiB);
  nlohmann::json j = default_json();
  j["gpu_budget_gib"] = 24.0;
  EXPECT_EQ(resolve_workload(workload_from_json(j, "w.json"), "w.json").gpu_budget_bytes(), 24 * kGiB);
}

TEST(Workload, UnknownModelAndHardwareNameTheWorkloadField) {
  nlohmann::json j = default_json();
  j["model"] = "gpt-9";
  EXPECT_EQ(error_of(j).rfind("w.json: field 'model': value \"gpt-9\": unknown model (known: ", 0), 0u) << error_of(j);
  j = default_json();
  j["hardware"] = "tpu-pod";
  EXPECT_EQ(error_of(j).rfind("w.json: field 'hardware': value \"tpu-pod\": unknown hardware", 0), 0u) << error_of(j);
}

TEST(Workload, NodesRepeatTheHardwaresNode) {
  nlohmann::json j = default_json();
  j["hardware"] = "h200-sxm-node";
  j["gpus"] = 96;
  j["global_batch"] = 96;
  EXPECT_EQ(error_of(j), "w.json: field 'gpus': value 96: hardware h200-sxm-node has 8 GPUs");
  j["nodes"] = 12;
  const Workload w = workload_from_json(j, "w.json");
  EXPECT_EQ(workload_from_json(workload_to_json(w), "rt"), w);
  const WorkloadContext c = resolve_workload(w, "w.json");
  EXPECT_EQ(c.hardware.total_gpus(), 96);
  EXPECT_EQ(c.host_budget_bytes(), 2 * 1024 * kGiB);  // per node
  j["hardware"] = "rtx4090-node";
  j["nodes"] = 2;
  j["gpus"] = 8;
  j["global_batch"] = 8;
  EXPECT_EQ(error_of(j), "w.json: field 'nodes': value 2: hardware rtx4090-node has no network (network.nic) to join 2 nodes");
  j["nodes"] = 0;
  EXPECT_EQ(error_of(j).rfind("w.json: field 'nodes': value 0:", 0), 0u) << error_of(j);
}

TEST(Workload, MoreGpusThanTheNodeHasIsRejected) {
  nlohmann::json j = default_json();
  j["gpus"] = 16;
  j["global_batch"] = 32;
  EXPECT_EQ(error_of(j), "w.json: field 'gpus': value 16: hardware h100-sxm-node has 8 GPUs");
}

TEST(Workload, ContextBeyondYarnExtendedPositionsIsRejected) {
  nlohmann::json j = default_json();
  j["global_batch"] = 4;
  j["seq_len"] = 524288;
  EXPECT_NE(error_of(j).find("field 'seq_len': value 524288: exceeds max_position_embeddings 262144"), std::string::npos);
  j["yarn_factor"] = 2;
  EXPECT_EQ(error_of(j), "");
}

TEST(Workload, BatchMustSplitEvenlyOverGpus) {
  nlohmann::json j = default_json();
  j["global_batch"] = 30;
  EXPECT_EQ(error_of(j), "w.json: field 'global_batch': value 30: must be a multiple of gpus = 4 (whole sequences per GPU) "
                        "or divide it (each sequence split over gpus / global_batch GPUs)");
  j["global_batch"] = 3;
  EXPECT_NE(error_of(j).find("field 'global_batch': value 3: must be a multiple of gpus = 4"), std::string::npos);
  j["global_batch"] = 2;  // each sequence over 2 GPUs
  EXPECT_EQ(error_of(j), "");
  j["seq_len"] = 4097;
  EXPECT_EQ(error_of(j), "w.json: field 'seq_len': value 4097: must split evenly over the 2 GPUs of each sequence "
                        "(gpus / global_batch)");
}

TEST(Workload, UnknownFieldIsRejected) {
  nlohmann::json j = default_json();
  j["gpu"] = 4;
  EXPECT_EQ(error_of(j), "w.json: field 'gpu': value 4: unknown field");
}

}  // namespace
}  // namespace oom
