// Attention whose output for a query row depends only on that row and on the keys and values it may
// see, in slot order: not on how many rows the pass holds, how wide a window of the cache it spans,
// nor on where the slots it may not see lie. torch's CPU attention splits its sums into blocks by
// the pass's shape, so a token verified in row 3 of a pass rounds unlike the same token decoded
// alone, and a lossless method then writes other tokens than plain decoding (models/exact.py).
//
// For each row and head, in float32: the scores of the visible slots (each a dot product summed in
// one fixed order over 16 lanes), their maximum, exp(score - max), the sum of those in slot order,
// and the values weighted by them, summed in slot order. Slots the mask hides are skipped, not
// weighted by zero, so a token tree's node, whose ancestors sit in other slots than its chain's,
// sums the same terms in the same order as the chain.
//
// Every step inside a slot is element-wise or in a fixed order, so the vector paths (AVX-512, AVX2)
// and the scalar one compute the same bits; which runs follows ATEN_CPU_CAPABILITY (quant_mm.cpp).

#include <torch/library.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <immintrin.h>
#include <limits>
#include <type_traits>
#include <vector>

#include "isa.h"

using draftlab_isa::load8_avx2;

namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kMaxGroup = 8;  // query heads scored per sweep over a slot's key
constexpr int64_t kMaxChunks = 16;  // 16-lane chunks of a head on the vector paths (dim <= 256)

// e^x for x <= 0 (a score less its row's maximum), from float operations only (Cephes' expf), so
// that every path rounds alike: libm's expf differs between its scalar and vector versions.
inline __attribute__((always_inline)) float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);  // keeps 2^n normal; e^-87 is below any sum it joins
  const float t = x * 1.44269504088896341f;
  const float n = (t + 12582912.0f) - 12582912.0f;  // t rounded to an integer (1.5·2^23)
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float e = std::fma(p, r * r, r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return e * two_n;
}

// What a path computes, for G query heads of one key head (`qf`: G rows of `padded` floats, zero
// past dim) over the n slots a row sees (`seen`), in the order they come, from the keys and values
// in float32 (converted exactly, a block of slots at a time: `attend_rows`):
//   dots:    w[g·n + i] = fma(q_g · k_seen[i], scale, add[i]), each dot product over 16 lanes
//            (lane j takes dims j, j + 16, ...: a product, then fused multiply-adds), the lanes then
//            summed as a tree (j + 8, then j + 4, j + 2, j + 1);
//   softmax: w[i] = e^(w[i] - max w), and their sum over 16 lanes (lane i mod 16, in order of i),
//            the lanes summed by the same tree;
//   weigh:   acc[g·padded + d] = Σ_i w[g·n + i] · v_seen[i][d], in order of i (fused multiply-adds).
// The vector paths run 16 slots at a time and sum 8 dot products' lanes at once (`tree8`), in the
// same tree. `scratch` holds one key zero-padded to `padded` (the scalar path's).
struct Path {
  void (*dots)(const float* qf, int64_t heads, int64_t padded, const float* keys, int64_t slot_stride,
               const int64_t* seen, int64_t n, int64_t dim, float scale, const float* add, float* w, int64_t w_stride,
               float* scratch);
  float (*softmax)(float* w, int64_t n);
  void (*weigh)(const float* w, int64_t heads, int64_t padded, const float* values, int64_t slot_stride,
                const int64_t* seen, int64_t n, int64_t dim, int64_t w_stride, float* acc);
};

inline float tree16(float* lane) {
  for (int64_t width = kLanes / 2; width >= 1; width /= 2) {
    for (int64_t j = 0; j < width; ++j) lane[j] += lane[j + width];
  }
  return lane[0];
}

// ---- The reference, one lane at a time.
void dots_scalar(const float* qf, int64_t heads, int64_t padded, const float* keys, int64_t slot_stride,
                 const int64_t* seen, int64_t n, int64_t dim, float scale, const float* add, float* w, int64_t w_stride, float* kf) {
  for (int64_t d = dim; d < padded; ++d) kf[d] = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float* k = keys + seen[i] * slot_stride;
    for (int64_t d = 0; d < dim; ++d) kf[d] = k[d];
    for (int64_t g = 0; g < heads; ++g) {
      const float* q = qf + g * padded;
      float part[kLanes];
      for (int64_t j = 0; j < kLanes; ++j) part[j] = q[j] * kf[j];
      for (int64_t c = kLanes; c < padded; c += kLanes) {
        for (int64_t j = 0; j < kLanes; ++j) part[j] = std::fma(q[c + j], kf[c + j], part[j]);
      }
      w[g * w_stride + i] = std::fma(tree16(part), scale, add[i]);
    }
  }
}

inline float lane_sum_tail(float* lane, const float* w, int64_t from, int64_t n) {
  for (int64_t i = from; i < n; ++i) lane[i % kLanes] += w[i];
  return tree16(lane);
}

float softmax_scalar(float* w, int64_t n) {
  float top = w[0];
  for (int64_t i = 1; i < n; ++i) top = std::max(top, w[i]);
  for (int64_t i = 0; i < n; ++i) w[i] = exp_nonpositive(w[i] - top);
  float lane[kLanes] = {};
  return lane_sum_tail(lane, w, 0, n);
}

void weigh_scalar(const float* w, int64_t heads, int64_t padded, const float* values, int64_t slot_stride,
                  const int64_t* seen, int64_t n, int64_t dim, int64_t w_stride, float* acc) {
  for (int64_t i = 0; i < n; ++i) {
    const float* v = values + seen[i] * slot_stride;
    for (int64_t g = 0; g < heads; ++g) {
      const float p = w[g * w_stride + i];
      float* a = acc + g * padded;
      for (int64_t d = 0; d < dim; ++d) a[d] = std::fma(p, v[d], a[d]);
    }
  }
}

// The dot products' places in `tree8`'s input, so that its output lane e is dot product e.
constexpr int kTreeSlot[8] = {0, 2, 1, 3, 4, 6, 5, 7};

#define DL_TARGET_AVX512 "avx512f,avx512bw,avx512vl,fma,f16c"
#define DL_TARGET_AVX2 "avx2,fma,f16c"

// Eight dot products' 8 lanes (each already lanes j + lanes j + 8), a[kTreeSlot[e]] = product e:
// lane e of the result sums product e's lanes as (j + 4), then (j + 2), then (j + 1).
#define DL_TREE8(TARGET, NAME)                                                                \
  __attribute__((target(TARGET), always_inline)) inline __m256 NAME(const __m256* a) {       \
    __m256 y[4], z[2];                                                                        \
    for (int i = 0; i < 4; ++i) {                                                             \
      y[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[i], a[i + 4], 0x20),                      \
                           _mm256_permute2f128_ps(a[i], a[i + 4], 0x31));                     \
    }                                                                                         \
    for (int i = 0; i < 2; ++i) {                                                             \
      z[i] = _mm256_add_ps(_mm256_shuffle_ps(y[i], y[i + 2], _MM_SHUFFLE(1, 0, 1, 0)),        \
                           _mm256_shuffle_ps(y[i], y[i + 2], _MM_SHUFFLE(3, 2, 3, 2)));       \
    }                                                                                         \
    return _mm256_add_ps(_mm256_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),              \
                         _mm256_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));             \
  }
DL_TREE8(DL_TARGET_AVX512, tree8_avx512)
DL_TREE8(DL_TARGET_AVX2, tree8_avx2)

// e^x of 8 lanes, as exp_nonpositive computes one.
#define DL_EXP8(TARGET, NAME)                                                                               \
  __attribute__((target(TARGET), always_inline)) inline __m256 NAME(__m256 x) {                            \
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));                                                          \
    const __m256 magic = _mm256_set1_ps(12582912.0f);                                                      \
    const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), magic), \
                                   magic);                                                                 \
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), x);                                       \
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);                                             \
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);                                                           \
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));                                           \
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));                                           \
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));                                           \
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));                                           \
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));                                           \
    const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));      \
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23); \
    return _mm256_mul_ps(e, _mm256_castsi256_ps(bits));                                                    \
  }
DL_EXP8(DL_TARGET_AVX512, exp8_avx512)
DL_EXP8(DL_TARGET_AVX2, exp8_avx2)


// ---- AVX-512 (16 lanes in one register) and AVX2 (two registers of 8).
template <int C>
__attribute__((target(DL_TARGET_AVX512))) void dots_avx512(const float* qf, int64_t heads, int64_t padded,
                                                           const float* keys, int64_t slot_stride, const int64_t* seen,
                                                           int64_t n, int64_t dim, float scale, const float* add,
                                                           float* w, int64_t w_stride, float*) {
  const int64_t chunks = C > 0 ? C : dim / kLanes;
  for (int64_t i0 = 0; i0 < n; i0 += kLanes) {
    const int64_t m = std::min(kLanes, n - i0);
    // Past the last slot (m < 16), the first slot's key stands in: those dot products are not kept,
    // and the loop below then has no branch, so its 16 chains unroll and overlap.
    const float* k[kLanes];
    for (int64_t e = 0; e < kLanes; ++e) k[e] = keys + seen[i0 + (e < m ? e : 0)] * slot_stride;
    for (int64_t g = 0; g < heads; ++g) {
      __m512 qv[kMaxChunks];
      for (int64_t c = 0; c < chunks; ++c) qv[c] = _mm512_loadu_ps(qf + g * padded + c * kLanes);
      __m256 half[2][8];
#pragma GCC unroll 16
      for (int64_t e = 0; e < kLanes; ++e) {
        __m512 part = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k[e]));
        for (int64_t c = 1; c < chunks; ++c) part = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k[e] + c * kLanes), part);
        half[e / 8][kTreeSlot[e % 8]] = _mm256_add_ps(
            _mm512_castps512_ps256(part), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(part), 1)));
      }
      // The 16 dot products' fused multiply-adds at once (each rounds as std::fma does alone).
      const __m512 dot = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(tree8_avx512(half[0]))),
                                                             _mm256_castps_pd(tree8_avx512(half[1])), 1));
      const __mmask16 keep = static_cast<__mmask16>((1u << m) - 1);
      _mm512_mask_storeu_ps(w + g * w_stride + i0, keep,
                            _mm512_fmadd_ps(dot, _mm512_set1_ps(scale), _mm512_maskz_loadu_ps(keep, add + i0)));
    }
  }
}

template <int C>
__attribute__((target(DL_TARGET_AVX2))) void dots_avx2(const float* qf, int64_t heads, int64_t padded,
                                                       const float* keys, int64_t slot_stride, const int64_t* seen,
                                                       int64_t n, int64_t dim, float scale, const float* add,
                                                       float* w, int64_t w_stride, float*) {
  const int64_t chunks = C > 0 ? C : dim / kLanes;
  for (int64_t i0 = 0; i0 < n; i0 += kLanes) {
    const int64_t m = std::min(kLanes, n - i0);
    for (int64_t g = 0; g < heads; ++g) {
      const float* q = qf + g * padded;
      __m256 half[2][8];
      for (int64_t e = 0; e < kLanes; ++e) {
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
        if (e < m) {
          const float* k = keys + seen[i0 + e] * slot_stride;
          lo = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(k));
          hi = _mm256_mul_ps(_mm256_loadu_ps(q + 8), _mm256_loadu_ps(k + 8));
          for (int64_t c = 1; c < chunks; ++c) {
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + c * kLanes), _mm256_loadu_ps(k + c * kLanes), lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + c * kLanes + 8), _mm256_loadu_ps(k + c * kLanes + 8), hi);
          }
        }
        half[e / 8][kTreeSlot[e % 8]] = _mm256_add_ps(lo, hi);
      }
      alignas(32) float dot[kLanes];
      _mm256_store_ps(dot, tree8_avx2(half[0]));
      _mm256_store_ps(dot + 8, tree8_avx2(half[1]));
      for (int64_t e = 0; e < m; ++e) w[g * w_stride + i0 + e] = std::fma(dot[e], scale, add[i0 + e]);
    }
  }
}

// The maximum, the exponentials in place, and their sum (lanes of 16, summed as the tree).
#define DL_SOFTMAX(TARGET, NAME, EXP8)                                                        \
  __attribute__((target(TARGET))) float NAME(float* w, int64_t n) {                         \
    int64_t i = 0;                                                                            \
    __m256 top8 = _mm256_set1_ps(w[0]);                                                       \
    for (; i + 8 <= n; i += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(w + i));            \
    alignas(32) float lanes[8];                                                               \
    _mm256_store_ps(lanes, top8);                                                             \
    float top = lanes[0];                                                                     \
    for (int j = 1; j < 8; ++j) top = std::max(top, lanes[j]);                                \
    for (; i < n; ++i) top = std::max(top, w[i]);                                             \
    const __m256 t = _mm256_set1_ps(top);                                                     \
    __m256 sum_lo = _mm256_setzero_ps(), sum_hi = _mm256_setzero_ps();                        \
    for (i = 0; i + kLanes <= n; i += kLanes) {                                               \
      const __m256 lo = EXP8(_mm256_sub_ps(_mm256_loadu_ps(w + i), t));                       \
      const __m256 hi = EXP8(_mm256_sub_ps(_mm256_loadu_ps(w + i + 8), t));                   \
      _mm256_storeu_ps(w + i, lo);                                                            \
      _mm256_storeu_ps(w + i + 8, hi);                                                        \
      sum_lo = _mm256_add_ps(sum_lo, lo);                                                     \
      sum_hi = _mm256_add_ps(sum_hi, hi);                                                     \
    }                                                                                         \
    for (int64_t j = i; j < n; ++j) w[j] = exp_nonpositive(w[j] - top);                      \
    alignas(32) float sums[kLanes];                                                           \
    _mm256_store_ps(sums, sum_lo);                                                            \
    _mm256_store_ps(sums + 8, sum_hi);                                                        \
    return lane_sum_tail(sums, w, i, n);                                                      \
  }
DL_SOFTMAX(DL_TARGET_AVX512, softmax_avx512, exp8_avx512)
DL_SOFTMAX(DL_TARGET_AVX2, softmax_avx2, exp8_avx2)

// Head by head, slot after slot, every lane of the head at once (element-wise: AVX-512 and AVX2 alike).
template <int C>
__attribute__((target(DL_TARGET_AVX2))) void weigh_avx2(const float* w, int64_t heads, int64_t padded,
                                                        const float* values, int64_t slot_stride,
                                                        const int64_t* seen, int64_t n, int64_t dim, int64_t w_stride, float* acc) {
  const int64_t vecs = (C > 0 ? C * kLanes : dim) / 8;
  for (int64_t g = 0; g < heads; ++g) {
    float* a = acc + g * padded;
    __m256 sum[2 * kMaxChunks];
    for (int64_t c = 0; c < vecs; ++c) sum[c] = _mm256_loadu_ps(a + c * 8);
    for (int64_t i = 0; i < n; ++i) {
      const float* v = values + seen[i] * slot_stride;
      const __m256 p = _mm256_set1_ps(w[g * w_stride + i]);
      for (int64_t c = 0; c < vecs; ++c) sum[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + c * 8), sum[c]);
    }
    for (int64_t c = 0; c < vecs; ++c) _mm256_storeu_ps(a + c * 8, sum[c]);
  }
}

// H heads at once, slot after slot: each head's sums run through the slots in order, as one head's
// do alone, but H heads' chains of fused multiply-adds overlap (one head's 4 chains at 64 dims
// waited on each other's latency) and share each value's loads.
template <int C, int H>
__attribute__((target(DL_TARGET_AVX512), always_inline)) inline void weigh_heads_avx512(
    const float* w, int64_t padded, const float* values, int64_t slot_stride, const int64_t* seen, int64_t n,
    int64_t w_stride, float* acc) {
  __m512 sum[H][C];
  for (int h = 0; h < H; ++h) {
    for (int c = 0; c < C; ++c) sum[h][c] = _mm512_loadu_ps(acc + h * padded + c * kLanes);
  }
  for (int64_t i = 0; i < n; ++i) {
    const float* v = values + seen[i] * slot_stride;
    __m512 vc[C];
    for (int c = 0; c < C; ++c) vc[c] = _mm512_loadu_ps(v + c * kLanes);
    for (int h = 0; h < H; ++h) {
      const __m512 p = _mm512_set1_ps(w[h * w_stride + i]);
      for (int c = 0; c < C; ++c) sum[h][c] = _mm512_fmadd_ps(p, vc[c], sum[h][c]);
    }
  }
  for (int h = 0; h < H; ++h) {
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + h * padded + c * kLanes, sum[h][c]);
  }
}

template <int C>
__attribute__((target(DL_TARGET_AVX512))) void weigh_avx512(const float* w, int64_t heads, int64_t padded,
                                                            const float* values, int64_t slot_stride,
                                                            const int64_t* seen, int64_t n, int64_t dim, int64_t w_stride, float* acc) {
  if constexpr (C == 4 || C == 8) {
    constexpr int kAtOnce = C == 4 ? 3 : 2;  // accumulators and one slot's values fit the 32 registers
    int64_t g = 0;
    for (; g + kAtOnce <= heads; g += kAtOnce) {
      weigh_heads_avx512<C, kAtOnce>(w + g * w_stride, padded, values, slot_stride, seen, n, w_stride, acc + g * padded);
    }
    for (; g < heads; ++g) {
      weigh_heads_avx512<C, 1>(w + g * w_stride, padded, values, slot_stride, seen, n, w_stride, acc + g * padded);
    }
    return;
  }
  const int64_t vecs = C > 0 ? C : dim / kLanes;
  for (int64_t g = 0; g < heads; ++g) {
    float* a = acc + g * padded;
    __m512 sum[kMaxChunks];
    for (int64_t c = 0; c < vecs; ++c) sum[c] = _mm512_loadu_ps(a + c * kLanes);
    for (int64_t i = 0; i < n; ++i) {
      const float* v = values + seen[i] * slot_stride;
      const __m512 p = _mm512_set1_ps(w[g * w_stride + i]);
      for (int64_t c = 0; c < vecs; ++c) sum[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + c * kLanes), sum[c]);
    }
    for (int64_t c = 0; c < vecs; ++c) _mm512_storeu_ps(a + c * kLanes, sum[c]);
  }
}

struct Shape {
  int64_t batch, heads, kv_heads, rows, slots, dim;
};

// Strides of a 4-D tensor, in elements.
struct Strides {
  int64_t b, h, r, s;
  explicit Strides(const at::Tensor& t) : b(t.stride(0)), h(t.stride(1)), r(t.stride(2)), s(t.stride(3)) {}
};

// The mask's verdict on a slot: hidden (skipped), or visible with what it adds to the score.
template <typename M>
inline bool visible(M value, float& add) {
  if constexpr (std::is_same_v<M, bool>) {
    add = 0.0f;
    return value;
  } else {
    add = static_cast<float>(value);
    // transformers hides slots with the dtype's lowest value, not -inf.
    return value > std::numeric_limits<M>::lowest() && add != -std::numeric_limits<float>::infinity();
  }
}

// One key head's keys or values as float32 rows of `dim`, contiguous.
template <typename T>
__attribute__((target(DL_TARGET_AVX2))) void to_float_avx2(const T* src, int64_t slot_stride, int64_t slots,
                                                           int64_t dim, float* dst) {
  for (int64_t s = 0; s < slots; ++s) {
    for (int64_t d = 0; d < dim; d += 8) _mm256_storeu_ps(dst + s * dim + d, load8_avx2(src + s * slot_stride + d));
  }
}

// 16 values a register where the head size allows.
template <typename T>
__attribute__((target(DL_TARGET_AVX512))) void to_float_avx512(const T* src, int64_t slot_stride, int64_t slots,
                                                                int64_t dim, float* dst) {
  if (dim % kLanes != 0) return to_float_avx2<T>(src, slot_stride, slots, dim, dst);
  for (int64_t s = 0; s < slots; ++s) {
    for (int64_t d = 0; d < dim; d += kLanes) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + s * slot_stride + d));
      __m512 x;
      if constexpr (std::is_same_v<T, at::BFloat16>) {
        x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
      } else {
        x = _mm512_cvtph_ps(raw);
      }
      _mm512_storeu_ps(dst + s * dim + d, x);
    }
  }
}

template <typename T>
void to_float(const T* x, int64_t slot_stride, int64_t slots, int64_t dim, int64_t isa, float* y) {
  if (isa == 2 && dim % 8 == 0) return to_float_avx512<T>(x, slot_stride, slots, dim, y);
  if (isa == 1 && dim % 8 == 0) return to_float_avx2<T>(x, slot_stride, slots, dim, y);
  for (int64_t s = 0; s < slots; ++s) {
    for (int64_t d = 0; d < dim; ++d) y[s * dim + d] = static_cast<float>(x[s * slot_stride + d]);
  }
}

// Slots of a key head converted to float32 at a time by `attend_rows`: their keys (then their
// values) stay in L1 (16 KB at 64 dims) while every row and head of the item uses them.
constexpr int64_t kBlockSlots = 64;
constexpr int64_t kMaxRowsPer = 8;  // rows per item: bounds its lists of slots and scores

// A thread's buffer number kSlot of element type E, at least n long: kept across calls and only
// grown. Made anew per call, a pass's 30 calls allocated and zeroed up to ~200 KB each (8 rows,
// 1040 slots).
template <typename E, int kSlot>
std::vector<E>& scratch(int64_t n) {
  thread_local std::vector<E> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer;
}

// Items of `split` heads of one key head's group, for a group of up to `rows_per` rows: out is
// [batch, rows, heads, dim]. Each row's scores, softmax and weighted sum run over its own visible
// slots in slot order, so a row gets the same bits whatever else the pass holds. The loops run
// over slots in blocks outermost, then rows: a block of keys (then of values) is read, and
// converted, once for all the item's rows and heads. A row's dot products are each its own; its
// softmax runs over all its scores; its weighted sum runs block after block through its slots in
// order, the accumulators carried in memory between blocks. When each row read the key head's keys
// and values on its own, 8 rows at a 1040-slot window cost 4x one row (Zen5).
template <typename T, typename M>
void attend_rows(const Path& path, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                 at::Tensor& out, const Shape& sh, float scale, int64_t split, int64_t rows_per, int64_t isa,
                 int64_t begin, int64_t end, int64_t step) {
  const Strides qs(q), ks(k);
  const bool masked = mask.defined();
  const Strides ms = masked ? Strides(mask) : Strides(q);
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  const M* mp = masked ? mask.data_ptr<M>() : nullptr;
  T* op = out.data_ptr<T>();
  const int64_t group = sh.heads / sh.kv_heads, padded = (sh.dim + kLanes - 1) / kLanes * kLanes;
  const int64_t chunks = group / split, row_groups = (sh.rows + rows_per - 1) / rows_per;
  constexpr bool kFloat = std::is_same_v<T, float>;
  // Per row of the item: the slots it sees (absolute), what the mask adds, its scores (split x n),
  // its accumulators; and per block, its visible slots' places in the block. Each is written before
  // it is read (the accumulators are cleared per item).
  auto& seen = scratch<int64_t, 0>(rows_per * sh.slots);
  auto& count = scratch<int64_t, 1>(rows_per);
  auto& from = scratch<int64_t, 2>(rows_per);
  auto& local = scratch<int64_t, 3>(kBlockSlots);
  auto& add = scratch<float, 0>(rows_per * sh.slots);
  auto& w = scratch<float, 1>(rows_per * split * sh.slots);
  auto& qf = scratch<float, 2>(rows_per * split * padded);
  auto& acc = scratch<float, 3>(rows_per * split * padded);
  auto& lanes = scratch<float, 4>(padded);
  auto& block = scratch<float, 5>(kFloat ? 0 : kBlockSlots * sh.dim);
  auto& totals = scratch<float, 6>(rows_per * split);
  for (int64_t item = begin; item < end; item += step) {
    const int64_t chunk = item % chunks, rg = (item / chunks) % row_groups;
    const int64_t kvh = (item / (chunks * row_groups)) % sh.kv_heads, b = item / (chunks * row_groups * sh.kv_heads);
    const int64_t h0 = kvh * group + chunk * split, r0 = rg * rows_per, nr = std::min(rows_per, sh.rows - r0);
    int64_t last = 0;  // one past the last slot any row of the item sees
    for (int64_t j = 0; j < nr; ++j) {
      const int64_t r = r0 + j;
      int64_t* sj = seen.data() + j * sh.slots;
      float* aj = add.data() + j * sh.slots;
      int64_t n = 0;
      if (masked) {
        const M* row = mp + b * ms.b + r * ms.r;
        for (int64_t s = 0; s < sh.slots; ++s) {
          if (visible(row[s * ms.s], aj[n])) sj[n++] = s;
        }
      } else {
        for (int64_t s = 0; s <= sh.slots - sh.rows + r; ++s, ++n) {
          sj[n] = s;
          aj[n] = 0.0f;
        }
      }
      count[j] = n;
      if (n > 0) last = std::max(last, sj[n - 1] + 1);
      for (int64_t g = 0; g < split; ++g) {
        const T* qrow = qp + b * qs.b + (h0 + g) * qs.h + r * qs.r;
        float* qj = qf.data() + (j * split + g) * padded;
        for (int64_t d = 0; d < padded; ++d) qj[d] = d < sh.dim ? static_cast<float>(qrow[d]) : 0.0f;
      }
    }
    std::fill(acc.begin(), acc.begin() + nr * split * padded, 0.0f);
    const int64_t at = b * ks.b + kvh * ks.h;
    // Each row's visible slots within [s0, s0 + kBlockSlots): where they start in its list, how many.
    const auto in_block = [&](int64_t j, int64_t s0, int64_t& lo, int64_t& len) {
      const int64_t* sj = seen.data() + j * sh.slots;
      lo = from[j];
      int64_t hi = lo;
      while (hi < count[j] && sj[hi] < s0 + kBlockSlots) ++hi;
      len = hi - lo;
      from[j] = hi;
      for (int64_t i = 0; i < len; ++i) local[i] = sj[lo + i] - s0;
    };
    // The block's keys or values as float32 (the cache's own rows where it is float32).
    const auto block_rows = [&](const T* base, int64_t s0, int64_t& stride) -> const float* {
      const int64_t slots = std::min(kBlockSlots, last - s0);
      if constexpr (kFloat) {
        stride = ks.r;
        return base + at + s0 * ks.r;
      } else {
        to_float<T>(base + at + s0 * ks.r, ks.r, slots, sh.dim, isa, block.data());
        stride = sh.dim;
        return block.data();
      }
    };
    // Each row's visible slots, block by block in slot order, with that block's keys or values.
    const auto sweep = [&](const T* base, const auto& use) {
      std::fill(from.begin(), from.begin() + nr, 0);
      for (int64_t s0 = 0; s0 < last; s0 += kBlockSlots) {
        int64_t stride = 0;
        const float* rows = block_rows(base, s0, stride);
        for (int64_t j = 0; j < nr; ++j) {
          int64_t lo = 0, len = 0;
          in_block(j, s0, lo, len);
          if (len > 0) use(j, lo, len, rows, stride);
        }
      }
    };
    sweep(kp, [&](int64_t j, int64_t lo, int64_t len, const float* keys, int64_t stride) {
      path.dots(qf.data() + j * split * padded, split, padded, keys, stride, local.data(), len, sh.dim, scale,
                add.data() + j * sh.slots + lo, w.data() + j * split * sh.slots + lo, count[j], lanes.data());
    });
    for (int64_t j = 0; j < nr; ++j) {
      for (int64_t g = 0; g < split; ++g) {
        totals[j * split + g] =
            count[j] > 0 ? path.softmax(w.data() + j * split * sh.slots + g * count[j], count[j]) : 0.0f;
      }
    }
    sweep(vp, [&](int64_t j, int64_t lo, int64_t len, const float* values, int64_t stride) {
      path.weigh(w.data() + j * split * sh.slots + lo, split, padded, values, stride, local.data(), len, sh.dim,
                 count[j], acc.data() + j * split * padded);
    });
    for (int64_t j = 0; j < nr; ++j) {
      for (int64_t g = 0; g < split; ++g) {
        T* o = op + ((b * sh.rows + r0 + j) * sh.heads + h0 + g) * sh.dim;
        const float* a = acc.data() + (j * split + g) * padded;
        const float inv = count[j] > 0 ? 1.0f / totals[j * split + g] : 0.0f;
        for (int64_t d = 0; d < sh.dim; ++d) o[d] = static_cast<T>(a[d] * inv);
      }
    }
  }
}

bool cpu_has_avx512() { return draftlab_isa::cpu_has_avx512(/*vnni=*/false); }
using draftlab_isa::cpu_has_avx2;
int64_t attend_isa() { return draftlab_isa::best_isa(/*vnni=*/false); }

Path path_for(int64_t isa, int64_t dim) {
  if (dim % kLanes != 0 || dim > kLanes * kMaxChunks) isa = 0;
  // The common head sizes with their loops unrolled.
  if (isa == 2 && dim == 64) return {&dots_avx512<4>, &softmax_avx512, &weigh_avx512<4>};
  if (isa == 2 && dim == 128) return {&dots_avx512<8>, &softmax_avx512, &weigh_avx512<8>};
  if (isa == 2) return {&dots_avx512<0>, &softmax_avx512, &weigh_avx512<0>};
  if (isa == 1 && dim == 64) return {&dots_avx2<4>, &softmax_avx2, &weigh_avx2<4>};
  if (isa == 1 && dim == 128) return {&dots_avx2<8>, &softmax_avx2, &weigh_avx2<8>};
  if (isa == 1) return {&dots_avx2<0>, &softmax_avx2, &weigh_avx2<0>};
  return {&dots_scalar, &softmax_scalar, &weigh_scalar};
}

template <typename T, typename M>
void dispatch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, at::Tensor& out,
              const Shape& sh, float scale, int64_t isa) {
  const Path path = path_for(isa, sh.dim);
  const int64_t group = sh.heads / sh.kv_heads;
  // Heads per item: a whole group (up to kMaxGroup) shares each key and value it loads.
  int64_t split = 1;
  for (int64_t s = std::min(group, kMaxGroup); s > 1 && split == 1; --s) {
    if (group % s == 0) split = s;
  }
  // Rows in groups of at most kMaxRowsPer, as few groups as leave every thread two items: each
  // group reads a key head's keys and values once (`attend_rows`). One row alone ran 1.4-1.7x
  // faster this way than one head per item (windows of 272 and 1040 slots, Zen5), though 3 items
  // then share 2 threads.
  const int64_t threads = at::get_num_threads(), units = sh.batch * sh.heads / split;
  const int64_t groups = std::min(sh.rows, std::max((2 * threads + units - 1) / units,
                                                    (sh.rows + kMaxRowsPer - 1) / kMaxRowsPer));
  const int64_t rows_per = (sh.rows + groups - 1) / groups;
  const int64_t items = units * ((sh.rows + rows_per - 1) / rows_per);
  // Thread t takes items t, t + threads, ...: a causal prompt's later rows see more slots, and
  // neighbouring items are neighbouring row groups, so each thread gets early and late rows alike.
  const int64_t stride = std::min(threads, items);
  at::parallel_for(0, stride, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      attend_rows<T, M>(path, q, k, v, mask, out, sh, scale, split, rows_per, isa, t, items, stride);
    }
  });
}

template <typename T>
void by_mask(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, at::Tensor& out,
             const Shape& sh, float scale, int64_t isa) {
  if (!mask.defined() || mask.scalar_type() == at::kBool) return dispatch<T, bool>(q, k, v, mask, out, sh, scale, isa);
  switch (mask.scalar_type()) {
    case at::kFloat: return dispatch<T, float>(q, k, v, mask, out, sh, scale, isa);
    case at::kBFloat16: return dispatch<T, at::BFloat16>(q, k, v, mask, out, sh, scale, isa);
    case at::kHalf: return dispatch<T, at::Half>(q, k, v, mask, out, sh, scale, isa);
    default: TORCH_CHECK(false, "attend: the mask must be bool, float32, bfloat16 or float16");
  }
}

// q [batch, heads, rows, dim]; k, v [batch, kv_heads, slots, dim]; mask (optional) broadcastable to
// [batch, 1, rows, slots], bool (true: visible) or additive; out [batch, rows, heads, dim].
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
                  double scale, int64_t isa) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attend: q, k, v must be 4-D");
  TORCH_CHECK(k.sizes() == v.sizes(), "attend: keys and values differ in shape");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "attend: q, k, v must share a dtype");
  const Shape sh{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)};
  TORCH_CHECK(k.size(0) == sh.batch && k.size(3) == sh.dim, "attend: keys do not fit the queries");
  TORCH_CHECK(sh.kv_heads > 0 && sh.heads % sh.kv_heads == 0, "attend: heads must be a multiple of kv heads");
  const at::Tensor qc = q.stride(3) == 1 ? q : q.contiguous();
  const at::Tensor kc = k.stride(3) == 1 ? k : k.contiguous();
  const at::Tensor vc = v.stride(3) == 1 && v.strides() == kc.strides() ? v : v.contiguous();
  TORCH_CHECK(vc.strides() == kc.strides(), "attend: keys and values must share a layout");
  at::Tensor m;
  if (mask.has_value() && mask->defined()) {
    TORCH_CHECK(mask->dim() == 4 && (mask->size(1) == 1), "attend: the mask must be [batch, 1, rows, slots]");
    m = mask->expand({sh.batch, sh.heads, sh.rows, sh.slots});  // stride 0 over heads
  }
  at::Tensor out = at::empty({sh.batch, sh.rows, sh.heads, sh.dim}, q.options());
  if (out.numel() == 0) return out;
  if (isa < 0) isa = attend_isa();
  TORCH_CHECK(isa != 2 || cpu_has_avx512(), "attend: this CPU lacks AVX-512");
  TORCH_CHECK(isa != 1 || cpu_has_avx2(), "attend: this CPU lacks AVX2");
  const float sc = static_cast<float>(scale);
  switch (q.scalar_type()) {
    case at::kFloat: by_mask<float>(qc, kc, vc, m, out, sh, sc, isa); break;
    case at::kBFloat16: by_mask<at::BFloat16>(qc, kc, vc, m, out, sh, sc, isa); break;
    case at::kHalf: by_mask<at::Half>(qc, kc, vc, m, out, sh, sc, isa); break;
    default: TORCH_CHECK(false, "attend: q, k, v must be float32, bfloat16 or float16");
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(draftlab, m) {
  m.def("attend(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, int isa=-1) -> Tensor");
}

TORCH_LIBRARY_IMPL(draftlab, CPU, m) { m.impl("attend", &attend); }

// The C entry point compiled packages call (quant_mm.cpp says why).
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_attend(
    AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v, AtenTensorHandle* mask, double scale, int64_t isa,
    AtenTensorHandle* ret0) {
  using torch::aot_inductor::tensor_handle_to_tensor_pointer;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    const std::optional<at::Tensor> m = torch::aot_inductor::pointer_to_optional<at::Tensor>(mask);
    *ret0 = torch::aot_inductor::new_tensor_handle(attend(*tensor_handle_to_tensor_pointer(q),
                                                          *tensor_handle_to_tensor_pointer(k),
                                                          *tensor_handle_to_tensor_pointer(v), m, scale, isa));
  });
}
