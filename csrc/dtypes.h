// The dtypes Carbon computes in, and the checks every op uses for them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "exact/float_format.h"

namespace carbon {

inline bool is_supported(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

inline FormatId format_of(at::ScalarType t) {
  if (t == at::kBFloat16) return FormatId::kBFloat16;
  if (t == at::kHalf) return FormatId::kFloat16;
  return FormatId::kFloat32;
}

inline void check_supported_dtype(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(is_supported(t.scalar_type()), "carbon.", op, ": ", name, " has dtype ", t.scalar_type(),
                   "; supported dtypes are float32, bfloat16 and float16 (carbon rounds the exact "
                   "result into these formats; for float64 use torch's own op)");
}

inline at::ScalarType checked_out_dtype(const char* op, at::ScalarType out) {
  TORCH_CHECK_TYPE(is_supported(out), "carbon.", op, ": output dtype ", out,
                   " is not supported; use float32, bfloat16 or float16");
  return out;
}

// Calls fn(T{}) with T the C++ element type of a supported dtype.
template <typename Fn>
void with_element_type(at::ScalarType t, Fn&& fn) {
  switch (t) {
    case at::kBFloat16:
      return fn(c10::BFloat16{});
    case at::kHalf:
      return fn(c10::Half{});
    default:
      return fn(float{});
  }
}

}  // namespace carbon
