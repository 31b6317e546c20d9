#include "planner/engine/step_engine.h"

#include <map>

#include "planner/engine/analytic_evaluator.h"

namespace oom {
namespace {

std::map<std::string, StepEngineFactory>& registry() {
  static std::map<std::string, StepEngineFactory> r = {
      {"analytic", [] { return std::unique_ptr<StepEngine>(std::make_unique<AnalyticEngine>()); }}};
  return r;
}

}  // namespace

void register_step_engine(const std::string& name, StepEngineFactory factory) { registry()[name] = std::move(factory); }

std::unique_ptr<StepEngine> make_step_engine(const std::string& name) {
  const auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second();
}

std::vector<std::string> step_engine_names() {
  std::vector<std::string> names;
  for (const auto& [name, f] : registry()) names.push_back(name);
  return names;
}

}  // namespace oom
