#include "backend/runtime/threads.h"

#include <dlfcn.h>

#include <ATen/Parallel.h>

namespace oom::backend {
namespace {

template <typename F>
F blas_symbol(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

void set_compute_threads(int n) {
  if (n <= 0) return;
  at::set_num_threads(n);
  if (auto set = blas_symbol<void (*)(int)>("openblas_set_num_threads")) set(n);
}

int blas_threads() {
  if (auto get = blas_symbol<int (*)()>("openblas_get_num_threads")) return get();
  return 0;
}

}  // namespace oom::backend
