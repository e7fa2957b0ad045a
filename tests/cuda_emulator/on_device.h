// Force-included (by build.py) into the op files of the emulated build: every tensor is treated as a device
// tensor, so the ops take their CUDA branches into the emulated kernels.
#pragma once

template <typename T>
constexpr bool cuda_emu_on_cpu(const T&) {
  return false;
}
