#include "costmodel/input_error.h"

#include <cstdio>
#include <cstdlib>

namespace oom {
namespace {

std::string file_prefix(const std::string& file) { return file.empty() ? std::string() : file + ": "; }

// The message stays one line: control characters (a newline in a JSON key or a file name) are
// written as \xNN.
std::string one_line(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[(c >> 4) & 0xf];
      out += hex[c & 0xf];
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

InputError::InputError(const std::string& file, const std::string& field, const std::string& value,
                       const std::string& reason)
    : std::runtime_error(one_line(file_prefix(file) + "field '" + field + "': value " + value + ": " + reason)),
      file_(file),
      field_(field) {}

InputError::InputError(const std::string& file, const std::string& reason)
    : std::runtime_error(one_line(file_prefix(file) + reason)), file_(file) {}

void assert_fail(const char* expr, const char* file, int line, const char* msg) {
  std::fprintf(stderr, "internal error: %s:%d: assertion '%s' failed: %s\n", file, line, expr, msg);
  std::abort();
}

}  // namespace oom
