// Token files (llm.c layout, backend/io/token_file.h) → TokenFile: validation, bounds-checked
// reads, the cached maximum and moves of every accepted file.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <vector>

#include "backend/io/token_file.h"
#include "tests/fuzz/fuzz_support.h"

using namespace oom;

OOM_FUZZ_TARGET(token_file) {
  std::optional<io::TokenFile> f;
  if (!fuzz::accepts([&] { f.emplace(io::TokenFile::from_bytes(std::string(input), "tokens.bin")); })) return;
  OOM_FUZZ_CHECK(f->version() == 1 || f->version() == 2);
  OOM_FUZZ_CHECK(f->size() >= 0);
  OOM_FUZZ_CHECK(input.size() == io::kTokenFileHeaderBytes + static_cast<std::size_t>(f->size()) * f->token_bytes());
  const std::uint32_t mx = f->max_token();
  std::vector<std::int64_t> all(static_cast<std::size_t>(f->size()));
  f->copy(0, f->size(), all.data());
  std::uint32_t seen = 0;
  for (std::int64_t i = 0; i < f->size(); ++i) {
    OOM_FUZZ_CHECK(all[static_cast<std::size_t>(i)] == static_cast<std::int64_t>((*f)[i]));
    seen = std::max(seen, (*f)[i]);
  }
  OOM_FUZZ_CHECK(seen == mx);
  if (f->size() > 0) OOM_FUZZ_CHECK((*f)[f->max_token_position()] == mx);
  // Reads past either end are refused, and leave the output alone.
  std::int64_t sentinel = -7;
  bool refused = false;
  try {
    f->copy(f->size(), 1, &sentinel);
  } catch (const std::out_of_range&) {
    refused = true;
  }
  OOM_FUZZ_CHECK(refused && sentinel == -7);
  refused = false;
  try {
    f->copy(-1, 1, &sentinel);
  } catch (const std::out_of_range&) {
    refused = true;
  }
  OOM_FUZZ_CHECK(refused && sentinel == -7);
  // A moved file reads the same tokens (the bytes may live in the string's small buffer).
  io::TokenFile moved = std::move(*f);
  if (moved.size() > 0) OOM_FUZZ_CHECK(moved[0] == static_cast<std::uint32_t>(all[0]));
}
