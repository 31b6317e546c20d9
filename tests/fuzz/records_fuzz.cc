// Recorded measurements (JSON Lines) → StepRecord / OperatorRecord (parse_record_line), line by
// line as load_records reads a file, the round trip of each accepted record, and plan_from_json
// on the plan a step record carries.
#include "costmodel/json_input.h"
#include "planner/plan/plan.h"
#include "tests/fuzz/fuzz_support.h"
#include "traces/records.h"

using namespace oom;

OOM_FUZZ_TARGET(records) {
  const std::string text(input);
  std::size_t start = 0;
  for (int number = 1; start <= text.size(); ++number) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;

    const std::string origin = "records.jsonl:" + std::to_string(number);
    RecordSet set;
    if (!fuzz::accepts([&] { parse_record_line(line, origin, set); })) continue;
    OOM_FUZZ_CHECK(set.steps.size() + set.operators.size() == 1);
    RecordSet back;
    if (!set.steps.empty()) {
      const StepRecord& s = set.steps.front();
      parse_record_line(step_record_to_json(s).dump(), origin, back);
      OOM_FUZZ_CHECK(back.steps.size() == 1 && back.steps.front() == s);
      if (!s.plan.is_null()) fuzz::accepts([&] { plan_from_json(s.plan, origin); });
    } else {
      parse_record_line(operator_record_to_json(set.operators.front()).dump(), origin, back);
      OOM_FUZZ_CHECK(back.operators.size() == 1 && back.operators.front() == set.operators.front());
    }
  }
}
