// CPU kernel of the indexed accumulations. Destinations (o, j) are split
// over threads; each destination adds its segment of contributing source
// rows column by column (tier 1, vectorized across a block of columns, one
// sequential chain per column), then every column is decided on its own
// (scatter_kernel.h). The chains' depth is the number of terms whatever the
// thread count, so the bits never depend on it.
#include <ATen/Parallel.h>

#include <algorithm>

#include "../dtypes.h"
#include "scatter.h"
#include "scatter_kernel.h"

namespace carbon {
namespace {

constexpr int64_t kColumnBlock = 256;

// Tier 1 of one block of columns: s[c] = (self) + sum of the rows, a[c] the
// same for absolute values.
template <typename T>
__attribute__((target_clones("avx2", "default"))) void block_sums(const T* __restrict__ self,
                                                                 const T* __restrict__ source,
                                                                 const int64_t* __restrict__ order, int64_t count,
                                                                 int64_t inner, int64_t width,
                                                                 double* __restrict__ s, double* __restrict__ a) {
  if (self) {
    for (int64_t c = 0; c < width; ++c) {
      const double v = element_value(self[c]);
      s[c] = v;
      a[c] = abs_value(v);
    }
  } else {
    for (int64_t c = 0; c < width; ++c) s[c] = a[c] = 0.0;
  }
  for (int64_t p = 0; p < count; ++p) {
    const T* row = source + order[p] * inner;
    for (int64_t c = 0; c < width; ++c) {
      const double v = element_value(row[c]);
      s[c] = s[c] + v;
      a[c] = a[c] + abs_value(v);
    }
  }
}

// Tier 1's decision for a block of columns, without branches (so the loop
// vectorizes), restricted to intervals in f's normal range. It is
// round_if_decided(s, factor * a) specialized to that range: the interval
// [s - beta, s + beta], pushed one ulp outwards (next_down / next_up are
// steps of one in the magnitude's bits), must lie on one side of 0 with both
// ends rounding to the same normal number of f. Every other column (zeros,
// subnormals, overflow, non-finite sums, undecided intervals) is flagged in
// `pending` for scatter_finish. A decided column is RN_f(exact sum), as from
// scatter_finish, so the tier that decides never shows in the bits.
template <typename F>
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) uint32_t decide_block(
    const double* __restrict__ s, const double* __restrict__ a, double factor, int64_t width,
    typename F::Bits* __restrict__ out, uint8_t* __restrict__ pending) {
  constexpr FloatFormat f = F::get();
  uint32_t all_decided = 1;
  for (int64_t c = 0; c < width; ++c) {
    const double beta = factor * a[c];
    const uint64_t lo = double_to_bits(s[c] - beta), hi = double_to_bits(s[c] + beta);
    const uint64_t mag_lo = lo & ~kSignBit, mag_hi = hi & ~kSignBit;
    const uint64_t inner = (mag_lo < mag_hi ? mag_lo : mag_hi) - 1;  // one ulp towards 0 (0 wraps: not normal)
    const uint64_t outer = (mag_lo < mag_hi ? mag_hi : mag_lo) + 1;  // one ulp away from 0
    const uint64_t r_inner = round_normal_bits(inner, f);
    const uint32_t decided = static_cast<uint32_t>(((lo ^ hi) & kSignBit) == 0) & rounds_to_normal(inner, f) &
                             rounds_to_normal(outer, f) & static_cast<uint32_t>(r_inner == round_normal_bits(outer, f));
    const uint32_t sign = static_cast<uint32_t>(lo >> 63) << (f.total_bits - 1);
    out[c] = static_cast<typename F::Bits>(sign | encode_normal(r_inner, f));
    pending[c] = static_cast<uint8_t>(decided ^ 1u);
    all_decided &= decided;
  }
  return all_decided;
}

template <typename T, typename F>
void scatter_rows(const T* self, const T* source, const int64_t* order, const int64_t* offsets, int64_t outer,
                  int64_t N, int64_t S, int64_t inner, typename F::Bits* out) {
  constexpr FloatFormat f = F::get();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1));
  at::parallel_for(0, outer * S, grain, [&](int64_t begin, int64_t end) {
    double s[kColumnBlock], a[kColumnBlock];
    uint8_t pending[kColumnBlock];
    for (int64_t d = begin; d < end; ++d) {
      const int64_t o = d / S, j = d % S;
      const int64_t* seg = order + offsets[j];
      const int64_t count = offsets[j + 1] - offsets[j];
      typename F::Bits* dst = out + d * inner;
      if (count == 0 && !self) continue;  // +0, from the zero fill in scatter_rows_cpu
      const double factor = scatter_bound_factor(count + (self ? 1 : 0));
      for (int64_t c0 = 0; c0 < inner; c0 += kColumnBlock) {
        const int64_t width = std::min(kColumnBlock, inner - c0);
        const T* self_row = self ? self + d * inner + c0 : nullptr;
        const T* src = source + o * N * inner + c0;
        block_sums(self_row, src, seg, count, inner, width, s, a);
        if (decide_block<F>(s, a, factor, width, dst + c0, pending)) continue;
        for (int64_t c = 0; c < width; ++c) {
          if (!pending[c]) continue;
          const DestinationTerms<T> terms{self_row ? self_row + c : nullptr, src + c, seg, count, inner};
          dst[c0 + c] = static_cast<typename F::Bits>(encode(scatter_finish(terms, s[c], a[c], factor, f), f));
        }
      }
    }
  });
}

}  // namespace

void scatter_rows_cpu(const at::Tensor& self, const at::Tensor& source, const at::Tensor& order,
                      const at::Tensor& offsets, int64_t outer, int64_t S, int64_t inner, at::Tensor& out) {
  const int64_t N = order.numel();
  // Destinations with nothing to add (no self, no contribution) are +0: one
  // zero fill of the whole output (torch's, at memset speed), then the kernel
  // writes only the destinations that have terms.
  if (!self.defined()) out.zero_();
  with_element_type(source.scalar_type(), [&](auto element) {
    using T = decltype(element);
    with_format(format_of(out.scalar_type()), [&](auto fmt) {
      using F = decltype(fmt);
      scatter_rows<T, F>(self.defined() ? self.const_data_ptr<T>() : nullptr, source.const_data_ptr<T>(),
                         order.const_data_ptr<int64_t>(), offsets.const_data_ptr<int64_t>(), outer, N, S, inner,
                         static_cast<typename F::Bits*>(out.mutable_data_ptr()));
    });
  });
}

}  // namespace carbon
