// Products with few rows per batch (M <= kFewRows) on the CPU, computed
// directly from b as it lies in memory: a decoding step (one token's
// activations times each weight), a small batch through nn.Linear. The
// general path widens all of b into an fp64 copy with per-column statistics
// before its GEMM: ~0.8-1.4 ns per element of b on the 2-core Zen 3 VM,
// which for one row of a was 6-13x torch's whole product (measured
// 1 x 768 x 768: 456 us against 70 us for x W^T; 808 us against 70 for x W).
// Here b is read where it lies, widened in registers (with more than four
// rows, a chunk at a time into a 16 KB buffer first) and multiplied into
// fp64 sums; nothing else of size K x N is written.
//
// For output (i, j), c = bias_ij + sum_k a_ik b_kj, the result is RN_f(c) by
// the general path's tier 1 (matmul_kernel.h): s = an fp64 evaluation of the
// sum (each product exact in fp64; any order, so any blocking or vector
// width) within gamma_{K+1} * (|a_i| |b_j| + |bias_ij|) of c (Cauchy-Schwarz
// with the 2-norms of a's row and b's column, computed here the same way as
// the general path's, sqrt of an fp64 sum of squares; kBoundSlack covers
// their rounding). decide_block (branch-free, f's normal range) decides
// almost every output; the rest go through matmul_round_fast (zero rows and
// columns by the sign rule, the general interval test) and then the exact
// accumulator, one output at a time. Whichever decides, the output is
// RN_f(c), so this path, the general one and any thread count give the same
// bits (tests/test_mm_few_rows.py: the oracle, the general path, rows alone
// against rows in large products, AVX2 against the portable loop; and
// tests/test_mm_exact.py runs its cases through both paths).
//
// b's layouts: rows contiguous (x W with W [K, N], HF's Conv1D) -- eight
// columns at a time as a row of eight values per k (axpy form); columns
// contiguous (x W^T with W [N, K], nn.Linear) -- four columns at a time,
// each a dot product over k in four lanes. Other strides: the general path.
#include "matmul_few_rows.h"

#include <ATen/ops/empty.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "../cpu_features.h"
#include "../dtypes.h"
#include "../exact/decide_block.h"
#include "../exact/exact_sum.h"
#include "../exact/fp_env.h"
#include "../exact/widen_avx2.h"
#include "../reduce/reduce_kernel.h"
#include "matmul_cpu.h"
#include "matmul_kernel.h"

namespace carbon {
namespace {

constexpr int64_t kBlock = 64;  // columns of one task: outputs decided together
constexpr int64_t kRowChunk = 32;  // rows of b (rows contiguous) a task takes at a time

// What a task computes for its block of columns: s[i * kBlock + c] the fp64
// sum for row i, column c (without the bias), and each column's 2-norm. The
// columns' RowSigns (matmul_kernel.h) matter only for an output whose row or
// column is all zeros, so column_signs finds them when such an output first
// needs them.
struct BlockSums {
  double s[kFewRows * kBlock];
  double b_norm[kBlock];
  uint8_t b_signs[kBlock];
  bool signs_known;
};

// b's element (k, c) of the task's block: at b[k * sk + c * sc].
template <typename TB>
struct BlockOperand {
  const TB* b;
  int64_t sk, sc;
};

uint8_t signs_of_bits(uint64_t any_bits, uint64_t all_bits) {
  return static_cast<uint8_t>(((all_bits & kSignBit) == 0 ? kSomePositive : 0) |
                              ((any_bits & kSignBit) != 0 ? kSomeNegative : 0));
}

template <typename TB>
uint8_t column_signs(const BlockOperand<TB>& b, int64_t K, int64_t c) {
  uint64_t any_bits = 0, all_bits = ~uint64_t{0};
  for (int64_t k = 0; k < K; ++k) {
    const uint64_t x = double_to_bits(element_value(b.b[k * b.sk + c * b.sc]));
    any_bits |= x;
    all_bits &= x;
  }
  return signs_of_bits(any_bits, all_bits);
}

// Columns [c0, c1) of the block, one value at a time (the portable path, and
// the columns the vector loops leave).
template <typename TB>
void block_columns_scalar(const double* a, int64_t M, int64_t K, const BlockOperand<TB>& b, int64_t c0, int64_t c1,
                          BlockSums& out) {
  for (int64_t c = c0; c < c1; ++c) {
    const TB* col = b.b + c * b.sc;
    double squares = 0.0;
    for (int64_t k = 0; k < K; ++k) {
      const double x = element_value(col[k * b.sk]);
      squares = squares + x * x;
    }
    out.b_norm[c] = std::sqrt(squares);
    for (int64_t i = 0; i < M; ++i) {
      const double* ai = a + i * K;
      double sum = 0.0;
      for (int64_t k = 0; k < K; ++k) sum = sum + ai[k] * element_value(col[k * b.sk]);
      out.s[i * kBlock + c] = sum;
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define CARBON_FEW_ROWS_AVX2 1
#define CARBON_AVX2 __attribute__((target("avx2,fma,f16c")))
#define CARBON_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

// The loops below each convert b's values once per group of rows and
// multiply them into 4-lane fp64 accumulators; the first group of rows also
// sums the squares (the columns' norms) from the same registers, so that b
// is widened once for M <= 4 (a separate pass for the norms and signs cost
// about as much as the products: measured ~0.2 ns per element each, one
// thread). The loops over rows and columns of registers carry "#pragma GCC
// unroll": without it gcc 12 kept the accumulator arrays in memory and
// stored every one of them on each k (M = 4 ran at a third of the speed).

CARBON_AVX2_INLINE double sum4(__m256d x) {
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(x), _mm256_extractf128_pd(x, 1));
  return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

// Rows contiguous: columns c .. c + 7 over rows k0 .. k0 + kc - 1 of b,
// added to the running sums s (zero when first) of R <= 4 rows of a (lda
// apart), and with kNorms the squares to the running sums q[0, 8); b's rows
// sk elements apart (b itself, or block_avx2's packed chunk). R <= 2: two
// sets of accumulators (even and odd k), so that enough fma chains are in
// flight.
template <int R, bool kNorms>
struct Rows8 {
  __m256d lo[R], hi[R], q_lo, q_hi;
};

template <int R, bool kNorms, typename TB>
CARBON_AVX2_INLINE void fma_rows8(const double* a, int64_t lda, int64_t k, const TB* bk, Rows8<R, kNorms>& acc) {
  const Doubles8 x = widen8x2(bk);
  if (kNorms) {
    acc.q_lo = _mm256_fmadd_pd(x.lo, x.lo, acc.q_lo);
    acc.q_hi = _mm256_fmadd_pd(x.hi, x.hi, acc.q_hi);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m256d ar = _mm256_broadcast_sd(a + r * lda + k);
    acc.lo[r] = _mm256_fmadd_pd(ar, x.lo, acc.lo[r]);
    acc.hi[r] = _mm256_fmadd_pd(ar, x.hi, acc.hi[r]);
  }
}

template <int R, bool kNorms, typename TB>
CARBON_AVX2 void products_rows8(const double* a, int64_t lda, int64_t kc, const TB* b, int64_t sk, bool first,
                                double* s, double* q) {
  constexpr bool kTwoSets = R <= 2;
  Rows8<R, kNorms> e, o;
  const __m256d zero = _mm256_setzero_pd();
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    e.lo[r] = first ? zero : _mm256_loadu_pd(s + r * kBlock);
    e.hi[r] = first ? zero : _mm256_loadu_pd(s + r * kBlock + 4);
    o.lo[r] = o.hi[r] = zero;
  }
  e.q_lo = kNorms ? _mm256_loadu_pd(q) : zero;
  e.q_hi = kNorms ? _mm256_loadu_pd(q + 4) : zero;
  o.q_lo = o.q_hi = zero;
  int64_t k = 0;
  if (kTwoSets) {
    for (; k + 2 <= kc; k += 2) {
      fma_rows8(a, lda, k, b + k * sk, e);
      fma_rows8(a, lda, k + 1, b + (k + 1) * sk, o);
    }
  }
  for (; k < kc; ++k) fma_rows8(a, lda, k, b + k * sk, e);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_pd(s + r * kBlock, kTwoSets ? _mm256_add_pd(e.lo[r], o.lo[r]) : e.lo[r]);
    _mm256_storeu_pd(s + r * kBlock + 4, kTwoSets ? _mm256_add_pd(e.hi[r], o.hi[r]) : e.hi[r]);
  }
  if (kNorms) {
    _mm256_storeu_pd(q, kTwoSets ? _mm256_add_pd(e.q_lo, o.q_lo) : e.q_lo);
    _mm256_storeu_pd(q + 4, kTwoSets ? _mm256_add_pd(e.q_hi, o.q_hi) : e.q_hi);
  }
}

template <bool kNorms, typename TB>
CARBON_AVX2 void products_rows8_any(int64_t R, const double* a, int64_t lda, int64_t kc, const TB* b, int64_t sk,
                                    bool first, double* s, double* q) {
  switch (R) {
    case 4: return products_rows8<4, kNorms>(a, lda, kc, b, sk, first, s, q);
    case 3: return products_rows8<3, kNorms>(a, lda, kc, b, sk, first, s, q);
    case 2: return products_rows8<2, kNorms>(a, lda, kc, b, sk, first, s, q);
    default: return products_rows8<1, kNorms>(a, lda, kc, b, sk, first, s, q);
  }
}

// Columns contiguous: columns c .. c + 3, each a dot product over k in four
// lanes (the k mod 4 tail added lane by lane at the end), for R rows of a
// (lda apart); with kNorms (R = 1, the first row) also the columns' squares.
// 4R accumulators (plus 4).
template <int R, bool kNorms, typename TB>
CARBON_AVX2 void products_columns4(const double* a, int64_t lda, int64_t K, const TB* b, int64_t sc, double* s,
                                   double* norm) {
  __m256d acc[R][4], q[4];
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    q[c] = _mm256_setzero_pd();
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r][c] = _mm256_setzero_pd();
  }
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    __m256d x[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      x[c] = widen4(b + c * sc + k);
      if (kNorms) q[c] = _mm256_fmadd_pd(x[c], x[c], q[c]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256d ar = _mm256_loadu_pd(a + r * lda + k);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_fmadd_pd(ar, x[c], acc[r][c]);
    }
  }
  for (int c = 0; c < 4; ++c) {
    double squares = sum4(q[c]);
    for (int r = 0; r < R; ++r) {
      double sum = sum4(acc[r][c]);
      for (int64_t t = k; t < K; ++t) sum = sum + a[r * lda + t] * element_value(b[c * sc + t]);
      s[r * kBlock + c] = sum;
    }
    if (kNorms) {
      for (int64_t t = k; t < K; ++t) {
        const double x = element_value(b[c * sc + t]);
        squares = squares + x * x;
      }
      norm[c] = std::sqrt(squares);
    }
  }
}

// Rows [0, kc) of b's chunk, columns [0, strips) (a multiple of 8),
// widened into packed[k * kBlock + c].
template <typename TB>
CARBON_AVX2 void pack_rows(const TB* b, int64_t sk, int64_t kc, int64_t strips, double* packed) {
  for (int64_t k = 0; k < kc; ++k)
    for (int64_t c = 0; c < strips; c += 8) {
      const Doubles8 x = widen8x2(b + k * sk + c);
      _mm256_store_pd(packed + k * kBlock + c, x.lo);
      _mm256_store_pd(packed + k * kBlock + c + 4, x.hi);
    }
}

template <typename TB>
CARBON_AVX2 void block_avx2(const double* a, int64_t M, int64_t K, const BlockOperand<TB>& b, int64_t width,
                            BlockSums& out) {
  int64_t c = 0;
  if (b.sc == 1) {
    const int64_t strips = width / 8 * 8;
    double squares[kBlock] = {};
    alignas(64) double packed[kRowChunk * kBlock];
    // More than one group of rows: each chunk widened once into `packed`
    // (rows kBlock doubles apart, 16 KB), which every group then reads from
    // L1. Read in place instead, rows of b N elements apart fall into a few
    // of L1's sets (N = 768: 3 KB apart, 4 of 64 sets; N = 3072: 12 KB, one
    // set), so the chunk did not stay in L1 across the groups (measured, one
    // thread, 8 x 768 x 768: 605 -> 428 us). One group reads b once either
    // way, and packing would be a pass more (1 x 3072 x 768: 815 -> 1534 us).
    const bool pack = M > 4;
    for (int64_t k0 = 0; k0 < K; k0 += kRowChunk) {
      const int64_t kc = std::min(kRowChunk, K - k0);
      const TB* bk = b.b + k0 * b.sk;
      if (pack) pack_rows(bk, b.sk, kc, strips, packed);
      for (c = 0; c < strips; c += 8) {
        double* s_cols = out.s + c;
        if (pack) {
          products_rows8_any<true>(4, a + k0, K, kc, packed + c, kBlock, k0 == 0, s_cols, squares + c);
          for (int64_t r = 4; r < M; r += 4)
            products_rows8_any<false>(std::min<int64_t>(4, M - r), a + r * K + k0, K, kc, packed + c, kBlock, k0 == 0,
                                      s_cols + r * kBlock, nullptr);
        } else {
          products_rows8_any<true>(M, a + k0, K, kc, bk + c, b.sk, k0 == 0, s_cols, squares + c);
        }
      }
    }
    for (c = 0; c < strips; ++c) out.b_norm[c] = std::sqrt(squares[c]);
  } else {
    for (; c + 4 <= width; c += 4) {
      const TB* bc = b.b + c * b.sc;
      double* s_cols = out.s + c;
      products_columns4<1, true>(a, K, K, bc, b.sc, s_cols, out.b_norm + c);
      for (int64_t r = 1; r < M; r += 2) {
        if (M - r >= 2) products_columns4<2, false>(a + r * K, K, K, bc, b.sc, s_cols + r * kBlock, nullptr);
        else products_columns4<1, false>(a + r * K, K, K, bc, b.sc, s_cols + r * kBlock, nullptr);
      }
    }
  }
  block_columns_scalar(a, M, K, b, c, width, out);
}

#undef CARBON_AVX2
#undef CARBON_AVX2_INLINE
#endif

template <typename TB>
void block_sums(const double* a, int64_t M, int64_t K, const BlockOperand<TB>& b, int64_t width, BlockSums& out) {
  out.signs_known = false;
#ifdef CARBON_FEW_ROWS_AVX2
  if (cpu::avx2()) return block_avx2(a, M, K, b, width, out);
#endif
  block_columns_scalar(a, M, K, b, 0, width, out);
}

// RN_f(c) for one output by the exact accumulator.
template <typename TB>
double exact_output(const double* ai, int64_t K, const TB* col, int64_t sk, const double* bias, const FloatFormat& f) {
  int64_t limb[kLimbs];
  uint32_t flags;
  exact_sum_clear(limb, flags);
  for (int64_t k = 0; k < K; ++k) exact_sum_add_product(limb, flags, ai[k], element_value(col[k * sk]));
  if (bias) exact_sum_add(limb, flags, *bias);
  return exact_sum_round(limb, flags, f);
}

template <typename TB, typename F>
void few_rows_products(const at::Tensor& a64, const at::Tensor& a_norms, const at::Tensor& a_row_signs,
                       const at::Tensor& b3, const at::Tensor& bias64, at::Tensor& out) {
  constexpr FloatFormat f = F::get();
  const int64_t B = b3.size(0), K = b3.size(1), N = b3.size(2), M = a64.size(1);
  const double* a = a64.const_data_ptr<double>();  // [B, M, K], contiguous
  const double* a_norm = a_norms.const_data_ptr<double>();
  const uint8_t* a_signs = a_row_signs.const_data_ptr<uint8_t>();
  const TB* b = b3.const_data_ptr<TB>();
  const int64_t sbb = b3.stride(0), sbk = b3.stride(1), sbn = b3.stride(2);
  const double* bias = bias64.defined() ? bias64.const_data_ptr<double>() : nullptr;  // [B, M, N], expanded
  const int64_t sxb = bias ? bias64.stride(0) : 0, sxm = bias ? bias64.stride(1) : 0, sxn = bias ? bias64.stride(2) : 0;
  auto* o = static_cast<typename F::Bits*>(out.mutable_data_ptr());
  const double factor = fp64_gemm_gamma(K, bias != nullptr);
  const int64_t blocks = (N + kBlock - 1) / kBlock;
  // About 2^18 products per task at least (~0.1 ms), so that small products
  // stay on one thread.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / (M * kBlock * K));
  carbon::parallel_for(0, B * blocks, grain, [&](int64_t begin, int64_t end) {
    BlockSums sums;
    double approx[kBlock], abs_bound[kBlock];
    uint8_t pending[kBlock];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bi = task / blocks, j0 = (task % blocks) * kBlock, width = std::min(kBlock, N - j0);
      const double* ab = a + bi * M * K;
      const BlockOperand<TB> operand{b + bi * sbb + j0 * sbn, sbk, sbn};
      block_sums(ab, M, K, operand, width, sums);
      // The view matmul_round_fast reads for the outputs decide_block leaves:
      // this block's sums as a [1, M, kBlock] GEMM result.
      MatmulView v{};
      v.approx = sums.s;
      v.a_norm = a_norm + bi * M;
      v.b_norm = sums.b_norm;
      v.a_signs = a_signs + bi * M;
      v.b_signs = sums.b_signs;
      v.bias = bias ? bias + bi * sxb + j0 * sxn : nullptr;
      v.bias_stride_m = sxm;
      v.bias_stride_n = sxn;
      v.B = 1, v.M = M, v.N = kBlock, v.K = K;
      v.gemm_gamma = factor;
      for (int64_t i = 0; i < M; ++i) {
        const double* si = sums.s + i * kBlock;
        const double na = a_norm[bi * M + i];
        const double* bias_row = v.bias ? v.bias + i * sxm : nullptr;
        for (int64_t c = 0; c < width; ++c) {
          const double x = bias_row ? bias_row[c * sxn] : 0.0;
          approx[c] = bias_row ? si[c] + x : si[c];
          abs_bound[c] = abs_sum_bound(na, sums.b_norm[c], x);
        }
        typename F::Bits* out_row = o + (bi * M + i) * N + j0;
        if (decide_block<F>(approx, abs_bound, factor, width, out_row, pending)) continue;
        for (int64_t c = 0; c < width; ++c) {
          if (!pending[c]) continue;
          if (!sums.signs_known && is_finite(na) && is_finite(sums.b_norm[c]) && (na == 0.0 || sums.b_norm[c] == 0.0)) {
            for (int64_t l = 0; l < width; ++l) sums.b_signs[l] = column_signs(operand, K, l);
            sums.signs_known = true;
          }
          double r;
          if (!matmul_round_fast(v, 0, i, c, f, &r))
            r = exact_output(ab + i * K, K, operand.b + c * sbn, sbk, bias_row ? bias_row + c * sxn : nullptr, f);
          out_row[c] = static_cast<typename F::Bits>(encode(r, f));
        }
      }
    }
  });
}

}  // namespace

bool matmul_few_rows_cpu(const at::Tensor& a3, const at::Tensor& b3, const at::Tensor& bias, at::Tensor& out) {
  const int64_t B = a3.size(0), M = a3.size(1), K = a3.size(2), N = b3.size(2);
  if (M < 1 || M > kFewRows || K < 1 || !out.is_contiguous()) return false;
  if (b3.stride(2) != 1 && b3.stride(1) != 1) return false;
  // CARBON_MATMUL_GENERAL set: the general path for every shape (read per
  // call, so that tests can run each case through both paths).
  if (std::getenv("CARBON_MATMUL_GENERAL") != nullptr) return false;
  // a is small (at most kFewRows rows per batch): widened by the general
  // path's widen_operand_cpu, whose row norms and signs the bound and the
  // sign rule read (its quanta and spans are not used here).
  at::Tensor a64 = at::empty({B, M, K}, a3.options().dtype(at::kDouble));
  at::Tensor a_norms = at::empty({B * M}, a64.options());
  at::Tensor a_signs = at::empty({B * M}, a64.options().dtype(at::kByte));
  at::Tensor a_quanta = at::empty({B * M}, a64.options());
  at::Tensor a_spans = at::empty({B * M, 2}, a64.options().dtype(at::kInt));
  int precision = 0;
  with_format(format_of(a3.scalar_type()), [&](auto fmt) { precision = decltype(fmt)::get().precision; });
  widen_operand_cpu(a3, a64, a_norms, a_signs, precision, 1.0, a_quanta, a_spans);
  const at::Tensor bias64 = bias.defined() ? bias.to(at::kDouble).expand({B, M, N}) : at::Tensor();
  with_element_type(b3.scalar_type(), [&](auto element) {
    with_format(format_of(out.scalar_type()), [&](auto fmt) {
      few_rows_products<decltype(element), decltype(fmt)>(a64, a_norms, a_signs, b3, bias64, out);
    });
  });
  return true;
}

}  // namespace carbon
