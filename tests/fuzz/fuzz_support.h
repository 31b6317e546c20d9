// Fuzz targets: one entry function per loader of outside input, registered by name.
//
// A target feeds arbitrary bytes to a loader and checks what every input must satisfy: the
// loader either accepts it or throws oom::InputError whose message is one non-empty line; an
// accepted value survives its JSON round trip unchanged; the code that consumes accepted values
// (parameter counts, static cost and memory) runs without a sanitizer report. Any other
// exception escapes the entry and any broken check aborts: both are crashes to the fuzzer.
//
// The same entries run under libFuzzer (tests/fuzz/libfuzzer_main.cc, clang) and in the corpus
// replay test of the normal build (tests/gates/fuzz_replay_test.cc). Entries keep no state
// between inputs except read-only data loaded once (configs); not thread-safe.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>

namespace oom::fuzz {

using Entry = void (*)(std::string_view input);

// Every target linked into this program, by name.
const std::map<std::string, Entry>& targets();

struct Registrar {
  Registrar(const char* name, Entry entry);
};

// Runs `load`; returns false when it throws InputError (after checking the message is one
// non-empty line), true when it returns normally. Other exceptions propagate.
bool accepts(const std::function<void()>& load);

[[noreturn]] void check_failed(const char* expr, const char* file, int line);

}  // namespace oom::fuzz

#define OOM_FUZZ_CHECK(cond) ((cond) ? static_cast<void>(0) : ::oom::fuzz::check_failed(#cond, __FILE__, __LINE__))

// Defines and registers the entry of target `name`: OOM_FUZZ_TARGET(plan) { ... use input ... }
#define OOM_FUZZ_TARGET(name)                                                         \
  static void oom_fuzz_entry_##name(std::string_view input);                          \
  static const ::oom::fuzz::Registrar oom_fuzz_registrar_##name(#name, &oom_fuzz_entry_##name); \
  static void oom_fuzz_entry_##name(std::string_view input)
