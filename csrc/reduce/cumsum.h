// cumsum_rows(x, dtype): out[r, i] = RN_F(x[r, 0] + ... + x[r, i]), every
// prefix sum exact and rounded once (F = dtype, default x's). The prefix sums
// of a row are its running fp64 sum decided by the monotone rounding test
// (depth i + 1), else an exact accumulator kept from the first undecided
// prefix on; on CUDA, long rows run in chunks that start from an fp64 prefix
// of the chunks before them (cumsum_cuda.cu); on an AVX-512 CPU, float32
// outputs are decided eight prefixes at a time with the hardware's rounding
// (cumsum_cpu.cpp). Each is RN_F of the exact sum, so every path agrees. Under carbon.enable it serves
// torch.cumsum (and its backward, a cumsum of the flipped gradient).
#pragma once

#include <ATen/core/Tensor.h>

#include "../exact/float_format.h"

namespace carbon {

at::Tensor cumsum_rows(const at::Tensor& x, std::optional<at::ScalarType> dtype);

void cumsum_rows_cpu(const at::Tensor& x, FormatId format, at::Tensor& out);
#ifdef CARBON_WITH_CUDA
void cumsum_rows_cuda(const at::Tensor& x, FormatId format, at::Tensor& out);
#endif

}  // namespace carbon
