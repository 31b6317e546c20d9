// convert_to_f32 / convert_from_f32 (declared in safetensors_file.h). These run on the checkpoint
// load path over every weight: large BF16 and FP32 conversions write with streaming stores
// (AVX-512, chosen at run time, else SSE2); the rest is written for the compiler to vectorize:
// fixed-width integer loads through memcpy (tensor bytes in a mapped file need not be aligned),
// branch-light scalar code for F16.
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/io/safetensors_file.h"

namespace oom::io {
namespace {

inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// IEEE binary16 → binary32, exact for every pattern (NaN payloads kept in the top mantissa bits).
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant · 2^-24, exact in FP32.
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return bits_to_float(float_to_bits(v) | sign);
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  return bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
}

// binary32 → binary16, round to nearest even; overflow → infinity; NaN → quiet NaN.
inline std::uint16_t float_to_half(float f) {
  std::uint32_t x = float_to_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u | static_cast<std::uint16_t>((x >> 13) & 0x3ffu);  // NaN
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // ≥ 65520 rounds to infinity (and infinity itself)
  if (x < 0x38800000u) {
    // Below 2^-14: a binary16 subnormal (units of 2^-24) or zero.
    const std::uint32_t exp = x >> 23;
    const std::uint32_t shift = 126 - exp;  // value = full_mant >> shift units
    if (shift > 24) return sign;
    const std::uint32_t full = (x & 0x7fffffu) | 0x800000u;
    std::uint32_t q = full >> shift;
    const std::uint32_t rem = full & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return sign | static_cast<std::uint16_t>(q);
  }
  std::uint32_t q = (x >> 13) - (112u << 10);
  const std::uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ++q;
  return sign | static_cast<std::uint16_t>(q);
}

// binary32 → bfloat16, round to nearest even; NaN → quiet NaN of the same sign.
inline std::uint16_t float_to_bf16(std::uint32_t x) {
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// Output past this size goes around the caches (streaming stores): a loader writes gigabytes of
// FP32 host state it will not read again soon, and skipping the read-for-ownership of every
// destination line saves a third of the memory traffic.
constexpr std::int64_t kStreamingMinElements = std::int64_t{1} << 18;  // 1 MiB of FP32

#if defined(__x86_64__)
// AVX-512: 16 elements per step, each store one whole 64-byte line (the cheapest streaming store).
__attribute__((target("avx512f"))) std::int64_t bf16_to_f32_avx512(const unsigned char* s, std::uint32_t* d,
                                                                     std::int64_t i, std::int64_t n) {
  for (; i + 16 <= n; i += 16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2 * i));
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
  }
  return i;
}
#endif

// BF16 → FP32 of n elements: a 16-bit shift, with streaming stores (AVX-512 or SSE2).
void bf16_to_f32(const unsigned char* s, std::uint32_t* d, std::int64_t n) {
  std::int64_t i = 0;
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512 && n >= kStreamingMinElements) {
    for (; i < n && (reinterpret_cast<std::uintptr_t>(d + i) & 63u) != 0; ++i) {
      std::uint16_t v;
      std::memcpy(&v, s + 2 * i, 2);
      d[i] = static_cast<std::uint32_t>(v) << 16;
    }
    i = bf16_to_f32_avx512(s, d, i, n);
    _mm_sfence();
  }
#endif
#if defined(__SSE2__)
  if (n >= kStreamingMinElements) {
    for (; i < n && (reinterpret_cast<std::uintptr_t>(d + i) & 15u) != 0; ++i) {
      std::uint16_t v;
      std::memcpy(&v, s + 2 * i, 2);
      d[i] = static_cast<std::uint32_t>(v) << 16;
    }
    const __m128i zero = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), _mm_unpacklo_epi16(zero, x));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 4), _mm_unpackhi_epi16(zero, x));
    }
    _mm_sfence();
  }
#endif
  for (; i < n; ++i) {
    std::uint16_t v;
    std::memcpy(&v, s + 2 * i, 2);
    d[i] = static_cast<std::uint32_t>(v) << 16;
  }
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) std::int64_t copy_f32_avx512(const unsigned char* s, float* d, std::int64_t i,
                                                                  std::int64_t n) {
  for (; i + 16 <= n; i += 16) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_loadu_si512(s + 4 * i));
  }
  return i;
}
#endif

// FP32 copy with streaming stores past kStreamingMinElements (glibc's memcpy switches to them only
// past a size tied to the last-level cache, far above a loader's chunks).
void copy_f32(const unsigned char* s, float* d, std::int64_t n) {
  std::int64_t i = 0;
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512 && n >= kStreamingMinElements) {
    for (; i < n && (reinterpret_cast<std::uintptr_t>(d + i) & 63u) != 0; ++i) std::memcpy(d + i, s + 4 * i, 4);
    i = copy_f32_avx512(s, d, i, n);
    _mm_sfence();
  }
#endif
#if defined(__SSE2__)
  if (n >= kStreamingMinElements) {
    for (; i < n && (reinterpret_cast<std::uintptr_t>(d + i) & 15u) != 0; ++i) std::memcpy(d + i, s + 4 * i, 4);
    for (; i + 8 <= n; i += 8) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 4 * i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 4 * i + 16));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 4), b);
    }
    _mm_sfence();
  }
#endif
  if (i < n) std::memcpy(d + i, s + 4 * i, static_cast<std::size_t>(n - i) * 4);
}

void check_n(std::int64_t n, std::size_t have, std::size_t size, const char* what) {
  if (n < 0) throw std::invalid_argument(std::string(what) + ": negative element count");
  if (have / size < static_cast<std::uint64_t>(n)) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(have) + " source bytes hold fewer than " +
                                std::to_string(n) + " elements");
  }
}

}  // namespace

void convert_to_f32(std::span<const std::byte> src, DType dtype, float* dst, std::int64_t n) {
  const auto* s = reinterpret_cast<const unsigned char*>(src.data());
  switch (dtype) {
    case DType::F32:
      check_n(n, src.size(), 4, "convert_to_f32");
      copy_f32(s, dst, n);
      return;
    case DType::BF16: {
      check_n(n, src.size(), 2, "convert_to_f32");
      bf16_to_f32(s, reinterpret_cast<std::uint32_t*>(dst), n);
      return;
    }
    case DType::F16:
      check_n(n, src.size(), 2, "convert_to_f32");
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t v;
        std::memcpy(&v, s + 2 * i, 2);
        dst[i] = half_to_float(v);
      }
      return;
    case DType::F64:
      check_n(n, src.size(), 8, "convert_to_f32");
      for (std::int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, s + 8 * i, 8);
        dst[i] = static_cast<float>(v);
      }
      return;
    default:
      throw std::invalid_argument(std::string("convert_to_f32: cannot convert ") + dtype_name(dtype) + " to F32");
  }
}

void convert_from_f32(const float* src, std::int64_t n, DType dtype, std::byte* dst) {
  if (n < 0) throw std::invalid_argument("convert_from_f32: negative element count");
  auto* d = reinterpret_cast<unsigned char*>(dst);
  switch (dtype) {
    case DType::F32:
      std::memcpy(d, src, static_cast<std::size_t>(n) * 4);
      return;
    case DType::BF16:
      for (std::int64_t i = 0; i < n; ++i) {
        const std::uint16_t v = float_to_bf16(float_to_bits(src[i]));
        std::memcpy(d + 2 * i, &v, 2);
      }
      return;
    case DType::F16:
      for (std::int64_t i = 0; i < n; ++i) {
        const std::uint16_t v = float_to_half(src[i]);
        std::memcpy(d + 2 * i, &v, 2);
      }
      return;
    default:
      throw std::invalid_argument(std::string("convert_from_f32: cannot convert F32 to ") + dtype_name(dtype));
  }
}

}  // namespace oom::io
