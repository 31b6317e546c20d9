// A safetensors file's bytes → parse_safetensors_header (backend/io), and on acceptance the
// invariants a loader relies on: every range inside the data section and matching its dtype and
// shape, the ranges tiling the data section in order; then the float tensors converted to FP32.
#include <cstring>
#include <vector>

#include "backend/io/safetensors_file.h"
#include "tests/fuzz/fuzz_support.h"

using namespace oom;

OOM_FUZZ_TARGET(safetensors_header) {
  io::SafetensorsHeader h;
  if (!fuzz::accepts([&] { h = io::parse_safetensors_header(input, input.size(), "fuzz.safetensors"); })) return;
  OOM_FUZZ_CHECK(input.size() >= 8 && h.data_start >= 8 && h.data_start <= input.size());
  std::uint64_t n = 0;
  std::memcpy(&n, input.data(), 8);
  OOM_FUZZ_CHECK(h.data_start == 8 + n);
  std::uint64_t covered = h.data_start;
  for (const io::TensorInfo& t : h.tensors) {
    OOM_FUZZ_CHECK(t.begin == covered && t.begin <= t.end && t.end <= input.size());
    covered = t.end;
    for (const std::int64_t d : t.shape) OOM_FUZZ_CHECK(d >= 0);
    const std::int64_t numel = t.numel();  // fits: the bytes are inside the input (or a dimension is 0)
    OOM_FUZZ_CHECK(numel >= 0 && static_cast<std::uint64_t>(numel) * io::dtype_size(t.dtype) == t.end - t.begin);
    if (t.dtype == io::DType::F32 || t.dtype == io::DType::F16 || t.dtype == io::DType::BF16 || t.dtype == io::DType::F64) {
      std::vector<float> out(static_cast<std::size_t>(numel));
      io::convert_to_f32(std::as_bytes(std::span(input.data() + t.begin, t.end - t.begin)), t.dtype, out.data(), numel);
      if (t.dtype != io::DType::F64 && numel > 0) {
        // Back to the stored dtype: the same bytes, except NaN payloads.
        std::vector<std::byte> back(t.end - t.begin);
        io::convert_from_f32(out.data(), numel, t.dtype, back.data());
        if (out[0] == out[0]) OOM_FUZZ_CHECK(std::memcmp(back.data(), input.data() + t.begin, io::dtype_size(t.dtype)) == 0);
      }
    }
  }
  OOM_FUZZ_CHECK(covered == input.size());
}
