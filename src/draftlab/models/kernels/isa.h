// Which vector path draftlab's kernels take on this CPU, and the loads both paths share, for
// quant_mm.cpp and attend.cpp.
#pragma once

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

namespace draftlab_isa {

enum Isa : int64_t { kAuto = -1, kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

inline bool cpu_has_avx512(bool vnni) {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
         (!vnni || __builtin_cpu_supports("avx512vnni"));
}

inline bool cpu_has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

// The widest path this CPU runs, capped like torch's own kernels by ATEN_CPU_CAPABILITY.
inline int64_t best_isa(bool vnni) {
  const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
  const std::string limit = cap ? cap : "";
  if (limit != "avx2" && limit != "default" && cpu_has_avx512(vnni)) return kAvx512;
  if (limit != "default" && cpu_has_avx2()) return kAvx2;
  return kScalar;
}

// 16 and 8 values of T (float, bfloat16 or float16) as float32, exactly.
template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"), always_inline)) inline __m512 load16_avx512(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_loadu_ps(p);
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  } else {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

template <typename T>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline __m256 load8_avx2(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_loadu_ps(p);
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

}  // namespace draftlab_isa
