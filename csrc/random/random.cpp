// Carbon's random ops: argument checks and dispatch (docs/contract.md §10).
// Every value is a function of (seed, offset, element index) computed by the
// shared code of philox.h (the CPU kernels, random_cpu.cpp, in vectorized
// loops), so the threads' split of the work (and the device) plays no role.
#include "random.h"

#include <ATen/ops/empty.h>
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

// ---- a draw's state: two ints, or the state tensor int64 [seed, offset] ------

random::DrawState int_state(const char* op, int64_t seed, int64_t offset) {
  check_offset(op, offset);
  random::DrawState state;
  state.seed = static_cast<uint64_t>(seed);
  state.offset = static_cast<uint64_t>(offset);
  return state;
}

// The state tensor of a draw on `device`. In host memory it is read here (and
// its offset checked); in the draw's CUDA memory the kernel reads it when it
// runs (unchecked: checking here would wait for the device). A CPU draw from
// a state in CUDA memory copies it to the host first -- the one case that
// waits for the device.
random::DrawState tensor_state(const char* op, const at::Tensor& state, at::Device device) {
  TORCH_CHECK_TYPE(state.scalar_type() == at::kLong, "carbon.", op,
                   ": state must be an int64 tensor [seed, offset], got ", state.scalar_type());
  TORCH_CHECK_VALUE(state.dim() == 1 && state.size(0) == 2, "carbon.", op,
                    ": state must be an int64 tensor [seed, offset] of shape (2,), got shape ", state.sizes());
  check_device(op, state.device());
  if (state.is_cpu() || device.is_cpu()) {
    const at::Tensor host = state.cpu();
    const int64_t* v = host.const_data_ptr<int64_t>();
    random::DrawState s = int_state(op, v[0], v[host.stride(0)]);
    s.from_host_tensor = true;
    return s;
  }
  TORCH_CHECK(state.device() == device, "carbon.", op, ": the state is on ", state.device(), " but the draw on ",
              device, " (the state must be in host memory or on the draw's device)");
  TORCH_CHECK(state.stride(0) == 1, "carbon.", op, ": a state tensor on the device must be contiguous");
  random::DrawState s;
  s.device_state = state.const_data_ptr<int64_t>();
  return s;
}

// ---- running a draw ------------------------------------------------------------

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

random::Params with_state(random::Params params, const random::DrawState& state) {
  params.state = state;
  return params;
}

// uniform, normal, trunc_normal: a new tensor of `size`, `dtype`, `device`.
// `state(device)` reads the draw's state for the output's device (`device`
// with its index resolved: "cuda" is the current CUDA device).
template <typename ReadState>
at::Tensor factory(const char* op, at::IntArrayRef size, at::ScalarType dtype, at::Device device,
                   const random::Params& params, ReadState&& state) {
  checked_out_dtype(op, dtype);
  check_device(op, device);
  for (const int64_t s : size) TORCH_CHECK_VALUE(s >= 0, "carbon.", op, ": negative size ", size);
  at::Tensor out = at::empty(size, at::TensorOptions().dtype(dtype).device(device));
  fill(with_state(params, state(out.device())), at::Tensor(), out);
  return out;
}

// bernoulli, dropout: an output of x's shape, dtype and device from x's values.
at::Tensor like(const at::Tensor& x, const random::Params& params) {
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  fill(params, in, out);
  return out;
}

// ---- each op's parameters (the checks both forms share) ------------------------

random::Params uniform_params(double low, double high) {
  const char* op = "uniform";
  check_finite(op, "low", low);
  check_finite(op, "high", high);
  TORCH_CHECK_VALUE(low <= high, "carbon.uniform: low must be <= high, got low=", low, " and high=", high);
  check_finite(op, "high - low", high - low);
  return random::Params{random::Kind::kUniform, {}, low, high, 0.0, 0.0, false};
}

random::Params normal_params(double mean, double std) {
  const char* op = "normal";
  check_finite(op, "mean", mean);
  check_finite(op, "std", std);
  TORCH_CHECK_VALUE(std >= 0.0, "carbon.normal: std must be >= 0, got ", std);
  return random::Params{random::Kind::kNormal, {}, mean, std, 0.0, 0.0, false};
}

random::Params trunc_normal_params(double mean, double std, double a, double b) {
  const char* op = "trunc_normal";
  check_finite(op, "mean", mean);
  check_finite(op, "std", std);
  check_finite(op, "a", a);
  check_finite(op, "b", b);
  TORCH_CHECK_VALUE(std >= 0.0, "carbon.trunc_normal: std must be >= 0, got ", std);
  TORCH_CHECK_VALUE(a <= b, "carbon.trunc_normal: a must be <= b, got a=", a, " and b=", b);
  return random::Params{random::Kind::kTruncNormal, {}, mean, std, a, b, false};
}

random::Params bernoulli_params(const at::Tensor& probs, std::optional<double> p) {
  const char* op = "bernoulli";
  check_supported_dtype(op, "probs", probs);
  check_device(op, probs.device());
  if (p.has_value()) check_probability(op, *p);
  return random::Params{random::Kind::kBernoulli, {}, p.value_or(0.0), 0.0, 0.0, 0.0, p.has_value()};
}

random::Params dropout_params(const at::Tensor& x, double p) {
  const char* op = "dropout";
  check_supported_dtype(op, "x", x);
  check_device(op, x.device());
  check_probability(op, p);
  return random::Params{random::Kind::kDropout, {}, p, 0.0, 0.0, 0.0, false};
}

}  // namespace

// ---- the ops: (seed, offset) as ints, or the state tensor (*_state_op) ---------

at::Tensor uniform_op(at::IntArrayRef size, int64_t seed, int64_t offset, double low, double high,
                      at::ScalarType dtype, at::Device device) {
  return factory("uniform", size, dtype, device, uniform_params(low, high),
                 [&](at::Device) { return int_state("uniform", seed, offset); });
}

at::Tensor uniform_state_op(at::IntArrayRef size, const at::Tensor& state, double low, double high,
                            at::ScalarType dtype, at::Device device) {
  return factory("uniform", size, dtype, device, uniform_params(low, high),
                 [&](at::Device out_device) { return tensor_state("uniform", state, out_device); });
}

at::Tensor normal_op(at::IntArrayRef size, int64_t seed, int64_t offset, double mean, double std,
                     at::ScalarType dtype, at::Device device) {
  return factory("normal", size, dtype, device, normal_params(mean, std),
                 [&](at::Device) { return int_state("normal", seed, offset); });
}

at::Tensor normal_state_op(at::IntArrayRef size, const at::Tensor& state, double mean, double std,
                           at::ScalarType dtype, at::Device device) {
  return factory("normal", size, dtype, device, normal_params(mean, std),
                 [&](at::Device out_device) { return tensor_state("normal", state, out_device); });
}

at::Tensor trunc_normal_op(at::IntArrayRef size, int64_t seed, int64_t offset, double mean, double std, double a,
                           double b, at::ScalarType dtype, at::Device device) {
  return factory("trunc_normal", size, dtype, device, trunc_normal_params(mean, std, a, b),
                 [&](at::Device) { return int_state("trunc_normal", seed, offset); });
}

at::Tensor trunc_normal_state_op(at::IntArrayRef size, const at::Tensor& state, double mean, double std, double a,
                                 double b, at::ScalarType dtype, at::Device device) {
  return factory("trunc_normal", size, dtype, device, trunc_normal_params(mean, std, a, b),
                 [&](at::Device out_device) { return tensor_state("trunc_normal", state, out_device); });
}

at::Tensor bernoulli_op(const at::Tensor& probs, int64_t seed, int64_t offset, std::optional<double> p) {
  const random::Params params = bernoulli_params(probs, p);
  return like(probs, with_state(params, int_state("bernoulli", seed, offset)));
}

at::Tensor bernoulli_state_op(const at::Tensor& probs, const at::Tensor& state, std::optional<double> p) {
  const random::Params params = bernoulli_params(probs, p);
  return like(probs, with_state(params, tensor_state("bernoulli", state, probs.device())));
}

at::Tensor dropout_op(const at::Tensor& x, double p, int64_t seed, int64_t offset) {
  const random::Params params = dropout_params(x, p);
  return like(x, with_state(params, int_state("dropout", seed, offset)));
}

at::Tensor dropout_state_op(const at::Tensor& x, double p, const at::Tensor& state) {
  const random::Params params = dropout_params(x, p);
  return like(x, with_state(params, tensor_state("dropout", state, x.device())));
}

}  // namespace carbon
