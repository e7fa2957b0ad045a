// The CUDA emulator's runtime (see cuda_emulator.h): blocks one after another, a block's threads as fibers on
// the calling host thread, switched only at barriers and warp collectives. A fiber is started with makecontext /
// swapcontext and afterwards switched with _setjmp / _longjmp, which (unlike swapcontext) make no system call to
// save the signal mask: softmax's rows cross ~25 barriers each, and every barrier is a switch per thread.
// (Fortified builds turn longjmp into __longjmp_chk, which refuses the jump between stacks that a switch is.)
#undef _FORTIFY_SOURCE
#include "cuda_emulator.h"

#include <setjmp.h>
#include <ucontext.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <sstream>
#include <string>
#include <vector>

namespace cuda_emu {
namespace {

constexpr int kWarp = 32;
constexpr size_t kStackBytes = 256 * 1024;  // the deepest device call chains (exact tiers, binary64 math) use a few KiB

enum class State { kRunnable, kBlockWait, kWarpWait, kDone };

struct Fiber {
  ucontext_t context;  // the first entry
  jmp_buf jump;        // where it continues
  bool started = false;
  ThreadView view;
  State state = State::kRunnable;
  uint64_t result = 0;  // a collective's value for this thread
  unsigned index = 0, warp = 0, lane = 0;
};

struct WarpState {
  unsigned present = 0;  // lanes that exist (the last warp of a block may be partial)
  unsigned exited = 0;
  unsigned arrived = 0;  // lanes waiting in the pending collective
  unsigned mask = 0;
  WarpOp op = WarpOp::kSync;
  int width = kWarp;
  uint64_t values[kWarp] = {};
  int params[kWarp] = {};
};

enum class BarrierKind { kPlain, kOr, kAnd, kCount };

struct Block {
  std::vector<Fiber> fibers;
  std::vector<WarpState> warps;
  unsigned alive = 0;
  unsigned barrier_arrived = 0;
  BarrierKind barrier_kind = BarrierKind::kPlain;
  int64_t barrier_value = 0;
  ucontext_t scheduler_context;  // written by each first entry, never resumed
  jmp_buf scheduler;
  Fiber* running = nullptr;
  const std::function<void()>* body = nullptr;
  std::string error;
  unsigned char* shared = nullptr;
};

thread_local Block* tl_block = nullptr;
thread_local std::vector<std::unique_ptr<char[]>> tl_stacks;
thread_local std::unique_ptr<double[]> tl_shared;
thread_local size_t tl_shared_bytes = 0;
thread_local uint64_t tl_rng = 0;
std::atomic<int64_t> g_launches{0};
std::mutex g_shared_mutex;
std::unordered_map<void*, size_t> g_shared;  // every static __shared__ variable seen so far, and its size

void poison_static_shared() {
  const std::lock_guard<std::mutex> lock(g_shared_mutex);
  for (const auto& [p, bytes] : g_shared) std::memset(p, 0xFF, bytes);
}

uint64_t next_random() {
  if (tl_rng == 0) {
    const char* seed = std::getenv("CARBON_CUDA_EMULATOR_SEED");
    tl_rng = 0x9E3779B97F4A7C15ull ^ (seed ? std::strtoull(seed, nullptr, 10) : 0ull);
    if (tl_rng == 0) tl_rng = 1;
  }
  tl_rng ^= tl_rng << 13;
  tl_rng ^= tl_rng >> 7;
  tl_rng ^= tl_rng << 17;
  return tl_rng;
}

Block& block() {
  TORCH_CHECK(tl_block != nullptr && tl_block->running != nullptr,
              "cuda emulator: a device builtin was used outside a kernel");
  return *tl_block;
}

// Back to the scheduler; returns when this fiber is scheduled again.
void yield_to_scheduler(Block& b) {
  if (_setjmp(b.running->jump) == 0) _longjmp(b.scheduler, 1);
}

// Runs f until it yields, fails or ends.
void resume(Block& b, Fiber& f) {
  b.running = &f;
  if (_setjmp(b.scheduler) == 0) {
    if (!f.started) {
      f.started = true;
      swapcontext(&b.scheduler_context, &f.context);  // comes back through _longjmp(b.scheduler)
    } else {
      _longjmp(f.jump, 1);
    }
  }
  b.running = nullptr;
}

[[noreturn]] void fail(Block& b, const std::string& message) {
  const Fiber* f = b.running;
  std::ostringstream out;
  out << "cuda emulator: block (" << f->view.block_idx.x << "," << f->view.block_idx.y << "," << f->view.block_idx.z
      << ") thread (" << f->view.thread_idx.x << "," << f->view.thread_idx.y << "," << f->view.thread_idx.z
      << "): " << message;
  b.error = out.str();
  b.running->state = State::kDone;
  _longjmp(b.scheduler, 1);  // never resumed
}

void release_block_barrier_if_complete(Block& b) {
  if (b.barrier_arrived == 0 || b.barrier_arrived != b.alive) return;
  int64_t value = b.barrier_value;
  if (b.barrier_kind == BarrierKind::kOr || b.barrier_kind == BarrierKind::kAnd) value = value != 0;
  for (Fiber& f : b.fibers)
    if (f.state == State::kBlockWait) {
      f.state = State::kRunnable;
      f.result = static_cast<uint64_t>(value);
    }
  b.barrier_arrived = 0;
}

int arrive_at_block_barrier(BarrierKind kind, int predicate) {
  Block& b = block();
  if (b.barrier_arrived == 0) {
    b.barrier_kind = kind;
    b.barrier_value = kind == BarrierKind::kAnd ? 1 : 0;
  } else if (b.barrier_kind != kind) {
    fail(b, "threads of one block wait in different kinds of barrier (__syncthreads and __syncthreads_or/and/count)");
  }
  const int64_t p = predicate != 0;
  if (kind == BarrierKind::kOr) b.barrier_value |= p;
  if (kind == BarrierKind::kAnd) b.barrier_value &= p;
  if (kind == BarrierKind::kCount) b.barrier_value += p;
  b.running->state = State::kBlockWait;
  ++b.barrier_arrived;
  release_block_barrier_if_complete(b);
  yield_to_scheduler(b);
  return static_cast<int>(b.running->result);
}

uint64_t lane_result(const WarpState& w, unsigned lane, Block& b) {
  const int width = w.width;
  const int param = w.params[lane];
  const unsigned base = lane / static_cast<unsigned>(width) * static_cast<unsigned>(width);
  unsigned src = lane;
  switch (w.op) {
    case WarpOp::kSync:
      return 0;
    case WarpOp::kAny:
    case WarpOp::kAll:
    case WarpOp::kBallot: {
      uint64_t ballot = 0;
      for (unsigned l = 0; l < kWarp; ++l)
        if ((w.mask >> l & 1u) && w.values[l]) ballot |= 1ull << l;
      if (w.op == WarpOp::kBallot) return ballot;
      if (w.op == WarpOp::kAny) return ballot != 0;
      return ballot == w.mask;
    }
    case WarpOp::kShflXor:
      src = lane ^ static_cast<unsigned>(param);
      if (src >= base + static_cast<unsigned>(width)) src = lane;
      break;
    case WarpOp::kShflIdx:
      src = base + static_cast<unsigned>(param % width);
      break;
    case WarpOp::kShflDown:
      src = lane + static_cast<unsigned>(param);
      if (src >= base + static_cast<unsigned>(width)) src = lane;
      break;
    case WarpOp::kShflUp:
      src = lane >= base + static_cast<unsigned>(param) ? lane - static_cast<unsigned>(param) : lane;
      break;
  }
  if (!(w.mask >> src & 1u)) {
    std::ostringstream out;
    out << "lane " << lane << " reads lane " << src << " in a shuffle, outside the mask 0x" << std::hex << w.mask;
    fail(b, out.str());
  }
  return w.values[src];
}

void exit_fiber(Block& b, Fiber& f) {
  WarpState& w = b.warps[f.warp];
  w.exited |= 1u << f.lane;
  if (w.arrived != 0 && (w.mask >> f.lane & 1u)) {
    std::ostringstream out;
    out << "exits while lanes of its warp wait for it in a warp collective (mask 0x" << std::hex << w.mask << ")";
    fail(b, out.str());
  }
  f.state = State::kDone;
  --b.alive;
  release_block_barrier_if_complete(b);
}

void fiber_main() {
  Block& b = *tl_block;
  Fiber& f = *b.running;
  try {
    (*b.body)();
  } catch (const std::exception& e) {
    b.error = std::string("cuda emulator: a kernel threw: ") + e.what();
  }
  exit_fiber(b, f);
  _longjmp(b.scheduler, 1);  // a fiber never returns (its uc_link is null)
}

std::string describe_deadlock(const Block& b) {
  std::ostringstream out;
  out << "cuda emulator: deadlock in block (" << b.fibers[0].view.block_idx.x << "," << b.fibers[0].view.block_idx.y
      << "," << b.fibers[0].view.block_idx.z << "): " << b.alive << " threads alive, " << b.barrier_arrived
      << " waiting at a block barrier; warps waiting in collectives:";
  for (size_t w = 0; w < b.warps.size(); ++w)
    if (b.warps[w].arrived)
      out << " warp " << w << " (arrived 0x" << std::hex << b.warps[w].arrived << " of mask 0x" << b.warps[w].mask
          << ", exited 0x" << b.warps[w].exited << std::dec << ")";
  out << ". A barrier or collective is not reached by every thread it waits for.";
  return out.str();
}

void run_block(const LaunchConfig& config, dim3 block_idx, const std::function<void()>& body) {
  const unsigned n = config.block.count();
  while (tl_stacks.size() < n) tl_stacks.emplace_back(new char[kStackBytes]);
  Block b;
  b.body = &body;
  b.fibers.resize(n);
  b.warps.resize((n + kWarp - 1) / kWarp);
  b.alive = n;
  b.shared = reinterpret_cast<unsigned char*>(tl_shared.get());
  // Fresh shared memory holds garbage on a GPU: NaN bytes here, so a read before a write shows.
  if (config.shared_bytes) std::memset(b.shared, 0xFF, config.shared_bytes);
  poison_static_shared();
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = b.fibers[i];
    f.index = i;
    f.warp = i / kWarp;
    f.lane = i % kWarp;
    b.warps[f.warp].present |= 1u << f.lane;
    f.view.block_dim = config.block;
    f.view.grid_dim = config.grid;
    f.view.block_idx = block_idx;
    f.view.thread_idx = dim3(i % config.block.x, i / config.block.x % config.block.y,
                             i / (config.block.x * config.block.y));
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = tl_stacks[i].get();
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = nullptr;
    makecontext(&f.context, fiber_main, 0);
  }
  Block* const outer = tl_block;
  tl_block = &b;
  std::vector<unsigned> order(n);
  for (unsigned i = 0; i < n; ++i) order[i] = i;
  while (b.alive > 0 && b.error.empty()) {
    // A different interleaving each round: a result that depends on it reveals a missing barrier.
    for (unsigned i = n; i > 1; --i) std::swap(order[i - 1], order[next_random() % i]);
    bool progressed = false;
    for (unsigned i : order) {
      Fiber& f = b.fibers[i];
      if (f.state != State::kRunnable) continue;
      progressed = true;
      resume(b, f);
      if (!b.error.empty()) break;
    }
    if (!progressed && b.error.empty()) b.error = describe_deadlock(b);
  }
  tl_block = outer;
  TORCH_CHECK(b.error.empty(), b.error);
}

}  // namespace

ThreadView& current_thread() { return block().running->view; }

unsigned char* dynamic_shared_memory() { return block().shared; }

void track_shared(void* p, size_t bytes) {
  const std::lock_guard<std::mutex> lock(g_shared_mutex);
  // The first thread to declare it in this process: the block already runs, so poison it now.
  if (g_shared.emplace(p, bytes).second) std::memset(p, 0xFF, bytes);
}

int64_t launch_count() { return g_launches.load(); }

void set_schedule_seed(uint64_t seed) {
  tl_rng = 0x9E3779B97F4A7C15ull ^ seed;
  if (tl_rng == 0) tl_rng = 1;  // xorshift's one fixed point
}

void launch(const LaunchConfig& config, const std::function<void()>& body) {
  ++g_launches;
  TORCH_CHECK(tl_block == nullptr, "cuda emulator: a kernel launched a kernel");
  const cudaDeviceProp& props = *at::cuda::getCurrentDeviceProperties();
  TORCH_CHECK(config.grid.count() > 0, "cuda emulator: launch with an empty grid (",
              config.grid.x, "x", config.grid.y, "x", config.grid.z, "): CUDA rejects it");
  TORCH_CHECK(config.block.count() > 0 && config.block.count() <= static_cast<unsigned>(props.maxThreadsPerBlock),
              "cuda emulator: ", config.block.count(), " threads per block (CUDA allows 1 to ",
              props.maxThreadsPerBlock, ")");
  TORCH_CHECK(config.grid.y <= 65535 && config.grid.z <= 65535, "cuda emulator: grid y / z above 65535");
  TORCH_CHECK(config.shared_bytes <= props.sharedMemPerBlockOptin, "cuda emulator: ", config.shared_bytes,
              " bytes of dynamic shared memory, more than the device's opt-in limit ", props.sharedMemPerBlockOptin);
  if (tl_shared_bytes < config.shared_bytes) {
    tl_shared.reset(new double[(config.shared_bytes + 7) / 8]);
    tl_shared_bytes = config.shared_bytes;
  }
  for (unsigned z = 0; z < config.grid.z; ++z)
    for (unsigned y = 0; y < config.grid.y; ++y)
      for (unsigned x = 0; x < config.grid.x; ++x) run_block(config, dim3(x, y, z), body);
}

void block_barrier() { arrive_at_block_barrier(BarrierKind::kPlain, 0); }
int block_barrier_or(int p) { return arrive_at_block_barrier(BarrierKind::kOr, p); }
int block_barrier_and(int p) { return arrive_at_block_barrier(BarrierKind::kAnd, p); }
int block_barrier_count(int p) { return arrive_at_block_barrier(BarrierKind::kCount, p); }

uint64_t warp_collective(unsigned mask, WarpOp op, uint64_t value, int param, int width) {
  Block& b = block();
  Fiber& f = *b.running;
  WarpState& w = b.warps[f.warp];
  if (!(mask >> f.lane & 1u)) fail(b, "a warp collective whose mask leaves out the calling lane");
  if (mask & ~w.present) fail(b, "a warp collective whose mask names lanes the block does not have");
  if (mask & w.exited) fail(b, "a warp collective whose mask names lanes that have exited");
  if (width <= 0 || width > kWarp || (width & (width - 1)) != 0) fail(b, "a shuffle width that is not 1, 2, ..., 32");
  if (w.arrived == 0) {
    w.op = op;
    w.mask = mask;
    w.width = width;
  } else if (w.op != op || w.mask != mask || w.width != width) {
    fail(b, "lanes of one warp are in different warp collectives (operation, mask or width differ)");
  }
  w.values[f.lane] = value;
  w.params[f.lane] = param;
  w.arrived |= 1u << f.lane;
  f.state = State::kWarpWait;
  if (w.arrived == w.mask) {
    for (unsigned l = 0; l < kWarp; ++l)
      if (w.mask >> l & 1u) {
        Fiber& other = b.fibers[f.warp * kWarp + l];
        other.result = lane_result(w, l, b);
        other.state = State::kRunnable;
      }
    w.arrived = 0;
  }
  yield_to_scheduler(b);
  return f.result;
}

}  // namespace cuda_emu

namespace at {
namespace cuda {

cudaDeviceProp* getCurrentDeviceProperties() {
  static cudaDeviceProp props = [] {
    cudaDeviceProp p{};
    const char* sms = std::getenv("CARBON_CUDA_EMULATOR_SMS");
    p.multiProcessorCount = sms ? std::max(1, std::atoi(sms)) : 2;  // an H200 has 132; few keeps grids small
    p.sharedMemPerBlock = 48 * 1024;
    p.sharedMemPerBlockOptin = 232448;  // the H200's (227 KiB)
    p.maxThreadsPerBlock = 1024;
    p.warpSize = 32;
    return p;
  }();
  return &props;
}

}  // namespace cuda
}  // namespace at
