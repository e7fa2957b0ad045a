// Host-side interface of Carbon's random ops (docs/contract.md §10). The
// generator's state (seed, offset) lives in Python (carbon/random.py) and is
// passed to every op as two ints, so no op reads device memory for it.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <type_traits>

#include "philox.h"

namespace carbon {

// Factory ops: a new tensor of `size`, `dtype`, `device`.
at::Tensor uniform_op(at::IntArrayRef size, int64_t seed, int64_t offset, double low, double high,
                      at::ScalarType dtype, at::Device device);
at::Tensor normal_op(at::IntArrayRef size, int64_t seed, int64_t offset, double mean, double std,
                     at::ScalarType dtype, at::Device device);
at::Tensor trunc_normal_op(at::IntArrayRef size, int64_t seed, int64_t offset, double mean, double std, double a,
                           double b, at::ScalarType dtype, at::Device device);
// 0/1 of probs' shape and dtype: u_i < probs_i, or u_i < p when p is given.
at::Tensor bernoulli_op(const at::Tensor& probs, int64_t seed, int64_t offset, std::optional<double> p);
// keep_i = u_i >= p; kept: RN(x_i / (1 - p)), dropped: +0. Also the backward
// (applied to the incoming gradient with the same seed and offset).
at::Tensor dropout_op(const at::Tensor& x, double p, int64_t seed, int64_t offset);

namespace random {

enum class Kind { kUniform, kNormal, kTruncNormal, kBernoulli, kDropout };

struct Params {
  Kind kind;
  uint64_t seed;
  uint64_t offset;
  double a, b, c, d;  // uniform: low, high; normal: mean, std; trunc_normal: mean, std, a, b;
                      // bernoulli: p (if scalar); dropout: p
  bool scalar;        // bernoulli with a scalar p
};

// Number of counter blocks (or elements, for trunc_normal) a draw of n values iterates over.
inline int64_t work_items(Kind kind, int64_t n) {
  if (kind == Kind::kTruncNormal) return n;
  if (kind == Kind::kNormal) return (n + 1) / 2;
  return (n + 3) / 4;
}

// Fill the contiguous `out` (input: contiguous `in` of out's dtype, or undefined).
void random_cpu(const Params& params, const at::Tensor& in, at::Tensor& out);
#ifdef CARBON_WITH_CUDA
void random_cuda(const Params& params, const at::Tensor& in, at::Tensor& out);
#endif

// The work of item `item` (a block, or an element for trunc_normal).
template <Kind kKind, typename F>
CARBON_HD void random_item(const Params& p, uint64_t item, int64_t n, const typename F::Bits* in,
                           typename F::Bits* out) {
  if constexpr (kKind == Kind::kUniform) uniform_block<F>(p.seed, p.offset, item, n, p.a, p.b, out);
  if constexpr (kKind == Kind::kNormal) normal_block<F>(p.seed, p.offset, item, n, p.a, p.b, out);
  if constexpr (kKind == Kind::kTruncNormal) out[item] = trunc_normal_one<F>(p.seed, p.offset, item, p.a, p.b, p.c, p.d);
  if constexpr (kKind == Kind::kBernoulli) bernoulli_block<F>(p.seed, p.offset, item, n, in, p.scalar, p.a, out);
  if constexpr (kKind == Kind::kDropout) dropout_block<F>(p.seed, p.offset, item, n, in, p.a, out);
}

// Calls body(std::integral_constant<Kind, k>{}) for k known at run time.
template <typename Body>
void with_kind(Kind k, Body&& body) {
  switch (k) {
    case Kind::kUniform: return body(std::integral_constant<Kind, Kind::kUniform>{});
    case Kind::kNormal: return body(std::integral_constant<Kind, Kind::kNormal>{});
    case Kind::kTruncNormal: return body(std::integral_constant<Kind, Kind::kTruncNormal>{});
    case Kind::kBernoulli: return body(std::integral_constant<Kind, Kind::kBernoulli>{});
    case Kind::kDropout: return body(std::integral_constant<Kind, Kind::kDropout>{});
  }
}

}  // namespace random
}  // namespace carbon
