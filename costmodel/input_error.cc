#include "costmodel/input_error.h"

#include <cstdio>
#include <cstdlib>

namespace oom {
namespace {

std::string file_prefix(const std::string& file) { return file.empty() ? std::string() : file + ": "; }

}  // namespace

InputError::InputError(const std::string& file, const std::string& field, const std::string& value,
                       const std::string& reason)
    : std::runtime_error(file_prefix(file) + "field '" + field + "': value " + value + ": " + reason),
      file_(file),
      field_(field) {}

InputError::InputError(const std::string& file, const std::string& reason)
    : std::runtime_error(file_prefix(file) + reason), file_(file) {}

void assert_fail(const char* expr, const char* file, int line, const char* msg) {
  std::fprintf(stderr, "internal error: %s:%d: assertion '%s' failed: %s\n", file, line, expr, msg);
  std::abort();
}

}  // namespace oom
