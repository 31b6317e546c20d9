#include "costmodel/token_text.h"

#include <fmt/format.h>

namespace oom {

std::string tokens_text(std::int64_t tokens) {
  constexpr std::int64_t kKi = 1024, kMi = kKi * kKi;
  if (tokens >= kMi && tokens % kMi == 0) return fmt::format("{}M", tokens / kMi);
  if (tokens >= kKi && tokens % kKi == 0) return fmt::format("{}K", tokens / kKi);
  return fmt::format("{}", tokens);
}

}  // namespace oom
