// libFuzzer entry of one fuzz target: the program links exactly one NAME_fuzz.cc.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const oom::fuzz::Entry entry = [] {
    if (oom::fuzz::targets().size() != 1) {
      std::fprintf(stderr, "a libFuzzer program links exactly one fuzz target, found %zu\n", oom::fuzz::targets().size());
      std::abort();
    }
    return oom::fuzz::targets().begin()->second;
  }();
  entry(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
