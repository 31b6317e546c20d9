// Tests of sim/isolated_run.h: SimGrid runs in child processes, any number per process.
#include "sim/isolated_run.h"

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <simgrid/s4u.hpp>

namespace oom::sim {
namespace {

namespace sg4 = simgrid::s4u;

// A fresh SimGrid engine (a second one in one process would abort) whose one actor sleeps
// `seconds`; returns the clock at the end as text.
std::string simulate_sleep(double seconds) {
  int argc = 1;
  char program[] = "isolated_run_test";
  char* argv[] = {program, nullptr};
  auto* e = new sg4::Engine(&argc, argv);
  auto* zone = sg4::create_full_zone("z");
  sg4::Host* h = zone->create_host("h", 1e9)->seal();
  zone->seal();
  sg4::Actor::create("a", h, [seconds] { sg4::this_actor::sleep_for(seconds); });
  e->run();
  return std::to_string(sg4::Engine::get_clock());
}

// A 1.5-second sleep in a child.
std::string one_simulation() {
  return run_isolated([](std::string& out) { out = simulate_sleep(1.5); });
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

// A request handler: a fresh engine per request that sleeps as many seconds as the request says.
void sleep_request(const std::string& request, std::string& out) {
  if (request == "throw") throw std::invalid_argument("bad request");
  if (request == "die") std::_Exit(7);
  out = simulate_sleep(std::stod(request));
}

void echo_request(const std::string& request, std::string& out) { out = request; }

TEST(IsolatedRunTest, RequestsRunInPlaceWithoutAServer) {
  EXPECT_FALSE(isolated_server_running(sleep_request));
  EXPECT_EQ(run_isolated_request(sleep_request, "2.5"), "2.500000");
  EXPECT_EQ(run_isolated_request(sleep_request, "2.5"), "2.500000");
}

TEST(IsolatedRunTest, TheServerRunsEachRequestInAFreshProcess) {
  ASSERT_TRUE(start_isolated_server(sleep_request));
  EXPECT_TRUE(isolated_server_running(sleep_request));
  EXPECT_TRUE(start_isolated_server(sleep_request));  // once per process
  EXPECT_FALSE(start_isolated_server(echo_request));  // one handler per process
  EXPECT_FALSE(isolated_server_running(echo_request));
  // Every request gets a SimGrid engine of its own: a second engine in one process would abort.
  EXPECT_EQ(run_isolated_request(sleep_request, "1.5"), "1.500000");
  EXPECT_EQ(run_isolated_request(sleep_request, "0.25"), "0.250000");
  // Requests from several threads at once each get their own answer.
  std::vector<std::string> answers(8);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < answers.size(); ++i) {
    threads.emplace_back([&answers, i] { answers[i] = run_isolated_request(sleep_request, std::to_string(i + 1)); });
  }
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < answers.size(); ++i) EXPECT_EQ(answers[i], std::to_string(i + 1) + ".000000");
  // Errors come back as run_isolated() reports them, and the server goes on serving.
  try {
    run_isolated_request(sleep_request, "throw");
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "simulation failed: bad request");
  }
  EXPECT_THROW(run_isolated_request(sleep_request, "die"), std::runtime_error);
  EXPECT_EQ(run_isolated_request(sleep_request, "3"), "3.000000");
  // A handler without a server runs in place; the server's does not run it.
  EXPECT_EQ(run_isolated_request(echo_request, std::string("a\0b", 3)), std::string("a\0b", 3));
}

TEST(IsolatedRunTest, LargeRequestsAndAnswersTravelWhole) {
  ASSERT_TRUE(start_isolated_server(echo_request));
  std::string big(5 << 20, 'x');
  big[12345] = '\0';
  EXPECT_EQ(run_isolated_request(echo_request, big), big);
  EXPECT_EQ(run_isolated_request(echo_request, ""), "");
}

}  // namespace
}  // namespace oom::sim
