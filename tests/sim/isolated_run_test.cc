// Tests of sim/isolated_run.h: SimGrid runs in child processes, any number per process.
#include "sim/isolated_run.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>
#include <simgrid/s4u.hpp>

namespace oom::sim {
namespace {

namespace sg4 = simgrid::s4u;

// A fresh engine in the child: a one-second sleep; returns the clock as text.
std::string one_simulation() {
  return run_isolated([](std::string& out) {
    int argc = 1;
    char program[] = "isolated_run_test";
    char* argv[] = {program, nullptr};
    auto* e = new sg4::Engine(&argc, argv);
    auto* zone = sg4::create_full_zone("z");
    sg4::Host* h = zone->create_host("h", 1e9)->seal();
    zone->seal();
    sg4::Actor::create("a", h, [] { sg4::this_actor::sleep_for(1.5); });
    e->run();
    out = std::to_string(sg4::Engine::get_clock());
  });
}

TEST(IsolatedRunTest, ReturnsWhatTheChildWrote) {
  EXPECT_EQ(run_isolated([](std::string& out) { out = std::string("a\0b", 3); }), std::string("a\0b", 3));
  EXPECT_EQ(run_isolated([](std::string&) {}), "");
}

TEST(IsolatedRunTest, LargeOutputsComeBackWhole) {
  const std::string big(3 << 20, 'x');
  EXPECT_EQ(run_isolated([&](std::string& out) { out = big; }), big);
}

TEST(IsolatedRunTest, SeveralSimGridEnginesRunOneAfterAnother) {
  EXPECT_EQ(one_simulation(), "1.500000");
  EXPECT_EQ(one_simulation(), "1.500000");
}

TEST(IsolatedRunTest, AnExceptionInTheChildComesBackWithItsMessage) {
  try {
    run_isolated([](std::string&) { throw std::invalid_argument("bad graph"); });
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "simulation failed: bad graph");
  }
}

TEST(IsolatedRunTest, AChildThatDiesIsReported) {
  EXPECT_THROW(run_isolated([](std::string&) { std::_Exit(7); }), std::runtime_error);
}

}  // namespace
}  // namespace oom::sim
