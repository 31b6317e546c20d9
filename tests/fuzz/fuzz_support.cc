#include "tests/fuzz/fuzz_support.h"

#include <cstdio>
#include <cstdlib>

#include "costmodel/input_error.h"

namespace oom::fuzz {
namespace {

std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r;
  return r;
}

}  // namespace

const std::map<std::string, Entry>& targets() { return registry(); }

Registrar::Registrar(const char* name, Entry entry) {
  if (!registry().emplace(name, entry).second) {
    std::fprintf(stderr, "fuzz target %s registered twice\n", name);
    std::abort();
  }
}

bool accepts(const std::function<void()>& load) {
  try {
    load();
    return true;
  } catch (const InputError& e) {
    const std::string_view what = e.what();
    OOM_FUZZ_CHECK(!what.empty());
    OOM_FUZZ_CHECK(what.find('\n') == std::string_view::npos);
    return false;
  }
}

void check_failed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "fuzz check failed: %s:%d: %s\n", file, line, expr);
  std::abort();
}

}  // namespace oom::fuzz
