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

// decode_row then chain_sums in one pass: the same operations in the same
// order (element k into chain k mod kChains, the tail into chain 0), so the
// same fp64 sums and the same tier-1 decisions, with the row read once.
template <typename T>
CARBON_NORM_CLONES Sums decode_sums(const T* x, int64_t n, double* v) {
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

// decode_row then chain_squares(v, 0.0, n) in one pass (same operations,
// same order, so the same fp64 sum).
template <typename T>
CARBON_NORM_CLONES double decode_squares(const T* x, int64_t n, double* v) {
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

// Backward, vectorized: decode x and dy, xhat_k and g_k (float32 values, the
// operations of ln_xhat / rms_xhat and scaled_grad) into xh and g, with
// chain_sums(g) (layer_norm only) and chain_dot(g, xh) in the same pass: each
// sum adds element k into chain k mod kChains
// (the tail into chain 0) in the same order, so the fp64 sums, hence the
// tier-1 decisions, are the same bits. Returns false if some xhat or g needs
// the general path (xh, g, gs, gd then unusable: the caller redoes the row).
template <typename T, bool kRms, bool kW>
CARBON_NORM_CLONES bool backward_row_fast(const T* x, const T* dy, int64_t n, double mu, double rs,
                                          const double* w, double* xh, double* g, Sums* gs, Sums* gd) {
  uint64_t bad = 0;
  double ss[kChains] = {}, sa[kChains] = {}, ds[kChains] = {}, da[kChains] = {};
  int64_t k = 0;
  for (; k + kChains <= n; k += kChains)
    for (int l = 0; l < kChains; ++l) {
      const double v = element_value(x[k + l]), d = element_value(dy[k + l]);
      const double h = round_fast<F32>(kRms ? v * rs : (v - mu) * rs, bad);
      const double q = kW ? round_fast<F32>(d * w[k + l], bad) : d;
      xh[k + l] = h;
      g[k + l] = q;
      if (!kRms) {
        ss[l] = ss[l] + q;
        sa[l] = sa[l] + abs_value(q);
      }
      const double p = q * h;
      ds[l] = ds[l] + p;
      da[l] = da[l] + abs_value(p);
    }
  for (; k < n; ++k) {
    const double v = element_value(x[k]), d = element_value(dy[k]);
    const double h = round_fast<F32>(kRms ? v * rs : (v - mu) * rs, bad);
    const double q = kW ? round_fast<F32>(d * w[k], bad) : d;
    xh[k] = h;
    g[k] = q;
    if (!kRms) {
      ss[0] = ss[0] + q;
      sa[0] = sa[0] + abs_value(q);
    }
    const double p = q * h;
    ds[0] = ds[0] + p;
    da[0] = da[0] + abs_value(p);
  }
  if (!kRms) *gs = {fold_chains(ss), fold_chains(sa)};
  *gd = {fold_chains(ds), fold_chains(da)};
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
      double mu = 0.0, var;
      if (a.rms) {
        if (!mean_of_squares_fast(decode_squares(x + r * n, n, v.data()), n, depth, 0, &var))
          var = exact_mean_dot(v.data(), v.data(), n);
      } else {
        const Sums s = decode_sums(x + r * n, n, v.data());
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
      const T* xr = x + r * n;
      const T* dr = dy + r * n;
      Sums s, p;
      const bool fast =
          a.rms ? (w ? backward_row_fast<T, true, true>(xr, dr, n, mu, rs, w, xh.data(), g.data(), &s, &p)
                     : backward_row_fast<T, true, false>(xr, dr, n, mu, rs, w, xh.data(), g.data(), &s, &p))
                : (w ? backward_row_fast<T, false, true>(xr, dr, n, mu, rs, w, xh.data(), g.data(), &s, &p)
                     : backward_row_fast<T, false, false>(xr, dr, n, mu, rs, w, xh.data(), g.data(), &s, &p));
      if (!fast) {  // the general path, then the sums as before
        decode_row(xr, n, xv.data());
        decode_row(dr, n, dv.data());
        for (int64_t k = 0; k < n; ++k) {
          xh[k] = a.rms ? rms_xhat(xv[k], rs) : ln_xhat(xv[k], mu, rs);
          g[k] = scaled_grad(dv[k], w ? w + k : nullptr);
        }
        if (!a.rms) s = chain_sums(g.data(), n);
        p = chain_dot(g.data(), xh.data(), n);
      }
      double A = 0.0, B;
      if (!a.rms && !mean_fast(s.sum, s.abs_sum, n, depth, &A)) A = exact_mean(g.data(), n);
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

// decode_row of dy, then sw[j] += d[j] * xh[j], aw[j] += |same| (kW) and
// sb[j] += d[j], ab[j] += |d[j]| (kB), in one pass: per column the same
// additions in the same (row) order as before, so the same partial sums.
template <typename T, bool kW, bool kB>
CARBON_NORM_CLONES void tile_accumulate(const T* __restrict__ dy, const double* __restrict__ xh, int64_t width,
                                        double* __restrict__ sw, double* __restrict__ aw, double* __restrict__ sb,
                                        double* __restrict__ ab) {
  for (int64_t j = 0; j < width; ++j) {
    const double d = element_value(dy[j]);
    if (kW) {
      const double p = d * xh[j];
      sw[j] = sw[j] + p;
      aw[j] = aw[j] + abs_value(p);
    }
    if (kB) {
      sb[j] = sb[j] + d;
      ab[j] = ab[j] + abs_value(d);
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
        tile_accumulate<T, true, true>(dr, xh, width, sw, aw, sb, ab);
      else
        tile_accumulate<T, true, false>(dr, xh, width, sw, aw, sb, ab);
    } else if (want_b) {
      tile_accumulate<T, false, true>(dr, xh, width, sw, aw, sb, ab);
    }
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
