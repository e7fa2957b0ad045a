// CPU kernels of layer_norm and rms_norm. Rows are split over threads
// (at::parallel_for); each row is computed by one thread with summation
// trees that depend only on n (eight interleaved chains, then three pairwise
// levels), so the bits never depend on the thread count. Each row is first
// decoded into doubles (exact), then: statistics (tier 1, exact tier when
// undecided), then the elementwise outputs.
#include <ATen/Parallel.h>

#include <vector>

#include "../dtypes.h"
#include "../reduce/chain_tree.h"
#include "norm.h"
#include "norm_kernel.h"

namespace carbon {

namespace {

// The row loops are compiled for AVX-512 (x86-64-v4), AVX2 and any x86-64,
// chosen at load time: the same IEEE and integer operations, so the same bits.
#define CARBON_NORM_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))

struct Sums {
  double sum = 0.0, abs_sum = 0.0;
};

// sum v_k and sum |v_k|.
CARBON_NORM_CLONES Sums chain_sums(const double* v, int64_t n) {
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
CARBON_NORM_CLONES Sums chain_dot(const double* x, const double* y, int64_t n) {
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
CARBON_NORM_CLONES double chain_squares(const double* v, double c, int64_t n) {
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

template <typename T>
CARBON_NORM_CLONES void decode_row(const T* x, int64_t n, double* out) {
  for (int64_t k = 0; k < n; ++k) out[k] = element_value(x[k]);
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

// Outputs of one row, vectorized: y_k = RN_F(affine(xhat_k)) (forward) into
// out. Returns false (out partly written) if some value needs the general
// path.
template <typename F, bool kRms, bool kW, bool kB>
CARBON_NORM_CLONES bool forward_outputs_fast(const double* v, int64_t n, double mu,
                                                                             double rs, const double* w,
                                                                             const double* b,
                                                                             typename F::Bits* out) {
  uint64_t bad = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double xh = round_fast<F32>(kRms ? v[k] * rs : (v[k] - mu) * rs, bad);
    double y = kW ? xh * w[k] : xh;
    if (kB) y = y + b[k];
    out[k] = encode_fast<F>(round_fast<F>(y, bad));
  }
  return bad == 0;
}

template <typename F>
bool forward_outputs(const double* v, int64_t n, double mu, double rs, const double* w, const double* b, bool rms,
                     typename F::Bits* out) {
  if (rms) return w ? forward_outputs_fast<F, true, true, false>(v, n, mu, rs, w, b, out)
                    : forward_outputs_fast<F, true, false, false>(v, n, mu, rs, w, b, out);
  if (w) return b ? forward_outputs_fast<F, false, true, true>(v, n, mu, rs, w, b, out)
                  : forward_outputs_fast<F, false, true, false>(v, n, mu, rs, w, b, out);
  return b ? forward_outputs_fast<F, false, false, true>(v, n, mu, rs, w, b, out)
           : forward_outputs_fast<F, false, false, false>(v, n, mu, rs, w, b, out);
}

// Backward, vectorized: xhat_k and g_k (both float32 values) into xh, g.
template <bool kRms, bool kW>
CARBON_NORM_CLONES bool backward_terms_fast(const double* v, const double* d,
                                                                            int64_t n, double mu, double rs,
                                                                            const double* w, double* xh, double* g) {
  uint64_t bad = 0;
  for (int64_t k = 0; k < n; ++k) {
    xh[k] = round_fast<F32>(kRms ? v[k] * rs : (v[k] - mu) * rs, bad);
    g[k] = kW ? round_fast<F32>(d[k] * w[k], bad) : d[k];
  }
  return bad == 0;
}

template <typename F, bool kRms>
CARBON_NORM_CLONES bool backward_outputs_fast(const double* xh, const double* g,
                                                                              int64_t n, double A, double B,
                                                                              double rs, typename F::Bits* out) {
  uint64_t bad = 0;
  for (int64_t k = 0; k < n; ++k)
    out[k] = encode_fast<F>(round_fast<F>(kRms ? rms_dx(g[k], xh[k], B, rs) : ln_dx(g[k], xh[k], A, B, rs), bad));
  return bad == 0;
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
  at::parallel_for(0, rows, grain_for(n), [&](int64_t begin, int64_t end) {
    std::vector<double> v(n);
    for (int64_t r = begin; r < end; ++r) {
      decode_row(x + r * n, n, v.data());
      double mu = 0.0, var;
      if (a.rms) {
        if (!mean_of_squares_fast(chain_squares(v.data(), 0.0, n), n, depth, 0, &var))
          var = exact_mean_dot(v.data(), v.data(), n);
      } else {
        const Sums s = chain_sums(v.data(), n);
        if (!mean_fast(s.sum, s.abs_sum, n, depth, &mu)) mu = exact_mean(v.data(), n);
        if (!is_finite(mu))  // a row with an inf or a NaN
          var = canonical_nan();
        else if (!mean_of_squares_fast(chain_squares(v.data(), mu, n), n, depth, 3, &var))
          var = exact_mean_centered_squares(v.data(), mu, n);
        store32(mu, mean + r);
      }
      const double rs = rstd_of(var, a.eps32);
      store32(rs, rstd + r);
      auto* out = y + r * n;
      if (forward_outputs<F>(v.data(), n, mu, rs, w, b, a.rms, out)) continue;
      if (a.rms) {
        for (int64_t k = 0; k < n; ++k) store<F>(affine(rms_xhat(v[k], rs), w ? w + k : nullptr, nullptr), out + k);
      } else {
        for (int64_t k = 0; k < n; ++k)
          store<F>(affine(ln_xhat(v[k], mu, rs), w ? w + k : nullptr, b ? b + k : nullptr), out + k);
      }
    }
  });
}

template <typename T>
void backward_rows(const NormArgs& a, const at::Tensor& dy_tensor, at::Tensor& dx_tensor) {
  using F = typename FormatOf<T>::type;
  const int64_t rows = a.x.size(0), n = a.x.size(1);
  const T* x = a.x.const_data_ptr<T>();
  const T* dy = dy_tensor.const_data_ptr<T>();
  auto* dx = static_cast<typename F::Bits*>(dx_tensor.mutable_data_ptr());
  const std::vector<double> wv = decode_param(a.weight);
  const double* w = wv.empty() ? nullptr : wv.data();
  const float* mean = a.rms ? nullptr : a.mean.const_data_ptr<float>();
  const float* rstd = a.rstd.const_data_ptr<float>();
  const int64_t depth = chain_depth(n);
  at::parallel_for(0, rows, grain_for(n), [&](int64_t begin, int64_t end) {
    std::vector<double> xv(n), dv(n), xh(n), g(n);
    for (int64_t r = begin; r < end; ++r) {
      const double mu = a.rms ? 0.0 : load32(mean + r), rs = load32(rstd + r);
      decode_row(x + r * n, n, xv.data());
      decode_row(dy + r * n, n, dv.data());
      const bool fast = a.rms ? (w ? backward_terms_fast<true, true>(xv.data(), dv.data(), n, mu, rs, w, xh.data(), g.data())
                                   : backward_terms_fast<true, false>(xv.data(), dv.data(), n, mu, rs, w, xh.data(), g.data()))
                              : (w ? backward_terms_fast<false, true>(xv.data(), dv.data(), n, mu, rs, w, xh.data(), g.data())
                                   : backward_terms_fast<false, false>(xv.data(), dv.data(), n, mu, rs, w, xh.data(), g.data()));
      if (!fast) {
        for (int64_t k = 0; k < n; ++k) {
          xh[k] = a.rms ? rms_xhat(xv[k], rs) : ln_xhat(xv[k], mu, rs);
          g[k] = scaled_grad(dv[k], w ? w + k : nullptr);
        }
      }
      double A = 0.0, B;
      if (!a.rms) {
        const Sums s = chain_sums(g.data(), n);
        if (!mean_fast(s.sum, s.abs_sum, n, depth, &A)) A = exact_mean(g.data(), n);
      }
      const Sums p = chain_dot(g.data(), xh.data(), n);
      if (!mean_fast(p.sum, p.abs_sum, n, depth, &B)) B = exact_mean_dot(g.data(), xh.data(), n);
      auto* out = dx + r * n;
      if (a.rms ? backward_outputs_fast<F, true>(xh.data(), g.data(), n, A, B, rs, out)
                : backward_outputs_fast<F, false>(xh.data(), g.data(), n, A, B, rs, out))
        continue;
      if (a.rms) {
        for (int64_t k = 0; k < n; ++k) store<F>(rms_dx(g[k], xh[k], B, rs), out + k);
      } else {
        for (int64_t k = 0; k < n; ++k) store<F>(ln_dx(g[k], xh[k], A, B, rs), out + k);
      }
    }
  });
}

// ---------------------------------------------------------------- dweight, dbias

constexpr int64_t kColumnBlock = 256;  // columns summed side by side
constexpr int64_t kRowChunk = 512;     // rows per partial sum

template <bool kRms>
CARBON_NORM_CLONES bool tile_xhat_fast(const double* v, int64_t width, double mu,
                                                                       double rs, double* xh) {
  uint64_t bad = 0;
  for (int64_t j = 0; j < width; ++j) xh[j] = round_fast<F32>(kRms ? v[j] * rs : (v[j] - mu) * rs, bad);
  return bad == 0;
}

// s[j] += d[j] * m[j] (m null: d[j]), a[j] += |same| (exact products).
CARBON_NORM_CLONES void tile_accumulate(const double* __restrict__ d,
                                                                        const double* __restrict__ m, int64_t width,
                                                                        double* __restrict__ s,
                                                                        double* __restrict__ a) {
  if (m) {
    for (int64_t j = 0; j < width; ++j) {
      const double p = d[j] * m[j];
      s[j] = s[j] + p;
      a[j] = a[j] + abs_value(p);
    }
  } else {
    for (int64_t j = 0; j < width; ++j) {
      s[j] = s[j] + d[j];
      a[j] = a[j] + abs_value(d[j]);
    }
  }
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
  double xv[kColumnBlock], dv[kColumnBlock], xh[kColumnBlock];
  for (int64_t r = r0; r < r0 + count; ++r) {
    decode_row(dy + r * n + j0, width, dv);
    if (want_w) {
      const double mu = a.rms ? 0.0 : load32(mean + r), rs = load32(rstd + r);
      decode_row(x + r * n + j0, width, xv);
      if (!(a.rms ? tile_xhat_fast<true>(xv, width, mu, rs, xh) : tile_xhat_fast<false>(xv, width, mu, rs, xh)))
        for (int64_t j = 0; j < width; ++j) xh[j] = a.rms ? rms_xhat(xv[j], rs) : ln_xhat(xv[j], mu, rs);
      tile_accumulate(dv, xh, width, sw, aw);
    }
    if (want_b) tile_accumulate(dv, nullptr, width, sb, ab);
  }
}

// dw[j] = RN(sum_r dy[r, j] * xhat[r, j]), db[j] = RN(sum_r dy[r, j]): tiles of
// kRowChunk rows x kColumnBlock columns in parallel, then each column adds
// its tiles' partials in row order (depth kRowChunk + chunks + 1) and decides;
// an undecided column is summed exactly.
template <typename T>
void param_grads(const NormArgs& a, const at::Tensor& dy_tensor, at::Tensor& dw_tensor, at::Tensor& db_tensor) {
  using F = typename FormatOf<T>::type;
  constexpr FloatFormat f = F::get();
  const int64_t rows = a.x.size(0), n = a.x.size(1);
  const T* x = a.x.const_data_ptr<T>();
  const T* dy = dy_tensor.const_data_ptr<T>();
  const bool want_w = dw_tensor.defined(), want_b = db_tensor.defined();
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  const int64_t blocks = (n + kColumnBlock - 1) / kColumnBlock;
  const int64_t depth = kRowChunk + chunks + 1;
  std::vector<double> sw(chunks * n), aw(chunks * n), sb(chunks * n), ab(chunks * n);
  at::parallel_for(0, chunks * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t c = tile / blocks, j0 = (tile % blocks) * kColumnBlock;
      const int64_t count = std::min(kRowChunk, rows - c * kRowChunk), width = std::min(kColumnBlock, n - j0);
      const int64_t o = c * n + j0;
      column_tile(a, x, dy, c * kRowChunk, count, j0, width, want_w, want_b, sw.data() + o, aw.data() + o,
                  sb.data() + o, ab.data() + o);
    }
  });
  const float* mean = a.rms ? nullptr : a.mean.const_data_ptr<float>();
  const float* rstd = a.rstd.const_data_ptr<float>();
  auto* dw = want_w ? static_cast<typename F::Bits*>(dw_tensor.mutable_data_ptr()) : nullptr;
  auto* db = want_b ? static_cast<typename F::Bits*>(db_tensor.mutable_data_ptr()) : nullptr;
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      double s_w = 0.0, a_w = 0.0, s_b = 0.0, a_b = 0.0;
      for (int64_t c = 0; c < chunks; ++c) {
        s_w = s_w + sw[c * n + j];
        a_w = a_w + aw[c * n + j];
        s_b = s_b + sb[c * n + j];
        a_b = a_b + ab[c * n + j];
      }
      double value;
      if (want_w) {
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

}  // namespace carbon
