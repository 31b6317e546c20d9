// Tests of planner/engine/step_engine.h: a StepEngines table offers "analytic" from the start, and
// an engine added to one table is offered by that table alone.
#include "planner/engine/step_engine.h"

#include <gtest/gtest.h>

namespace oom {
namespace {

// An engine that does nothing: a name to add to a table.
class NamedEngine : public StepEngine {
 public:
  std::string name() const override { return "named"; }
  Trace execute(const StepGraph&, const DurationModel&) const override { return Trace{}; }
};

TEST(StepEngines, DefaultTableOffersTheAnalyticEngineOnly) {
  const StepEngines engines;
  EXPECT_EQ(engines.names(), std::vector<std::string>{"analytic"});
  EXPECT_TRUE(engines.has("analytic"));
  const auto analytic = engines.make("analytic");
  ASSERT_NE(analytic, nullptr);
  EXPECT_EQ(analytic->name(), "analytic");
}

TEST(StepEngines, AnAddedEngineIsOfferedByItsTableAlone) {
  StepEngines mine;
  mine.add("named", [] { return std::make_unique<NamedEngine>(); });
  const StepEngines other;
  EXPECT_EQ(mine.names(), (std::vector<std::string>{"analytic", "named"}));
  ASSERT_NE(mine.make("named"), nullptr);
  EXPECT_EQ(mine.make("named")->name(), "named");
  EXPECT_FALSE(other.has("named"));
  EXPECT_EQ(other.make("named"), nullptr);
  EXPECT_EQ(StepEngines().make("named"), nullptr);
}

TEST(StepEngines, UnknownNameMakesNoEngine) {
  const StepEngines engines = StepEngines().add("named", [] { return std::make_unique<NamedEngine>(); });
  EXPECT_FALSE(engines.has("warp-drive"));
  EXPECT_EQ(engines.make("warp-drive"), nullptr);
  EXPECT_EQ(engines.make(""), nullptr);
}

}  // namespace
}  // namespace oom
