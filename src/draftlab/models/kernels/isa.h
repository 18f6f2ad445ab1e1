// Which vector path draftlab's kernels take on this CPU, shared by quant_mm.cpp and attend.cpp.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

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

}  // namespace draftlab_isa
