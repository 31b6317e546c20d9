#include "tests/backend/drift.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace oom::backend::testing {

double record_drift(const std::string& check, double difference) {
  const char* log = std::getenv("OOM_DRIFT_LOG");
  if (log == nullptr || *log == '\0') return difference;
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = test == nullptr ? "(no test)" : std::string(test->test_suite_name()) + "." + test->name();
  std::string check_word = check;
  for (char& c : check_word) c = c == ' ' ? '_' : c;
  // One write(2) with O_APPEND: lines from the parallel test processes do not interleave.
  const std::string line = fmt::format("{} {} {:.3e}\n", name, check_word, difference);
  const int fd = ::open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    [[maybe_unused]] const ssize_t n = ::write(fd, line.data(), line.size());
    ::close(fd);
  }
  return difference;
}

double record_drift(const std::string& check, double got, double want) {
  const double d = std::abs(got - want);
  return record_drift(check, want != 0 ? d / std::abs(want) : d);
}

}  // namespace oom::backend::testing
