#include "backend/runtime/runtime.h"

#include <algorithm>

namespace oom::backend {

double clip_coefficient(double total_norm, double max_norm) {
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

}  // namespace oom::backend
