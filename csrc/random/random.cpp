// Carbon's random ops: argument checks and the CPU kernels (docs/contract.md
// §10). Every value is a function of (seed, offset, element index) computed
// by the shared code of philox.h, so the threads' split of the work (and the
// device) plays no role.
#include "random.h"

#include <ATen/Parallel.h>

#include <cmath>

#include "../dtypes.h"

namespace carbon {
namespace {

void check_device(const char* op, at::Device device) {
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "carbon.", op, ": tensors on ", device,
              " are not supported (CPU and CUDA only)");
}

void check_offset(const char* op, int64_t offset) {
  TORCH_CHECK_VALUE(offset >= 0, "carbon.", op, ": offset must be >= 0, got ", offset);
}

void check_finite(const char* op, const char* name, double v) {
  TORCH_CHECK_VALUE(std::isfinite(v), "carbon.", op, ": ", name, " must be finite, got ", v);
}

void check_probability(const char* op, double p) {
  TORCH_CHECK_VALUE(p >= 0.0 && p <= 1.0, "carbon.", op, ": p must be in [0, 1], got ", p);
}

void fill(const random::Params& params, const at::Tensor& in, at::Tensor& out) {
  if (out.numel() == 0) return;
  if (out.is_cpu()) {
    random::random_cpu(params, in, out);
  } else {
#ifdef CARBON_WITH_CUDA
    random::random_cuda(params, in, out);
#else
    TORCH_CHECK(false, "carbon: this build has no CUDA kernels");
#endif
  }
}

at::Tensor factory(const char* op, at::IntArrayRef size, int64_t seed, int64_t offset, at::ScalarType dtype,
                   at::Device device, const random::Params& params) {
  checked_out_dtype(op, dtype);
  check_device(op, device);
  check_offset(op, offset);
  for (const int64_t s : size) TORCH_CHECK_VALUE(s >= 0, "carbon.", op, ": negative size ", size);
  (void)seed;
  at::Tensor out = at::empty(size, at::TensorOptions().dtype(dtype).device(device));
  fill(params, at::Tensor(), out);
  return out;
}

}  // namespace

namespace random {

void random_cpu(const Params& params, const at::Tensor& in, at::Tensor& out) {
  const int64_t n = out.numel();
  with_format(format_of(out.scalar_type()), [&](auto fmt) {
    using F = decltype(fmt);
    using Bits = typename F::Bits;
    const Bits* ip = in.defined() ? static_cast<const Bits*>(in.const_data_ptr()) : nullptr;
    Bits* op = static_cast<Bits*>(out.mutable_data_ptr());
    with_kind(params.kind, [&](auto kind_tag) {
      constexpr Kind kKind = decltype(kind_tag)::value;
      const int64_t grain = kKind == Kind::kTruncNormal ? 512 : 2048;
      at::parallel_for(0, work_items(kKind, n), grain, [&](int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item)
          random_item<kKind, F>(params, static_cast<uint64_t>(item), n, ip, op);
      });
    });
  });
}

}  // namespace random

at::Tensor uniform_op(at::IntArrayRef size, int64_t seed, int64_t offset, double low, double high,
                      at::ScalarType dtype, at::Device device) {
  const char* op = "uniform";
  check_finite(op, "low", low);
  check_finite(op, "high", high);
  TORCH_CHECK_VALUE(low <= high, "carbon.uniform: low must be <= high, got low=", low, " and high=", high);
  check_finite(op, "high - low", high - low);
  const random::Params params{random::Kind::kUniform, static_cast<uint64_t>(seed), static_cast<uint64_t>(offset),
                              low, high, 0.0, 0.0, false};
  return factory(op, size, seed, offset, dtype, device, params);
}

at::Tensor normal_op(at::IntArrayRef size, int64_t seed, int64_t offset, double mean, double std,
                     at::ScalarType dtype, at::Device device) {
  const char* op = "normal";
  check_finite(op, "mean", mean);
  check_finite(op, "std", std);
  TORCH_CHECK_VALUE(std >= 0.0, "carbon.normal: std must be >= 0, got ", std);
  const random::Params params{random::Kind::kNormal, static_cast<uint64_t>(seed), static_cast<uint64_t>(offset),
                              mean, std, 0.0, 0.0, false};
  return factory(op, size, seed, offset, dtype, device, params);
}

at::Tensor trunc_normal_op(at::IntArrayRef size, int64_t seed, int64_t offset, double mean, double std, double a,
                           double b, at::ScalarType dtype, at::Device device) {
  const char* op = "trunc_normal";
  check_finite(op, "mean", mean);
  check_finite(op, "std", std);
  check_finite(op, "a", a);
  check_finite(op, "b", b);
  TORCH_CHECK_VALUE(std >= 0.0, "carbon.trunc_normal: std must be >= 0, got ", std);
  TORCH_CHECK_VALUE(a <= b, "carbon.trunc_normal: a must be <= b, got a=", a, " and b=", b);
  const random::Params params{random::Kind::kTruncNormal, static_cast<uint64_t>(seed), static_cast<uint64_t>(offset),
                              mean, std, a, b, false};
  return factory(op, size, seed, offset, dtype, device, params);
}

at::Tensor bernoulli_op(const at::Tensor& probs, int64_t seed, int64_t offset, std::optional<double> p) {
  const char* op = "bernoulli";
  check_supported_dtype(op, "probs", probs);
  check_device(op, probs.device());
  check_offset(op, offset);
  if (p.has_value()) check_probability(op, *p);
  const at::Tensor in = probs.contiguous();
  at::Tensor out = at::empty(probs.sizes(), probs.options().memory_format(at::MemoryFormat::Contiguous));
  const random::Params params{random::Kind::kBernoulli, static_cast<uint64_t>(seed), static_cast<uint64_t>(offset),
                              p.value_or(0.0), 0.0, 0.0, 0.0, p.has_value()};
  fill(params, in, out);
  return out;
}

at::Tensor dropout_op(const at::Tensor& x, double p, int64_t seed, int64_t offset) {
  const char* op = "dropout";
  check_supported_dtype(op, "x", x);
  check_device(op, x.device());
  check_offset(op, offset);
  check_probability(op, p);
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const random::Params params{random::Kind::kDropout, static_cast<uint64_t>(seed), static_cast<uint64_t>(offset),
                              p, 0.0, 0.0, 0.0, false};
  fill(params, in, out);
  return out;
}

}  // namespace carbon
