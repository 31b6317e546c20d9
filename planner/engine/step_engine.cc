#include "planner/engine/step_engine.h"

#include "planner/engine/analytic_evaluator.h"

namespace oom {

StepEngines::StepEngines() {
  add("analytic", [] { return std::unique_ptr<StepEngine>(std::make_unique<AnalyticEngine>()); });
}

StepEngines& StepEngines::add(std::string name, StepEngineFactory factory) {
  factories_[std::move(name)] = std::move(factory);
  return *this;
}

std::unique_ptr<StepEngine> StepEngines::make(const std::string& name) const {
  const auto it = factories_.find(name);
  return it == factories_.end() ? nullptr : it->second();
}

bool StepEngines::has(const std::string& name) const { return factories_.count(name) > 0; }

std::vector<std::string> StepEngines::names() const {
  std::vector<std::string> names;
  for (const auto& [name, factory] : factories_) names.push_back(name);
  return names;
}

}  // namespace oom
