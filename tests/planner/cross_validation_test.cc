// Tests of planner/calibration/cross_validation.h: records fall into the groups their keys name, a left-out
// record never takes part in the fit that predicts it (its own measurement cannot move its
// prediction), and a group whose removal leaves nothing to fit is reported, not predicted.
#include "planner/calibration/cross_validation.h"

#include <cmath>

#include <gtest/gtest.h>

#include "costmodel/input_error.h"
#include "planner/engine/cost_report.h"

namespace oom {
namespace {

StepRecord step(const std::string& id, std::int64_t batch, std::vector<int> resident, double measured_s, bool local = false) {
  StepRecord r;
  r.id = id;
  r.origin = id;
  r.workload = default_workload();
  r.workload.global_batch = batch;
  Plan p = default_plan();
  p.resident_layers = std::move(resident);
  if (local) {
    p = Plan{};
    p.path = ExpertPath::kLocal;
    p.param_transfer = ParamTransfer::kShard;
    p.cpu_grad_slots = 1;
  }
  r.plan = plan_to_json(p);
  r.measured.step_s = measured_s;
  return r;
}

OperatorRecord op(const std::string& id, const std::string& model, std::int64_t seq_len, double time_s) {
  OperatorRecord o;
  o.id = id;
  o.origin = id;
  o.model = model;
  o.hardware = "h100-sxm-node";
  o.layer_type = "moe";
  o.op = "moe_forward";
  o.batch = 1;
  o.seq_len = seq_len;
  o.time_s = time_s;
  return o;
}

RecordSet records(double b32_measured_s) {
  RecordSet set;
  set.steps = {step("ep-b16", 16, {0, 1, 3, 7, 11, 15, 19, 22, 26, 30, 34, 38}, 3.8), step("ep-b32", 32, {}, b32_measured_s),
               step("local-b128", 128, {}, 12.2, true)};
  StepRecord fsdp = step("fsdp2-b32", 32, {}, 7.0);
  fsdp.plan = nullptr;
  fsdp.system = "fsdp2-offload";
  set.steps.push_back(fsdp);
  set.operators = {op("op-moe-64k", "qwen3.6-35b-a3b", 65536, 0.02)};
  return set;
}

CvOptions quick(CvGrouping g) {
  CvOptions o;
  o.grouping = g;
  o.fit.starts = 1;
  o.fit.max_iterations = 4;
  return o;
}

const CvPrediction& find(const CrossValidation& cv, const std::string& id) {
  for (const auto& p : cv.predictions) {
    if (p.id == id) return p;
  }
  ADD_FAILURE() << "no prediction for " << id;
  static const CvPrediction none;
  return none;
}

TEST(CvGrouping, NamesRoundTripAndUnknownNamesAreRefused) {
  for (const CvGrouping g : {CvGrouping::kModel, CvGrouping::kHardware, CvGrouping::kGpus, CvGrouping::kPath, CvGrouping::kRecord}) {
    EXPECT_EQ(cv_grouping_from_name(cv_grouping_name(g)), g);
  }
  EXPECT_FALSE(cv_grouping_from_name("batch").has_value());
}

TEST(CvGrouping, StepRecordsGroupByTheirWorkloadPlanOrSystem) {
  const RecordSet set = records(5.0);
  const StepRecord& ep = set.steps[0];
  EXPECT_EQ(cv_group_of(ep, CvGrouping::kModel), "qwen3.6-35b-a3b");
  EXPECT_EQ(cv_group_of(ep, CvGrouping::kHardware), "h100-sxm-node");
  EXPECT_EQ(cv_group_of(ep, CvGrouping::kGpus), "4");
  EXPECT_EQ(cv_group_of(ep, CvGrouping::kPath), "ep");
  EXPECT_EQ(cv_group_of(set.steps[2], CvGrouping::kPath), "local");
  EXPECT_EQ(cv_group_of(set.steps[3], CvGrouping::kPath), "fsdp2-offload");
  EXPECT_EQ(cv_group_of(ep, CvGrouping::kRecord), "ep-b16");
}

// A class is one experiment of one model: leaving it out leaves every sibling row out.
TEST(CvGrouping, ClassesAreAnExperimentOfOneModel) {
  EXPECT_EQ(record_experiment("OOM arXiv 2611.11364 Table 4"), "Table 4");
  EXPECT_EQ(record_experiment("OOM arXiv 2611.11364 Table 4, §7.4"), "Table 4");
  EXPECT_EQ(record_experiment("OOM arXiv 2611.11364 §7.3 (22.4K tokens/s)"), "§7.3");
  EXPECT_EQ(record_experiment("OOM arXiv 2611.11364 §7.5, Appendix C"), "§7.5");
  EXPECT_EQ(record_experiment("OOM arXiv 2611.11364 Appendix G"), "Appendix G");
  EXPECT_EQ(record_experiment("local run 2026-12-01"), "local run 2026-12-01");
  const RecordSet set = records(5.0);
  StepRecord a = set.steps[0], b = set.steps[1], c = set.steps[1];
  a.source = "OOM arXiv 2611.11364 Table 4";
  b.source = "OOM arXiv 2611.11364 Table 4, §7.4";
  c.source = "OOM arXiv 2611.11364 Table 4";
  c.workload.model = "qwen3-30b-a3b";
  EXPECT_EQ(cv_group_of(a, CvGrouping::kClass), "Table 4 qwen3.6-35b-a3b");
  EXPECT_EQ(cv_group_of(b, CvGrouping::kClass), cv_group_of(a, CvGrouping::kClass));
  EXPECT_NE(cv_group_of(c, CvGrouping::kClass), cv_group_of(a, CvGrouping::kClass));
  OperatorRecord o = set.operators[0];
  o.source = "OOM arXiv 2611.11364 §5.3";
  EXPECT_EQ(cv_group_of(o, CvGrouping::kClass), "§5.3 qwen3.6-35b-a3b");
  EXPECT_EQ(cv_grouping_from_name("class"), CvGrouping::kClass);
}

TEST(CvGrouping, OperatorRecordsAreOneGpuMeasurementsOfTheirModel) {
  const OperatorRecord o = records(5.0).operators[0];
  EXPECT_EQ(cv_group_of(o, CvGrouping::kModel), "qwen3.6-35b-a3b");
  EXPECT_EQ(cv_group_of(o, CvGrouping::kGpus), "1");
  EXPECT_EQ(cv_group_of(o, CvGrouping::kPath), "operator");
  EXPECT_EQ(cv_group_of(o, CvGrouping::kRecord), "op-moe-64k");
}

TEST(CrossValidate, ALeftOutRecordsOwnMeasurementCannotMoveItsPrediction) {
  const HardwareSpec hw = load_hardware_spec("h100-sxm-node");
  const CrossValidation a = cross_validate(records(5.0), hw, quick(CvGrouping::kRecord));
  const CrossValidation b = cross_validate(records(50.0), hw, quick(CvGrouping::kRecord));
  ASSERT_EQ(a.predictions.size(), 5u);
  const CvPrediction& pa = find(a, "ep-b32");
  const CvPrediction& pb = find(b, "ep-b32");
  ASSERT_TRUE(pa.predicted_s && pb.predicted_s);
  EXPECT_EQ(*pa.predicted_s, *pb.predicted_s);  // bit for bit: the record is not in its fit
  EXPECT_EQ(*pa.measured_s, 5.0);
  EXPECT_EQ(*pb.measured_s, 50.0);
  // The other records' fits did use it: a tenfold measurement moves some of their predictions.
  bool moved = false;
  for (const std::string id : {"ep-b16", "local-b128", "op-moe-64k"}) {
    moved = moved || *find(a, id).predicted_s != *find(b, id).predicted_s;
  }
  EXPECT_TRUE(moved);
  // Every record is predicted by a fit that left it out: its group names it alone.
  for (const auto& g : a.groups) EXPECT_EQ(g.ids.size(), 1u) << g.group;
  // The offload baseline's record joins the fit like a plan record: its own fold leaves it out.
  EXPECT_EQ(find(a, "fsdp2-b32").kind, RecordKind::kBaseline);
  EXPECT_EQ(a.fits, 5);
}

TEST(CrossValidate, ALeftOutGroupIsPredictedByAFitWithoutAnyOfItsRecords) {
  const HardwareSpec hw = load_hardware_spec("h100-sxm-node");
  const CrossValidation a = cross_validate(records(5.0), hw, quick(CvGrouping::kPath));
  const CrossValidation b = cross_validate(records(50.0), hw, quick(CvGrouping::kPath));
  // ep-b16 and ep-b32 share the "ep" fold: ep-b32's measurement moves neither prediction.
  EXPECT_EQ(*find(a, "ep-b16").predicted_s, *find(b, "ep-b16").predicted_s);
  EXPECT_EQ(*find(a, "ep-b32").predicted_s, *find(b, "ep-b32").predicted_s);
  ASSERT_EQ(a.groups.size(), 4u);  // ep, local, fsdp2-offload, operator
  EXPECT_EQ(a.groups[0].group, "ep");
  EXPECT_EQ(a.groups[0].ids, (std::vector<std::string>{"ep-b16", "ep-b32"}));
  EXPECT_EQ(a.groups[0].fitted_records, 3);  // local-b128, the FSDP2 record and the operator record
  EXPECT_EQ(a.step.count, 3);
  EXPECT_EQ(a.op.count, 1);
  const std::string baseline = find(a, "fsdp2-b32").status;
  EXPECT_TRUE(baseline == "ok" || baseline == "oom") << baseline;
}

// Megatron-LM and KT-FT records take no part in a fit (lowered apart from the offload baselines)
// but are predicted, by their own lowering, with the fit that left their group out.
TEST(CrossValidate, SystemsLoweredApartArePredictedNotFailed) {
  RecordSet set = records(5.0);
  StepRecord megatron = set.steps.back();
  megatron.id = megatron.origin = "megatron-b32";
  megatron.system = "megatron-lm";
  megatron.measured.step_s = 20.0;
  set.steps.push_back(megatron);
  const CrossValidation cv = cross_validate(set, load_hardware_spec("h100-sxm-node"), quick(CvGrouping::kPath));
  const CvPrediction& p = find(cv, "megatron-b32");
  EXPECT_EQ(p.status, "ok") << p.reason;
  EXPECT_EQ(p.kind, RecordKind::kBaseline);
  ASSERT_TRUE(p.predicted_s.has_value());
  EXPECT_GT(*p.predicted_s, 0);
}

TEST(CrossValidate, AGroupWithoutWhichNothingIsLeftToFitIsReportedNotPredicted) {
  const HardwareSpec hw = load_hardware_spec("h100-sxm-node");
  const CrossValidation cv = cross_validate(records(5.0), hw, quick(CvGrouping::kHardware));
  ASSERT_EQ(cv.groups.size(), 1u);
  EXPECT_FALSE(cv.groups[0].not_predicted.empty());
  for (const auto& p : cv.predictions) EXPECT_EQ(p.status, "not_predicted") << p.id;
  EXPECT_EQ(cv.step.count, 0);
}

TEST(CrossValidate, RefusesHardwareWithoutRecordsAndUnknownEngines) {
  EXPECT_THROW(cross_validate(records(5.0), load_hardware_spec("rtx4090-node"), quick(CvGrouping::kRecord)), InputError);
  CvOptions o = quick(CvGrouping::kRecord);
  o.engine = "abacus";
  EXPECT_THROW(cross_validate(records(5.0), load_hardware_spec("h100-sxm-node"), o), InputError);
}

}  // namespace
}  // namespace oom
