// One place that sets how many threads the backend's CPU kernels use.
//
// LibTorch's intra-op pool (at::set_num_threads) does not reach the BLAS library that Debian's
// LibTorch calls for its GEMMs: OpenBLAS (pthread build) keeps its own pool, sized to the machine,
// whose idle workers spin on sched_yield. A "one thread" run would then still run its matrix
// products on every core and burn system time while waiting. set_compute_threads(n) sizes both
// pools (OpenBLAS through its C API when the loaded BLAS has it, looked up at run time so that any
// BLAS works). No LibTorch types here.
#pragma once

namespace oom::backend {

// Sets LibTorch's intra-op threads and the BLAS threads to n (n ≥ 1). n ≤ 0 leaves both as they are.
void set_compute_threads(int n);

// Threads the loaded BLAS uses (OpenBLAS), or 0 when the BLAS does not say.
int blas_threads();

}  // namespace oom::backend
