// Host-side interface of Carbon's random ops (docs/contract.md §10). Each op
// has two forms: (seed, offset) as two ints, or as a state tensor, int64
// [seed, offset], which carbon.Generator passes (carbon/random.py). A state
// tensor in host memory is read on the host; one in the draw's CUDA memory is
// read by the kernel itself, so the host never waits for the device and a
// captured CUDA graph reads the state current at each replay.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <type_traits>

#include "philox.h"

namespace carbon {

// Factory ops: a new tensor of `size`, `dtype`, `device`.
// The *_state_op forms take the state tensor in place of (seed, offset).
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

at::Tensor uniform_state_op(at::IntArrayRef size, const at::Tensor& state, double low, double high,
                            at::ScalarType dtype, at::Device device);
at::Tensor normal_state_op(at::IntArrayRef size, const at::Tensor& state, double mean, double std,
                           at::ScalarType dtype, at::Device device);
at::Tensor trunc_normal_state_op(at::IntArrayRef size, const at::Tensor& state, double mean, double std, double a,
                                 double b, at::ScalarType dtype, at::Device device);
at::Tensor bernoulli_state_op(const at::Tensor& probs, const at::Tensor& state, std::optional<double> p);
at::Tensor dropout_state_op(const at::Tensor& x, double p, const at::Tensor& state);

namespace random {

enum class Kind { kUniform, kNormal, kTruncNormal, kBernoulli, kDropout };

// A draw's (seed, offset): by value, or (device_state) the address of the
// int64 pair [seed, offset] in the draw's device memory, which the kernels
// read when they run.
struct DrawState {
  uint64_t seed = 0;
  uint64_t offset = 0;
  const int64_t* device_state = nullptr;
  // The values were read on the host from a state tensor: a CUDA graph would
  // replay them frozen while the generator moves on, so capturing is refused.
  bool from_host_tensor = false;
};

struct Params {
  Kind kind;
  DrawState state;
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
// (seed, offset) are passed apart from `p` (whose DrawState may only hold the
// address of them on the device).
template <Kind kKind, typename F>
CARBON_HD void random_item(const Params& p, uint64_t seed, uint64_t offset, uint64_t item, int64_t n,
                           const typename F::Bits* in, typename F::Bits* out) {
  if constexpr (kKind == Kind::kUniform) uniform_block<F>(seed, offset, item, n, p.a, p.b, out);
  if constexpr (kKind == Kind::kNormal) normal_block<F>(seed, offset, item, n, p.a, p.b, out);
  if constexpr (kKind == Kind::kTruncNormal) out[item] = trunc_normal_one<F>(seed, offset, item, p.a, p.b, p.c, p.d);
  if constexpr (kKind == Kind::kBernoulli) bernoulli_block<F>(seed, offset, item, n, in, p.scalar, p.a, out);
  if constexpr (kKind == Kind::kDropout) dropout_block<F>(seed, offset, item, n, in, p.a, out);
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
