// planner/calibration/validation.h with "system" records: baselines are predicted, or predicted out of memory.
#include <gtest/gtest.h>

#include "planner/calibration/validation.h"

namespace oom {
namespace {

StepRecord system_record(const std::string& id, const std::string& system, std::int64_t seq_len) {
  StepRecord rec;
  rec.id = id;
  rec.origin = "test:1";
  rec.system = system;
  rec.workload.model = "qwen3.6-35b-a3b";
  rec.workload.hardware = "h100-sxm-node";
  rec.workload.gpus = 4;
  rec.workload.global_batch = 4;
  rec.workload.seq_len = seq_len;
  rec.workload.yarn_factor = 4;
  rec.measured.step_s = 10.0;
  return rec;
}

TEST(ValidateBaselineRecords, FittingSystemsArePredictedAndTooLongContextsAreOutOfMemory) {
  RecordSet set;
  set.steps.push_back(system_record("zero-4k", "zero-offload", 4096));
  set.steps.push_back(system_record("fsdp2-1m", "fsdp2-offload", 1048576));
  set.steps.push_back(system_record("unknown", "deepspeed-ulysses", 4096));
  const ValidationReport r = validate_records(set, StepEngines(), "analytic");
  ASSERT_EQ(r.records.size(), 3u);
  EXPECT_EQ(r.records[0].status, "ok");
  EXPECT_EQ(r.records[0].system, "zero-offload");
  ASSERT_TRUE(r.records[0].predicted_step_s.has_value());
  EXPECT_GT(*r.records[0].predicted_step_s, 0);
  EXPECT_EQ(r.records[1].status, "oom");
  EXPECT_NE(r.records[1].reason.find("GPU 0 out of memory"), std::string::npos) << r.records[1].reason;
  EXPECT_FALSE(r.records[1].predicted_step_s.has_value());
  EXPECT_EQ(r.records[2].status, "failed");
  EXPECT_NE(r.records[2].reason.find("system"), std::string::npos);
  EXPECT_EQ(r.count, 0) << "plan-record summary is separate";
  EXPECT_EQ(r.baseline_count, 1);
  EXPECT_EQ(r.out_of_memory, 1);
  EXPECT_EQ(r.failures, 1);
  EXPECT_NE(validation_text(r).find("1 predicted out of memory"), std::string::npos);
}

}  // namespace
}  // namespace oom
