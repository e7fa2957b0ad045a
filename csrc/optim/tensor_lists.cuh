// One CUDA launch over many tensors (an optimizer's parameters, a model's
// gradients) instead of one launch per tensor: a model has hundreds of small
// tensors (biases, norm weights), and each launch of its own costs more than
// its work. A launch takes up to kListTensors tensors of one dtype; their
// pointers travel by value in the kernel's arguments (so a CUDA graph
// captures them, and nothing is copied to the device first). Each tensor is
// cut into chunks of a fixed number of elements, the launch's chunks are
// numbered tensor after tensor, and blocks take chunks in a grid-stride
// loop. Every element's result depends on that element alone (or, for the
// sum of squares, on fixed chunks), so the grouping and the grid never show
// in the bits.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "../cuda_launch.cuh"

namespace carbon {

// Arguments of a list launch stay well under the 4 KB every CUDA version
// accepts: a handful of pointer arrays of this many entries.
constexpr int kListTensors = 32;

// Chunk c of a launch belongs to tensor t with first_chunk[t] <= c < first_chunk[t + 1] and covers that
// tensor's elements [(c - first_chunk[t]) * chunk, ...) up to numel[t].
struct ListChunks {
  int64_t numel[kListTensors];
  int64_t first_chunk[kListTensors + 1];
  int64_t chunk;  // elements per chunk
  int count;      // tensors in the launch
};

// Chunk c's tensor t and its elements [begin, end) in that tensor.
struct ChunkRange {
  int t;
  int64_t begin, end;
};
__device__ __forceinline__ ChunkRange chunk_range(const ListChunks& l, int64_t c) {
  int t = 0;
  while (c >= l.first_chunk[t + 1]) ++t;
  const int64_t begin = (c - l.first_chunk[t]) * l.chunk;
  return {t, begin, min(begin + l.chunk, l.numel[t])};
}

// Blocks for a launch over l's chunks: one per chunk, at most 32 per SM (the rest in the grid-stride loop).
inline int list_blocks(const ListChunks& l) {
  return blocks_for(l.first_chunk[l.count], 1);
}

// Calls launch(indices, chunks) for runs of at most kListTensors tensors of one dtype, in order, leaving out the
// empty ones (nothing to launch for a list of only empty tensors).
template <typename Launch>
void for_each_tensor_list(at::TensorList tensors, int64_t chunk, Launch&& launch) {
  std::vector<size_t> run;
  auto flush = [&] {
    if (run.empty()) return;
    ListChunks l{};
    l.chunk = chunk;
    l.count = static_cast<int>(run.size());
    for (int k = 0; k < l.count; ++k) {
      l.numel[k] = tensors[run[k]].numel();
      l.first_chunk[k + 1] = l.first_chunk[k] + (l.numel[k] + chunk - 1) / chunk;
    }
    launch(run, l);
    run.clear();
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].numel() == 0) continue;
    if (!run.empty() && (run.size() == kListTensors || tensors[i].scalar_type() != tensors[run[0]].scalar_type()))
      flush();
    run.push_back(i);
  }
  flush();
}

}  // namespace carbon
