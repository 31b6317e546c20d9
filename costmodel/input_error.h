// Errors for outside input (config files, workloads, plans, recorded measurements).
//
// An InputError carries one line naming the file, the field and the offending value, ready to
// print as is: "error: plan.json: field 'resident_layers[3]': value 52: layer index out of
// range 0..39". Loaders throw it; the `oom` command catches it, prints the line on stderr and
// exits with code 2 before writing anything. Not for broken internal invariants (use OOM_ASSERT).
#pragma once

#include <stdexcept>
#include <string>

namespace oom {

class InputError : public std::runtime_error {
 public:
  // `file` may be empty for input that did not come from a file.
  InputError(const std::string& file, const std::string& field, const std::string& value,
             const std::string& reason);
  // A problem with the file as a whole (missing, unreadable, not JSON).
  InputError(const std::string& file, const std::string& reason);

  const std::string& file() const { return file_; }
  const std::string& field() const { return field_; }

 private:
  std::string file_;
  std::string field_;
};

// Aborts with file and line when an internal invariant is broken; active in every build type.
[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const char* msg);

}  // namespace oom

#define OOM_ASSERT(cond, msg) \
  ((cond) ? static_cast<void>(0) : ::oom::assert_fail(#cond, __FILE__, __LINE__, (msg)))
