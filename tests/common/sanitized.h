// Whether this test program is built with AddressSanitizer (the asan preset, a Debug build):
// tests whose full form would run past CTest's limit there run a reduced form instead.
#pragma once

namespace oom::test_support {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace oom::test_support
