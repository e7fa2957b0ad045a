// attention_logits: input checks and the CPU kernel (an elementwise loop).
#include "../cpu_features.h"
#include "attention.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../dtypes.h"
#include "../exact/fp_env.h"
#include "../matmul/matmul.h"
#include "../matmul/matmul_cpu.h"
#include "../reduce/reduce_kernel.h"
#include "../softmax/softmax.h"
#include "attention_cpu.h"
#include "attention_kernel.h"

namespace carbon {

at::Tensor attention_logits(const at::Tensor& s, double scale, const std::optional<at::Tensor>& mask, bool causal) {
  const char* op = "attention_logits";
  TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, "carbon.", op, ": scores must be float32, got ", s.scalar_type());
  TORCH_CHECK_VALUE(s.is_cpu() || s.is_cuda(), "carbon.", op, ": tensors on ", s.device(),
                    " are not supported (CPU and CUDA only)");
  TORCH_CHECK_VALUE(s.dim() == 3, "carbon.", op, ": expected scores [B, Tq, Tk], got shape ", s.sizes());
  TORCH_CHECK_VALUE(std::isfinite(scale), "carbon.", op, ": scale must be finite, got ", scale);
  at::Tensor m;
  if (mask.has_value() && mask->defined()) {
    check_supported_dtype(op, "mask", *mask);
    TORCH_CHECK_VALUE(mask->device() == s.device(), "carbon.", op,
                      ": expected all tensors on one device, but scores are on ", s.device(), " and mask is on ",
                      mask->device());
    TORCH_CHECK_VALUE(mask->sizes() == s.sizes(), "carbon.", op, ": mask has shape ", mask->sizes(),
                      " but the scores have shape ", s.sizes());
    m = *mask;
  }
  const at::Tensor sc = s.contiguous();
  at::Tensor out = at::empty_like(sc);
  if (out.numel() == 0) return out;
  if (sc.is_cpu()) {
    attention_logits_cpu(sc, scale, m, causal, out);
  } else {
#ifdef CARBON_WITH_CUDA
    attention_logits_cuda(sc, scale, m, causal, out);
#endif
  }
  return out;
}

namespace {

// One row of logits: z_j = attention_logit(s_j, scale, m_j, causal && j > i).
// The first pass rounds with branch-free integer operations, so it vectorizes
// (round_double's normal-range path: RN32 of a double whose magnitude lies in
// float32's normal range is round_normal_bits, and results at or above
// 2^128, and infinities, are +-inf; a signed zero is kept as it is, as
// round_double keeps it). Any other value (NaN, or a magnitude below
// float32's smallest normal) sends the row through attention_logit itself,
// which is the definition.
template <typename MaskAt>
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void logits_row(const float* in, double scale,
                                                                           MaskAt mask_at, int64_t limit,
                                                                           int64_t Tk, float* o) {
  constexpr FloatFormat f = Format<FormatId::kFloat32>::get();
  uint32_t ok = 1;
  for (int64_t j = 0; j < limit; ++j) {
    const double v = static_cast<double>(in[j]) * scale + mask_at(j);
    const uint64_t u = double_to_bits(v), mag = u & ~kSignBit;
    const uint64_t rounded = round_normal_bits(mag, f);
    const bool zero = mag == 0;
    const bool big = (mag >= normal_min_bits(f)) & (mag <= kExpMask);  // normal range, overflow or inf
    ok &= (zero | big) ? 1u : 0u;
    const uint32_t magbits = zero ? 0u : (rounded >= overflow_bits(f) ? 0x7F800000u : encode_normal(rounded, f));
    const uint32_t bits = (static_cast<uint32_t>(u >> 63) << 31) | magbits;
    std::memcpy(o + j, &bits, sizeof bits);
  }
  if (!ok)
    for (int64_t j = 0; j < limit; ++j) o[j] = static_cast<float>(attention_logit(in[j], scale, mask_at(j), false));
  for (int64_t j = limit; j < Tk; ++j) o[j] = -INFINITY;  // attention_logit's causal case
}

// The accessor of "no mask": m = -0 (see with_mask_rows).
struct NoMask {
  double operator()(int64_t) const { return -0.0; }
};

// CARBON_ATTENTION_PORTABLE set: the compiled loops instead (to compare).
bool logits_avx512_available() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") && std::getenv("CARBON_ATTENTION_PORTABLE") == nullptr && cpu::avx512_allowed();
  return yes;
}

// logits_row's first pass without a mask on AVX-512, 8 logits per step in
// 512-bit vectors (GCC's x86-64-v4 clone used 256-bit ones): the same
// operations per element (the exact float -> double conversion, the
// product, + -0, round_normal_bits, the same selects), so the same bits;
// returns logits_row's `ok` (false: the caller redoes the row by
// attention_logit).
// (GCC 12 reports the intrinsics' internal undefined vectors as "may be
// used uninitialized" here: a false positive in avx512fintrin.h.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,avx512dq,avx512vl"))) bool logits_row_avx512(const float* in, double scale,
                                                                             int64_t limit, float* o) {
  constexpr FloatFormat f = Format<FormatId::kFloat32>::get();
  constexpr int drop = 53 - f.precision;
  const __m512i sign_bit = _mm512_set1_epi64(static_cast<int64_t>(kSignBit));
  const __m512i one = _mm512_set1_epi64(1);
  const __m512i half_less_one = _mm512_set1_epi64((int64_t{1} << (drop - 1)) - 1);
  const __m512i keep = _mm512_set1_epi64(static_cast<int64_t>(~((uint64_t{1} << drop) - 1)));
  const __m512i normal_min = _mm512_set1_epi64(static_cast<int64_t>(normal_min_bits(f)));
  const __m512i exp_mask = _mm512_set1_epi64(static_cast<int64_t>(kExpMask));
  const __m512i overflow = _mm512_set1_epi64(static_cast<int64_t>(overflow_bits(f)));
  const __m512i inf_bits = _mm512_set1_epi64(0x7F800000);
  const __m512i rebias = _mm512_set1_epi64(static_cast<int64_t>(static_cast<uint64_t>(1023 - f.max_exp)
                                                                << (f.precision - 1)));
  const __m512d sc = _mm512_set1_pd(scale), minus_zero = _mm512_set1_pd(-0.0);
  __mmask8 ok = 0xFF;
  for (int64_t j = 0; j < limit; j += 8) {
    const __mmask8 lanes = limit - j >= 8 ? __mmask8{0xFF} : static_cast<__mmask8>((1u << (limit - j)) - 1);
    const __m512d v = _mm512_add_pd(_mm512_mul_pd(_mm512_cvtps_pd(_mm256_maskz_loadu_ps(lanes, in + j)), sc), minus_zero);
    const __m512i u = _mm512_castpd_si512(v), mag = _mm512_andnot_si512(sign_bit, u);
    const __m512i last_kept = _mm512_and_si512(_mm512_srli_epi64(mag, drop), one);
    const __m512i rounded = _mm512_and_si512(_mm512_add_epi64(_mm512_add_epi64(mag, half_less_one), last_kept), keep);
    // Unsigned comparisons, as logits_row's (mag < 2^63, rounded <= 2^63).
    const __mmask8 zero = _mm512_cmpeq_epi64_mask(mag, _mm512_setzero_si512());
    const __mmask8 big = _mm512_cmpge_epu64_mask(mag, normal_min) & _mm512_cmple_epu64_mask(mag, exp_mask);
    ok &= static_cast<__mmask8>((zero | big) | ~lanes);
    const __m512i encoded = _mm512_sub_epi64(_mm512_srli_epi64(rounded, drop), rebias);
    const __m512i magbits = _mm512_mask_blend_epi64(_mm512_cmpge_epu64_mask(rounded, overflow), encoded, inf_bits);
    const __m512i bits = _mm512_or_si512(_mm512_slli_epi64(_mm512_srli_epi64(u, 63), 31),
                                         _mm512_maskz_mov_epi64(static_cast<__mmask8>(~zero), magbits));
    _mm512_mask_cvtepi64_storeu_epi32(o + j, lanes, bits);
  }
  return ok == 0xFF;
}
#pragma GCC diagnostic pop

// The AVX2 loop (CPUs without AVX-512): off with CARBON_ATTENTION_PORTABLE
// or CARBON_CPU_NO_AVX2 (cpu_features.h).
bool logits_avx2_available() {
  static const bool yes = !logits_avx512_available() && cpu::avx2() &&
                          std::getenv("CARBON_ATTENTION_PORTABLE") == nullptr;
  return yes;
}

// logits_row's first pass without a mask on AVX2, 4 logits per step: the
// exact float -> double conversion, the product by scale and + -0 in fp64
// as attention_logit, then RN32 by vcvtpd2ps, which under the default MXCSR
// of every op (fp_env.h: round to nearest-even, no flush-to-zero) is
// round_double(z, float32) for every double but NaN -- signed zeros kept,
// gradual underflow to float32's subnormals, overflow to +-inf -- so the
// same bits as attention_logit. A NaN lane returns false (the caller redoes
// the row by attention_logit, which writes the canonical NaN).
__attribute__((target("avx2,fma"))) bool logits_row_avx2(const float* in, double scale, int64_t limit, float* o) {
  const __m256d sc = _mm256_set1_pd(scale), minus_zero = _mm256_set1_pd(-0.0);
  __m256d nan = _mm256_setzero_pd();
  int64_t j = 0;
  for (; j + 4 <= limit; j += 4) {
    const __m256d z = _mm256_add_pd(_mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(in + j)), sc), minus_zero);
    nan = _mm256_or_pd(nan, _mm256_cmp_pd(z, z, _CMP_UNORD_Q));
    _mm_storeu_ps(o + j, _mm256_cvtpd_ps(z));
  }
  if (_mm256_movemask_pd(nan) != 0) return false;
  for (; j < limit; ++j) {
    const double z = static_cast<double>(in[j]) * scale + -0.0;
    if (z != z) return false;
    o[j] = static_cast<float>(round_double(z, Format<FormatId::kFloat32>::get()));
  }
  return true;
}

// logits_row without a mask: on AVX-512 by logits_row_avx512, on AVX2 by
// logits_row_avx2.
void logits_row(const float* in, double scale, NoMask mask_at, int64_t limit, int64_t Tk, float* o) {
  const bool avx512 = logits_avx512_available();
  if (!avx512 && !logits_avx2_available()) return logits_row<NoMask>(in, scale, mask_at, limit, Tk, o);
  if (!(avx512 ? logits_row_avx512(in, scale, limit, o) : logits_row_avx2(in, scale, limit, o)))
    for (int64_t j = 0; j < limit; ++j) o[j] = static_cast<float>(attention_logit(in[j], scale, -0.0, false));
  for (int64_t j = limit; j < Tk; ++j) o[j] = -INFINITY;  // attention_logit's causal case
}


// Calls run(mask_row), where mask_row(b, i) returns the accessor j -> m_bij
// (a double) of the mask's row (b, i). Without a mask m = -0: x + -0 == x,
// signed zeros included.
template <typename Run>
void with_mask_rows(const at::Tensor& mask, Run run) {
  if (!mask.defined()) return run([](int64_t, int64_t) { return NoMask{}; });
  with_element_type(mask.scalar_type(), [&](auto element) {
    using T = decltype(element);
    const T* m = mask.const_data_ptr<T>();
    const int64_t sb = mask.stride(0), sq = mask.stride(1), sk = mask.stride(2);
    run([=](int64_t b, int64_t i) {
      const T* row = m + b * sb + i * sq;
      return [=](int64_t j) { return element_value(row[j * sk]); };
    });
  });
}

// The logits of row r = b * Tq + i of the scores `in` into z.
template <typename MaskRow>
void logits_of_row(const float* in, double scale, MaskRow& mask_row, bool causal, int64_t r, int64_t Tq,
                   int64_t Tk, float* z) {
  const int64_t b = r / Tq, i = r % Tq;
  const int64_t limit = causal ? std::min(i + 1, Tk) : Tk;  // entries j > i are masked out
  logits_row(in + r * Tk, scale, mask_row(b, i), limit, Tk, z);
}

}  // namespace

void attention_logits_cpu(const at::Tensor& s, double scale, const at::Tensor& mask, bool causal, at::Tensor& out) {
  const int64_t B = s.size(0), Tq = s.size(1), Tk = s.size(2);
  const float* in = s.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  with_mask_rows(mask, [&](auto mask_row) {
    carbon::parallel_for(0, B * Tq, std::max<int64_t>(1, 16384 / std::max<int64_t>(Tk, 1)), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) logits_of_row(in, scale, mask_row, causal, r, Tq, Tk, o + r * Tk);
    });
  });
}

namespace {

// Rows of logits per step of attention_probs: they stay in the cache
// between the two row kernels, and under is_causal the rows of a step are
// cut at the longest one's end (at most kFusedRows - 1 columns past a row's).
constexpr int64_t kFusedRows = 16;

// Rows of softmax gradients per step of attention_probs_backward: ~128 KiB.
int64_t backward_rows(int64_t n) { return std::clamp<int64_t>(32768 / std::max<int64_t>(n, 1), 16, 256); }

// A float32 tensor of contiguous rows over memory of one thread, pointed at
// successive row ranges without creating a tensor for each (a tensor costs
// ~1 us to create: 3 ms per fused op at 48 x 256 x 256 in 16-row steps).
class RowsWindow {
 public:
  // base: the float32 memory, holding at least `capacity` elements.
  RowsWindow(float* base, int64_t capacity)
      : t_(at::from_blob(base, {capacity}, at::TensorOptions().dtype(at::kFloat))) {}
  // The rows [offset / n, offset / n + rows) of width n, offset in elements.
  at::Tensor& at(int64_t offset, int64_t rows, int64_t n) {
    c10::TensorImpl* impl = t_.unsafeGetTensorImpl();
    impl->set_storage_offset(offset);
    impl->set_sizes_contiguous({rows, n});
    return t_;
  }

 private:
  at::Tensor t_;
};

// The float32 scores RN32(q k^T) in memory of this thread's scratch pool
// (they live only during the call, so reused memory spares the page faults
// of a fresh tensor). Causal: only the entries j <= i, the others +0.
at::Tensor scratch_scores(const at::Tensor& q, const at::Tensor& k, bool causal) {
  const int64_t B = q.size(0), L = q.size(1), S = k.size(1);
  const int64_t n = B * L * S;
  at::Tensor scores = scratch_doubles({(n + 1) / 2}).view(at::kFloat).narrow(0, 0, n).view({B, L, S});
  bmm_into_cpu(q, k.transpose(1, 2), scores, causal);
  return scores;
}

void check_attention_args(const char* op, const at::Tensor& q, const at::Tensor& k) {
  TORCH_CHECK_VALUE(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2), "carbon.", op,
                    ": expected q [B, L, E] and k [B, S, E], got shapes ", q.sizes(), " and ", k.sizes());
}

}  // namespace

at::Tensor attention_probs(const at::Tensor& q, const at::Tensor& k, double scale,
                           const std::optional<at::Tensor>& mask, bool causal) {
  const char* op = "attention_probs";
  check_attention_args(op, q, k);
  const bool masked = mask.has_value() && mask->defined();
  if (!q.is_cpu()) {  // the composition, op by op (the fused kernel is the CPU's)
    const at::Tensor scores = carbon::bmm(q, k.transpose(1, 2), at::kFloat);
    return carbon::softmax(carbon::attention_logits(scores, scale, mask, causal), -1, std::nullopt, false);
  }
  const int64_t B = q.size(0), L = q.size(1), S = k.size(1);
  at::Tensor probs = at::empty({B, L, S}, q.options().dtype(at::kFloat));
  if (probs.numel() == 0) {
    carbon::bmm(q, k.transpose(1, 2), at::kFloat);  // its checks
    return probs;
  }
  const at::Tensor scores = scratch_scores(q, k, causal);
  // attention_logits's checks, on the scores it would be given.
  TORCH_CHECK_VALUE(std::isfinite(scale), "carbon.attention_logits: scale must be finite, got ", scale);
  at::Tensor m;
  if (masked) {
    check_supported_dtype("attention_logits", "mask", *mask);
    TORCH_CHECK_VALUE(mask->device() == q.device(), "carbon.attention_logits: expected all tensors on one device, but ",
                      "scores are on ", q.device(), " and mask is on ", mask->device());
    TORCH_CHECK_VALUE(mask->sizes() == scores.sizes(), "carbon.attention_logits: mask has shape ", mask->sizes(),
                      " but the scores have shape ", scores.sizes());
    m = *mask;
  }
  const float* in = scores.const_data_ptr<float>();
  float* o = probs.mutable_data_ptr<float>();
  with_mask_rows(m, [&](auto mask_row) {
    carbon::parallel_for(0, B * L, kFusedRows, [&](int64_t begin, int64_t end) {
      std::vector<float> z(kFusedRows * S), p(kFusedRows * S);
      RowsWindow z_rows(z.data(), kFusedRows * S), p_rows(p.data(), kFusedRows * S);
      for (int64_t r0 = begin; r0 < end; r0 += kFusedRows) {
        const int64_t rows = std::min(end, r0 + kFusedRows) - r0;
        // Causal: the rows' logits past column n are all -inf (j > i for
        // every row here), so softmax sees rows of n columns (see below).
        int64_t n = S;
        if (causal) {
          n = 0;
          for (int64_t r = r0; r < r0 + rows; ++r) n = std::max(n, std::min(S, r % L + 1));
        }
        for (int64_t r = r0; r < r0 + rows; ++r) {
          const int64_t b = r / L, i = r % L;
          logits_row(in + r * S, scale, mask_row(b, i), causal ? std::min(i + 1, n) : n, n, z.data() + (r - r0) * n);
        }
        softmax_rows_cpu(z_rows.at(0, rows, n), false, false, FormatId::kFloat32, p_rows.at(0, rows, n));
        // Softmax of a row with -inf entries left out: its maximum, its case
        // (a row of -inf stays one; a NaN or +inf is never among the
        // -inf) and S = RN32(sum of the e_j) are the full row's (each left
        // out e_j is EXP(-inf) = +0), and each output is RN32(e_j / S) of
        // its own e_j. The outputs left out are then RN32(+0 / S) = +0, or
        // the row's NaN when the row's case is NaN (every output of such a
        // row is the same canonical NaN; no other row has a NaN output).
        for (int64_t r = 0; r < rows; ++r) {
          float* row = o + (r0 + r) * S;
          std::copy(p.data() + r * n, p.data() + (r + 1) * n, row);
          std::fill(row + n, row + S, std::isnan(row[0]) ? row[0] : 0.0f);
        }
      }
    });
  });
  return probs;
}

at::Tensor attention_probs_backward(const at::Tensor& grad, const at::Tensor& probs, double scale) {
  const char* op = "attention_probs_backward";
  TORCH_CHECK_TYPE(grad.scalar_type() == at::kFloat && probs.scalar_type() == at::kFloat, "carbon.", op,
                   ": grad and probs must be float32, got ", grad.scalar_type(), " and ", probs.scalar_type());
  TORCH_CHECK_VALUE(probs.dim() == 3 && grad.sizes() == probs.sizes(), "carbon.", op,
                    ": expected grad and probs of one shape [B, L, S], got ", grad.sizes(), " and ", probs.sizes());
  TORCH_CHECK_VALUE(grad.device() == probs.device(), "carbon.", op, ": expected all tensors on one device, got ",
                    grad.device(), " and ", probs.device());
  TORCH_CHECK_VALUE(std::isfinite(scale), "carbon.", op, ": scale must be finite, got ", scale);
  if (!probs.is_cpu()) {  // the composition, op by op
    return carbon::attention_logits(carbon::softmax_backward(grad, probs, -1, at::kFloat), scale, std::nullopt, false);
  }
  const int64_t B = probs.size(0), L = probs.size(1), S = probs.size(2);
  at::Tensor ds = at::empty({B, L, S}, probs.options());
  if (ds.numel() == 0) return ds;
  const at::Tensor g_all = grad.contiguous(), p_all = probs.contiguous();
  // Read only (softmax_backward_rows_cpu reads grad and y).
  float* g_data = const_cast<float*>(g_all.const_data_ptr<float>());
  float* p_data = const_cast<float*>(p_all.const_data_ptr<float>());
  float* o = ds.mutable_data_ptr<float>();
  const int64_t step = backward_rows(S);
  carbon::parallel_for(0, B * L, step, [&](int64_t begin, int64_t end) {
    std::vector<float> dz(step * S);
    RowsWindow g_rows(g_data, B * L * S), p_rows(p_data, B * L * S), dz_rows(dz.data(), step * S);
    for (int64_t r0 = begin; r0 < end; r0 += step) {
      const int64_t rows = std::min(end, r0 + step) - r0;
      softmax_backward_rows_cpu(g_rows.at(r0 * S, rows, S), p_rows.at(r0 * S, rows, S), false, FormatId::kFloat32,
                                dz_rows.at(0, rows, S));
      // attention_logits's gradient: the same step without a mask.
      for (int64_t r = 0; r < rows; ++r)
        logits_row(dz.data() + r * S, scale, NoMask{}, S, S, o + (r0 + r) * S);
    }
  });
  return ds;
}

}  // namespace carbon
