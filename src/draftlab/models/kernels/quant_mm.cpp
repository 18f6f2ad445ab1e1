// GGUF block weights (Q4_1, Q8_0) times activations quantized to 8 bits per block of 32, in integer
// arithmetic: the dot products llama.cpp runs for these storages (its q4_1 x q8_1 and q8_0 x q8_0),
// laid out so that one vector lane is one output row. A block's codes are loaded (and unpacked) once
// and reused by every activation row, so a pass of 8 tokens reads the weights once, like a pass of one.
//
// Every path (AVX-512 VNNI, AVX2, scalar) computes each output as the same sequence of float
// operations over the blocks, in the same order, from exact integer sums inside a block: the results
// are bit-identical across paths and do not depend on how many rows a pass holds.
//
// Layout (models/kernels/__init__.py `pack_q4_1`, `pack_q8_0`): output rows in tiles of 16. For tile t
// and block b, 8 groups g of 16 lanes (rows) x 4 bytes (inputs 4g..4g+3 of the block). Q8_0 stores
// them as 8 chunks of 64 signed bytes; Q4_1 as 4 chunks whose low nibbles hold groups 0-3 and high
// nibbles groups 4-7. Scales (and Q4_1's minima) are the GGUF's float16 values, their bits as int16,
// [tile][block][16].

#include <torch/library.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "isa.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <memory>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kLanes = 16;
constexpr int64_t kMaxRows = 8;  // activation rows per sweep over the weights
// Blocks of activations one thread quantizes at least: a pass of up to 8 tokens (at most 384 blocks
// of its widest input, 1536) stays on the calling thread, where starting the other costs more.
constexpr int64_t kQuantizeGrain = 512;
// How many blocks ahead of the one in use a tile's codes, scales and minima are fetched into cache.
// The codes of tiles lie one after another in memory, so this runs on into the next tile; the
// scales and minima are streams of their own, 32 bytes a block, one line for two blocks.
// Without it a pass of 8 rows waited on memory between bursts of arithmetic: 10.3 -> 9.0 ms for
// the compiled 8-token pass, 5.9 -> 5.2 ms for one token (Zen4, 2 threads, codes 2 KB ahead).
// 16 blocks ahead, scales and minima included (Zen5, all 30 layers' matrices then the head in pass
// order, A/B in one process): 8 rows 4.06 -> 3.5-3.6 ms for the layers, 1.12 -> 0.83-0.96 ms for the
// head, one row unchanged; under the AVX2 path one row 4.7 -> 4.0 ms (layers), 0.82 -> 0.68 (head).
constexpr int64_t kAheadBlocks = 16;

template <int64_t kTileBytes, bool kMinima>
inline void fetch_ahead(const uint8_t* codes, const uint16_t* d, const uint16_t* m, int64_t b) {
  const char* p = reinterpret_cast<const char*>(codes + (b + kAheadBlocks) * kTileBytes);
  for (int64_t line = 0; line < kTileBytes; line += 64) _mm_prefetch(p + line, _MM_HINT_T0);
  if (b % 2 == 0) {
    _mm_prefetch(reinterpret_cast<const char*>(d + (b + kAheadBlocks) * kLanes), _MM_HINT_T0);
    if constexpr (kMinima) _mm_prefetch(reinterpret_cast<const char*>(m + (b + kAheadBlocks) * kLanes), _MM_HINT_T0);
  }
}

using draftlab_isa::kAuto;
using draftlab_isa::load16_avx512;
using draftlab_isa::load8_avx2;
using draftlab_isa::kAvx2;
using draftlab_isa::kAvx512;
using draftlab_isa::kScalar;

// Q4_1: 4-bit codes q in 0..15, w = q·d + m. Q8_0: signed 8-bit codes, w = q·d.
template <bool kQ4>
constexpr int64_t tile_bytes() {
  return kQ4 ? kLanes * kGroup / 2 : kLanes * kGroup;
}

struct Activations {
  // Per row and block: 32 signed codes, their scale d, the integer sum of the codes and d times it.
  // Left uninitialised: every entry is written before it is read.
  std::unique_ptr<int8_t[]> q_;
  std::unique_ptr<float[]> d_;
  std::unique_ptr<int32_t[]> sum_;
  std::unique_ptr<float[]> s_;
  int8_t* q;
  float* d;
  int32_t* sum;
  float* s;

  Activations(int64_t rows, int64_t k)
      : q_(new int8_t[rows * k]),
        d_(new float[rows * (k / kGroup)]),
        sum_(new int32_t[rows * (k / kGroup)]),
        s_(new float[rows * (k / kGroup)]),
        q(q_.get()),
        d(d_.get()),
        sum(sum_.get()),
        s(s_.get()) {}
};

// Blocks rb0..rb1 of the whole input (rows are contiguous and k a multiple of 32: block rb of the
// whole is block rb % (k / 32) of row rb / (k / 32)).
template <typename T>
void quantize(const T* x, Activations& a, int64_t rb0, int64_t rb1) {
  for (int64_t rb = rb0; rb < rb1; ++rb) {
    float xb[kGroup];
    for (int64_t i = 0; i < kGroup; ++i) xb[i] = static_cast<float>(x[rb * kGroup + i]);
    float amax = 0.f;
    for (int64_t i = 0; i < kGroup; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.f;
    const float id = d > 0.f ? 1.f / d : 0.f;
    int32_t sum = 0;
    int8_t* qb = a.q + rb * kGroup;
    for (int64_t i = 0; i < kGroup; ++i) {
      const int32_t q = static_cast<int32_t>(std::nearbyint(xb[i] * id));
      qb[i] = static_cast<int8_t>(q);
      sum += q;
    }
    a.d[rb] = d;
    a.sum[rb] = sum;
    a.s[rb] = d * static_cast<float>(sum);
  }
}

// The same quantization, a block of 32 at a time in vector registers, for the vector paths: every
// step is exact (max, |x|) or rounded as the scalar one is (the same division, product, and
// conversion to the nearest integer, ties to even), so the codes and scales are the same bits. The
// scalar loop's nearbyint, a libm call per value, took most of an 8-token pass's kernel time.

template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) void quantize_avx512(const T* x, Activations& a, int64_t rb0,
                                                                             int64_t rb1) {
  for (int64_t rb = rb0; rb < rb1; ++rb) {
    const T* xb = x + rb * kGroup;
    const __m512 v0 = load16_avx512(xb), v1 = load16_avx512(xb + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.f;
    const float id = d > 0.f ? 1.f / d : 0.f;
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
    int8_t* qb = a.q + rb * kGroup;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtepi32_epi8(q1));
    const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    a.d[rb] = d;
    a.sum[rb] = sum;
    a.s[rb] = d * static_cast<float>(sum);
  }
}


template <typename T>
__attribute__((target("avx2,fma,f16c"))) void quantize_avx2(const T* x, Activations& a, int64_t rb0, int64_t rb1) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t rb = rb0; rb < rb1; ++rb) {
    const T* xb = x + rb * kGroup;
    __m256 v[4];
    __m256 top = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = load8_avx2(xb + 8 * i);
      top = _mm256_max_ps(top, _mm256_and_ps(v[i], magnitude));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, top);
    float amax = 0.f;
    for (float l : lanes) amax = std::max(amax, l);
    const float d = amax / 127.f;
    const float id = d > 0.f ? 1.f / d : 0.f;
    alignas(32) int32_t q[kGroup];
    for (int i = 0; i < 4; ++i) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(q + 8 * i), _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id))));
    }
    int8_t* qb = a.q + rb * kGroup;
    int32_t sum = 0;
    for (int64_t i = 0; i < kGroup; ++i) {
      qb[i] = static_cast<int8_t>(q[i]);
      sum += q[i];
    }
    a.d[rb] = d;
    a.sum[rb] = sum;
    a.s[rb] = d * static_cast<float>(sum);
  }
}

struct Weights {
  const uint8_t* codes;  // one tile's blocks
  const uint16_t* d;
  const uint16_t* m;  // Q4_1 only
  int64_t blocks;
};

struct Out {
  float* data;
  int64_t stride;  // outputs per row
  int64_t col0;    // this tile's first output
};

inline float half_to_float(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }

// The reference: one lane at a time, the same float operations as the vector paths.
template <bool kQ4>
void tile_scalar(const Weights& w, const Activations& a, int64_t k, int64_t row0, int64_t rows, const Out& out) {
  for (int64_t r = row0; r < row0 + rows; ++r) {
    for (int64_t lane = 0; lane < kLanes; ++lane) {
      float acc = 0.f;
      for (int64_t b = 0; b < w.blocks; ++b) {
        const uint8_t* tb = w.codes + b * tile_bytes<kQ4>();
        const int8_t* xq = a.q + r * k + b * kGroup;
        int32_t isum = 0;
        for (int64_t g = 0; g < 8; ++g) {
          for (int64_t i = 0; i < 4; ++i) {
            int32_t code;
            if constexpr (kQ4) {
              const uint8_t byte = tb[(g % 4) * 64 + lane * 4 + i];
              code = g < 4 ? (byte & 0x0F) : (byte >> 4);
            } else {
              code = static_cast<int8_t>(tb[g * 64 + lane * 4 + i]);
            }
            isum += code * xq[4 * g + i];
          }
        }
        const int64_t ab = r * w.blocks + b;
        acc = std::fma(static_cast<float>(isum), half_to_float(w.d[b * kLanes + lane]) * a.d[ab], acc);
        if constexpr (kQ4) acc = std::fma(half_to_float(w.m[b * kLanes + lane]), a.s[ab], acc);
      }
      out.data[r * out.stride + out.col0 + lane] = acc;
    }
  }
}

template <bool kQ4>
__attribute__((target("avx2,fma,f16c"))) void tile_avx2(const Weights& w, const Activations& a, int64_t k,
                                                        int64_t row0, int64_t rows, const Out& out) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t half = 0; half < 2; ++half) {  // lanes 0-7, then 8-15
    __m256 acc[kMaxRows];
    for (int64_t r = 0; r < rows; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < w.blocks; ++b) {
      const uint8_t* tb = w.codes + b * tile_bytes<kQ4>() + half * 32;
      if (half == 0) fetch_ahead<tile_bytes<kQ4>(), kQ4>(w.codes, w.d, w.m, b);
      // u: the codes as unsigned bytes; for Q8_0 their magnitudes, with the signs in sg (maddubs
      // takes one unsigned operand and saturates pairs at 16 bits: 2·127·127 fits, 2·255·127 not).
      __m256i u[8], sg[8];
      for (int64_t g = 0; g < 8; ++g) {
        if constexpr (kQ4) {
          const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tb + (g % 4) * 64));
          u[g] = _mm256_and_si256(g < 4 ? p : _mm256_srli_epi16(p, 4), low);
        } else {
          sg[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tb + g * 64));
          u[g] = _mm256_abs_epi8(sg[g]);
        }
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d + b * kLanes + half * 8)));
      __m256 m = _mm256_setzero_ps();
      if constexpr (kQ4) m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.m + b * kLanes + half * 8)));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = row0 + r, ab = row * w.blocks + b;
        const int32_t* xq = reinterpret_cast<const int32_t*>(a.q + row * k + b * kGroup);
        __m256i sum32;
        if constexpr (kQ4) {
          // A code is at most 15 and |x| at most 127, so a byte pair sums to at most 3810 and eight
          // groups' pairs to 30480: exact in 16 bits. One widening multiply a block instead of eight
          // (the multiply ports were the bound of an 8-token pass on AVX2).
          __m256i s16 = _mm256_maddubs_epi16(u[0], _mm256_set1_epi32(xq[0]));
          for (int64_t g = 1; g < 8; ++g) {
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(u[g], _mm256_set1_epi32(xq[g])));
          }
          sum32 = _mm256_madd_epi16(s16, ones);
        } else {
          __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
          for (int64_t g = 0; g < 8; ++g) {
            const __m256i x = _mm256_sign_epi8(_mm256_set1_epi32(xq[g]), sg[g]);
            s[g % 2] = _mm256_add_epi32(s[g % 2], _mm256_madd_epi16(_mm256_maddubs_epi16(u[g], x), ones));
          }
          sum32 = _mm256_add_epi32(s[0], s[1]);
        }
        const __m256 isum = _mm256_cvtepi32_ps(sum32);
        acc[r] = _mm256_fmadd_ps(isum, _mm256_mul_ps(d, _mm256_set1_ps(a.d[ab])), acc[r]);
        if constexpr (kQ4) acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(a.s[ab]), acc[r]);
      }
    }
    for (int64_t r = 0; r < rows; ++r) _mm256_storeu_ps(out.data + (row0 + r) * out.stride + out.col0 + half * 8, acc[r]);
  }
}

// R activation rows at once, known at compile time so that their accumulators live in registers.
template <bool kQ4, int R>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c"))) void tile_avx512_rows(
    const Weights& w, const Activations& a, int64_t k, int64_t row0, const Out& out) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int32_t* xq[R];
  for (int64_t b = 0; b < w.blocks; ++b) {
    const uint8_t* tb = w.codes + b * tile_bytes<kQ4>();
    fetch_ahead<tile_bytes<kQ4>(), kQ4>(w.codes, w.d, w.m, b);
    for (int r = 0; r < R; ++r) xq[r] = reinterpret_cast<const int32_t*>(a.q + (row0 + r) * k + b * kGroup);
    // Each group's codes meet every row before the next group's are unpacked. Unsigned bytes for
    // vpdpbusd: Q4_1's codes as they are, Q8_0's moved up by 128 (undone below by the rows' code sums).
    __m512i s[R];
    for (int r = 0; r < R; ++r) s[r] = _mm512_setzero_si512();
    for (int g = 0; g < 8; ++g) {
      __m512i u;
      if constexpr (kQ4) {
        const __m512i p = _mm512_loadu_si512(tb + (g % 4) * 64);
        u = _mm512_and_si512(g < 4 ? p : _mm512_srli_epi16(p, 4), low);
      } else {
        u = _mm512_xor_si512(_mm512_loadu_si512(tb + g * 64), flip);
      }
      for (int r = 0; r < R; ++r) s[r] = _mm512_dpbusd_epi32(s[r], u, _mm512_set1_epi32(xq[r][g]));
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.d + b * kLanes)));
    __m512 m = _mm512_setzero_ps();
    if constexpr (kQ4) m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.m + b * kLanes)));
    for (int r = 0; r < R; ++r) {
      const int64_t ab = (row0 + r) * w.blocks + b;
      __m512i si = s[r];
      if constexpr (!kQ4) si = _mm512_sub_epi32(si, _mm512_set1_epi32(128 * a.sum[ab]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_mul_ps(d, _mm512_set1_ps(a.d[ab])), acc[r]);
      if constexpr (kQ4) acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.s[ab]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out.data + (row0 + r) * out.stride + out.col0, acc[r]);
}

template <bool kQ4>
void tile_avx512(const Weights& w, const Activations& a, int64_t k, int64_t row0, int64_t rows, const Out& out) {
  switch (rows) {
    case 1: return tile_avx512_rows<kQ4, 1>(w, a, k, row0, out);
    case 2: return tile_avx512_rows<kQ4, 2>(w, a, k, row0, out);
    case 3: return tile_avx512_rows<kQ4, 3>(w, a, k, row0, out);
    case 4: return tile_avx512_rows<kQ4, 4>(w, a, k, row0, out);
    case 5: return tile_avx512_rows<kQ4, 5>(w, a, k, row0, out);
    case 6: return tile_avx512_rows<kQ4, 6>(w, a, k, row0, out);
    case 7: return tile_avx512_rows<kQ4, 7>(w, a, k, row0, out);
    default: return tile_avx512_rows<kQ4, 8>(w, a, k, row0, out);
  }
}

bool cpu_has_avx512() { return draftlab_isa::cpu_has_avx512(/*vnni=*/true); }
using draftlab_isa::cpu_has_avx2;
int64_t best_isa() { return draftlab_isa::best_isa(/*vnni=*/true); }

template <bool kQ4>
at::Tensor block_mm(const char* name, const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                    const at::Tensor* minima, int64_t isa) {
  TORCH_CHECK(x.dim() == 2, name, ": x must be [rows, inputs]");
  TORCH_CHECK(codes.element_size() == 1 && codes.dim() == 3 && codes.size(2) == tile_bytes<kQ4>(), name,
              ": codes must be bytes [tiles, blocks, ", tile_bytes<kQ4>(), "]");
  const int64_t tiles = codes.size(0), blocks = codes.size(1), k = blocks * kGroup;
  TORCH_CHECK(x.size(1) == k, name, ": x has ", x.size(1), " inputs, the weights ", k);
  for (const at::Tensor* t : {&scales, minima}) {
    if (t == nullptr) continue;
    TORCH_CHECK(t->scalar_type() == at::kShort && t->numel() == tiles * blocks * kLanes, name,
                ": scales and minima must be float16 bits in int16 [tiles, blocks, 16]");
  }
  if (isa == kAuto) isa = best_isa();
  TORCH_CHECK(isa != kAvx512 || cpu_has_avx512(), name, ": this CPU lacks AVX-512 VNNI");
  TORCH_CHECK(isa != kAvx2 || cpu_has_avx2(), name, ": this CPU lacks AVX2");

  // Activations are read in their own dtype (a model's bfloat16): no float32 copy per call.
  const at::Tensor xf = x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf
                            ? x.contiguous()
                            : x.to(at::kFloat).contiguous();
  const at::Tensor wc = codes.contiguous(), wd = scales.contiguous();
  const at::Tensor wm = minima ? minima->contiguous() : wd;
  const int64_t rows = xf.size(0);
  at::Tensor out = at::empty({rows, tiles * kLanes}, xf.options().dtype(at::kFloat));
  if (rows == 0) return out;
  Activations a(rows, k);
  const auto quantize_all = [&](const auto* x) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(x)>>;
    // A prompt's rows are quantized on every thread (each block on its own, so the same bits):
    // on one thread they kept the other idle for 6-8% of a 585-token prompt's matrices (Zen4).
    at::parallel_for(0, rows * blocks, kQuantizeGrain, [&](int64_t rb0, int64_t rb1) {
      if (isa == kAvx512) {
        quantize_avx512<T>(x, a, rb0, rb1);
      } else if (isa == kAvx2) {
        quantize_avx2<T>(x, a, rb0, rb1);
      } else {
        quantize<T>(x, a, rb0, rb1);
      }
    });
  };
  if (xf.scalar_type() == at::kBFloat16) {
    quantize_all(xf.data_ptr<at::BFloat16>());
  } else if (xf.scalar_type() == at::kHalf) {
    quantize_all(xf.data_ptr<at::Half>());
  } else {
    quantize_all(xf.data_ptr<float>());
  }
  const auto* cp = static_cast<const uint8_t*>(wc.data_ptr());
  const auto* dp = reinterpret_cast<const uint16_t*>(wd.data_ptr<int16_t>());
  const auto* mp = reinterpret_cast<const uint16_t*>(wm.data_ptr<int16_t>());
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const Weights w{cp + t * blocks * tile_bytes<kQ4>(), dp + t * blocks * kLanes, mp + t * blocks * kLanes, blocks};
      const Out o{out.data_ptr<float>(), tiles * kLanes, t * kLanes};
      for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
        const int64_t r = std::min(kMaxRows, rows - r0);
        if (isa == kAvx512) {
          tile_avx512<kQ4>(w, a, k, r0, r, o);
        } else if (isa == kAvx2) {
          tile_avx2<kQ4>(w, a, k, r0, r, o);
        } else {
          tile_scalar<kQ4>(w, a, k, r0, r, o);
        }
      }
    }
  });
  return out;
}

at::Tensor q4_1_q8_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                      const at::Tensor& minima, int64_t isa) {
  return block_mm<true>("q4_1_q8_mm", x, codes, scales, &minima, isa);
}

at::Tensor q8_0_q8_mm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, int64_t isa) {
  return block_mm<false>("q8_0_q8_mm", x, codes, scales, nullptr, isa);
}

int64_t q8_isa() { return best_isa(); }

}  // namespace

TORCH_LIBRARY(draftlab, m) {
  m.def("q4_1_q8_mm(Tensor x, Tensor codes, Tensor scales, Tensor minima, int isa=-1) -> Tensor");
  m.def("q8_0_q8_mm(Tensor x, Tensor codes, Tensor scales, int isa=-1) -> Tensor");
  m.def("q8_isa() -> int");
}

TORCH_LIBRARY_IMPL(draftlab, CPU, m) {
  m.impl("q4_1_q8_mm", &q4_1_q8_mm);
  m.impl("q8_0_q8_mm", &q8_0_q8_mm);
}

TORCH_LIBRARY_IMPL(draftlab, CompositeExplicitAutograd, m) { m.impl("q8_isa", &q8_isa); }

// C entry points that compiled packages call directly (inductor's aot_inductor.custom_ops_to_c_shims,
// named as it names them: aoti_torch_cpu_<op>), instead of through the package's boxed proxy
// executor, which a pass of the 4-bit target crossed 151 times (docs/results.md, stop 71).
#define DRAFTLAB_SHIM extern "C" __attribute__((visibility("default"))) AOTITorchError

DRAFTLAB_SHIM aoti_torch_cpu_q4_1_q8_mm(AtenTensorHandle x, AtenTensorHandle codes, AtenTensorHandle scales,
                                        AtenTensorHandle minima, int64_t isa, AtenTensorHandle* ret0) {
  using torch::aot_inductor::tensor_handle_to_tensor_pointer;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *ret0 = torch::aot_inductor::new_tensor_handle(
        q4_1_q8_mm(*tensor_handle_to_tensor_pointer(x), *tensor_handle_to_tensor_pointer(codes),
                   *tensor_handle_to_tensor_pointer(scales), *tensor_handle_to_tensor_pointer(minima), isa));
  });
}

DRAFTLAB_SHIM aoti_torch_cpu_q8_0_q8_mm(AtenTensorHandle x, AtenTensorHandle codes, AtenTensorHandle scales,
                                        int64_t isa, AtenTensorHandle* ret0) {
  using torch::aot_inductor::tensor_handle_to_tensor_pointer;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *ret0 = torch::aot_inductor::new_tensor_handle(q8_0_q8_mm(*tensor_handle_to_tensor_pointer(x),
                                                              *tensor_handle_to_tensor_pointer(codes),
                                                              *tensor_handle_to_tensor_pointer(scales), isa));
  });
}
