// Kernels that test the CUDA emulator itself (tests/test_cuda_emulator.py): what the warp collectives and
// barriers return, and that the bugs the emulator promises to catch are caught. Registered as carbon_emu::_emu_*.
#include "cuda_emulator.h"

#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;

// out[op][lane] for one warp: 0 shfl_xor(lane, 5), 1 shfl_idx(lane, 3), 2 shfl_down(lane, 3), 3 shfl_up(lane, 3),
// 4 shfl_xor with width 8 (mask 9), 5 shfl_down with width 8 (delta 3), 6 ballot(lane odd), 7 any(lane == 30),
// 8 all(lane < 31), 9 __syncthreads_or(lane == 7) (block of 64: lanes of both warps), 10 __syncthreads_count(odd).
__global__ void collectives_kernel(int64_t* out) {
  const int t = static_cast<int>(threadIdx.x);
  const int lane = t % 32;
  const int64_t row = 64;
  int64_t v[11];
  v[0] = __shfl_xor_sync(kFull, t, 5);
  v[1] = __shfl_sync(kFull, t, 3);
  v[2] = __shfl_down_sync(kFull, t, 3);
  v[3] = __shfl_up_sync(kFull, t, 3);
  v[4] = __shfl_xor_sync(kFull, t, 9, 8);
  v[5] = __shfl_down_sync(kFull, t, 3, 8);
  v[6] = static_cast<int64_t>(__ballot_sync(kFull, lane % 2));
  v[7] = __any_sync(kFull, lane == 30);
  v[8] = __all_sync(kFull, lane < 31);
  v[9] = __syncthreads_or(t == 7);
  v[10] = __syncthreads_count(t % 2);
  for (int k = 0; k < 11; ++k) out[k * row + t] = v[k];
}

at::Tensor collectives() {
  at::Tensor out = at::full({11, 64}, -1, at::kLong);
  int64_t* p = out.data_ptr<int64_t>();
  cuda_emu::launch(cuda_emu::LaunchConfig(1, 64), [&] { collectives_kernel(p); });
  return out;
}

// A block sum through shared memory with the barrier after the writes left out when `buggy`: thread t adds its
// neighbours' slots, which are written or not yet written depending on the order the threads ran in.
__global__ void neighbour_sum_kernel(bool buggy, int64_t* out) {
  __shared__ int64_t slots[128];
  const unsigned t = threadIdx.x;
  slots[t] = 0;
  __syncthreads();
  slots[t] = t + 1;
  if (!buggy) __syncthreads();
  out[t] = slots[(t + 1) % 128] + slots[(t + 127) % 128];
}

at::Tensor neighbour_sum(bool buggy, int64_t seed) {
  cuda_emu::set_schedule_seed(static_cast<uint64_t>(seed));
  at::Tensor out = at::zeros({128}, at::kLong);
  int64_t* p = out.data_ptr<int64_t>();
  cuda_emu::launch(cuda_emu::LaunchConfig(1, 128), [&] { neighbour_sum_kernel(buggy, p); });
  return out;
}

// The bugs the emulator reports instead of hanging or returning garbage.
__global__ void misuse_kernel(int64_t kind) {
  const unsigned t = threadIdx.x;
  if (kind == 0) {  // half a warp waits at the block barrier, the other half in a warp collective: deadlock
    if (t < 16) __syncthreads();
    else __syncwarp();
  } else if (kind == 1) {  // a full-mask shuffle after lanes exited
    if (t >= 16) return;
    (void)__shfl_xor_sync(kFull, t, 1);
  } else if (kind == 2) {  // lanes of one warp in different collectives
    if (t % 2) (void)__shfl_xor_sync(kFull, t, 1);
    else (void)__any_sync(kFull, 1);
  } else if (kind == 3) {  // threads of one block in different kinds of barrier
    if (t < 32) __syncthreads();
    else (void)__syncthreads_or(1);
  } else if (kind == 4) {  // a shuffle reading a lane outside its mask
    if (t % 32 < 16 || t % 32 == 31) (void)__shfl_sync(0x0000FFFFu | (1u << 31), t, 20);
  }
}

void misuse(int64_t kind) {
  if (kind == 5) {  // an empty grid
    cuda_emu::launch(cuda_emu::LaunchConfig(0, 32), [] {});
    return;
  }
  cuda_emu::launch(cuda_emu::LaunchConfig(1, 64), [&] { misuse_kernel(kind); });
}

int64_t launches() { return cuda_emu::launch_count(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(carbon_emu, m) {
  m.def("_emu_collectives() -> Tensor", &collectives);
  m.def("_emu_neighbour_sum(bool buggy, int seed) -> Tensor", &neighbour_sum);
  m.def("_emu_misuse(int kind) -> ()", &misuse);
  m.def("_emu_launches() -> int", &launches);
}
