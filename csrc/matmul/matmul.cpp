// The matmul ops: input checks and the device-independent part of the
// algorithm (exact fp64 copies, the fp64 GEMM, row statistics), then the
// device's rounding kernel. See docs/contract.md for what is guaranteed.
#include "matmul.h"

#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/promote_types.h>
#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>

#include "../dtypes.h"
#include "../exact/fp_env.h"
#include "matmul_cpu.h"
#include "matmul_few_rows.h"
#include "matmul_small_k.h"

namespace carbon {
namespace {

void check_device(const char* op, const at::Tensor& a, const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.device() == a.device(), "carbon.", op, ": expected all tensors on one device, ",
                    "but a is on ", a.device(), " and ", name, " is on ", t.device());
}

at::ScalarType output_dtype(const char* op, const at::Tensor& a, const at::Tensor& b,
                            std::optional<at::ScalarType> requested) {
  return checked_out_dtype(op, requested.value_or(at::promote_types(a.scalar_type(), b.scalar_type())));
}

// Significand bits of a supported dtype.
int precision_of(at::ScalarType t) {
  if (t == at::kBFloat16) return 8;
  if (t == at::kHalf) return 11;
  return 24;
}

// The view of B problems (one batch chunk): the fp64 copies, the GEMM's
// result and the rows' statistics of those B, and the bias (undefined, or
// expanded to [all batches, M, N]) from batch b0 on.
MatmulView make_view(int64_t B, int64_t M, int64_t N, int64_t K, const at::Tensor& bias64, int64_t b0,
                     const at::Tensor& approx, const at::Tensor& a64, const at::Tensor& bt64, const at::Tensor& a_norm,
                     const at::Tensor& b_norm, const at::Tensor& a_signs, const at::Tensor& b_signs) {
  MatmulView v{};
  v.B = B, v.M = M, v.N = N, v.K = K;
  if (bias64.defined()) {
    v.bias = bias64.const_data_ptr<double>() + b0 * bias64.stride(0);
    v.bias_stride_b = bias64.stride(0);
    v.bias_stride_m = bias64.stride(1);
    v.bias_stride_n = bias64.stride(2);
  }
  v.gemm_gamma = fp64_gemm_gamma(K, bias64.defined());
  v.approx = approx.const_data_ptr<double>();
  v.a = a64.const_data_ptr<double>();
  v.bt = bt64.const_data_ptr<double>();
  v.a_norm = a_norm.const_data_ptr<double>();
  v.b_norm = b_norm.const_data_ptr<double>();
  v.a_signs = a_signs.const_data_ptr<uint8_t>();
  v.b_signs = b_signs.const_data_ptr<uint8_t>();
  return v;
}

// Bytes of scratch (fp64 copies of both operands and the GEMM's result) per
// batch chunk and thread of the CPU path: about one core's L2 cache. The
// batch is processed in chunks of that size, each widened, multiplied and
// rounded before the next one, so each chunk's fp64 copies are written and
// read again while in the cache (and the next chunk reuses that memory),
// instead of the whole batch's copies (100 MB for causal attention's
// 48 x 256 x 256 probabilities and their transpose) going out to memory and
// back. Every output is computed from its own row and column alone, so the
// chunks cannot change a bit.
constexpr int64_t kChunkBytesPerThread = int64_t{1} << 20;

// Rows of one batch's product per chunk of the CPU path: all M unless the
// fp64 GEMM's result, M x N doubles, is large (above 32 MiB and twice the
// budget); then enough rows for the budget, but at least 256, so that each
// chunk's GEMM still does 512 flops per element of b it reads again.
// Measured (one thread / two, ms, whole product against row chunks):
// 8192 x 16 x 4096 265 / 305 -> 129 / 155 (the 268 MB result's first-touch
// page faults and memory traffic gone), 8192 x 256 x 8192 1125 / 1170 ->
// 910 / 960, 8192 x 768 x 768 and 1024 x 256 x 8192 within 3% either way.
int64_t rows_per_chunk(int64_t M, int64_t N, int64_t budget) {
  const int64_t row_bytes = std::max<int64_t>(N, 1) * static_cast<int64_t>(sizeof(double));
  if (M * row_bytes <= std::max<int64_t>(int64_t{32} << 20, 2 * budget)) return M;
  return std::clamp<int64_t>(budget / row_bytes, 256, M);
}

// Widened rows (of a, or of b transposed) and their statistics, as
// widen_operand_cpu writes them.
struct Widened {
  at::Tensor values, norm, signs, quantum, spans;
};

// widen_operand_cpu of x into w (its tensors are views of the caller's).
void widen(const at::Tensor& x, const Widened& w, int precision, double scale) {
  at::Tensor values = w.values, norm = w.norm, signs = w.signs, quantum = w.quantum, spans = w.spans;
  widen_operand_cpu(x, values, norm, signs, precision, scale, quantum, spans);
}

// Tier 1's approximation of a times bt (batches b0 on, as many as `a` holds)
// into `approx`, and the rounding of every output into out_part. Any fp64
// GEMM is fine: the bound covers every summation order, so the BLAS's
// blocking and threading cannot matter. Each row is rounded on its own, so
// rounding the GEMM's rows as they are done (while in the cache) or all of
// them after it gives the same bits.
void multiply_and_round(const Widened& a, const Widened& bt, at::Tensor& approx, const at::Tensor& bias64, int64_t b0,
                        FormatId f, at::Tensor& out_part, bool lower_only) {
  const int64_t B = a.values.size(0), M = a.values.size(1), K = a.values.size(2), N = bt.values.size(1);
  MatmulView v = make_view(B, M, N, K, bias64, b0, approx, a.values, bt.values, a.norm, bt.norm, a.signs, bt.signs);
  v.a_quantum53 = a.quantum.const_data_ptr<double>();
  v.b_quantum = bt.quantum.const_data_ptr<double>();
  const bool rounded = fp64_gemm_cpu(a.values, bt.values, a.spans, bt.spans, approx, lower_only,
                                     [&](int64_t begin, int64_t end) {
                                       matmul_round_row_range_cpu(v, f, out_part, lower_only, begin, end);
                                     });
  if (!rounded) matmul_round_rows_cpu(v, f, out_part, lower_only);
}

// The CPU path of matmul_into, in chunks of the batch.
void matmul_into_cpu(const at::Tensor& a3, const at::Tensor& b3, const at::Tensor& bias, at::Tensor& out,
                     bool lower_only) {
  // A short inner dimension and few rows (a depthwise convolution): the
  // direct path, without the copies and row statistics below.
  if (!lower_only && matmul_small_k_cpu(a3, b3, bias, out)) return;
  // Few rows per batch (a decoding step, a small batch through a linear
  // layer): straight from b, without its fp64 copy and statistics, which
  // would cost more than the products.
  if (!lower_only && matmul_few_rows_cpu(a3, b3, bias, out)) return;
  const int64_t B = a3.size(0), M = a3.size(1), K = a3.size(2), N = b3.size(2);
  // Exact copies in double (every supported value is a double), laid out so
  // that a row of a and a column of b are contiguous for the exact tiers,
  // and the statistics of those rows and columns. Each operand is widened
  // and summarized in one pass (at::Tensor::copy_ alone is slower than both
  // together).
  const auto stat_options = a3.options().dtype(at::kDouble);
  at::Tensor a_norm = at::empty({B * M}, stat_options);
  at::Tensor b_norm = at::empty({B * N}, stat_options);
  at::Tensor a_signs = at::empty({B * M}, stat_options.dtype(at::kByte));
  at::Tensor b_signs = at::empty({B * N}, stat_options.dtype(at::kByte));
  at::Tensor a_quantum = at::empty({B * M}, stat_options);
  at::Tensor b_quantum = at::empty({B * N}, stat_options);
  const auto span_options = stat_options.dtype(at::kInt);
  at::Tensor a_spans = at::empty({B * M, 2}, span_options), b_spans = at::empty({B * N, 2}, span_options);
  const at::Tensor b3t = b3.transpose(1, 2);
  at::Tensor bias64;
  if (bias.defined()) bias64 = bias.to(at::kDouble).expand({B, M, N});

  const int64_t per_batch = (M * K + N * K + M * N) * static_cast<int64_t>(sizeof(double));
  const int64_t budget = kChunkBytesPerThread * std::max<int64_t>(1, at::get_num_threads());
  const int64_t chunk = std::clamp<int64_t>(budget / std::max<int64_t>(per_batch, 1), 1, B);
  const FormatId f = format_of(out.scalar_type());
  const int64_t row_chunk = rows_per_chunk(M, N, budget);
  if (!lower_only && row_chunk < M) {
    // Large outputs: each batch's rows in chunks, so that the fp64 GEMM's
    // result lives in scratch of row_chunk rows instead of all M (an LM
    // head of 8192 x 50257 outputs would need 3.3 GB more). b is widened
    // once per batch; each chunk, a task of its own (the BLAS then runs on
    // one thread: measured, the BLAS's own threads over 32 calls of 256
    // rows cost 2.5x one call of 8192 rows on 2 busy cores), widens its rows
    // of a into its thread's scratch, multiplies them by all of b and rounds
    // them. Every output is computed from its own row and column alone, so
    // the chunks cannot change a bit.
    const int64_t chunks = (M + row_chunk - 1) / row_chunk;
    for (int64_t b = 0; b < B; ++b) {
      const Widened bt{scratch_doubles({1, N, K}), b_norm.narrow(0, b * N, N), b_signs.narrow(0, b * N, N),
                       b_quantum.narrow(0, b * N, N), b_spans.narrow(0, b * N, N)};
      widen(b3t.narrow(0, b, 1), bt, precision_of(b3.scalar_type()), 1.0);
      carbon::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          const int64_t r0 = c * row_chunk, rows = std::min(row_chunk, M - r0), first = b * M + r0;
          const Widened a{scratch_doubles({1, rows, K}), a_norm.narrow(0, first, rows),
                          a_signs.narrow(0, first, rows), a_quantum.narrow(0, first, rows),
                          a_spans.narrow(0, first, rows)};
          widen(a3.narrow(0, b, 1).narrow(1, r0, rows), a, precision_of(a3.scalar_type()), 0x1p53);
          at::Tensor approx = scratch_doubles({1, rows, N});
          const at::Tensor bias_rows = bias64.defined() ? bias64.narrow(1, r0, rows) : bias64;
          at::Tensor out_rows = out.narrow(0, b, 1).narrow(1, r0, rows);
          multiply_and_round(a, bt, approx, bias_rows, b, f, out_rows, false);
        }
      });
    }
    return;
  }
  // One chunk of batches: widened into this thread's scratch, multiplied and rounded.
  auto run_chunk = [&](int64_t b0, int64_t cb) {
    const Widened a{scratch_doubles({cb, M, K}), a_norm.narrow(0, b0 * M, cb * M), a_signs.narrow(0, b0 * M, cb * M),
                    a_quantum.narrow(0, b0 * M, cb * M), a_spans.narrow(0, b0 * M, cb * M)};
    const Widened bt{scratch_doubles({cb, N, K}), b_norm.narrow(0, b0 * N, cb * N), b_signs.narrow(0, b0 * N, cb * N),
                     b_quantum.narrow(0, b0 * N, cb * N), b_spans.narrow(0, b0 * N, cb * N)};
    widen(a3.narrow(0, b0, cb), a, precision_of(a3.scalar_type()), 0x1p53);
    widen(b3t.narrow(0, b0, cb), bt, precision_of(b3.scalar_type()), 1.0);
    at::Tensor approx = scratch_doubles({cb, M, N});  // tier 1's approximation
    at::Tensor out_chunk = out.narrow(0, b0, cb);
    multiply_and_round(a, bt, approx, bias64, b0, f, out_chunk, lower_only);
  };
  const int64_t threads = at::get_num_threads();
  const int64_t small_chunk = std::clamp<int64_t>(kChunkBytesPerThread / std::max<int64_t>(per_batch, 1), 1, B);
  if (threads > 1 && B >= 4 * threads * small_chunk) {
    // Many small batches (attention's heads): each chunk a task of its own,
    // sized for one thread's cache, and everything in it (widening, the
    // BLAS, rounding) on that thread. Parallel inside each chunk instead,
    // the threads met at ~5 barriers per chunk: measured, 48 x 256 x 64 x
    // 256 at 2 threads spent ~12% of its time in OpenMP's waits.
    const int64_t chunks = (B + small_chunk - 1) / small_chunk;
    carbon::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) run_chunk(c * small_chunk, std::min(small_chunk, B - c * small_chunk));
    });
    return;
  }
  for (int64_t b0 = 0; b0 < B; b0 += chunk) run_chunk(b0, std::min(chunk, B - b0));
}

// fp64 scratch (doubles) the device path may hold per chunk of a product: 2 GiB, or
// CARBON_CUDA_MATMUL_SCRATCH_BYTES (tests use a few KiB to exercise the slicing on small products).
int64_t device_scratch_doubles() {
  const char* bytes = std::getenv("CARBON_CUDA_MATMUL_SCRATCH_BYTES");
  const int64_t b = bytes != nullptr ? std::atoll(bytes) : (int64_t{2} << 30);
  return std::max<int64_t>(b / static_cast<int64_t>(sizeof(double)), 1);
}

// a3: [B, M, K], b3: [B, K, N], bias: broadcastable to [B, M, N] or undefined;
// out: [B, M, N], contiguous, of the output dtype. The bias is converted
// before it is expanded, so a broadcast bias costs no memory. lower_only
// (CPU, no bias): see bmm_into_cpu.
void matmul_into(const at::Tensor& a3, const at::Tensor& b3, const at::Tensor& bias, at::Tensor& out,
                 bool lower_only) {
  const int64_t B = a3.size(0), M = a3.size(1), K = a3.size(2), N = b3.size(2);
  if (out.numel() == 0) return;
  if (a3.is_cpu()) return matmul_into_cpu(a3, b3, bias, out, lower_only);
  at::Tensor bias64;
  if (bias.defined()) bias64 = bias.to(at::kDouble).expand({B, M, N});
  const at::Tensor b3t = b3.transpose(1, 2);
  // The device's scratch -- fp64 copies of both operands and the fp64 GEMM's result -- is bounded: whole
  // batches at a time while they fit, else one batch's rows in slices (a language model's output layer,
  // 16384 x 768 x 50257, would otherwise hold 6.6 GB of fp64 products). Each output is computed from its own
  // row and column alone, so the slicing cannot change a bit.
  const int64_t budget = device_scratch_doubles();
  const int64_t per_batch = M * N + M * K + N * K;
  const int64_t batches = std::clamp<int64_t>(budget / std::max<int64_t>(per_batch, 1), 1, B);
  const int64_t rows = batches > 1 || per_batch <= budget
                           ? M
                           : std::clamp<int64_t>((budget - N * K) / std::max<int64_t>(N + K, 1), 1, M);
  for (int64_t b0 = 0; b0 < B; b0 += batches) {
    const int64_t cb = std::min(batches, B - b0);
    const auto options = a3.options().dtype(at::kDouble);
    at::Tensor bt64 = at::empty({cb, N, K}, options);
    at::Tensor b_norm = at::empty({cb * N}, options);
    at::Tensor b_signs = at::empty({cb * N}, options.dtype(at::kByte));
#ifdef CARBON_WITH_CUDA
    widen_rows_cuda(b3t.narrow(0, b0, cb), bt64, b_norm, b_signs);
#endif
    for (int64_t m0 = 0; m0 < M; m0 += rows) {
      const int64_t cm = std::min(rows, M - m0);
      at::Tensor a64 = at::empty({cb, cm, K}, options);
      at::Tensor a_norm = at::empty({cb * cm}, options);
      at::Tensor a_signs = at::empty({cb * cm}, options.dtype(at::kByte));
#ifdef CARBON_WITH_CUDA
      widen_rows_cuda(a3.narrow(0, b0, cb).narrow(1, m0, cm), a64, a_norm, a_signs);
#endif
      const at::Tensor approx =
          (cb == 1 ? at::mm(a64[0], bt64[0].t()).unsqueeze(0) : at::bmm(a64, bt64.transpose(1, 2))).contiguous();
      const at::Tensor bias_part = bias64.defined() ? bias64.narrow(0, b0, cb).narrow(1, m0, cm) : bias64;
      at::Tensor out_part = out.narrow(0, b0, cb).narrow(1, m0, cm);  // contiguous: whole batches, or one's rows
      TORCH_INTERNAL_ASSERT(out_part.is_contiguous());
      const MatmulView v =
          make_view(cb, cm, N, K, bias_part, 0, approx, a64, bt64, a_norm, b_norm, a_signs, b_signs);
#ifdef CARBON_WITH_CUDA
      matmul_round_cuda(v, format_of(out.scalar_type()), out_part);
#endif
    }
  }
}

at::Tensor matmul_correctly_rounded(const at::Tensor& a3, const at::Tensor& b3,
                                    const at::Tensor& bias, at::ScalarType out_dtype) {
  at::Tensor out = at::empty({a3.size(0), a3.size(1), b3.size(2)}, a3.options().dtype(out_dtype));
  matmul_into(a3, b3, bias, out, false);
  return out;
}

void check_operands(const char* op, const at::Tensor& a, const at::Tensor& b, int64_t rank) {
  check_supported_dtype(op, "a", a);
  check_supported_dtype(op, "b", b);
  check_device(op, a, "b", b);
  TORCH_CHECK(a.is_cpu() || a.is_cuda(), "carbon.", op, ": tensors on ", a.device(),
              " are not supported (CPU and CUDA only)");
  TORCH_CHECK_VALUE(a.dim() == rank && b.dim() == rank, "carbon.", op, ": expected ", rank,
                    "-D tensors, got a with shape ", a.sizes(), " and b with shape ", b.sizes());
  TORCH_CHECK_VALUE(a.size(rank - 1) == b.size(rank - 2), "carbon.", op,
                    ": shapes cannot be multiplied (", a.sizes(), " and ", b.sizes(), ")");
  if (rank == 3)
    TORCH_CHECK_VALUE(a.size(0) == b.size(0), "carbon.", op, ": batch sizes differ (",
                      a.sizes(), " and ", b.sizes(), ")");
  // Fewer than 2^31 terms keeps the exact accumulator's limbs from overflowing.
  TORCH_CHECK_VALUE(a.size(rank - 1) < (int64_t(1) << 31) - 1, "carbon.", op,
                    ": the inner dimension must be below 2^31 - 1");
}

const at::Tensor& checked_bias(const char* op, const at::Tensor& bias, const at::Tensor& a,
                        at::IntArrayRef out_shape) {
  check_supported_dtype(op, "bias", bias);
  check_device(op, a, "bias", bias);
  TORCH_CHECK_VALUE(bias.dim() <= static_cast<int64_t>(out_shape.size()) &&
                        at::is_expandable_to(bias.sizes(), out_shape),
                    "carbon.", op, ": bias of shape ", bias.sizes(),
                    " cannot be broadcast to the output shape ", out_shape);
  return bias;
}

}  // namespace

at::Tensor mm(const at::Tensor& a, const at::Tensor& b, std::optional<at::ScalarType> out_dtype) {
  check_operands("mm", a, b, 2);
  const auto out = output_dtype("mm", a, b, out_dtype);
  return matmul_correctly_rounded(a.unsqueeze(0), b.unsqueeze(0), at::Tensor(), out)[0];
}

at::Tensor addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b,
                 std::optional<at::ScalarType> out_dtype) {
  check_operands("addmm", a, b, 2);
  const auto out = output_dtype("addmm", a, b, out_dtype);
  const std::vector<int64_t> shape{a.size(0), b.size(1)};
  const at::Tensor& bias2 = checked_bias("addmm", bias, a, shape);
  return matmul_correctly_rounded(a.unsqueeze(0), b.unsqueeze(0), bias2, out)[0];
}

at::Tensor bmm(const at::Tensor& a, const at::Tensor& b, std::optional<at::ScalarType> out_dtype) {
  check_operands("bmm", a, b, 3);
  const auto out = output_dtype("bmm", a, b, out_dtype);
  return matmul_correctly_rounded(a, b, at::Tensor(), out);
}

void bmm_into_cpu(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, bool lower_only) {
  check_operands("bmm", a, b, 3);
  TORCH_CHECK(a.is_cpu() && out.is_cpu() && out.is_contiguous() && out.dim() == 3 && out.size(0) == a.size(0) &&
                  out.size(1) == a.size(1) && out.size(2) == b.size(2),
              "carbon: bmm_into_cpu expects CPU operands and a contiguous CPU output of shape [B, M, N]");
  checked_out_dtype("bmm", out.scalar_type());
  matmul_into(a, b, at::Tensor(), out, lower_only);
}

at::Tensor baddbmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b,
                   std::optional<at::ScalarType> out_dtype) {
  check_operands("baddbmm", a, b, 3);
  const auto out = output_dtype("baddbmm", a, b, out_dtype);
  const std::vector<int64_t> shape{a.size(0), a.size(1), b.size(2)};
  return matmul_correctly_rounded(a, b, checked_bias("baddbmm", bias, a, shape), out);
}

}  // namespace carbon
