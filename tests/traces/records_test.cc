// Recorded measurements: the paper file loads; bad lines name file:line and field.
#include "traces/records.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "costmodel/input_error.h"

namespace oom {
namespace {

TEST(Records, PaperFileLoadsStepsAndOperators) {
  const RecordSet set = load_records(std::string(OOM_SOURCE_DIR) + "/traces/paper/paper-calibration.jsonl");
  EXPECT_EQ(set.steps.size(), 20u);
  EXPECT_EQ(set.operators.size(), 20u);
  int systems = 0;
  for (const auto& s : set.steps) systems += s.system.empty() ? 0 : 1;
  EXPECT_EQ(systems, 3);
  const auto& first = set.steps.front();
  EXPECT_EQ(first.id, "t4-b16");
  EXPECT_DOUBLE_EQ(*first.measured.step_s, 3.776);
  EXPECT_EQ(first.workload.global_batch, 16);
  const auto& op = set.operators.front();
  EXPECT_EQ(op.op, "attention_forward");
  EXPECT_DOUBLE_EQ(op.time_s, 3.18);
}

TEST(Records, RoundTripThroughJson) {
  const RecordSet set = load_records(std::string(OOM_SOURCE_DIR) + "/traces/paper/paper-calibration.jsonl");
  for (const auto& s : set.steps) {
    RecordSet again;
    parse_record_line(step_record_to_json(s).dump(), s.origin, again);
    ASSERT_EQ(again.steps.size(), 1u);
    EXPECT_EQ(again.steps[0], s) << s.id;
  }
  for (const auto& o : set.operators) {
    RecordSet again;
    parse_record_line(operator_record_to_json(o).dump(), o.origin, again);
    EXPECT_EQ(again.operators.at(0), o) << o.id;
  }
}

TEST(Records, BadLineNamesFileLineAndField) {
  const auto path = (std::filesystem::temp_directory_path() / "oom_records_test.jsonl").string();
  std::ofstream(path) << "# comment\n\n"
                      << R"({"id": "a", "workload": {"model": "m", "hardware": "h", "gpus": 0, "global_batch": 4, "seq_len": 8}, "plan": {}, "measured": {"step_s": 1}})"
                      << "\n";
  try {
    load_records(path);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), path + ":3: field 'workload.gpus': value 0: out of range 1..65536");
  }
  std::filesystem::remove(path);
}

TEST(Records, DuplicateIdsAndMissingMeasurementsAreErrors) {
  RecordSet set;
  const std::string line = R"({"id": "a", "workload": {"model": "m", "hardware": "h", "gpus": 1, "global_batch": 4, "seq_len": 8}, "system": "fsdp2-offload", "measured": {}})";
  try {
    parse_record_line(line, "r.jsonl:1", set);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "r.jsonl:1: field 'measured': value {}: names no measurement (step_s, gpu_peak_gib or host_gib)");
  }
  const auto path = (std::filesystem::temp_directory_path() / "oom_records_dup.jsonl").string();
  const std::string ok = R"({"id": "a", "workload": {"model": "m", "hardware": "h", "gpus": 1, "global_batch": 4, "seq_len": 8}, "system": "fsdp2-offload", "measured": {"step_s": 2}})";
  std::ofstream(path) << ok << "\n" << ok << "\n";
  try {
    load_records(path);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), path + ":2: field 'id': value \"a\": duplicate record id");
  }
  std::filesystem::remove(path);
}

// A measured compute breakdown (Measured::compute_s) loads, round-trips, and a key that is not
// "forward.KIND" or "backward.KIND" names the field.
TEST(Records, ComputeBreakdownLoadsAndBadKeysNameTheField) {
  const std::string head = R"({"id": "a", "workload": {"model": "m", "hardware": "h", "gpus": 1, "global_batch": 4, "seq_len": 8}, "plan": {}, )";
  RecordSet set;
  parse_record_line(head + R"("measured": {"step_s": 0.05, "compute_s": {"forward.attention": 0.004, "backward.gemm": 0.011}}})", "r.jsonl:1",
                    set);
  ASSERT_EQ(set.steps.size(), 1u);
  const auto& m = set.steps[0].measured;
  ASSERT_EQ(m.compute_s.size(), 2u);
  EXPECT_DOUBLE_EQ(m.compute_s.at("forward.attention"), 0.004);
  EXPECT_DOUBLE_EQ(m.compute_s.at("backward.gemm"), 0.011);
  RecordSet again;
  parse_record_line(step_record_to_json(set.steps[0]).dump(), "r.jsonl:1", again);
  EXPECT_EQ(again.steps.at(0), set.steps[0]);
  for (const auto& [measured, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"step_s": 1, "compute_s": {"sideways.gemm": 0.1}})",
            "r.jsonl:1: field 'measured.compute_s.sideways.gemm': value 0.1: expected \"forward.KIND\" or \"backward.KIND\" with KIND an operator kind such as gemm"},
           {R"({"step_s": 1, "compute_s": {"forward.attention": -2}})",
            "r.jsonl:1: field 'measured.compute_s.forward.attention': value -2: out of range 0..1000000000"},
           {R"({"step_s": 1, "compute_s": [1]})", "r.jsonl:1: field 'measured.compute_s': value [1]: expected an object"}}) {
    RecordSet bad;
    try {
      parse_record_line(head + R"("measured": )" + measured + "}", "r.jsonl:1", bad);
      ADD_FAILURE() << measured;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  }
}

// Several files are read as one set, in order; an id in two of them names both places.
TEST(Records, SeveralFilesAreOneSetAndAnIdMayNotRepeatAcrossThem) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string a = (dir / "oom_records_a.jsonl").string(), b = (dir / "oom_records_b.jsonl").string();
  const RecordSet paper = load_records(std::string(OOM_SOURCE_DIR) + "/traces/paper/paper-calibration.jsonl");
  auto write = [](const std::string& path, const std::string& lines) { std::ofstream(path) << lines; };
  write(a, step_record_to_json(paper.steps.at(0)).dump() + "\n");
  write(b, step_record_to_json(paper.steps.at(1)).dump() + "\n" + operator_record_to_json(paper.operators.at(0)).dump() + "\n");
  const RecordSet both = load_records(std::vector<std::string>{a, b});
  ASSERT_EQ(both.steps.size(), 2u);
  EXPECT_EQ(both.steps[0].id, paper.steps[0].id);
  EXPECT_EQ(both.steps[1].id, paper.steps[1].id);
  ASSERT_EQ(both.operators.size(), 1u);
  write(b, step_record_to_json(paper.steps.at(0)).dump() + "\n");
  try {
    load_records(std::vector<std::string>{a, b});
    ADD_FAILURE() << "an id in two files was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(b + ":1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("also " + a + ":1"), std::string::npos) << e.what();
  }
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

}  // namespace
}  // namespace oom
