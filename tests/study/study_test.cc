// experiments/study.h: study files, their expansion, the runner with a fake plan search, the
// table and the CSV.
#include "experiments/study.h"
#include "experiments/paper_report.h"
#include "experiments/ablation.h"
#include "experiments/plan_finder.h"
#include "experiments/published.h"
#include "planner/lowering/graph_size_estimate.h"
#include "tests/common/cluster_workload.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include "costmodel/input_error.h"
#include "planner/search/plan_search.h"

namespace oom {
namespace {

nlohmann::json small_study() {
  return nlohmann::json::parse(R"({
    "name": "small", "description": "tiny model, two GPUs",
    "baselines": ["fsdp2-offload", "megatrain"],
    "sweeps": [{"name": "batch", "models": ["tiny-moe"], "hardware": ["h100-sxm-node"], "gpus": [2],
                "global_batch": [2, 4], "seq_len": [256], "host_budget_gib": [null, 64]}]})");
}

// A plan search stand-in: a fixed plan whose throughput is 1000 tokens/s per sequence per GPU,
// infeasible beyond 1 sequence per GPU.
StudyPlan fake_search(const WorkloadContext& ctx, const PlanVariant& system) {
  (void)system;
  if (ctx.workload.seqs_per_gpu() > 1) throw std::runtime_error("GPU budget 1.0 GiB < 2.0 GiB needed by decoder 0 backward");
  StudyPlan p;
  p.summary = plan_summary(p.plan);
  p.tokens_per_s = 1000.0 * static_cast<double>(ctx.workload.global_batch);
  p.step_s = static_cast<double>(ctx.workload.global_batch * ctx.workload.seq_len) / p.tokens_per_s;
  p.gpu_peak_bytes = kGiB;
  p.host_bytes_per_numa = {kGiB, kGiB};
  return p;
}

TEST(StudyFile, RoundTripsThroughJson) {
  const StudySpec s = study_from_json(small_study(), "small.json");
  const StudySpec t = study_from_json(study_to_json(s), "again.json");
  EXPECT_EQ(study_to_json(t), study_to_json(s));
  ASSERT_EQ(s.baselines.size(), 2u);
  EXPECT_EQ(s.baselines[1], BaselineSystem::kMegaTrain);
  ASSERT_EQ(s.sweeps[0].host_budget_gib.size(), 2u);
  EXPECT_FALSE(s.sweeps[0].host_budget_gib[0].has_value());
  EXPECT_EQ(*s.sweeps[0].host_budget_gib[1], 64.0);
}

TEST(StudyFile, BadFieldsAreInputErrorsNamingTheField) {
  auto message = [](nlohmann::json j) {
    try {
      study_from_json(j, "s.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  nlohmann::json j = small_study();
  j["sweeps"][0]["seqs_per_gpu"] = {1};
  EXPECT_NE(message(j).find("exactly one of global_batch, seqs_per_gpu and gpus_per_seq"), std::string::npos) << message(j);
  j = small_study();
  j["sweeps"][0]["gpus_per_seq"] = {2};
  EXPECT_NE(message(j).find("sweeps[0].gpus_per_seq"), std::string::npos) << message(j);
  j = small_study();
  j["baselines"] = {"fsdp2-offload", "deepspeed"};
  EXPECT_NE(message(j).find("baselines[1]"), std::string::npos) << message(j);
  j = small_study();
  j["sweeps"][0]["seq_len"] = nlohmann::json::array();
  EXPECT_NE(message(j).find("sweeps[0].seq_len"), std::string::npos) << message(j);
  j = small_study();
  j["sweeps"][0]["host_budget_gib"] = {-1};
  EXPECT_NE(message(j).find("host_budget_gib[0]"), std::string::npos) << message(j);
  j = small_study();
  j["sweep"] = j["sweeps"];
  EXPECT_NE(message(j).find("sweep"), std::string::npos) << message(j);
}

TEST(DefaultStudy, FourKBatchesAndLongContextsWithOneSequencePerGpu) {
  const std::vector<StudyCase> cases = expand_study(default_study());
  ASSERT_EQ(cases.size(), 10u);
  EXPECT_EQ(cases[0].sweep, "batch");
  EXPECT_EQ(cases[0].workload.global_batch, 16);
  EXPECT_EQ(cases[4].workload.global_batch, 256);
  for (int i = 5; i < 10; ++i) {
    EXPECT_EQ(cases[static_cast<std::size_t>(i)].sweep, "context");
    EXPECT_EQ(cases[static_cast<std::size_t>(i)].workload.seqs_per_gpu(), 1);
  }
  EXPECT_EQ(cases[9].workload.seq_len, 1048576);
  EXPECT_EQ(cases[9].workload.yarn_factor, 4.0) << "1M tokens need 4x YaRN over 256K positions";
  EXPECT_EQ(cases[5].workload.yarn_factor, 1.0);
  for (const auto& c : cases) EXPECT_NO_THROW(resolve_workload(c.workload, "default study"));
}

TEST(RunStudy, RowsCarryThePlanTheBaselinesAndTheSpeedupOverTheBestBaseline) {
  const StudySpec spec = study_from_json(small_study(), "small.json");
  std::vector<int> seen;
  const StudyResult r = run_study(spec, StepEngines(), &fake_search, [&](int done, int total, const std::string&) {
    seen.push_back(done);
    EXPECT_EQ(total, 4);
  });
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 3, 4}));
  ASSERT_EQ(r.rows.size(), 4u);
  const StudyRow& row = r.rows[0];
  ASSERT_TRUE(row.plan.has_value());
  ASSERT_EQ(row.baselines.size(), 2u);
  double best = 0;
  for (const auto& b : row.baselines) {
    if (b.fits()) best = std::max(best, b.tokens_per_s);
    EXPECT_TRUE(b.trace.stages.empty()) << "rows keep numbers, not traces";
  }
  ASSERT_GT(best, 0);
  ASSERT_TRUE(row.speedup.has_value());
  EXPECT_DOUBLE_EQ(*row.speedup, row.plan->tokens_per_s / best);
  // Batch 4 on 2 GPUs: the fake search finds nothing; the row says why and has no speedup.
  const StudyRow& infeasible = r.rows[2];
  EXPECT_FALSE(infeasible.plan.has_value());
  EXPECT_NE(infeasible.infeasible.find("GPU budget"), std::string::npos);
  EXPECT_FALSE(infeasible.speedup.has_value());
}

TEST(RunStudy, ASweepOfGpusPerSequenceSplitsSequencesAndOnlyFsdp2AmongTheBaselinesRunsThem) {
  nlohmann::json j = small_study();
  j["sweeps"][0].erase("global_batch");
  j["sweeps"][0]["gpus"] = {4};
  j["sweeps"][0]["gpus_per_seq"] = {2, 4};
  j["sweeps"][0]["host_budget_gib"] = {nullptr};
  const StudySpec spec = study_from_json(j, "cp.json");
  EXPECT_EQ(study_to_json(study_from_json(study_to_json(spec), "again.json")), study_to_json(spec));
  const StudyResult r = run_study(spec, StepEngines(), &fake_search);
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(r.rows[0].study_case.workload.global_batch, 2);  // 4 GPUs, 2 per sequence
  EXPECT_EQ(r.rows[1].study_case.workload.global_batch, 1);
  for (const StudyRow& row : r.rows) {
    ASSERT_EQ(row.baselines.size(), 2u);
    // FSDP2 splits the sequences too (context parallelism); MegaTrain runs whole sequences only.
    EXPECT_EQ(row.baselines[0].system, BaselineSystem::kFsdp2Offload);
    EXPECT_TRUE(row.baselines[0].not_run.empty()) << row.baselines[0].not_run;
    EXPECT_TRUE(row.baselines[0].fits());
    EXPECT_GT(row.baselines[0].step_s, 0);
    EXPECT_FALSE(row.baselines[1].fits());
    EXPECT_NE(row.baselines[1].not_run.find("whole sequences per GPU"), std::string::npos) << row.baselines[1].not_run;
    EXPECT_TRUE(row.speedup);
  }
  const std::string table = study_table_text(r);
  EXPECT_NE(table.find("n/a"), std::string::npos) << table;
  EXPECT_NE(table.find("megatrain: megatrain runs whole sequences per GPU"), std::string::npos) << table;
  EXPECT_NE(study_csv(r).find("runs whole sequences per GPU"), std::string::npos);
}

TEST(RunStudy, TableAndCsvHaveOneLinePerCaseAndEveryBaselineColumn) {
  const StudyResult r = run_study(study_from_json(small_study(), "small.json"), StepEngines(), &fake_search);
  const std::string csv = study_csv(r);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5);
  EXPECT_TRUE(csv.starts_with("sweep,system,model,hardware,gpus,global_batch,seq_len,"));
  for (const char* col : {"fsdp2-offload_tokens_per_s", "megatrain_oom", "host_gib", "speedup"}) {
    EXPECT_NE(csv.find(col), std::string::npos) << col;
  }
  EXPECT_NE(csv.find("infeasible,\"GPU budget"), std::string::npos);
  const std::string table = study_table_text(r);
  EXPECT_NE(table.find("fsdp2-offload"), std::string::npos);
  EXPECT_NE(table.find("no plan fits: GPU budget"), std::string::npos);
  EXPECT_NE(table.find("4 cases"), std::string::npos);
  const nlohmann::json j = study_result_to_json(r);
  EXPECT_EQ(j["rows"].size(), 4u);
  EXPECT_TRUE(j["rows"][2]["plan"].is_null());
}

TEST(RunStudy, AWorkloadThatDoesNotResolveIsBadInput) {
  nlohmann::json j = small_study();
  j["sweeps"][0]["gpus"] = {64};
  j["sweeps"][0]["global_batch"] = {64};
  EXPECT_THROW(run_study(study_from_json(j, "s.json"), StepEngines(), &fake_search), InputError);
}

TEST(PlanSummary, NamesPathResidencyAndPartitions) {
  Plan ep;
  ep.resident_layers = {0, 1, 3};
  ep.moe_retained_layers = {38, 39};
  EXPECT_EQ(plan_summary(ep), "ep R3/K2 c64K");
  ep.resident_layers.clear();
  ep.ep_group_gpus = 384;
  EXPECT_EQ(plan_summary(ep), "ep R0/K2 c64K EP384");
  Plan local;
  local.path = ExpertPath::kLocal;
  local.param_transfer = ParamTransfer::kShard;
  local.split.attention_head_group = 2;
  local.keep_attention_results = true;
  EXPECT_EQ(plan_summary(local), "local shard h2 O/LSE");
}

TEST(PlanVariant, EverySpellingRoundTripsAndNonsenseIsRejected) {
  for (const char* name : {"search", "search:ep", "search:local", "base", "base:ep", "base:local", "ep:R23/K4", "ep:R0/K0",
                           "local:A", "local:B", "local:1+1", "local:3+1"}) {
    const auto v = plan_variant_from_name(name);
    ASSERT_TRUE(v.has_value()) << name;
    EXPECT_EQ(plan_variant_name(*v), name);
  }
  for (const char* name : {"", "searc", "search:gpu", "ep:R-1/K0", "ep:R3", "ep:R3/K4x", "ep:R03/K4", "local:C", "base:"}) {
    EXPECT_FALSE(plan_variant_from_name(name).has_value()) << name;
  }
  EXPECT_EQ(plan_variant_from_name("ep:R23/K4")->resident_layers, 23);
  EXPECT_EQ(plan_variant_from_name("ep:R23/K4")->retained_layers, 4);
}

TEST(PlanVariant, BoundaryPoliciesSetOlseAndKeptBoundaries) {
  Plan local;
  local.path = ExpertPath::kLocal;
  EXPECT_FALSE(with_boundary_policy(local, "A", 8).keep_attention_results);
  EXPECT_TRUE(with_boundary_policy(local, "B", 8).boundaries.host_kept_all);
  const Plan one = with_boundary_policy(local, "1+1", 8);
  EXPECT_TRUE(one.keep_attention_results);
  EXPECT_EQ(one.boundaries.host_kept, (std::vector<int>{0, 2, 4, 6}));
  const Plan three = with_boundary_policy(local, "3+1", 8);
  EXPECT_EQ(three.boundaries.host_kept, (std::vector<int>{0, 4}));
  EXPECT_EQ(three.boundaries.regenerate_cap, 3);
  for (const char* p : {"A", "B", "1+1", "3+1"}) EXPECT_EQ(boundary_policy_of(with_boundary_policy(local, p, 8)), p);
}

// The Local search may choose SCO (every boundary offloaded, one prefetched); a policy that
// regenerates boundaries must not carry it, or the plan fails validate_plan (as Tables 6 and 7 of
// `oom report-paper` did). The plan's other schedules stay as the search chose them.
TEST(PlanVariant, BoundaryPoliciesKeepScoOnlyWhereEveryBoundaryIsOnTheHost) {
  Workload w;
  w.model = "tiny-moe";
  w.hardware = "h100-sxm-node";
  w.gpus = 1;
  w.global_batch = 2;
  w.seq_len = 256;
  const WorkloadContext ctx = resolve_workload(w, "w");
  Plan searched;
  searched.path = ExpertPath::kLocal;
  searched.flat.selective_checkpoint_offload = true;
  searched.flat.optimizer_bucket_mib = 64;
  ASSERT_NO_THROW(validate_plan(searched, ctx.model, ctx.workload, "plan"));
  for (const char* p : {"A", "B", "1+1", "3+1"}) {
    const Plan plan = with_boundary_policy(searched, p, ctx.model.layers);
    EXPECT_EQ(plan.flat.selective_checkpoint_offload, plan.boundaries.host_kept_all) << p;
    EXPECT_EQ(plan.flat.optimizer_bucket_mib, 64) << p;
    EXPECT_NO_THROW(validate_plan(plan, ctx.model, ctx.workload, "plan")) << p;
  }
}

// Tables 6 and 7 set the Local search's plan under each boundary policy; the search may choose
// SCO, which only a policy that keeps every boundary on the host admits. Each variant's plan is
// built as report-paper builds it (find_plan_by_search) and validates, or does not fit the GPU
// (a row with its reason in the report); a plan that does not validate is an InputError that stops
// the report.
TEST(PaperStudies, BoundaryPolicyVariantsOfTables6And7Validate) {
  int variants = 0, fitting = 0;
  for (const char* name : {"table6-512k-split-keep-replay.json", "table7-policy-sweep.json"}) {
    const std::string file = std::string(OOM_SOURCE_DIR) + "/experiments/paper/" + name;
    for (const auto& c : expand_study(load_study(file))) {
      SCOPED_TRACE(fmt::format("{} {} S={}", name, plan_variant_name(c.system), c.workload.seq_len));
      ASSERT_EQ(c.system.kind, PlanVariant::Kind::kLocalPolicy);
      const WorkloadContext ctx = resolve_workload(c.workload, file);
      ++variants;
      try {
        const StudyPlan plan = find_plan_by_search(ctx, c.system);
        EXPECT_NO_THROW(validate_plan(plan.plan, ctx.model, ctx.workload, file));
        EXPECT_EQ(boundary_policy_of(plan.plan), c.system.policy);
        ++fitting;
      } catch (const InfeasibleWorkload&) {
        // 3+1 at 512K holds three regenerated boundaries on the GPU: 81.3 GiB of its 80.
      } catch (const InputError& e) {
        ADD_FAILURE() << e.what();
      }
    }
  }
  EXPECT_EQ(variants, 3 + 3 * 4);
  EXPECT_GE(fitting, 12);
}

// A study cut to its smallest cases: one workload per sweep (the first model, hardware and
// budgets, the least GPUs, batch and context), every system kept.
TEST(StudyFile, SmallestCasesKeepEverySweepAndSystem) {
  StudySpec s = default_study();
  s.sweeps[1].systems = {PlanVariant{}, *plan_variant_from_name("local:1+1")};
  s.sweeps[1].host_budget_gib = {512, std::nullopt};
  const StudySpec small = smallest_cases(s);
  const auto cases = expand_study(small);
  ASSERT_EQ(cases.size(), 3u);
  EXPECT_EQ(cases[0].sweep, "batch");
  EXPECT_EQ(cases[0].workload.global_batch, 16);
  EXPECT_EQ(cases[0].workload.seq_len, 4096);
  EXPECT_EQ(cases[1].workload.seq_len, 65536);
  EXPECT_EQ(cases[1].workload.global_batch, 4);  // one sequence per GPU
  EXPECT_EQ(cases[1].workload.host_budget_gib, 512);
  EXPECT_EQ(cases[2].system, *plan_variant_from_name("local:1+1"));
  // The cut study is a study file like any other.
  EXPECT_EQ(expand_study(study_from_json(study_to_json(small), "s.json")).size(), 3u);
}

TEST(StudyFile, SystemsExpandEveryWorkloadOnceEachAndRoundTrip) {
  nlohmann::json j = small_study();
  j["figure"] = "OOM Figure 4";
  j["sweeps"][0]["systems"] = {"base:ep", "search"};
  const StudySpec s = study_from_json(j, "s.json");
  EXPECT_EQ(s.figure, "OOM Figure 4");
  EXPECT_EQ(study_to_json(study_from_json(study_to_json(s), "again.json")), study_to_json(s));
  const auto cases = expand_study(s);
  ASSERT_EQ(cases.size(), 8u);
  EXPECT_EQ(plan_variant_name(cases[0].system), "base:ep");
  EXPECT_EQ(plan_variant_name(cases[1].system), "search");
  EXPECT_EQ(cases[0].workload, cases[1].workload);
  j["sweeps"][0]["systems"] = {"search", "ep:R2"};
  try {
    study_from_json(j, "s.json");
    ADD_FAILURE() << "a bad system is bad input";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("sweeps[0].systems[1]"), std::string::npos) << e.what();
  }
}

// A sweep over node counts: each node count of the hardware, every GPU of the nodes unless the
// sweep lists GPU counts; the nodes round-trip and name the row.
TEST(StudyFile, NodeCountsSweepEveryGpuOfTheNodes) {
  nlohmann::json j = small_study();
  auto& sweep = j["sweeps"][0];
  sweep["hardware"] = {"h200-sxm-node"};
  sweep["nodes"] = {1, 2, 12};
  sweep.erase("gpus");
  sweep.erase("global_batch");
  sweep["seqs_per_gpu"] = {1};
  const StudySpec s = study_from_json(j, "s.json");
  EXPECT_EQ(study_to_json(study_from_json(study_to_json(s), "again.json")), study_to_json(s));
  std::vector<std::pair<int, int>> sizes;
  for (const auto& c : expand_study(s)) {
    ASSERT_TRUE(c.workload.nodes.has_value());
    if (sizes.empty() || sizes.back() != std::make_pair(*c.workload.nodes, c.workload.gpus)) sizes.emplace_back(*c.workload.nodes, c.workload.gpus);
    EXPECT_NO_THROW(resolve_workload(c.workload, "s.json"));
  }
  EXPECT_EQ(sizes, (std::vector<std::pair<int, int>>{{1, 8}, {2, 16}, {12, 96}}));
  StudyRow row;
  row.study_case = expand_study(s).back();
  EXPECT_NE(row.label().find("h200-sxm-node*12 x96"), std::string::npos) << row.label();
  // Listed GPU counts apply on each node count.
  sweep["gpus"] = {4};
  const auto cases = expand_study(study_from_json(j, "s.json"));
  for (const auto& c : cases) EXPECT_EQ(c.workload.gpus, 4);
  // Without nodes, "gpus" is required.
  sweep.erase("nodes");
  sweep.erase("gpus");
  EXPECT_THROW(study_from_json(j, "s.json"), InputError);
}

TEST(RunStudy, EachSystemGetsItsOwnRowAndTheBaselinesRunOncePerWorkload) {
  nlohmann::json j = small_study();
  j["sweeps"][0]["systems"] = {"base", "search"};
  std::vector<std::string> asked;
  const StudyResult r = run_study(study_from_json(j, "s.json"), StepEngines(), [&](const WorkloadContext& ctx, const PlanVariant& v) {
    asked.push_back(plan_variant_name(v));
    return fake_search(ctx, v);
  });
  ASSERT_EQ(r.rows.size(), 8u);
  EXPECT_EQ(asked, (std::vector<std::string>{"base", "search", "base", "search", "base", "search", "base", "search"}));
  EXPECT_EQ(r.rows[0].baselines.size(), r.rows[1].baselines.size());
  EXPECT_EQ(r.rows[0].baselines[0].step_s, r.rows[1].baselines[0].step_s);
  EXPECT_NE(study_csv(r).find("\nbatch,base,tiny-moe,"), std::string::npos);
  EXPECT_NE(r.rows[0].label().find("[base]"), std::string::npos);
  EXPECT_EQ(r.rows[1].label().find("["), std::string::npos) << "the default system is not named";
}

// The cases on several threads give the same rows as on one, byte for byte in the CSV and the
// table (its last line, the wall time, aside), with the real plan search and a workload's systems
// sharing its baselines; progress counts every case once.
TEST(RunStudy, OutputsAreTheSameBytesWhateverTheThreads) {
  nlohmann::json j = small_study();
  j["sweeps"][0]["systems"] = {"search", "base", "search/noflat"};
  const StudySpec spec = study_from_json(j, "s.json");
  const auto table = [](const StudyResult& r) {
    const std::string t = study_table_text(r);
    return t.substr(0, t.rfind(" cases in "));
  };
  const StudyResult one = run_study(spec, StepEngines(), &find_plan_by_search);
  for (const int threads : {2, 3}) {
    std::vector<int> done;
    const StudyResult many = run_study(spec, StepEngines(), &find_plan_by_search, [&](int d, int total, const std::string&) {
      done.push_back(d);
      EXPECT_EQ(total, 12);
    }, threads);
    EXPECT_EQ(done, (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})) << threads << " threads";
    EXPECT_EQ(study_csv(many), study_csv(one)) << threads << " threads";
    EXPECT_EQ(table(many), table(one)) << threads << " threads";
  }
  EXPECT_NE(study_csv(one).find(",ok,"), std::string::npos) << "the search found plans";
}

// A small study stating verdicts: the plan search fits at both batches, MegaTrain runs out of host
// memory; the sweep runs MegaTrain only.
nlohmann::json verdict_study() {
  nlohmann::json j = small_study();
  j["sweeps"][0]["host_budget_gib"] = {nullptr};
  j["sweeps"][0]["baselines"] = {"megatrain"};
  j["sweeps"][0]["verdicts"] = {{"search", "fits"}, {"megatrain", "host"}};
  return j;
}

// The fake search, out of GPU memory as the plan search says it (InfeasibleWorkload with its space).
StudyPlan fake_search_out_of_gpu(const WorkloadContext& ctx, const PlanVariant& system) {
  if (ctx.workload.seqs_per_gpu() > 1) throw InfeasibleWorkload("GPU budget 1.0 GiB < 2.0 GiB needed by decoder 0 backward", "gpu");
  return fake_search(ctx, system);
}

TEST(StudyVerdicts, PublishedVerdictsAndASweepsBaselinesRoundTrip) {
  const StudySpec s = study_from_json(verdict_study(), "v.json");
  ASSERT_EQ(s.sweeps[0].verdicts.size(), 2u);
  EXPECT_EQ(s.sweeps[0].verdicts[0], (PublishedVerdict{"megatrain", Capacity::kHost}));
  EXPECT_EQ(s.sweeps[0].verdicts[1], (PublishedVerdict{"search", Capacity::kFits}));
  ASSERT_TRUE(s.sweeps[0].baselines.has_value());
  EXPECT_EQ(*s.sweeps[0].baselines, std::vector<BaselineSystem>{BaselineSystem::kMegaTrain});
  EXPECT_EQ(study_to_json(study_from_json(study_to_json(s), "again.json")), study_to_json(s));
  EXPECT_TRUE(states_verdicts(s));
  EXPECT_FALSE(states_verdicts(study_from_json(small_study(), "small.json")));
  for (const Capacity c : {Capacity::kFits, Capacity::kGpu, Capacity::kHost}) EXPECT_EQ(capacity_from_name(capacity_name(c)), c);
  EXPECT_FALSE(capacity_from_name("oom").has_value());
}

TEST(StudyVerdicts, AVerdictOrABaselineTheSweepCannotStateIsBadInputNamingIt) {
  auto message = [](nlohmann::json j) {
    try {
      study_from_json(j, "v.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  nlohmann::json j = verdict_study();
  j["sweeps"][0]["verdicts"]["search"] = "oom";
  EXPECT_NE(message(j).find("sweeps[0].verdicts.search"), std::string::npos) << message(j);
  j = verdict_study();
  j["sweeps"][0]["verdicts"]["fsdp2-offload"] = "gpu";  // a baseline of the study the sweep does not run
  EXPECT_NE(message(j).find("sweeps[0].verdicts.fsdp2-offload"), std::string::npos) << message(j);
  j = verdict_study();
  j["sweeps"][0]["verdicts"]["zero-offload"] = "gpu";  // not a baseline of the study
  EXPECT_NE(message(j).find("sweeps[0].verdicts.zero-offload"), std::string::npos) << message(j);
  j = verdict_study();
  j["sweeps"][0]["verdicts"]["search:ep"] = "fits";  // not a system of the sweep
  EXPECT_NE(message(j).find("sweeps[0].verdicts.search:ep"), std::string::npos) << message(j);
  j = verdict_study();
  j["sweeps"][0]["verdicts"] = nlohmann::json::object();
  EXPECT_NE(message(j).find("sweeps[0].verdicts"), std::string::npos) << message(j);
  j = verdict_study();
  j["sweeps"][0]["baselines"] = {"zero-offload"};
  EXPECT_NE(message(j).find("sweeps[0].baselines[0]"), std::string::npos) << message(j);
  j = verdict_study();
  j["sweeps"][0]["verdict"] = {{"search", "fits"}};
  EXPECT_NE(message(j).find("sweeps[0].verdict"), std::string::npos) << message(j);
}

TEST(StudyVerdicts, TheTableCsvAndJsonSetEachPublishedVerdictBesideThePredictedOneAndMarkAMismatch) {
  const StudyResult r = run_study(study_from_json(verdict_study(), "v.json"), StepEngines(), &fake_search_out_of_gpu);
  ASSERT_EQ(r.rows.size(), 2u);
  // Batch 2: the search fits (as published); MegaTrain fits the tiny model (published: host).
  const std::vector<VerdictCheck> b2 = verdict_checks(r, r.rows[0]);
  ASSERT_EQ(b2.size(), 2u);
  EXPECT_EQ(b2[0].system, "megatrain");
  EXPECT_EQ(b2[0].predicted, "fits");
  EXPECT_FALSE(b2[0].matches());
  EXPECT_EQ(b2[1].system, "search");
  EXPECT_TRUE(b2[1].matches());
  // Batch 4: no plan fits the GPU.
  const std::vector<VerdictCheck> b4 = verdict_checks(r, r.rows[1]);
  ASSERT_EQ(b4.size(), 2u);
  EXPECT_EQ(b4[1].predicted, "gpu");
  EXPECT_FALSE(b4[1].matches());
  // FSDP2 is a baseline of the study that the sweep does not run: n/a, and no reason line.
  EXPECT_FALSE(r.rows[0].baselines[0].fits());
  EXPECT_EQ(r.rows[0].baselines[0].failure_cell(), "n/a");
  const std::string table = study_table_text(r);
  EXPECT_NE(table.find("Capacity verdicts, published / predicted:"), std::string::npos) << table;
  EXPECT_NE(table.find("search fits / gpu"), std::string::npos) << table;
  EXPECT_NE(table.find("MISMATCH"), std::string::npos) << table;
  EXPECT_NE(table.find("capacity verdicts: 4 stated, 1 match, 3 MISMATCH"), std::string::npos) << table;
  EXPECT_EQ(table.find("fsdp2-offload: not run"), std::string::npos) << table;
  const std::string csv = study_csv(r);
  EXPECT_NE(csv.find(",published_verdict,verdict,fsdp2-offload_published_verdict,fsdp2-offload_verdict,"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",fits,gpu,,,host,fits"), std::string::npos) << csv;  // batch 4: search, fsdp2 (none), megatrain
  check_study_csv(csv, "v.csv");
  const nlohmann::json j = study_result_to_json(r);
  ASSERT_EQ(j["rows"][1]["verdicts"].size(), 2u);
  EXPECT_EQ(j["rows"][1]["verdicts"][1]["predicted"], "gpu");
  EXPECT_EQ(j["rows"][1]["verdicts"][1]["matches"], false);
  EXPECT_EQ(j["verdict_summary"], "capacity verdicts: 4 stated, 1 match, 3 MISMATCH");
  // A study that states none prints, writes and returns nothing of verdicts.
  const StudyResult plain = run_study(study_from_json(small_study(), "small.json"), StepEngines(), &fake_search_out_of_gpu);
  EXPECT_EQ(study_table_text(plain).find("verdict"), std::string::npos);
  EXPECT_EQ(study_csv(plain).find("verdict"), std::string::npos);
  EXPECT_FALSE(study_result_to_json(plain).contains("verdict_summary"));
  EXPECT_FALSE(study_result_to_json(plain)["rows"][0].contains("verdicts"));
}

// Synthetic records: an OOM plan point at batch 2, a no-residency (Base) EP point at batch 2, a
// baseline point, one at a workload the study does not cover, and an operator record.
RecordSet synthetic_records() {
  RecordSet set;
  auto line = [&](const std::string& text, int n) { parse_record_line(text, "syn.jsonl:" + std::to_string(n), set); };
  const std::string w2 = R"("workload": {"model": "tiny-moe", "hardware": "h100-sxm-node", "gpus": 2, "global_batch": 2, "seq_len": 256})";
  Plan r2;
  r2.resident_layers = {0, 1};
  const Plan r0;
  line(R"({"id": "ep-r2", "source": "s", )" + w2 + R"(, "plan": )" + plan_to_json(r2).dump() +
           R"(, "measured": {"step_s": 0.8, "gpu_peak_gib": 2.0}})", 1);
  line(R"({"id": "ep-r0", "source": "s", )" + w2 + R"(, "plan": )" + plan_to_json(r0).dump() + R"(, "measured": {"step_s": 1.6}})", 2);
  line(R"({"id": "fsdp", "source": "s", )" + w2 + R"(, "system": "fsdp2-offload", "measured": {"step_s": 3.0}})", 3);
  line(R"({"id": "other", "source": "s", "workload": {"model": "tiny-moe", "hardware": "h100-sxm-node", "gpus": 2, "global_batch": 8, "seq_len": 256}, "system": "megatrain", "measured": {"step_s": 9.0}})", 4);
  line(R"({"id": "op", "source": "s", "kind": "operator", "model": "tiny-moe", "hardware": "h100-sxm-node", "layer_type": "moe", "op": "moe_forward", "batch": 1, "seq_len": 256, "measured": {"time_s": 0.1}})", 5);
  return set;
}

TEST(Published, RecordsMatchTheirWorkloadAndSystemAndTheRestIsIgnored) {
  nlohmann::json j = small_study();
  j["sweeps"][0]["systems"] = {"search", "base:ep", "ep:R2/K0"};
  j["sweeps"][0]["host_budget_gib"] = {nullptr};
  StudyResult r = run_study(study_from_json(j, "s.json"), StepEngines(), &fake_search);
  attach_published(r, synthetic_records(), "syn.jsonl");
  ASSERT_EQ(r.rows.size(), 6u);  // batch 2 and 4, three systems each
  // Batch 2: "search" takes the fastest plan point, "base:ep" the R0 point, "ep:R2/K0" the R2 one.
  ASSERT_TRUE(r.rows[0].published.has_value());
  EXPECT_EQ(r.rows[0].published->id, "ep-r2");
  ASSERT_TRUE(r.rows[1].published.has_value());
  EXPECT_EQ(r.rows[1].published->id, "ep-r0");
  ASSERT_TRUE(r.rows[2].published.has_value());
  EXPECT_EQ(r.rows[2].published->id, "ep-r2");
  ASSERT_EQ(r.rows[0].published_baselines.size(), 2u);
  ASSERT_TRUE(r.rows[0].published_baselines[0].has_value());
  EXPECT_EQ(r.rows[0].published_baselines[0]->id, "fsdp");
  EXPECT_FALSE(r.rows[0].published_baselines[1].has_value()) << "no megatrain record at batch 2";
  // Batch 4: nothing published (the batch-8 record is not in the study).
  for (std::size_t i = 3; i < 6; ++i) EXPECT_FALSE(r.rows[i].published.has_value());
  // The fake predicts 0.256 s at batch 2 (2 x 256 tokens at 2000 tokens/s): -68% against 0.8 s.
  const std::string csv = study_csv(r);
  EXPECT_NE(csv.find("published_step_s"), std::string::npos);
  EXPECT_NE(csv.find("fsdp2-offload_step_error"), std::string::npos);
  EXPECT_NE(csv.find(",ep-r2,0.8,640,-0.6800,2.000,"), std::string::npos) << csv;
  const PublishedErrors e = published_errors(r);
  EXPECT_EQ(e.plan_count, 3);
  EXPECT_NEAR(e.plan_max_abs, 0.84, 1e-9);  // 0.256 s against 1.6 s
  const std::string table = study_table_text(r);
  EXPECT_NE(table.find("published (syn.jsonl): 3 OOM points"), std::string::npos) << table;
  EXPECT_NE(table.find("0.80s -68.0%"), std::string::npos) << table;
  EXPECT_TRUE(study_result_to_json(r).contains("published_errors"));
}

TEST(Published, WithoutRecordsTheCsvHasNoPublishedColumns) {
  const StudyResult r = run_study(study_from_json(small_study(), "small.json"), StepEngines(), &fake_search);
  EXPECT_EQ(study_csv(r).find("published"), std::string::npos);
  EXPECT_FALSE(study_result_to_json(r).contains("published_errors"));
}

TEST(PaperStudies, EveryFileNamesItsFigureAndItsWorkloadsResolve) {
  const std::vector<std::string> files = paper_study_files(std::string(OOM_SOURCE_DIR) + "/experiments/paper");
  ASSERT_GE(files.size(), 14u);
  for (const auto& file : files) {
    const StudySpec s = load_study(file);
    EXPECT_EQ(s.name + ".json", std::filesystem::path(file).filename().string()) << "the file is named after its study";
    EXPECT_EQ(s.figure.rfind("OOM ", 0), 0u) << file << ": the figure or table of the OOM paper it reproduces";
    EXPECT_FALSE(s.description.empty()) << file;
    for (const auto& c : expand_study(s)) EXPECT_NO_THROW(resolve_workload(c.workload, file)) << file;
  }
}

// Bounded work (planner/lowering/graph_size_estimate.h): every shipped study and ablation, each
// case lowered with every rank's stages (`oom simulate --every-rank`, the largest graph a case can
// make) for its representative plan and its configured baselines, stays at least ten times under
// the default stage limit; and the estimate a study prints counts every case.
// The estimate `oom whatif` prints is one the run keeps: the CPU time of a small study with the
// real plan search stays within the estimate on one thread (CPU time, not wall: a loaded machine
// stretches the wall clock, not the work), and the estimate on two threads is at least the largest
// case's share and at most the one-thread estimate.
TEST(WorkEstimate, ASmallStudyFinishesWithinItsEstimate) {
  const StudySpec spec = load_study(std::string(OOM_SOURCE_DIR) + "/tests/study/data/small-study.json");
  const WorkEstimate one = estimate_study(spec, 1), two = estimate_study(spec, 2);
  EXPECT_LE(two.wall_s, one.wall_s);
  EXPECT_GE(two.wall_s, one.wall_s / 2);
  const std::clock_t started = std::clock();
  const StudyResult r = run_study(spec, StepEngines(), &find_plan_by_search);
  const double cpu_s = static_cast<double>(std::clock() - started) / CLOCKS_PER_SEC;
  EXPECT_EQ(r.rows.size(), 2u);
#if !defined(__SANITIZE_ADDRESS__)  // the estimate is an optimised build's; a sanitizer's runs ~30x longer
  EXPECT_LE(cpu_s, one.wall_s) << one.text();
#endif
  std::cout << "small study: " << cpu_s << " s of CPU, estimated " << one.text() << "\n";
}

TEST(WorkEstimate, EveryShippedStudyWithEveryRankFitsTheDefaultLimitTenTimesOver) {
  const std::string src = OOM_SOURCE_DIR;
  std::vector<std::string> studies = paper_study_files(src + "/experiments/paper");
  std::vector<std::string> ablations;
  for (const auto& e : std::filesystem::directory_iterator(src + "/experiments")) {
    if (e.path().extension() != ".json") continue;
    // A what-if study has sweeps; an ablation, variants.
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(e.path()));
    (j.contains("sweeps") ? studies : ablations).push_back(e.path().string());
  }
  LoweringOptions every_rank;
  double largest = 0;
  std::string where;
  const auto keep = [&](double stages, const std::string& what) {
    if (stages > largest) largest = stages, where = what;
  };
  for (const auto& file : studies) {
    const StudySpec spec = load_study(file);
    const WorkEstimate e = estimate_study(spec);
    EXPECT_EQ(e.cases, static_cast<int>(expand_study(spec).size())) << file;
    EXPECT_GT(e.wall_s, 0) << file;
    for (const auto& c : expand_study(spec)) {
      const WorkloadContext ctx = resolve_workload(c.workload, file);
      Plan representative;
      if (ctx.workload.gpus_per_seq() > 1) representative.context_parallel_gpus = ctx.workload.gpus_per_seq();
      const std::string what = file + " " + c.sweep + " " + std::to_string(ctx.workload.gpus) + " GPUs";
      keep(estimate_step_graph(representative, ctx, every_rank).stages, what);
      for (const BaselineSystem b : spec.baselines) {
        const BaselineFit fit = configure_baseline(b, ctx);
        if (fit.setup) keep(estimate_baseline_graph(*fit.setup, ctx, every_rank).stages, what + " " + std::string(baseline_system_name(b)));
      }
    }
  }
  for (const auto& file : ablations) {
    const AblationSpec spec = load_ablation(file);
    EXPECT_GT(estimate_ablation(spec, file).cases, 0) << file;
    for (const auto& w : spec.workloads) {
      const WorkloadContext ctx = resolve_workload(w.workload, file);
      for (const auto& v : spec.variants) keep(estimate_step_graph(ablation_plan(spec, v, ctx, file), ctx, every_rank).stages, file + " " + v.name);
    }
  }
  // The cluster benchmarks (tests/bench/sim_bench.cc, experiments/bench/cluster-scaling.json): the
  // default plan on 32 DGX H200 nodes and FSDP2 on 96, every rank's stages.
  keep(estimate_step_graph(Plan{}, test_support::cluster_workload("qwen3.6-35b-a3b", 32), every_rank).stages, "EP benchmark, 256 GPUs");
  const WorkloadContext cluster = test_support::cluster_workload("qwen3.6-35b-a3b", 96);
  const BaselineFit fsdp2 = configure_baseline(BaselineSystem::kFsdp2Offload, cluster);
  ASSERT_TRUE(fsdp2.setup);
  keep(estimate_baseline_graph(*fsdp2.setup, cluster, every_rank).stages, "FSDP2 benchmark, 768 GPUs");
  std::cout << "largest shipped graph: " << largest << " stages (" << where << ")\n";
  EXPECT_GT(largest, 0);
  EXPECT_LT(largest * 10, kDefaultMaxStages) << where;
}

TEST(PaperReport, SectionHasFigurePlotsPredictionsAndPublishedErrors) {
  nlohmann::json j = small_study();
  j["figure"] = "OOM Figure 99";
  j["sweeps"][0]["host_budget_gib"] = {nullptr};
  PaperSection s;
  s.result = run_study(study_from_json(j, "s.json"), StepEngines(), &fake_search);
  s.plots = {"small/throughput-batch.png"};
  std::string md = paper_section_markdown(s);
  EXPECT_NE(md.find("## OOM Figure 99: small"), std::string::npos) << md;
  EXPECT_NE(md.find("![small](small/throughput-batch.png)"), std::string::npos) << md;
  EXPECT_NE(md.find("| workload | system | plan |"), std::string::npos) << md;
  EXPECT_NE(md.find("Largest workload each system completes"), std::string::npos) << md;
  EXPECT_EQ(md.find("Predicted vs published"), std::string::npos) << "no records attached";
  EXPECT_EQ(md.find("Capacity verdicts"), std::string::npos) << "no verdicts stated";
  PaperSection verdicts;
  verdicts.result = run_study(study_from_json(verdict_study(), "v.json"), StepEngines(), &fake_search_out_of_gpu);
  const std::string v = paper_section_markdown(verdicts);
  EXPECT_NE(v.find("### Capacity verdicts, published and predicted"), std::string::npos) << v;
  EXPECT_NE(v.find("| search | fits | gpu | MISMATCH |"), std::string::npos) << v;
  EXPECT_NE(v.find("capacity verdicts: 4 stated, 1 match, 3 MISMATCH"), std::string::npos) << v;
  attach_published(s.result, synthetic_records(), "syn.jsonl");
  md = paper_section_markdown(s);
  EXPECT_NE(md.find("| ep-r2 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| fsdp |"), std::string::npos) << md;
  PaperSection grid;
  j["sweeps"][0]["systems"] = {"ep:R0/K0", "ep:R0/K1", "ep:R2/K0", "ep:R2/K1"};
  grid.result = run_study(study_from_json(j, "s.json"), StepEngines(), &fake_search);
  const std::string g = paper_section_markdown(grid);
  EXPECT_NE(g.find("| | K0 | K1 |"), std::string::npos) << g;
  EXPECT_NE(g.find("| R2 | 0.256 | 0.256 |"), std::string::npos) << g;
  const std::string report = paper_report_markdown({s}, "analytic", 1.5);
  EXPECT_NE(report.find("| OOM Figure 99 | 2 | 2 |"), std::string::npos) << report;
}

}  // namespace
}  // namespace oom
