// How a token count reads in plan notes, peak labels and report tables: a whole number of mebi-
// or kibi-tokens with its suffix (1048576 → "1M", 65536 → "64K"), any other count in digits
// (1000 → "1000").
#pragma once

#include <cstdint>
#include <string>

namespace oom {

std::string tokens_text(std::int64_t tokens);

}  // namespace oom
