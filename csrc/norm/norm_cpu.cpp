// CPU kernels of layer_norm and rms_norm. Rows are split over threads
// (at::parallel_for); each row is computed by one thread with summation
// trees that depend only on n (eight interleaved chains, then three pairwise
// levels), so the bits never depend on the thread count. Each row is first
// decoded into doubles (exact), then: statistics (tier 1, exact tier when
// undecided), then the elementwise outputs. The fused backward also sums
// dweight / dbias per fixed block of rows (backward_fused), so those too are
// the same for every thread count.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <immintrin.h>
#include <memory>
#include <type_traits>
#include <vector>

#include "../cpu_features.h"
#include "../dtypes.h"
#include "../exact/fp_env.h"
#include "../exact/round16_avx2.h"
#include "../reduce/chain_tree.h"
#include "norm.h"
#include "norm_kernel.h"

namespace carbon {

namespace {

// The row loops are compiled for AVX-512 (x86-64-v4), AVX2 and any x86-64,
// chosen at load time: the same IEEE and integer operations, so the same bits.
#define CARBON_NORM_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
// The explicit kChains-lane forms (*_v4) are compiled for AVX-512 only: on
// AVX2 GCC splits their 8-double vectors badly; there the scalar forms
// (*_portable) run instead (dispatch below). Same operations, same bits.
#define CARBON_NORM_V4 __attribute__((target("arch=x86-64-v4")))
#define CARBON_NORM_PORTABLE __attribute__((target_clones("avx2", "default")))

struct Sums {
  double sum = 0.0, abs_sum = 0.0;
};

// One chain per lane of a vector of kChains doubles. GCC's vector
// extensions apply the written IEEE operation lane by lane (nothing is
// reassociated, and -ffp-contract=off forbids fusing), so lane l performs
// exactly the additions of the scalar chain l: element k into chain
// k mod kChains, the tail into chain 0 afterwards. Written out because the
// auto-vectorizer turned the scalar form of these loops into shuffles.
typedef double Lanes __attribute__((vector_size(kChains * sizeof(double))));
typedef uint64_t LaneBits __attribute__((vector_size(kChains * sizeof(uint64_t))));

#define CARBON_LANES_INLINE inline __attribute__((always_inline))

CARBON_LANES_INLINE Lanes load_lanes(const double* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

CARBON_LANES_INLINE void store_lanes(double* p, Lanes v) { std::memcpy(p, &v, sizeof v); }

CARBON_LANES_INLINE Lanes abs_lanes(Lanes v) { return (Lanes)((LaneBits)v & ~kSignBit); }

// element_value of kChains consecutive elements (exact widenings).
template <typename T>
CARBON_LANES_INLINE Lanes decode_lanes(const T* p) {
  double v[kChains];
  for (int l = 0; l < kChains; ++l) v[l] = element_value(p[l]);
  return load_lanes(v);
}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // see below (forward outputs)
// float32 and bfloat16 by the AVX-512 conversion of 8 floats at once (the
// generic vector conversion was split into two halves by GCC).
template <>
CARBON_LANES_INLINE CARBON_NORM_V4 Lanes decode_lanes(const float* p) {
  return (Lanes)_mm512_cvtps_pd(_mm256_loadu_ps(p));
}
template <>
CARBON_LANES_INLINE CARBON_NORM_V4 Lanes decode_lanes(const c10::BFloat16* p) {  // the top halves of float32s
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return (Lanes)_mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
}
#pragma GCC diagnostic pop

// sum v_k and sum |v_k|.
CARBON_NORM_V4 Sums chain_sums_v4(const double* v, int64_t n) {
  Lanes s = {}, a = {};
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const Lanes e = load_lanes(v + k);
    s = s + e;
    a = a + abs_lanes(e);
  }
  double sc[kChains], ac[kChains];
  store_lanes(sc, s);
  store_lanes(ac, a);
  for (; k < n; ++k) {
    sc[0] = sc[0] + v[k];
    ac[0] = ac[0] + abs_value(v[k]);
  }
  return {fold_chains(sc), fold_chains(ac)};
}

// sum a_k (x) b_k and sum |a_k (x) b_k| (exact products).
CARBON_NORM_V4 Sums chain_dot_v4(const double* x, const double* y, int64_t n) {
  Lanes s = {}, a = {};
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const Lanes p = load_lanes(x + k) * load_lanes(y + k);
    s = s + p;
    a = a + abs_lanes(p);
  }
  double sc[kChains], ac[kChains];
  store_lanes(sc, s);
  store_lanes(ac, a);
  for (; k < n; ++k) {
    const double p = x[k] * y[k];
    sc[0] = sc[0] + p;
    ac[0] = ac[0] + abs_value(p);
  }
  return {fold_chains(sc), fold_chains(ac)};
}

// sum (v_k (-) c)^2 (c = 0: the exact squares).
CARBON_NORM_V4 double chain_squares_v4(const double* v, double c, int64_t n) {
  Lanes s = {};
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const Lanes d = load_lanes(v + k) - c;
    s = s + d * d;
  }
  double sc[kChains];
  store_lanes(sc, s);
  for (; k < n; ++k) {
    const double d = v[k] - c;
    sc[0] = sc[0] + d * d;
  }
  return fold_chains(sc);
}

template <typename T>
CARBON_NORM_CLONES void decode_row(const T* x, int64_t n, double* out) {
  for (int64_t k = 0; k < n; ++k) out[k] = element_value(x[k]);
}

// decode_row then chain_sums in one pass: the same operations in the same
// order, so the same fp64 sums and the same tier-1 decisions, with the row
// read once.
template <typename T>
CARBON_NORM_V4 Sums decode_sums_v4(const T* x, int64_t n, double* v) {
  Lanes s = {}, a = {};
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const Lanes e = decode_lanes(x + k);
    store_lanes(v + k, e);
    s = s + e;
    a = a + abs_lanes(e);
  }
  double sc[kChains], ac[kChains];
  store_lanes(sc, s);
  store_lanes(ac, a);
  for (; k < n; ++k) {
    const double e = element_value(x[k]);
    v[k] = e;
    sc[0] = sc[0] + e;
    ac[0] = ac[0] + abs_value(e);
  }
  return {fold_chains(sc), fold_chains(ac)};
}

// decode_row then chain_squares(v, 0.0, n) in one pass (same operations,
// same order, so the same fp64 sum).
template <typename T>
CARBON_NORM_V4 double decode_squares_v4(const T* x, int64_t n, double* v) {
  Lanes s = {};
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const Lanes e = decode_lanes(x + k);
    store_lanes(v + k, e);
    const Lanes d = e - 0.0;
    s = s + d * d;
  }
  double sc[kChains];
  store_lanes(sc, s);
  for (; k < n; ++k) {
    const double e = element_value(x[k]);
    v[k] = e;
    const double d = e - 0.0;
    sc[0] = sc[0] + d * d;
  }
  return fold_chains(sc);
}

// decode_sums_v4 and, in the same pass, the sum of the exact squares v_k^2.
// Two sets of chains, so that consecutive additions into a chain are two
// iterations apart (with one set, every 8 elements wait on the latency of
// the fma into q, 4 cycles).
// With n >= 32: elements 16i + l go into chain l (l < 16, lanes of set 0 then
// set 1) while 16 remain, the next 8 (if any) into set 0's chains, the two
// sets are added lane-wise, the last n mod 8 go into chain 0, then
// fold_chains. No value passes through more than floor(n / 16) + 1 + 1 + 7 + 3
// additions, which is at most chain_depth(n) = floor(n / 8) + 10 for n >= 24,
// the depth the callers' tier-1 tests take. Below 32 only set 0 runs: the
// tree of chain_sums / chain_squares. Either way the decided means and
// variances are the correctly rounded ones; only which rows tier 1 decides
// can depend on the tree.
template <typename T>
CARBON_NORM_V4 Sums decode_moments_v4(const T* x, int64_t n, double* v, double* squares) {
  Lanes s = {}, a = {}, q = {}, s1 = {}, a1 = {}, q1 = {};
  int64_t k = 0;
  auto step = [&](Lanes& sum, Lanes& abs_sum, Lanes& square_sum, int64_t at) CARBON_NORM_V4 {
    const Lanes e = decode_lanes(x + at);
    store_lanes(v + at, e);
    sum = sum + e;
    abs_sum = abs_sum + abs_lanes(e);
    // square_sum (+) e e as one fma: e e is exact (a square of a float
    // value), so the same value, on the multiply pipes (see centered_lanes).
    square_sum = (Lanes)_mm512_fmadd_pd((__m512d)e, (__m512d)e, (__m512d)square_sum);
  };
  if (n >= 32)
    for (; k + 2 * kChains <= n; k += 2 * kChains) {
      step(s, a, q, k);
      step(s1, a1, q1, k + kChains);
    }
  for (; k + kChains <= n; k += kChains) step(s, a, q, k);
  s = s + s1;
  a = a + a1;
  q = q + q1;
  double sc[kChains], ac[kChains], qc[kChains];
  store_lanes(sc, s);
  store_lanes(ac, a);
  store_lanes(qc, q);
  for (; k < n; ++k) {
    const double e = element_value(x[k]);
    v[k] = e;
    sc[0] = sc[0] + e;
    ac[0] = ac[0] + abs_value(e);
    qc[0] = qc[0] + e * e;
  }
  *squares = fold_chains(qc);
  return {fold_chains(sc), fold_chains(ac)};
}

// Tier 1 of var = RN32(C / n), C = sum (x_k - mu)^2 (real squares), from the
// first pass's sums alone, without the centred pass: C = S2 - 2 mu S1 + n mu^2
// exactly, S1 = sum x_k, S2 = sum x_k^2 (exact squares: products of two
// float values). T1, TA, T2 are the fp64 sums of x_k, |x_k|, x_k^2 by a
// tree of depth d, so with g = gamma_d:
//   |T1 - S1| <= g A1,  A1 = sum |x_k| <= TA / (1 - g),
//   |T2 - S2| <= g S2 <= g T2 / (1 - g)           (nonnegative terms).
// Computed: P = fl(2mu (x) T1) (2mu exact), Q = fl(T2 - P),
// R = fl(n (x) (mu (x) mu)) (mu^2 exact), Ct = fl(Q + R); each rounding errs by
// at most u = 2^-53 of its result (no result is subnormal: every nonzero
// one is at least 2^-298), so
//   |Ct - C| <= g (T2 + 2|mu| TA) / (1 - g) + u (|P| + |Q| + |R| + |Ct|),
// and kBoundSlack covers 1 / (1 - g) < 1 + 2^-21 and the roundings of the
// bound. The usual monotone test on Ct / n then decides; C near 0 (or a
// large mean against a small spread, where the bound is loose) is not
// decided and the caller takes the centred pass.
bool variance_from_moments(double T1, double TA, double T2, double mu, int64_t n, int64_t depth, double* out) {
  const double P = (2.0 * mu) * T1;
  const double Q = T2 - P;
  const double R = static_cast<double>(n) * (mu * mu);
  const double Ct = Q + R;
  const double beta = (gamma_n(depth) * (T2 + abs_value(2.0 * mu) * TA) +
                       kUnitRoundoff * (abs_value(P) + abs_value(Q) + abs_value(R) + abs_value(Ct))) *
                      kBoundSlack;
  return round_quotient_if_decided(Ct, beta, static_cast<double>(n), F32::get(), out);
}

// Exact tier of RN32(sum v / n).
double exact_mean(const double* v, int64_t n) {
  int64_t limb[kLimbs];
  uint32_t flags;
  exact_sum_clear(limb, flags);
  for (int64_t k = 0; k < n; ++k) exact_sum_add(limb, flags, v[k]);
  return exact_mean_round(limb, flags, n);
}

// Exact tier of RN32(sum a_k b_k / n).
double exact_mean_dot(const double* a, const double* b, int64_t n) {
  int64_t limb[kLimbs];
  uint32_t flags;
  exact_sum_clear(limb, flags);
  for (int64_t k = 0; k < n; ++k) exact_sum_add_product(limb, flags, a[k], b[k]);
  return exact_mean_round(limb, flags, n);
}

// ---------------------------------------------------------------- exact fp64 sums
//
// Tier 1 can never decide a mean that lies exactly on a rounding tie of
// float32, whatever its error bound, and such means are common when the
// terms have few bits (bfloat16 or float16 values, their squares, small
// integers) and n is a power of two: then the fp64 sum is often exact, and
// the exact sum over n is a tie. When the fp64 sum is provably exact, the
// exact accumulator is given that one value instead of the n terms: the same
// exact sum, so the same rounding and the same bits, for one addition.
//
// Exactness: if every term is an integer multiple of 2^m and the terms'
// absolute sum is below 2^(m+53), every partial sum of any tree is a
// multiple of 2^m of magnitude below 2^(m+53), hence a double, so every
// addition is exact.

// The bits of the smallest nonzero |v_k| (0 if every v_k is +-0).
CARBON_NORM_CLONES uint64_t min_nonzero_magnitude(const double* v, int64_t n) {
  uint64_t least = ~0ull;
  for (int64_t k = 0; k < n; ++k) least = std::min(least, (double_to_bits(v[k]) & ~kSignBit) - 1);  // +-0 wraps
  return least + 1;
}

// Whether an fp64 sum of terms is exact, by the test above. `least` is the
// smallest nonzero |term| (bits; every term is a normal double: a nonzero
// value of a supported format is at least 2^-149, a square 2^-298), `bits`
// the most significant bits a term has, so no term has a set bit below
// 2^(exponent(least) - bits + 1) =: 2^m. `abs_sum` is the fp64 absolute
// sum of the terms by a tree of depth d: the real one is at most
// abs_sum / (1 - gamma_d) < 2 abs_sum.
bool fp64_sum_is_exact(double sum, double abs_sum, uint64_t least, int bits) {
  if (least == 0 || sum == 0.0 || !is_finite(sum) || !is_finite(abs_sum)) return false;  // zeros: signs
  const int m = static_cast<int>(least >> 52) - 1023 - (bits - 1);
  return abs_sum < std::ldexp(1.0, m + 52);
}

// RN32(c / n) of an exact sum c held in one double.
double exact_mean_of(double c, int64_t n) {
  int64_t limb[kLimbs];
  uint32_t flags;
  exact_sum_clear(limb, flags);
  exact_sum_add(limb, flags, c);
  return exact_mean_round(limb, flags, n);
}

// The exact tier of RN32(sum v_k / n) for values v_k of at most `bits`
// significant bits whose fp64 sums (by the row's tree) are `sum` and
// `abs_sum`.
double exact_mean_of_values(const double* v, int64_t n, double sum, double abs_sum, int bits) {
  if (fp64_sum_is_exact(sum, abs_sum, min_nonzero_magnitude(v, n), bits)) return exact_mean_of(sum, n);
  return exact_mean(v, n);
}

// The exact tier of RN32(sum v_k^2 / n) for values v_k of at most `bits`
// significant bits whose exact squares' fp64 sum (by the row's tree) is
// `squares` (their own absolute sum). A square has at most 2 * bits
// significant bits, and the smallest nonzero one is the square of the
// smallest nonzero |v_k| (exact in fp64: at most 48 bits).
double exact_mean_of_squares(const double* v, int64_t n, double squares, int bits) {
  const uint64_t least = min_nonzero_magnitude(v, n);
  if (least != 0) {
    const double x = bits_to_double(least);
    if (fp64_sum_is_exact(squares, squares, double_to_bits(x * x), 2 * bits)) return exact_mean_of(squares, n);
  }
  return exact_mean_dot(v, v, n);
}

// Exact tier of RN32(sum (v_k - mu)^2 / n), finite v and mu.
double exact_mean_centered_squares(const double* v, double mu, int64_t n) {
  int64_t limb[kLimbs];
  uint32_t flags;
  exact_sum_clear(limb, flags);
  for (int64_t k = 0; k < n; ++k) add_centered_square(limb, flags, v[k], mu);
  return exact_mean_round(limb, flags, n);
}

std::vector<double> decode_param(const at::Tensor& p) {
  std::vector<double> out;
  if (!p.defined()) return out;
  out.resize(p.numel());
  with_element_type(p.scalar_type(), [&](auto element) {
    using T = decltype(element);
    decode_row(p.const_data_ptr<T>(), p.numel(), out.data());
  });
  return out;
}

template <typename F>
void store(double value, typename F::Bits* out) {
  *out = static_cast<typename F::Bits>(encode(round_double(value, F::get()), F::get()));
}

void store32(double value, float* out) {
  const uint32_t bits = encode(value, F32::get());
  std::memcpy(out, &bits, sizeof bits);
}

double load32(const float* p) {
  uint32_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return decode(bits, F32::get());
}

// Branch-free RN_f for the common case, so the elementwise loops vectorize:
// exact for v = +-0 or |v| in f's normal range with a finite result;
// anything else sets `bad` and the caller redoes the row with round_double.
template <typename F>
inline double round_fast(double v, uint64_t& bad) {
  constexpr FloatFormat f = F::get();
  const uint64_t u = double_to_bits(v), mag = u & ~kSignBit;
  const uint64_t r = round_normal_bits(mag, f);
  const bool ok = mag == 0 || ((mag - normal_min_bits(f)) < (overflow_bits(f) - normal_min_bits(f)) && r < overflow_bits(f));
  bad |= ok ? 0 : 1;
  return bits_to_double((u & kSignBit) | r);
}

// Bits in f of a value produced by round_fast (not bad).
template <typename F>
inline typename F::Bits encode_fast(double v) {
  constexpr FloatFormat f = F::get();
  const uint64_t u = double_to_bits(v), mag = u & ~kSignBit;
  const uint32_t sign = (u & kSignBit) ? (1u << (f.total_bits - 1)) : 0u;
  return static_cast<typename F::Bits>(sign | (mag == 0 ? 0u : encode_normal(mag, f)));
}

// One element of the backward rows: xhat_k and g_k (ln_xhat / rms_xhat and
// scaled_grad by round_fast, bad set where it does not apply) into xh and g,
// g into chain l of ss / sa (layer_norm only) and g xhat into chain l of ds /
// da: the portable loop's body, and the vector loops' tails (l = 0).
template <typename T, bool kRms, bool kW>
inline __attribute__((always_inline)) void backward_row_element(const T* x, const T* dy, int64_t k, int l, double mu,
                                                                double rs, const double* w, double* xh, double* g,
                                                                double* ss, double* sa, double* ds, double* da,
                                                                uint64_t& bad) {
  const double v = element_value(x[k]), d = element_value(dy[k]);
  const double h = round_fast<F32>(kRms ? v * rs : (v - mu) * rs, bad);
  const double q = kW ? round_fast<F32>(d * w[k], bad) : d;
  xh[k] = h;
  g[k] = q;
  if (!kRms) {
    ss[l] = ss[l] + q;
    sa[l] = sa[l] + abs_value(q);
  }
  const double p = q * h;
  ds[l] = ds[l] + p;
  da[l] = da[l] + abs_value(p);
}

// ---------------------------------------------------------------- row outputs, portable loop

// One forward output, y_k = RN_F(affine(xhat_k)), by round_fast (bad set
// where it does not apply): the portable loop's body, and the vector loops'
// tails.
template <typename F, bool kRms, bool kW, bool kB>
inline __attribute__((always_inline)) void forward_output_element(const double* v, int64_t k, double mu, double rs,
                                                                  const double* w, const double* b,
                                                                  typename F::Bits* out, uint64_t& bad) {
  const double xh = round_fast<F32>(kRms ? v[k] * rs : (v[k] - mu) * rs, bad);
  double y = kW ? xh * w[k] : xh;
  if (kB) y = y + b[k];
  out[k] = encode_fast<F>(round_fast<F>(y, bad));
}

// Outputs of one row, vectorized: y_k = RN_F(affine(xhat_k)) (forward) into
// out. Returns false (out partly written) if some value needs the general
// path. (A plain loop: the compiler vectorizes it as well as the lane form,
// which was slower here for bfloat16.)
template <typename F, bool kRms, bool kW, bool kB>
CARBON_NORM_CLONES bool forward_outputs_fast(const double* v, int64_t n, double mu, double rs, const double* w,
                                             const double* b, typename F::Bits* out) {
  uint64_t bad = 0;
  for (int64_t k = 0; k < n; ++k) {
    forward_output_element<F, kRms, kW, kB>(v, k, mu, rs, w, b, out, bad);
  }
  return bad == 0;
}

// ---------------------------------------------------------------- forward outputs, AVX-512

// GCC 12 reports the _mm512_undefined_pd() inside some conversion
// intrinsics as "may be used uninitialized" (a false positive in
// avx512fintrin.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The AVX-512 output loops round with the hardware conversions, which are
// IEEE roundings (correct for every finite value, subnormal results
// included) in the default MXCSR state, in which every op runs
// (csrc/exact/fp_env.h): the bits are round_double's.

// Lanes holding a NaN: the hardware keeps a NaN's sign and payload, Carbon
// writes the canonical NaN, so a row with one is redone by the general path.
CARBON_NORM_V4 inline __mmask8 nan_lanes(__m256 f) { return _mm256_fpclass_ps_mask(f, 0x81); }  // QNaN | SNaN

// Round to odd into float32 (truncate, then set the last bit when inexact):
// it keeps at least 13 bits below the last bit of bfloat16 and float16, so
// rounding the result to nearest-even in either gives RN of the double
// (rounding to odd with two or more extra bits never double-rounds). The
// inexact test looks at the 29 significand bits float32 drops, which is
// exact for |y| >= 2^-126 (above float32's range truncation gives its
// largest finite value, odd already, which rounds to infinity in both
// formats as RN does). Below 2^-126 the result may lack its sticky bit:
// bfloat16 flags those lanes (float32 subnormals; a zero result means
// |y| < 2^-149, which rounds to a zero of y's sign anyway), and float16
// rounds every such y to a zero of its sign whatever the sticky bit.
CARBON_NORM_V4 inline __m256i round_to_odd32(__m512d y) {
  const __m256i z = _mm256_castps_si256(_mm512_cvt_roundpd_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC));
  const __mmask8 inexact = _mm512_test_epi64_mask(_mm512_castpd_si512(y), _mm512_set1_epi64((1 << 29) - 1));
  return _mm256_mask_or_epi32(z, inexact, z, _mm256_set1_epi32(1));
}

// Lanes of a round_to_odd32 result that bfloat16 cannot take by the bit
// operations below: NaN, and float32 subnormals (whose sticky bit may be
// missing).
CARBON_NORM_V4 inline __mmask8 bf16_bad_lanes(__m256i u) {
  return _mm256_fpclass_ps_mask(_mm256_castsi256_ps(u), 0xA1);  // QNaN | SNaN | denormal
}

// RN_F of 8 doubles, stored as F's bits; lanes the caller must redo
// flagged in `bad`.
template <typename F>
CARBON_NORM_V4 inline void round_store_lanes(typename F::Bits* out, __m512d y, __mmask8& bad);
template <>
CARBON_NORM_V4 inline void round_store_lanes<F32>(uint32_t* out, __m512d y, __mmask8& bad) {
  const __m256 f = _mm512_cvtpd_ps(y);
  bad |= nan_lanes(f);
  _mm256_storeu_ps(reinterpret_cast<float*>(out), f);
}
// bfloat16 is the top half of float32: round_normal_bits on the float32
// bits (add 0x7FFF plus the last kept bit, truncate) is RN_bf16 of a normal
// float32; a carry out of the largest finite value gives the bits of
// infinity, RN's overflow; +-inf and +-0 stay themselves.
template <>
CARBON_NORM_V4 inline void round_store_lanes<Format<FormatId::kBFloat16>>(uint16_t* out, __m512d y, __mmask8& bad) {
  const __m256i u = round_to_odd32(y);
  bad |= bf16_bad_lanes(u);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd), 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtepi32_epi16(r));
}
// float16: the hardware float32 -> float16 conversion, to nearest-even
// (float16's subnormals included; a float32-subnormal or zero input is
// below half its smallest subnormal and gives a zero of its sign either
// way).
template <>
CARBON_NORM_V4 inline void round_store_lanes<Format<FormatId::kFloat16>>(uint16_t* out, __m512d y, __mmask8& bad) {
  const __m256i u = round_to_odd32(y);
  bad |= nan_lanes(_mm256_castsi256_ps(u));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm256_cvtps_ph(_mm256_castsi256_ps(u), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// The AVX-512 loops below are bound by the two 256-bit pipes that add and
// convert (Zen 4; a 512-bit addition or conversion takes both for a cycle),
// while the two multiply pipes have room: where a multiplication is exact,
// an addition can ride in a fused multiply-add there instead, with the same
// result. fma(a, b, c) rounds a b + c once; when the product a b is exact in
// fp64 that is the value of a (x) b (+) c, and IEEE 754 gives an exact zero
// the sign of the sum of the exact product and c, as the addition does.

// v (-) mu as fmsub(v, 1, mu): v 1 is exact.
CARBON_LANES_INLINE CARBON_NORM_V4 __m512d centered_lanes(__m512d v, __m512d mu) {
  return _mm512_fmsub_pd(v, _mm512_set1_pd(1.0), mu);
}

// affine() on 8 lanes: (xhat (x) w) (+) b. With both, one fma: xhat and w
// are float32 values (the weight has x's dtype), so their fp64 product is
// exact (48 bits, and at least 2^-298 in magnitude when nonzero, never
// subnormal in fp64).
template <bool kW, bool kB>
CARBON_LANES_INLINE CARBON_NORM_V4 __m512d affine_lanes(__m512d xh, const double* w, const double* b) {
  if (kW && kB) return _mm512_fmadd_pd(xh, _mm512_loadu_pd(w), _mm512_loadu_pd(b));
  if (kW) return _mm512_mul_pd(xh, _mm512_loadu_pd(w));
  if (kB) return _mm512_add_pd(xh, _mm512_loadu_pd(b));
  return xh;
}

// forward_outputs_fast, 8 elements at a time, for a thread in the default
// MXCSR state: x-hat = RN32 by the hardware conversion, y rounded by
// round_store_lanes (the same operations on each element; the tail as
// forward_outputs_fast). A NaN x-hat makes y NaN (x-hat (x) w (+) b), so
// only y is checked.
template <typename F, bool kRms, bool kW, bool kB>
CARBON_NORM_V4 bool forward_outputs_fast_v4(const double* v, int64_t n, double mu, double rs, const double* w,
                                            const double* b, typename F::Bits* out) {
  const __m512d vmu = _mm512_set1_pd(mu), vrs = _mm512_set1_pd(rs);
  __mmask8 bad_lanes = 0;
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m512d e = _mm512_loadu_pd(v + k);
    const __m512d p = kRms ? _mm512_mul_pd(e, vrs) : _mm512_mul_pd(centered_lanes(e, vmu), vrs);
    const __m512d xh = _mm512_cvtps_pd(_mm512_cvtpd_ps(p));
    const __m512d y = affine_lanes<kW, kB>(xh, w + k, b + k);
    round_store_lanes<F>(out + k, y, bad_lanes);
  }
  uint64_t bad = bad_lanes != 0;
  for (; k < n; ++k) {
    forward_output_element<F, kRms, kW, kB>(v, k, mu, rs, w, b, out, bad);
  }
  return bad == 0;
}

// forward_outputs_fast_v4 for bfloat16 output on CPUs with AVX512_BF16:
// the last step, RN_bf16 of the round-to-odd float32, by the hardware's
// float32 -> bfloat16 conversion (to nearest-even, NaN quieted, denormal
// inputs flushed -- those lanes are flagged as in the bit form above).
// The same loop otherwise; a separate function because the instruction
// needs its own target.
#define CARBON_NORM_V4_BF16 __attribute__((target("arch=x86-64-v4,avx512bf16")))
template <bool kRms, bool kW, bool kB>
CARBON_NORM_V4_BF16 bool forward_outputs_bf16_native(const double* v, int64_t n, double mu, double rs,
                                                     const double* w, const double* b, uint16_t* out) {
  const __m512d vmu = _mm512_set1_pd(mu), vrs = _mm512_set1_pd(rs);
  __mmask8 bad_lanes = 0;
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m512d e = _mm512_loadu_pd(v + k);
    const __m512d p = kRms ? _mm512_mul_pd(e, vrs) : _mm512_mul_pd(centered_lanes(e, vmu), vrs);
    const __m512d xh = _mm512_cvtps_pd(_mm512_cvtpd_ps(p));
    const __m512d y = affine_lanes<kW, kB>(xh, w + k, b + k);
    const __m256i u = round_to_odd32(y);
    bad_lanes |= bf16_bad_lanes(u);
    const __m128bh r = _mm256_cvtneps_pbh(_mm256_castsi256_ps(u));
    std::memcpy(out + k, &r, sizeof r);
  }
  using BF16 = Format<FormatId::kBFloat16>;
  uint64_t bad = bad_lanes != 0;
  for (; k < n; ++k) {
    forward_output_element<BF16, kRms, kW, kB>(v, k, mu, rs, w, b, out, bad);
  }
  return bad == 0;
}

bool has_avx512_bf16() {
  static const bool yes = __builtin_cpu_supports("avx512bf16");
  return yes;
}

// ---------------------------------------------------------------- backward rows, AVX-512 + default MXCSR

// 8 elements as float32 values (every supported format widens exactly).
template <typename T>
CARBON_LANES_INLINE CARBON_NORM_V4 __m256 decode_floats(const T* p);
template <>
CARBON_LANES_INLINE CARBON_NORM_V4 __m256 decode_floats(const float* p) {
  return _mm256_loadu_ps(p);
}
template <>
CARBON_LANES_INLINE CARBON_NORM_V4 __m256 decode_floats(const c10::BFloat16* p) {  // the top halves of float32s
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}
template <>
CARBON_LANES_INLINE CARBON_NORM_V4 __m256 decode_floats(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Backward, vectorized: decode x and dy, xhat_k and g_k (float32 values, the
// operations of ln_xhat / rms_xhat and scaled_grad, with the hardware float32
// roundings, IEEE in the default MXCSR state, so round_double's values for
// every input) into xh and g, and in the same pass the chain sums of g and of
// g xhat (chain_sums / chain_dot's chains: element k into lane k mod kChains
// in order, the tail into chain 0 afterwards, then fold_chains). Returns false
// if some xhat or g needs the general path (the caller then redoes the row). A row with a NaN x-hat or g is flagged
// (the general path then redoes it, as before). wf holds the weight as
// float32 values (w's values: the weight has x's dtype), for g below.
template <typename T, bool kRms, bool kW>
CARBON_NORM_V4 bool backward_row_fast_hw(const T* __restrict__ x, const T* __restrict__ dy, int64_t n, double mu,
                                         double rs, const double* __restrict__ w, const float* __restrict__ wf,
                                         double* __restrict__ xh, double* __restrict__ g, Sums* gs, Sums* gd) {
  constexpr bool kSums = !kRms;
  const __m512d vmu = _mm512_set1_pd(mu), vrs = _mm512_set1_pd(rs);
  __m512d ss = _mm512_setzero_pd(), sa = _mm512_setzero_pd(), ds = _mm512_setzero_pd(), da = _mm512_setzero_pd();
  __mmask8 bad_lanes = 0;
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const __m512d v = _mm512_cvtps_pd(decode_floats(x + k));
    const __m256 h32 = _mm512_cvtpd_ps(kRms ? _mm512_mul_pd(v, vrs) : _mm512_mul_pd(centered_lanes(v, vmu), vrs));
    bad_lanes |= nan_lanes(h32);
    const __m512d h = _mm512_cvtps_pd(h32);
    _mm512_storeu_pd(xh + k, h);
    // g = RN32(dy (x) w): dy and w are float32 values, so their fp64 product
    // is exact and its RN32 is the IEEE float32 product, one instruction
    // instead of a widening, an fp64 product and a narrowing (this loop is
    // bound by the pipes that convert and add).
    __m256 q32 = decode_floats(dy + k);
    if (kW) {
      q32 = _mm256_mul_ps(q32, _mm256_loadu_ps(wf + k));
      bad_lanes |= nan_lanes(q32);
    }
    const __m512d q = _mm512_cvtps_pd(q32);
    _mm512_storeu_pd(g + k, q);
    if (kSums) {
      ss = _mm512_add_pd(ss, q);
      sa = _mm512_add_pd(sa, _mm512_abs_pd(q));
    }
    // ds (+) g x-hat and da (+) |g x-hat| as fmas: g and x-hat are float32
    // values, so g x-hat and |g| |x-hat| = |g x-hat| are exact (same values;
    // see centered_lanes).
    ds = _mm512_fmadd_pd(q, h, ds);
    da = _mm512_fmadd_pd(_mm512_abs_pd(q), _mm512_abs_pd(h), da);
  }
  double ssc[kChains], sac[kChains], dsc[kChains], dac[kChains];
  _mm512_storeu_pd(ssc, ss);
  _mm512_storeu_pd(sac, sa);
  _mm512_storeu_pd(dsc, ds);
  _mm512_storeu_pd(dac, da);
  uint64_t bad = bad_lanes != 0;
  for (; k < n; ++k) backward_row_element<T, kRms, kW>(x, dy, k, 0, mu, rs, w, xh, g, ssc, sac, dsc, dac, bad);
  if (bad != 0) return false;
  if (kSums) *gs = {fold_chains(ssc), fold_chains(sac)};
  *gd = {fold_chains(dsc), fold_chains(dac)};
  return true;
}

// dx of one row (rms_dx / ln_dx), rounded with round_store_lanes (NaN lanes flagged).
template <typename F, bool kRms>
CARBON_NORM_V4 bool backward_outputs_fast_hw(const double* xh, const double* g, int64_t n, double A, double B,
                                             double rs, typename F::Bits* out) {
  const __m512d vA = _mm512_set1_pd(A), vB = _mm512_set1_pd(B), vrs = _mm512_set1_pd(rs);
  __mmask8 bad_lanes = 0;
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const __m512d h = _mm512_loadu_pd(xh + k), q = _mm512_loadu_pd(g + k);
    // rms_dx / ln_dx, the same operations lane by lane, the additions fused
    // (see centered_lanes): x-hat and B are float32 values (B = RN32 of a
    // mean), so xhat (x) B is exact and fnmadd(xhat, B, c) = c (-) (xhat (x) B);
    // g (-) A as centered_lanes(g, A).
    const __m512d c = kRms ? q : centered_lanes(q, vA);
    const __m512d dx = _mm512_mul_pd(vrs, _mm512_fnmadd_pd(h, vB, c));
    round_store_lanes<F>(out + k, dx, bad_lanes);
  }
  uint64_t bad = bad_lanes != 0;
  for (; k < n; ++k)
    out[k] = encode_fast<F>(round_fast<F>(kRms ? rms_dx(g[k], xh[k], B, rs) : ln_dx(g[k], xh[k], A, B, rs), bad));
  return bad == 0;
}

#pragma GCC diagnostic pop

// ---------------------------------------------------------------- row loops, AVX2 (x86-64-v3)
//
// The AVX-512 loops above, rewritten for CPUs with AVX2 + FMA + F16C and no
// AVX-512 (Zen 1-3, Haswell to Alder Lake), which otherwise run the portable
// loops. The bits are the same because the operations are: the kChains = 8
// chains are held as two registers of four doubles, lanes 0-3 and 4-7, so
// element k still goes into chain k mod 8, each chain receives the same
// additions in the same order, the tail goes into chain 0 afterwards and the
// chains are folded by fold_chains (the same fp64 sums, hence the same tier-1
// decisions). Every fused multiply-add below stands where the AVX-512 loop
// has one, for the same reason (the product is exact, see centered_lanes).
// The float32 roundings are the hardware conversions, IEEE round-to-nearest-
// even in the default MXCSR state in which every op runs. AVX2 has no mask
// registers and no per-instruction rounding mode: NaN lanes are found by
// unordered compares; float16 outputs take a round-to-odd float32 built from
// the nearest-even conversion (round_to_odd32_avx2), bfloat16 outputs an
// 8-bit rounding by Veltkamp's split (round_to_8_bits; both in
// csrc/exact/round16_avx2.h).
#define CARBON_NORM_AVX2 __attribute__((target("avx2,fma,f16c")))
#define CARBON_AVX2_INLINE inline __attribute__((always_inline)) CARBON_NORM_AVX2

// kChains lanes: lanes 0-3 and 4-7.
struct Lanes2 {
  __m256d lo, hi;
};

CARBON_AVX2_INLINE Lanes2 zero2() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
CARBON_AVX2_INLINE Lanes2 load2(const double* p) { return {_mm256_loadu_pd(p), _mm256_loadu_pd(p + 4)}; }
CARBON_AVX2_INLINE void store2(double* p, Lanes2 v) {
  _mm256_storeu_pd(p, v.lo);
  _mm256_storeu_pd(p + 4, v.hi);
}
CARBON_AVX2_INLINE __m256d abs4(__m256d v) { return _mm256_andnot_pd(_mm256_set1_pd(-0.0), v); }
CARBON_AVX2_INLINE Lanes2 add2(Lanes2 a, Lanes2 b) { return {_mm256_add_pd(a.lo, b.lo), _mm256_add_pd(a.hi, b.hi)}; }
CARBON_AVX2_INLINE Lanes2 abs2(Lanes2 v) { return {abs4(v.lo), abs4(v.hi)}; }
// c (+) a b in one rounding: only where a b is exact (then the same value).
CARBON_AVX2_INLINE Lanes2 fmadd2(Lanes2 a, Lanes2 b, Lanes2 c) {
  return {_mm256_fmadd_pd(a.lo, b.lo, c.lo), _mm256_fmadd_pd(a.hi, b.hi, c.hi)};
}
// Lanes holding a NaN, as all-ones lanes (accumulated by OR, tested once).
CARBON_AVX2_INLINE __m256d nan4(__m256d v) { return _mm256_cmp_pd(v, v, _CMP_UNORD_Q); }
CARBON_AVX2_INLINE __m256 nan8(__m256 v) { return _mm256_cmp_ps(v, v, _CMP_UNORD_Q); }

// 8 elements as float32 values (every supported format widens exactly:
// bfloat16 is the top half of a float32, float16 by the F16C conversion).
template <typename T>
CARBON_AVX2_INLINE __m256 floats8_avx2(const T* p);
template <>
CARBON_AVX2_INLINE __m256 floats8_avx2(const float* p) {
  return _mm256_loadu_ps(p);
}
template <>
CARBON_AVX2_INLINE __m256 floats8_avx2(const c10::BFloat16* p) {
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}
template <>
CARBON_AVX2_INLINE __m256 floats8_avx2(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The exact widening of 8 float32 values: lanes 0-3 and 4-7.
CARBON_AVX2_INLINE Lanes2 widen2(__m256 f) {
  return {_mm256_cvtps_pd(_mm256_castps256_ps128(f)), _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1))};
}

// element_value of 8 consecutive elements.
template <typename T>
CARBON_AVX2_INLINE Lanes2 decode2(const T* p) {
  return widen2(floats8_avx2(p));
}

// The partial chains of two registers as kChains doubles (for the tail and
// fold_chains).
CARBON_AVX2_INLINE void spill2(double* c, Lanes2 v) { store2(c, v); }

// chain_sums_v4.
CARBON_NORM_AVX2 Sums chain_sums_avx2(const double* v, int64_t n) {
  Lanes2 s = zero2(), a = zero2();
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const Lanes2 e = load2(v + k);
    s = add2(s, e);
    a = add2(a, abs2(e));
  }
  double sc[kChains], ac[kChains];
  spill2(sc, s);
  spill2(ac, a);
  for (; k < n; ++k) {
    sc[0] = sc[0] + v[k];
    ac[0] = ac[0] + abs_value(v[k]);
  }
  return {fold_chains(sc), fold_chains(ac)};
}

// chain_dot_v4 (exact products, added as separate operations like there).
CARBON_NORM_AVX2 Sums chain_dot_avx2(const double* x, const double* y, int64_t n) {
  Lanes2 s = zero2(), a = zero2();
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const Lanes2 xv = load2(x + k), yv = load2(y + k);
    const Lanes2 p = {_mm256_mul_pd(xv.lo, yv.lo), _mm256_mul_pd(xv.hi, yv.hi)};
    s = add2(s, p);
    a = add2(a, abs2(p));
  }
  double sc[kChains], ac[kChains];
  spill2(sc, s);
  spill2(ac, a);
  for (; k < n; ++k) {
    const double p = x[k] * y[k];
    sc[0] = sc[0] + p;
    ac[0] = ac[0] + abs_value(p);
  }
  return {fold_chains(sc), fold_chains(ac)};
}

// chain_squares_v4: d = v (-) c, then s (+) d (x) d, two roundings (d d is
// not exact for c != 0, so no fma here).
CARBON_NORM_AVX2 double chain_squares_avx2(const double* v, double c, int64_t n) {
  const __m256d vc = _mm256_set1_pd(c);
  Lanes2 s = zero2();
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const Lanes2 e = load2(v + k);
    const __m256d dl = _mm256_sub_pd(e.lo, vc), dh = _mm256_sub_pd(e.hi, vc);
    s = add2(s, {_mm256_mul_pd(dl, dl), _mm256_mul_pd(dh, dh)});
  }
  double sc[kChains];
  spill2(sc, s);
  for (; k < n; ++k) {
    const double d = v[k] - c;
    sc[0] = sc[0] + d * d;
  }
  return fold_chains(sc);
}

// decode_sums_v4.
template <typename T>
CARBON_NORM_AVX2 Sums decode_sums_avx2(const T* x, int64_t n, double* v) {
  Lanes2 s = zero2(), a = zero2();
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const Lanes2 e = decode2(x + k);
    store2(v + k, e);
    s = add2(s, e);
    a = add2(a, abs2(e));
  }
  double sc[kChains], ac[kChains];
  spill2(sc, s);
  spill2(ac, a);
  for (; k < n; ++k) {
    const double e = element_value(x[k]);
    v[k] = e;
    sc[0] = sc[0] + e;
    ac[0] = ac[0] + abs_value(e);
  }
  return {fold_chains(sc), fold_chains(ac)};
}

// decode_squares_v4: s (+) e e with e = e (-) 0.0 = e an element's value
// (-0 - 0 = -0, and the square is +0 either way), so the square is exact and
// one fma gives the same value as the product and the addition.
template <typename T>
CARBON_NORM_AVX2 double decode_squares_avx2(const T* x, int64_t n, double* v) {
  Lanes2 s = zero2();
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const Lanes2 e = decode2(x + k);
    store2(v + k, e);
    s = fmadd2(e, e, s);
  }
  double sc[kChains];
  spill2(sc, s);
  for (; k < n; ++k) {
    const double e = element_value(x[k]);
    v[k] = e;
    const double d = e - 0.0;
    sc[0] = sc[0] + d * d;
  }
  return fold_chains(sc);
}

// decode_moments_v4, the same two sets of chains (set 0 and set 1, each
// two registers) in the same order: for n >= 32, 16 elements per step into
// set 0 then set 1, then 8 at a time into set 0, the sets added lane-wise,
// the tail into chain 0, then fold_chains. So the sums, and the depth the
// callers assume, are those of the AVX-512 loop.
template <typename T>
CARBON_NORM_AVX2 Sums decode_moments_avx2(const T* x, int64_t n, double* v, double* squares) {
  Lanes2 s = zero2(), a = zero2(), q = zero2(), s1 = zero2(), a1 = zero2(), q1 = zero2();
  int64_t k = 0;
  auto step = [&](Lanes2& sum, Lanes2& abs_sum, Lanes2& square_sum, int64_t at) CARBON_NORM_AVX2 {
    const Lanes2 e = decode2(x + at);
    store2(v + at, e);
    sum = add2(sum, e);
    abs_sum = add2(abs_sum, abs2(e));
    square_sum = fmadd2(e, e, square_sum);  // e e exact (as decode_moments_v4)
  };
  if (n >= 32)
    for (; k + 2 * kChains <= n; k += 2 * kChains) {
      step(s, a, q, k);
      step(s1, a1, q1, k + kChains);
    }
  for (; k + kChains <= n; k += kChains) step(s, a, q, k);
  s = add2(s, s1);
  a = add2(a, a1);
  q = add2(q, q1);
  double sc[kChains], ac[kChains], qc[kChains];
  spill2(sc, s);
  spill2(ac, a);
  spill2(qc, q);
  for (; k < n; ++k) {
    const double e = element_value(x[k]);
    v[k] = e;
    sc[0] = sc[0] + e;
    ac[0] = ac[0] + abs_value(e);
    qc[0] = qc[0] + e * e;
  }
  *squares = fold_chains(qc);
  return {fold_chains(sc), fold_chains(ac)};
}

// RN_F of kChains doubles (lanes 0-3 in lo, 4-7 in hi), stored as F's bits;
// NaN lanes (the hardware keeps a NaN's sign and payload, Carbon writes the
// canonical NaN) and, for bfloat16, float32-subnormal lanes are OR-ed into
// `bad` for the caller to redo the row by the general path (as
// round_store_lanes flags them).
template <typename F>
CARBON_AVX2_INLINE void round_store2(typename F::Bits* out, Lanes2 y, __m256d& bad);
template <>
CARBON_AVX2_INLINE void round_store2<F32>(uint32_t* out, Lanes2 y, __m256d& bad) {
  const __m128 lo = _mm256_cvtpd_ps(y.lo), hi = _mm256_cvtpd_ps(y.hi);
  bad = _mm256_or_pd(bad, _mm256_or_pd(nan4(y.lo), nan4(y.hi)));
  _mm_storeu_ps(reinterpret_cast<float*>(out), lo);
  _mm_storeu_ps(reinterpret_cast<float*>(out) + 4, hi);
}
// bfloat16 and float16: csrc/exact/round16_avx2.h (RN to 8 bits by
// Veltkamp's split, then the hardware conversion; round to odd into float32,
// then F16C's nearest-even conversion).
template <>
CARBON_AVX2_INLINE void round_store2<Format<FormatId::kBFloat16>>(uint16_t* out, Lanes2 y, __m256d& bad) {
  round_store_bf16x8(out, y.lo, y.hi, &bad);
}
template <>
CARBON_AVX2_INLINE void round_store2<Format<FormatId::kFloat16>>(uint16_t* out, Lanes2 y, __m256d& bad) {
  round_store_f16x8(out, y.lo, y.hi, &bad);
}

// centered_lanes on 4 lanes: v (-) mu as fmsub(v, 1, mu).
CARBON_AVX2_INLINE __m256d centered4(__m256d v, __m256d mu) { return _mm256_fmsub_pd(v, _mm256_set1_pd(1.0), mu); }

// affine_lanes on 4 lanes (the fma only with both: xhat w exact).
template <bool kW, bool kB>
CARBON_AVX2_INLINE __m256d affine4(__m256d xh, const double* w, const double* b) {
  if (kW && kB) return _mm256_fmadd_pd(xh, _mm256_loadu_pd(w), _mm256_loadu_pd(b));
  if (kW) return _mm256_mul_pd(xh, _mm256_loadu_pd(w));
  if (kB) return _mm256_add_pd(xh, _mm256_loadu_pd(b));
  return xh;
}

// forward_outputs_fast_v4 on AVX2: x-hat = RN32 by the hardware conversion
// (4 doubles to 4 floats, IEEE), widened back exactly, y = affine, rounded
// by round_store2; the tail as forward_outputs_fast. A NaN x-hat makes y
// NaN, so only y is checked.
template <typename F, bool kRms, bool kW, bool kB>
CARBON_NORM_AVX2 bool forward_outputs_fast_avx2(const double* v, int64_t n, double mu, double rs, const double* w,
                                                const double* b, typename F::Bits* out) {
  const __m256d vmu = _mm256_set1_pd(mu), vrs = _mm256_set1_pd(rs);
  __m256d bad_lanes = _mm256_setzero_pd();
  int64_t k = 0;
  auto half = [&](int64_t at) CARBON_NORM_AVX2 {
    const __m256d e = _mm256_loadu_pd(v + at);
    const __m256d p = kRms ? _mm256_mul_pd(e, vrs) : _mm256_mul_pd(centered4(e, vmu), vrs);
    const __m256d xh = _mm256_cvtps_pd(_mm256_cvtpd_ps(p));
    return affine4<kW, kB>(xh, w + at, b + at);
  };
  for (; k + kChains <= n; k += kChains) round_store2<F>(out + k, {half(k), half(k + 4)}, bad_lanes);
  // (testz: round_store2's masks may be 32-bit lanes.)
  uint64_t bad = !_mm256_testz_si256(_mm256_castpd_si256(bad_lanes), _mm256_castpd_si256(bad_lanes));
  for (; k < n; ++k) {
    forward_output_element<F, kRms, kW, kB>(v, k, mu, rs, w, b, out, bad);
  }
  return bad == 0;
}

// backward_row_fast_hw on AVX2: the same operations lane by lane (x-hat and
// g by the hardware's float32 roundings; g = dy w as one float32 product,
// exact in fp64 before its rounding; the sums of g x-hat as fmas, g x-hat
// exact), the same chains (element k into lane k mod kChains, the tail into
// chain 0, fold_chains), NaN x-hat or g flagged.
template <typename T, bool kRms, bool kW>
CARBON_NORM_AVX2 bool backward_row_fast_avx2(const T* __restrict__ x, const T* __restrict__ dy, int64_t n,
                                             double mu, double rs, const double* __restrict__ w,
                                             const float* __restrict__ wf, double* __restrict__ xh,
                                             double* __restrict__ g, Sums* gs, Sums* gd) {
  constexpr bool kSums = !kRms;
  const __m256d vmu = _mm256_set1_pd(mu), vrs = _mm256_set1_pd(rs);
  Lanes2 ss = zero2(), sa = zero2(), ds = zero2(), da = zero2();
  __m256 bad_lanes = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) {
    const Lanes2 v = decode2(x + k);
    const __m256d pl = kRms ? _mm256_mul_pd(v.lo, vrs) : _mm256_mul_pd(centered4(v.lo, vmu), vrs);
    const __m256d ph = kRms ? _mm256_mul_pd(v.hi, vrs) : _mm256_mul_pd(centered4(v.hi, vmu), vrs);
    const __m256 h32 = _mm256_set_m128(_mm256_cvtpd_ps(ph), _mm256_cvtpd_ps(pl));
    bad_lanes = _mm256_or_ps(bad_lanes, nan8(h32));
    const Lanes2 h = widen2(h32);
    store2(xh + k, h);
    __m256 q32 = floats8_avx2(dy + k);
    if (kW) {
      q32 = _mm256_mul_ps(q32, _mm256_loadu_ps(wf + k));
      bad_lanes = _mm256_or_ps(bad_lanes, nan8(q32));
    }
    const Lanes2 q = widen2(q32);
    store2(g + k, q);
    if (kSums) {
      ss = add2(ss, q);
      sa = add2(sa, abs2(q));
    }
    ds = fmadd2(q, h, ds);
    da = fmadd2(abs2(q), abs2(h), da);
  }
  double ssc[kChains], sac[kChains], dsc[kChains], dac[kChains];
  spill2(ssc, ss);
  spill2(sac, sa);
  spill2(dsc, ds);
  spill2(dac, da);
  uint64_t bad = _mm256_movemask_ps(bad_lanes) != 0;
  for (; k < n; ++k) backward_row_element<T, kRms, kW>(x, dy, k, 0, mu, rs, w, xh, g, ssc, sac, dsc, dac, bad);
  if (bad != 0) return false;
  if (kSums) *gs = {fold_chains(ssc), fold_chains(sac)};
  *gd = {fold_chains(dsc), fold_chains(dac)};
  return true;
}

// backward_outputs_fast_hw on AVX2: dx = r (x) fnmadd(xhat, B, g (-) A)
// (xhat B exact), rounded by round_store2.
template <typename F, bool kRms>
CARBON_NORM_AVX2 bool backward_outputs_fast_avx2(const double* xh, const double* g, int64_t n, double A, double B,
                                                 double rs, typename F::Bits* out) {
  const __m256d vA = _mm256_set1_pd(A), vB = _mm256_set1_pd(B), vrs = _mm256_set1_pd(rs);
  __m256d bad_lanes = _mm256_setzero_pd();
  auto half = [&](int64_t at) CARBON_NORM_AVX2 {
    const __m256d h = _mm256_loadu_pd(xh + at), q = _mm256_loadu_pd(g + at);
    const __m256d c = kRms ? q : centered4(q, vA);
    return _mm256_mul_pd(vrs, _mm256_fnmadd_pd(h, vB, c));
  };
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains) round_store2<F>(out + k, {half(k), half(k + 4)}, bad_lanes);
  // (testz: round_store2's masks may be 32-bit lanes.)
  uint64_t bad = !_mm256_testz_si256(_mm256_castpd_si256(bad_lanes), _mm256_castpd_si256(bad_lanes));
  for (; k < n; ++k)
    out[k] = encode_fast<F>(round_fast<F>(kRms ? rms_dx(g[k], xh[k], B, rs) : ln_dx(g[k], xh[k], A, B, rs), bad));
  return bad == 0;
}

// ---------------------------------------------------------------- dispatch

// The scalar forms of the row loops (the previous code, which GCC
// vectorizes for AVX2): the same operations in the same order as the lane
// forms.
// sum v_k and sum |v_k|.
CARBON_NORM_PORTABLE Sums chain_sums_portable(const double* v, int64_t n) {
  double s[kChains] = {}, a[kChains] = {};
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains)
    for (int l = 0; l < kChains; ++l) {
      s[l] = s[l] + v[k + l];
      a[l] = a[l] + abs_value(v[k + l]);
    }
  for (; k < n; ++k) {
    s[0] = s[0] + v[k];
    a[0] = a[0] + abs_value(v[k]);
  }
  return {fold_chains(s), fold_chains(a)};
}

// sum a_k (x) b_k and sum |a_k (x) b_k| (exact products).
CARBON_NORM_PORTABLE Sums chain_dot_portable(const double* x, const double* y, int64_t n) {
  double s[kChains] = {}, a[kChains] = {};
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains)
    for (int l = 0; l < kChains; ++l) {
      const double p = x[k + l] * y[k + l];
      s[l] = s[l] + p;
      a[l] = a[l] + abs_value(p);
    }
  for (; k < n; ++k) {
    const double p = x[k] * y[k];
    s[0] = s[0] + p;
    a[0] = a[0] + abs_value(p);
  }
  return {fold_chains(s), fold_chains(a)};
}

// sum (v_k (-) c)^2 (c = 0: the exact squares).
CARBON_NORM_PORTABLE double chain_squares_portable(const double* v, double c, int64_t n) {
  double s[kChains] = {};
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains)
    for (int l = 0; l < kChains; ++l) {
      const double d = v[k + l] - c;
      s[l] = s[l] + d * d;
    }
  for (; k < n; ++k) {
    const double d = v[k] - c;
    s[0] = s[0] + d * d;
  }
  return fold_chains(s);
}

// decode_row then chain_sums_portable in one pass: the same operations in the same
// order (element k into chain k mod kChains, the tail into chain 0), so the
// same fp64 sums and the same tier-1 decisions, with the row read once.
template <typename T>
CARBON_NORM_PORTABLE Sums decode_sums_portable(const T* x, int64_t n, double* v) {
  double s[kChains] = {}, a[kChains] = {};
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains)
    for (int l = 0; l < kChains; ++l) {
      const double e = element_value(x[k + l]);
      v[k + l] = e;
      s[l] = s[l] + e;
      a[l] = a[l] + abs_value(e);
    }
  for (; k < n; ++k) {
    const double e = element_value(x[k]);
    v[k] = e;
    s[0] = s[0] + e;
    a[0] = a[0] + abs_value(e);
  }
  return {fold_chains(s), fold_chains(a)};
}

// decode_row then chain_squares_portable(v, 0.0, n) in one pass (same operations,
// same order, so the same fp64 sum).
template <typename T>
CARBON_NORM_PORTABLE double decode_squares_portable(const T* x, int64_t n, double* v) {
  double s[kChains] = {};
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains)
    for (int l = 0; l < kChains; ++l) {
      const double e = element_value(x[k + l]);
      v[k + l] = e;
      const double d = e - 0.0;
      s[l] = s[l] + d * d;
    }
  for (; k < n; ++k) {
    const double e = element_value(x[k]);
    v[k] = e;
    const double d = e - 0.0;
    s[0] = s[0] + d * d;
  }
  return fold_chains(s);
}

// Backward, vectorized: decode x and dy, xhat_k and g_k (float32 values, the
// operations of ln_xhat / rms_xhat and scaled_grad) into xh and g, with
// chain_sums_portable(g) (layer_norm only) and chain_dot_portable(g, xh) in the same pass: each
// sum adds element k into chain k mod kChains
// (the tail into chain 0) in the same order, so the fp64 sums, hence the
// tier-1 decisions, are the same bits. Returns false if some xhat or g needs
// the general path (xh, g, gs, gd then unusable: the caller redoes the row).
template <typename T, bool kRms, bool kW>
CARBON_NORM_PORTABLE bool backward_row_fast_portable(const T* x, const T* dy, int64_t n, double mu, double rs,
                                          const double* w, double* xh, double* g, Sums* gs, Sums* gd) {
  uint64_t bad = 0;
  double ss[kChains] = {}, sa[kChains] = {}, ds[kChains] = {}, da[kChains] = {};
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains)
    for (int l = 0; l < kChains; ++l)
      backward_row_element<T, kRms, kW>(x, dy, k + l, l, mu, rs, w, xh, g, ss, sa, ds, da, bad);
  for (; k < n; ++k) backward_row_element<T, kRms, kW>(x, dy, k, 0, mu, rs, w, xh, g, ss, sa, ds, da, bad);
  if (!kRms) *gs = {fold_chains(ss), fold_chains(sa)};
  *gd = {fold_chains(ds), fold_chains(da)};
  return bad == 0;
}

template <typename F, bool kRms>
CARBON_NORM_PORTABLE bool backward_outputs_fast_portable(const double* xh, const double* g,
                                                                              int64_t n, double A, double B,
                                                                              double rs, typename F::Bits* out) {
  uint64_t bad = 0;
  for (int64_t k = 0; k < n; ++k)
    out[k] = encode_fast<F>(round_fast<F>(kRms ? rms_dx(g[k], xh[k], B, rs) : ln_dx(g[k], xh[k], A, B, rs), bad));
  return bad == 0;
}

// CARBON_NORM_SCALAR=1 in the environment forces the scalar forms (so that an
// AVX-512 machine can check that both give the same bits).
bool use_lanes() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512cd") && std::getenv("CARBON_NORM_SCALAR") == nullptr &&
                          cpu::avx512_allowed();
  return yes;
}

// Otherwise the AVX2 loops where the CPU has AVX2 + FMA + F16C (and neither
// CARBON_CPU_NO_AVX2 nor CARBON_NORM_SCALAR is set), else the portable ones.
bool use_avx2() {
  static const bool yes = !use_lanes() && cpu::avx2() && std::getenv("CARBON_NORM_SCALAR") == nullptr;
  return yes;
}

Sums chain_sums(const double* v, int64_t n) {
  if (use_lanes()) return chain_sums_v4(v, n);
  return use_avx2() ? chain_sums_avx2(v, n) : chain_sums_portable(v, n);
}

Sums chain_dot(const double* x, const double* y, int64_t n) {
  if (use_lanes()) return chain_dot_v4(x, y, n);
  return use_avx2() ? chain_dot_avx2(x, y, n) : chain_dot_portable(x, y, n);
}

double chain_squares(const double* v, double c, int64_t n) {
  if (use_lanes()) return chain_squares_v4(v, c, n);
  return use_avx2() ? chain_squares_avx2(v, c, n) : chain_squares_portable(v, c, n);
}

template <typename T>
Sums decode_sums(const T* x, int64_t n, double* v) {
  if (use_lanes()) return decode_sums_v4(x, n, v);
  return use_avx2() ? decode_sums_avx2(x, n, v) : decode_sums_portable(x, n, v);
}

template <typename T>
double decode_squares(const T* x, int64_t n, double* v) {
  if (use_lanes()) return decode_squares_v4(x, n, v);
  return use_avx2() ? decode_squares_avx2(x, n, v) : decode_squares_portable(x, n, v);
}

template <typename T, bool kRms, bool kW>
bool backward_row_fast(const T* x, const T* dy, int64_t n, double mu, double rs, const double* w, const float* wf,
                       double* xh, double* g, Sums* gs, Sums* gd) {
  if (use_lanes()) return backward_row_fast_hw<T, kRms, kW>(x, dy, n, mu, rs, w, wf, xh, g, gs, gd);
  if (use_avx2()) return backward_row_fast_avx2<T, kRms, kW>(x, dy, n, mu, rs, w, wf, xh, g, gs, gd);
  return backward_row_fast_portable<T, kRms, kW>(x, dy, n, mu, rs, w, xh, g, gs, gd);
}

template <typename F, bool kRms>
bool backward_outputs_fast(const double* xh, const double* g, int64_t n, double A, double B, double rs,
                           typename F::Bits* out) {
  if (use_lanes()) return backward_outputs_fast_hw<F, kRms>(xh, g, n, A, B, rs, out);
  if (use_avx2()) return backward_outputs_fast_avx2<F, kRms>(xh, g, n, A, B, rs, out);
  return backward_outputs_fast_portable<F, kRms>(xh, g, n, A, B, rs, out);
}

// hw: use_lanes() (AVX-512), else use_avx2() picks the AVX2 loop.
template <typename F, bool kRms, bool kW, bool kB>
bool forward_outputs_any(bool hw, const double* v, int64_t n, double mu, double rs, const double* w, const double* b,
                         typename F::Bits* out) {
  if constexpr (std::is_same_v<F, Format<FormatId::kBFloat16>>)
    if (hw && has_avx512_bf16()) return forward_outputs_bf16_native<kRms, kW, kB>(v, n, mu, rs, w, b, out);
  if (hw) return forward_outputs_fast_v4<F, kRms, kW, kB>(v, n, mu, rs, w, b, out);
  if (use_avx2()) return forward_outputs_fast_avx2<F, kRms, kW, kB>(v, n, mu, rs, w, b, out);
  return forward_outputs_fast<F, kRms, kW, kB>(v, n, mu, rs, w, b, out);
}

// hw: use_lanes() (AVX-512 present).
template <typename F>
bool forward_outputs(bool hw, const double* v, int64_t n, double mu, double rs, const double* w, const double* b,
                     bool rms, typename F::Bits* out) {
  if (rms) return w ? forward_outputs_any<F, true, true, false>(hw, v, n, mu, rs, w, b, out)
                    : forward_outputs_any<F, true, false, false>(hw, v, n, mu, rs, w, b, out);
  if (w) return b ? forward_outputs_any<F, false, true, true>(hw, v, n, mu, rs, w, b, out)
                  : forward_outputs_any<F, false, true, false>(hw, v, n, mu, rs, w, b, out);
  return b ? forward_outputs_any<F, false, false, true>(hw, v, n, mu, rs, w, b, out)
           : forward_outputs_any<F, false, false, false>(hw, v, n, mu, rs, w, b, out);
}

// Rows per task: about 32K elements.
int64_t grain_for(int64_t n) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1)); }

template <typename T>
void forward_rows(const NormArgs& a, at::Tensor& y_tensor) {
  using F = typename FormatOf<T>::type;
  const int64_t rows = a.x.size(0), n = a.x.size(1);
  const T* x = a.x.const_data_ptr<T>();
  auto* y = static_cast<typename F::Bits*>(y_tensor.mutable_data_ptr());
  const std::vector<double> wv = decode_param(a.weight), bv = decode_param(a.bias);
  const double* w = wv.empty() ? nullptr : wv.data();
  const double* b = bv.empty() ? nullptr : bv.data();
  float* mean = a.rms ? nullptr : a.mean.mutable_data_ptr<float>();
  float* rstd = a.rstd.mutable_data_ptr<float>();
  const int64_t depth = chain_depth(n);
  constexpr int kBits = F::get().precision;  // significant bits of an element
  carbon::parallel_for(0, rows, grain_for(n), [&](int64_t begin, int64_t end) {
    std::vector<double> v(n);
    const bool lanes = use_lanes(), hw = lanes, avx2 = use_avx2();
    for (int64_t r = begin; r < end; ++r) {
      double mu = 0.0, var;
      if (a.rms) {
        const double squares = decode_squares(x + r * n, n, v.data());
        if (!mean_of_squares_fast(squares, n, depth, 0, &var)) var = exact_mean_of_squares(v.data(), n, squares, kBits);
      } else {
        // With AVX-512 or AVX2 the first pass also sums the squares, and most
        // rows' variance is decided from those moments without the centred
        // pass (both loops form the same sums).
        double squares = 0.0;
        const bool moments = lanes || avx2;
        const Sums s = lanes  ? decode_moments_v4(x + r * n, n, v.data(), &squares)
                       : avx2 ? decode_moments_avx2(x + r * n, n, v.data(), &squares)
                              : decode_sums(x + r * n, n, v.data());
        if (!mean_fast(s.sum, s.abs_sum, n, depth, &mu)) mu = exact_mean_of_values(v.data(), n, s.sum, s.abs_sum, kBits);
        if (!is_finite(mu))  // a row with an inf or a NaN
          var = canonical_nan();
        else if (moments && variance_from_moments(s.sum, s.abs_sum, squares, mu, n, depth, &var))
          ;
        else if (!mean_of_squares_fast(chain_squares(v.data(), mu, n), n, depth, 3, &var))
          var = exact_mean_centered_squares(v.data(), mu, n);
        store32(mu, mean + r);
      }
      const double rs = rstd_of(var, a.eps32);
      store32(rs, rstd + r);
      auto* out = y + r * n;
      if (forward_outputs<F>(hw, v.data(), n, mu, rs, w, b, a.rms, out)) continue;
      if (a.rms) {
        for (int64_t k = 0; k < n; ++k) store<F>(affine(rms_xhat(v[k], rs), w ? w + k : nullptr, nullptr), out + k);
      } else {
        for (int64_t k = 0; k < n; ++k)
          store<F>(affine(ln_xhat(v[k], mu, rs), w ? w + k : nullptr, b ? b + k : nullptr), out + k);
      }
    }
  });
}

// The backward of one row: dx into out; leaves xhat in xh or in the
// caller's row (which the fused column sums read).
template <typename T>
struct RowBackward {
  using F = typename FormatOf<T>::type;
  const NormArgs& a;
  const T* x;
  const T* dy;
  typename F::Bits* dx;
  const double* w;
  const float* mean;
  const float* rstd;
  int64_t n, depth;
  std::vector<double> xv, dv, xh, g;
  std::vector<float> wf;  // w as float32 (exact: the weight has x's dtype)

  RowBackward(const NormArgs& args, const T* x_, const T* dy_, typename F::Bits* dx_, const double* w_)
      : a(args), x(x_), dy(dy_), dx(dx_), w(w_), mean(args.rms ? nullptr : args.mean.const_data_ptr<float>()),
        rstd(args.rstd.const_data_ptr<float>()), n(args.x.size(1)), depth(chain_depth(n)), xv(n), dv(n), xh(n),
        g(n) {
    if (w) wf.assign(w, w + n);
  }

  // The row's x-hat goes to xh_out when given (the fused backward's block
  // buffer), else to xh.
  void run(int64_t r, double* xh_out = nullptr) {
    const double mu = a.rms ? 0.0 : load32(mean + r), rs = load32(rstd + r);
    const T* xr = x + r * n;
    const T* dr = dy + r * n;
    double* h = xh_out ? xh_out : xh.data();
    double* q = g.data();
    double* d = dv.data();
    Sums s, p;
    const float* wv = wf.data();
    const bool fast = a.rms ? (w ? backward_row_fast<T, true, true>(xr, dr, n, mu, rs, w, wv, h, q, &s, &p)
                                 : backward_row_fast<T, true, false>(xr, dr, n, mu, rs, w, wv, h, q, &s, &p))
                            : (w ? backward_row_fast<T, false, true>(xr, dr, n, mu, rs, w, wv, h, q, &s, &p)
                                 : backward_row_fast<T, false, false>(xr, dr, n, mu, rs, w, wv, h, q, &s, &p));
    if (!fast) {  // the general path, then the sums as before
      decode_row(xr, n, xv.data());
      decode_row(dr, n, d);
      for (int64_t k = 0; k < n; ++k) {
        h[k] = a.rms ? rms_xhat(xv[k], rs) : ln_xhat(xv[k], mu, rs);
        q[k] = scaled_grad(d[k], w ? w + k : nullptr);
      }
      if (!a.rms) s = chain_sums(q, n);
      p = chain_dot(q, h, n);
    }
    double A = 0.0, B;
    // g: dy (an element) or RN32(dy (x) w)
    const int g_bits = w ? F32::get().precision : F::get().precision;
    if (!a.rms && !mean_fast(s.sum, s.abs_sum, n, depth, &A)) A = exact_mean_of_values(q, n, s.sum, s.abs_sum, g_bits);
    if (!mean_fast(p.sum, p.abs_sum, n, depth, &B)) B = exact_mean_dot(q, h, n);
    auto* out = dx + r * n;
    if (a.rms ? backward_outputs_fast<F, true>(h, q, n, A, B, rs, out)
              : backward_outputs_fast<F, false>(h, q, n, A, B, rs, out))
      return;
    if (a.rms) {
      for (int64_t k = 0; k < n; ++k) store<F>(rms_dx(q[k], h[k], B, rs), out + k);
    } else {
      for (int64_t k = 0; k < n; ++k) store<F>(ln_dx(q[k], h[k], A, B, rs), out + k);
    }
  }
};

template <typename T>
void backward_rows(const NormArgs& a, const at::Tensor& dy_tensor, at::Tensor& dx_tensor) {
  using F = typename FormatOf<T>::type;
  const int64_t rows = a.x.size(0), n = a.x.size(1);
  const std::vector<double> wv = decode_param(a.weight);
  auto* dx = static_cast<typename F::Bits*>(dx_tensor.mutable_data_ptr());
  carbon::parallel_for(0, rows, grain_for(n), [&](int64_t begin, int64_t end) {
    RowBackward<T> row(a, a.x.const_data_ptr<T>(), dy_tensor.const_data_ptr<T>(), dx,
                       wv.empty() ? nullptr : wv.data());
    for (int64_t r = begin; r < end; ++r) row.run(r);
  });
}

// ---------------------------------------------------------------- dweight, dbias

// Columns summed side by side. The block width only partitions the columns
// among tiles: each column's partial is still the sum over its chunk's rows
// in row order, so the width changes no bit; wide blocks let a tile stream
// whole rows of x and dy (1024: a 768-wide row is one contiguous read).
constexpr int64_t kColumnBlock = 1024;
constexpr int64_t kRowChunk = 512;     // rows per partial sum

// decode_row then the xhat of each element in one pass (the same operations).
template <typename T, bool kRms>
CARBON_NORM_CLONES bool tile_xhat_fast(const T* x, int64_t width, double mu, double rs, double* xh) {
  uint64_t bad = 0;
  for (int64_t j = 0; j < width; ++j) {
    const double v = element_value(x[j]);
    xh[j] = round_fast<F32>(kRms ? v * rs : (v - mu) * rs, bad);
  }
  return bad == 0;
}

// Adds the dy * xhat (kW) and dy (kB) terms of R consecutive rows (dy rows
// `stride` apart, re-decoded from the cache; xhat rows `xh_stride` apart)
// into the partials of columns 0..width-1, with their absolute values, in
// row order (exact products of two float values). Each partial is loaded
// and stored once per R rows.
template <typename T, int R, bool kW, bool kB>
inline __attribute__((always_inline)) void add_row_group(const T* dy, int64_t stride, const double* xh,
                                                         int64_t xh_stride, int64_t width, double* __restrict__ sw,
                                                         double* __restrict__ aw, double* __restrict__ sb,
                                                         double* __restrict__ ab) {
  for (int64_t j = 0; j < width; ++j) {
    double d[R];
    for (int i = 0; i < R; ++i) d[i] = element_value(dy[i * stride + j]);
    if (kW) {
      double s = sw[j], a = aw[j];
      for (int i = 0; i < R; ++i) {
        const double p = d[i] * xh[i * xh_stride + j];
        s = s + p;
        a = a + abs_value(p);
      }
      sw[j] = s;
      aw[j] = a;
    }
    if (kB) {
      double s = sb[j], a = ab[j];
      for (int i = 0; i < R; ++i) {
        s = s + d[i];
        a = a + abs_value(d[i]);
      }
      sb[j] = s;
      ab[j] = a;
    }
  }
}

// add_row_group over rows 0..rows-1, four at a time.
template <typename T, bool kW, bool kB>
CARBON_NORM_CLONES void add_rows_to_columns(const T* dy, int64_t stride, const double* xh, int64_t xh_stride,
                                            int64_t rows, int64_t width, double* __restrict__ sw,
                                            double* __restrict__ aw, double* __restrict__ sb,
                                            double* __restrict__ ab) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    add_row_group<T, 4, kW, kB>(dy + r * stride, stride, xh + r * xh_stride, xh_stride, width, sw, aw, sb, ab);
  for (; r < rows; ++r)
    add_row_group<T, 1, kW, kB>(dy + r * stride, stride, xh + r * xh_stride, xh_stride, width, sw, aw, sb, ab);
}

// Per-column sums over rows [r0, r0 + count) of dy * xhat and dy (and their
// absolute values), one chain per column: partials of tile (chunk, block).
template <typename T>
void column_tile(const NormArgs& a, const T* x, const T* dy, int64_t r0, int64_t count, int64_t j0, int64_t width,
                 bool want_w, bool want_b, double* sw, double* aw, double* sb, double* ab) {
  const int64_t n = a.x.size(1);
  const float* mean = a.rms ? nullptr : a.mean.const_data_ptr<float>();
  const float* rstd = a.rstd.const_data_ptr<float>();
  for (int64_t j = 0; j < width; ++j) sw[j] = aw[j] = sb[j] = ab[j] = 0.0;
  double xh[kColumnBlock];
  for (int64_t r = r0; r < r0 + count; ++r) {
    const T* dr = dy + r * n + j0;
    if (want_w) {
      const T* xr = x + r * n + j0;
      const double mu = a.rms ? 0.0 : load32(mean + r), rs = load32(rstd + r);
      if (!(a.rms ? tile_xhat_fast<T, true>(xr, width, mu, rs, xh) : tile_xhat_fast<T, false>(xr, width, mu, rs, xh)))
        for (int64_t j = 0; j < width; ++j)
          xh[j] = a.rms ? rms_xhat(element_value(xr[j]), rs) : ln_xhat(element_value(xr[j]), mu, rs);
      if (want_b)
        add_rows_to_columns<T, true, true>(dr, n, xh, width, 1, width, sw, aw, sb, ab);
      else
        add_rows_to_columns<T, true, false>(dr, n, xh, width, 1, width, sw, aw, sb, ab);
    } else if (want_b) {
      add_rows_to_columns<T, false, true>(dr, n, xh, width, 1, width, sw, aw, sb, ab);
    }
  }
}

// Per-column partial sums over blocks of rows: block c's sums for column j
// at [c * n + j] (sw: dy * xhat, aw: |dy * xhat|, sb: dy, ab: |dy|), each
// the sum of its rows in row order.
struct ColumnPartials {
  int64_t blocks, n;
  std::unique_ptr<double[]> sw, aw, sb, ab;
  ColumnPartials(int64_t blocks_, int64_t n_)
      : blocks(blocks_), n(n_), sw(new double[blocks_ * n_]), aw(new double[blocks_ * n_]),
        sb(new double[blocks_ * n_]), ab(new double[blocks_ * n_]) {}
};

// sum[j] = s[0 * n + j] + s[1 * n + j] + ... (block order, from 0.0) and
// the same for the absolute partials a, for j < width.
CARBON_NORM_CLONES void add_block_partials_loop(const double* __restrict__ s, const double* __restrict__ a,
                                                int64_t blocks, int64_t n, int64_t width, double* __restrict__ sum,
                                                double* __restrict__ abs_sum) {
  for (int64_t j = 0; j < width; ++j) sum[j] = abs_sum[j] = 0.0;
  for (int64_t c = 0; c < blocks; ++c)
    for (int64_t j = 0; j < width; ++j) {
      sum[j] = sum[j] + s[c * n + j];
      abs_sum[j] = abs_sum[j] + a[c * n + j];
    }
}

void add_block_partials(const double* s, const double* a, int64_t blocks, int64_t n, int64_t width,
                        std::vector<double>& sum, std::vector<double>& abs_sum) {
  sum.resize(width);
  abs_sum.resize(width);
  add_block_partials_loop(s, a, blocks, n, width, sum.data(), abs_sum.data());
}

// dw[j] = RN(sum_r dy[r, j] * xhat[r, j]), db[j] = RN(sum_r dy[r, j]) from the
// partials of blocks of at most block_rows rows: each column adds its blocks'
// partials in block order (depth block_rows + blocks + 1) and decides; an
// undecided column is summed exactly (re-reading x and dy). The partition is
// a function of the shape alone, and either way the value is the correctly
// rounded exact sum.
template <typename T>
void finish_columns(const NormArgs& a, const at::Tensor& dy_tensor, const ColumnPartials& P, int64_t block_rows,
                    at::Tensor& dw_tensor, at::Tensor& db_tensor) {
  using F = typename FormatOf<T>::type;
  constexpr FloatFormat f = F::get();
  const int64_t rows = a.x.size(0), n = a.x.size(1), chunks = P.blocks;
  const int64_t depth = block_rows + chunks + 1;
  const T* x = a.x.const_data_ptr<T>();
  const T* dy = dy_tensor.const_data_ptr<T>();
  const bool want_w = dw_tensor.defined(), want_b = db_tensor.defined();
  const double *sw = P.sw.get(), *aw = P.aw.get(), *sb = P.sb.get(), *ab = P.ab.get();
  const float* mean = a.rms ? nullptr : a.mean.const_data_ptr<float>();
  const float* rstd = a.rstd.const_data_ptr<float>();
  auto* dw = want_w ? static_cast<typename F::Bits*>(dw_tensor.mutable_data_ptr()) : nullptr;
  auto* db = want_b ? static_cast<typename F::Bits*>(db_tensor.mutable_data_ptr()) : nullptr;
  carbon::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    // Each column's blocks added in block order, the columns side by side
    // (contiguous rows of the partials, so the loop vectorizes).
    const int64_t width = end - begin;
    std::vector<double> col_sw, col_aw, col_sb, col_ab;
    if (want_w) add_block_partials(sw + begin, aw + begin, chunks, n, width, col_sw, col_aw);
    if (want_b) add_block_partials(sb + begin, ab + begin, chunks, n, width, col_sb, col_ab);
    for (int64_t j = begin; j < end; ++j) {
      double value;
      if (want_w) {
        const double s_w = col_sw[j - begin], a_w = col_aw[j - begin];
        if (!reduce_round_fast(s_w, a_w, rows, depth, false, f, &value)) {
          int64_t limb[kLimbs];
          uint32_t flags;
          exact_sum_clear(limb, flags);
          for (int64_t r = 0; r < rows; ++r) {
            const double v = element_value(x[r * n + j]), rs = load32(rstd + r);
            const double xh = a.rms ? rms_xhat(v, rs) : ln_xhat(v, load32(mean + r), rs);
            exact_sum_add_product(limb, flags, element_value(dy[r * n + j]), xh);
          }
          value = exact_sum_round(limb, flags, f);
        }
        dw[j] = static_cast<typename F::Bits>(encode(value, f));
      }
      if (want_b) {
        const double s_b = col_sb[j - begin], a_b = col_ab[j - begin];
        if (!reduce_round_fast(s_b, a_b, rows, depth, false, f, &value)) {
          int64_t limb[kLimbs];
          uint32_t flags;
          exact_sum_clear(limb, flags);
          for (int64_t r = 0; r < rows; ++r) exact_sum_add(limb, flags, element_value(dy[r * n + j]));
          value = exact_sum_round(limb, flags, f);
        }
        db[j] = static_cast<typename F::Bits>(encode(value, f));
      }
    }
  });
}

// dweight, dbias alone: tiles of kRowChunk rows x kColumnBlock columns in
// parallel, then finish_columns.
template <typename T>
void param_grads(const NormArgs& a, const at::Tensor& dy_tensor, at::Tensor& dw_tensor, at::Tensor& db_tensor) {
  const int64_t rows = a.x.size(0), n = a.x.size(1);
  const T* x = a.x.const_data_ptr<T>();
  const T* dy = dy_tensor.const_data_ptr<T>();
  const bool want_w = dw_tensor.defined(), want_b = db_tensor.defined();
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  const int64_t blocks = (n + kColumnBlock - 1) / kColumnBlock;
  ColumnPartials P(chunks, n);
  carbon::parallel_for(0, chunks * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t c = tile / blocks, j0 = (tile % blocks) * kColumnBlock;
      const int64_t count = std::min(kRowChunk, rows - c * kRowChunk), width = std::min(kColumnBlock, n - j0);
      const int64_t o = c * n + j0;
      column_tile(a, x, dy, c * kRowChunk, count, j0, width, want_w, want_b, P.sw.get() + o, P.aw.get() + o,
                  P.sb.get() + o, P.ab.get() + o);
    }
  });
  finish_columns<T>(a, dy_tensor, P, kRowChunk, dw_tensor, db_tensor);
}

// ---------------------------------------------------------------- fused backward

// Rows per block of the fused backward's column partials. Fixed (not a
// function of the thread count), so the partials, hence the tier-1
// decisions, are the same for every thread count; and the value is the
// correctly rounded exact sum whatever decides it.
constexpr int64_t kGradBlock = 64;

// add_rows_to_columns on AVX-512, the same values: 16 columns at a time
// (two vectors per partial), their partials held in registers while the
// block's rows pass (no partial is loaded or stored per row, and the two
// vectors' chains interleave, so no addition waits on the previous one's
// latency). The dweight terms ride on the multiply pipes: dy and x-hat are
// float32 values, so dy x-hat and |dy| |x-hat| = |dy x-hat| are exact in
// fp64 and fma(dy, x-hat, s) = s (+) dy x-hat (see centered_lanes).
template <typename T, bool kW, bool kB>
CARBON_NORM_V4 void add_rows_to_columns_v4(const T* dy, int64_t stride, const double* xh, int64_t rows, int64_t n,
                                           double* sw, double* aw, double* sb, double* ab) {
  constexpr int V = 2;  // vectors of kChains columns per pass
  int64_t j = 0;
  for (; j + V * kChains <= n; j += V * kChains) {
    __m512d s[V], a[V], t[V], c[V];
    for (int q = 0; q < V; ++q) s[q] = a[q] = t[q] = c[q] = _mm512_setzero_pd();
    for (int64_t r = 0; r < rows; ++r) {
      const T* d = dy + r * stride + j;
      const double* h = xh + r * n + j;
      for (int q = 0; q < V; ++q) {
        const __m512d v = (__m512d)decode_lanes(d + q * kChains);
        if (kW) {
          const __m512d e = _mm512_loadu_pd(h + q * kChains);
          s[q] = _mm512_fmadd_pd(v, e, s[q]);
          a[q] = _mm512_fmadd_pd(_mm512_abs_pd(v), _mm512_abs_pd(e), a[q]);
        }
        if (kB) {
          t[q] = _mm512_add_pd(t[q], v);
          c[q] = _mm512_add_pd(c[q], _mm512_abs_pd(v));
        }
      }
    }
    for (int q = 0; q < V; ++q) {
      const int64_t at = j + q * kChains;
      if (kW) {
        _mm512_storeu_pd(sw + at, s[q]);
        _mm512_storeu_pd(aw + at, a[q]);
      }
      if (kB) {
        _mm512_storeu_pd(sb + at, t[q]);
        _mm512_storeu_pd(ab + at, c[q]);
      }
    }
  }
  if (j == n) return;
  // The last n mod 16 columns: partials from +0, as above.
  for (int64_t k = j; k < n; ++k) sw[k] = aw[k] = sb[k] = ab[k] = 0.0;
  add_rows_to_columns<T, kW, kB>(dy + j, stride, xh + j, n, rows, n - j, sw + j, aw + j, sb + j, ab + j);
}

// add_rows_to_columns_v4 on AVX2, the same values: 8 columns at a time (two
// registers of four per partial, eight accumulators), held in registers
// while the block's rows pass; each column's partial is the sum of its rows'
// terms in row order from +0, as in every form (dy x-hat exact, so the fma
// is the product and the addition). The last n mod 8 columns by
// add_rows_to_columns.
template <typename T, bool kW, bool kB>
CARBON_NORM_AVX2 void add_rows_to_columns_avx2(const T* dy, int64_t stride, const double* xh, int64_t rows,
                                               int64_t n, double* sw, double* aw, double* sb, double* ab) {
  int64_t j = 0;
  for (; j + kChains <= n; j += kChains) {
    Lanes2 s = zero2(), a = zero2(), t = zero2(), c = zero2();
    for (int64_t r = 0; r < rows; ++r) {
      const Lanes2 v = decode2(dy + r * stride + j);
      if (kW) {
        const Lanes2 e = load2(xh + r * n + j);
        s = fmadd2(v, e, s);
        a = fmadd2(abs2(v), abs2(e), a);
      }
      if (kB) {
        t = add2(t, v);
        c = add2(c, abs2(v));
      }
    }
    if (kW) {
      store2(sw + j, s);
      store2(aw + j, a);
    }
    if (kB) {
      store2(sb + j, t);
      store2(ab + j, c);
    }
  }
  if (j == n) return;
  for (int64_t k = j; k < n; ++k) sw[k] = aw[k] = sb[k] = ab[k] = 0.0;
  add_rows_to_columns<T, kW, kB>(dy + j, stride, xh + j, n, rows, n - j, sw + j, aw + j, sb + j, ab + j);
}

// The column partials of `rows` rows from +0: partials[j] = the rows' terms
// of column j added in row order.
template <typename T>
void block_partials(const T* dy, int64_t stride, const double* xh, int64_t rows, int64_t n, bool want_w,
                    bool want_b, double* sw, double* aw, double* sb, double* ab) {
  if (use_lanes()) {
    if (want_w && want_b) return add_rows_to_columns_v4<T, true, true>(dy, stride, xh, rows, n, sw, aw, sb, ab);
    if (want_w) return add_rows_to_columns_v4<T, true, false>(dy, stride, xh, rows, n, sw, aw, sb, ab);
    return add_rows_to_columns_v4<T, false, true>(dy, stride, xh, rows, n, sw, aw, sb, ab);
  }
  if (use_avx2()) {
    if (want_w && want_b) return add_rows_to_columns_avx2<T, true, true>(dy, stride, xh, rows, n, sw, aw, sb, ab);
    if (want_w) return add_rows_to_columns_avx2<T, true, false>(dy, stride, xh, rows, n, sw, aw, sb, ab);
    return add_rows_to_columns_avx2<T, false, true>(dy, stride, xh, rows, n, sw, aw, sb, ab);
  }
  std::fill(sw, sw + n, 0.0);
  std::fill(aw, aw + n, 0.0);
  std::fill(sb, sb + n, 0.0);
  std::fill(ab, ab + n, 0.0);
  if (want_w && want_b) return add_rows_to_columns<T, true, true>(dy, stride, xh, n, rows, n, sw, aw, sb, ab);
  if (want_w) return add_rows_to_columns<T, true, false>(dy, stride, xh, n, rows, n, sw, aw, sb, ab);
  return add_rows_to_columns<T, false, true>(dy, stride, xh, n, rows, n, sw, aw, sb, ab);
}

// dx, dweight and dbias in one pass over x and dy: blocks of kGradBlock rows
// in parallel; each block runs its rows' backward (the same per-row
// operations as backward_rows), keeping the rows' x-hat in a block buffer
// (kGradBlock rows: 384 KB for n = 768, in L2 with the block's dy), then
// sums the block's columns from there; then finish_columns. (Adding each
// row into the partials as it was done, four rows at a time, kept four
// rows' buffers and the partials in L1 together, which did not fit: the
// rows' own backward ran 1.5x slower.)
template <typename T>
void backward_fused(const NormArgs& a, const at::Tensor& dy_tensor, at::Tensor& dx_tensor, at::Tensor& dw_tensor,
                    at::Tensor& db_tensor) {
  using F = typename FormatOf<T>::type;
  const int64_t rows = a.x.size(0), n = a.x.size(1);
  const bool want_w = dw_tensor.defined(), want_b = db_tensor.defined();
  const int64_t blocks = (rows + kGradBlock - 1) / kGradBlock;
  ColumnPartials P(blocks, n);
  const std::vector<double> wv = decode_param(a.weight);
  auto* dx = static_cast<typename F::Bits*>(dx_tensor.mutable_data_ptr());
  const T* dy = dy_tensor.const_data_ptr<T>();
  const int64_t grain = std::max<int64_t>(1, grain_for(n) / kGradBlock);
  carbon::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    RowBackward<T> row(a, a.x.const_data_ptr<T>(), dy, dx, wv.empty() ? nullptr : wv.data());
    std::vector<double> xh(kGradBlock * n);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t r0 = c * kGradBlock, count = std::min(rows, r0 + kGradBlock) - r0;
      for (int64_t i = 0; i < count; ++i) row.run(r0 + i, xh.data() + i * n);
      block_partials<T>(dy + r0 * n, n, xh.data(), count, n, want_w, want_b, P.sw.get() + c * n,
                        P.aw.get() + c * n, P.sb.get() + c * n, P.ab.get() + c * n);
    }
  });
  finish_columns<T>(a, dy_tensor, P, kGradBlock, dw_tensor, db_tensor);
}

}  // namespace

void norm_param_grads_cpu(const NormArgs& a, const at::Tensor& dy, at::Tensor& dw, at::Tensor& db) {
  with_element_type(a.x.scalar_type(), [&](auto element) { param_grads<decltype(element)>(a, dy, dw, db); });
}

void norm_forward_cpu(const NormArgs& a, at::Tensor& y) {
  with_element_type(a.x.scalar_type(), [&](auto element) { forward_rows<decltype(element)>(a, y); });
}

void norm_backward_cpu(const NormArgs& a, const at::Tensor& dy, at::Tensor& dx) {
  with_element_type(a.x.scalar_type(), [&](auto element) { backward_rows<decltype(element)>(a, dy, dx); });
}

void norm_backward_fused_cpu(const NormArgs& a, const at::Tensor& dy, at::Tensor& dx, at::Tensor& dw,
                             at::Tensor& db) {
  with_element_type(a.x.scalar_type(),
                    [&](auto element) { backward_fused<decltype(element)>(a, dy, dx, dw, db); });
}

}  // namespace carbon
