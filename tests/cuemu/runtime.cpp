// The block scheduler of cuemu (contract in cuemu.h, design in docs/kernels/emulator.md).
//
// A launch runs its blocks one after another on the calling OS thread. A block's threads are
// boost.context fibers; a fiber runs until it reaches a rendezvous (__syncthreads, a warp
// collective) or returns, then hands control back to the scheduler, which resumes the next ready
// fiber in the order of the schedule. Nothing runs concurrently, so the only interleavings are the
// ones at rendezvous points: a missing barrier shows up as a read of poisoned or stale shared
// memory in one order and not in another, which is why every kernel test runs all three orders.

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <cstdio>
#include <deque>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "cuemu/cuemu.h"
#include "cuemu/device_state.h"

extern "C" {
// Bounds of every __shared__ variable of the emulated kernels (see cuemu.h); weak, so a binary
// without emulated kernels still links.
extern char __start_cuemu_shared[] __attribute__((weak));
extern char __stop_cuemu_shared[] __attribute__((weak));
}

namespace cuemu {
namespace detail {

ThreadCoords* current_thread = nullptr;
uint3 block_idx;
dim3 block_dim;
dim3 grid_dim;

namespace {

namespace ctx = boost::context;

constexpr size_t kFiberStackBytes = 256 * 1024;
constexpr unsigned char kPoisonByte = 0xFF;  // NaN in fp32/fp16/bf16, -1 in integers
constexpr int kLandOneIn = 4;                // random schedule: chance of landing a cp.async group

enum class Status { kReady, kRunning, kAtBarrier, kAtWarpOp, kExited, kFaulted };

struct AsyncCopy {
  void* dst;
  const void* src;
  int cp_size;
  int src_size;
};

struct Thread : ThreadCoords {
  int linear = 0;
  int warp = 0;
  Status status = Status::kReady;
  ctx::fiber fiber;
  ctx::fiber scheduler;  // valid while this thread runs: resuming it yields
  Where where{};
  // Barrier operand.
  int predicate = 0;
  int* count = nullptr;
  // Warp collective operands (valid while status == kAtWarpOp).
  WarpRequest request{};
  // cp.async copies not yet committed, and committed groups not yet landed (oldest first).
  std::vector<AsyncCopy> open_copies;
  std::deque<std::vector<AsyncCopy>> groups;
};

// A warp collective some lanes of `mask` have arrived at.
struct PendingCollective {
  WarpOp op;
  unsigned mask;
  unsigned arrived;
};

// Per warp: which lanes have exited or wait at __syncthreads, and the open collectives (one per
// disjoint mask; lanes of one collective must agree on op and mask).
struct WarpState {
  unsigned exited = 0;
  unsigned at_barrier = 0;
  std::vector<PendingCollective> pending;
};

// Fiber stacks, reused across blocks and launches; freed with the pool (every fiber has ended).
class StackPool {
 public:
  StackPool() = default;
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;
  ~StackPool() {
    for (void* base : free_) std::free(base);
  }
  ctx::stack_context allocate() {
    if (free_.empty()) {
      void* base = std::malloc(kFiberStackBytes);
      if (base == nullptr) throw std::bad_alloc();
      free_.push_back(base);
    }
    void* base = free_.back();
    free_.pop_back();
    ctx::stack_context sc;
    sc.size = kFiberStackBytes;
    sc.sp = static_cast<char*>(base) + kFiberStackBytes;
    return sc;
  }
  void deallocate(ctx::stack_context& sc) { free_.push_back(static_cast<char*>(sc.sp) - sc.size); }

 private:
  std::vector<void*> free_;
};

// Allocator handle passed to each fiber (boost copies it).
struct PooledStack {
  StackPool* pool;
  ctx::stack_context allocate() { return pool->allocate(); }
  void deallocate(ctx::stack_context& sc) { pool->deallocate(sc); }
};

// Dynamic shared memory: `bytes` usable bytes that end where an inaccessible page begins, so a
// read or write past the launch's dynamic shared size faults instead of passing silently.
class SharedArena {
 public:
  ~SharedArena() {
    if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
  }
  void* prepare(size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t rounded = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
    if (rounded > usable_) {
      if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
      mapping_bytes_ = rounded + page;
      mapping_ = static_cast<char*>(mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      if (mapping_ == MAP_FAILED) throw std::bad_alloc();
      mprotect(mapping_ + rounded, page, PROT_NONE);
      usable_ = rounded;
    }
    base_ = mapping_ + usable_ - bytes;  // 16-byte aligned: bytes is rounded by the caller
    bytes_ = bytes;
    std::memset(base_, kPoisonByte, bytes);
    return base_;
  }
  bool contains(const void* p, size_t n) const {
    const char* c = static_cast<const char*>(p);
    return c >= base_ && c + n <= base_ + bytes_;
  }
  void* base() const { return base_; }

 private:
  char* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  size_t usable_ = 0;
  char* base_ = nullptr;
  size_t bytes_ = 0;
};

// State of the emulated device and of the block being run.
struct Emulator {
  // Writes the kernels this process launched to $CUEMU_LAUNCH_LOG, one "<object file> <hex offset
  // of the kernel function in it>" per line (scripts/check_kernel_sources.py resolves them with
  // nm and checks that every __global__ of kernels/ ran).
  ~Emulator() {
    const char* path = std::getenv("CUEMU_LAUNCH_LOG");
    if (path == nullptr || launched.empty()) return;
    if (FILE* f = std::fopen(path, "w")) {
      for (const void* kernel : launched) {
        Dl_info info{};
        if (dladdr(kernel, &info) == 0 || info.dli_fname == nullptr) continue;
        // The main program is named as it was started (maybe relative): use its real path.
        char self[4096] = {};
        const bool relative = info.dli_fname[0] != '/';
        if (relative && readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) continue;
        std::fprintf(f, "%s 0x%zx\n", relative ? self : info.dli_fname,
                     static_cast<size_t>(static_cast<const char*>(kernel) -
                                         static_cast<const char*>(info.dli_fbase)));
      }
      std::fclose(f);
    }
  }
  std::set<const void*> launched;
  ScheduleConfig schedule;
  StackPool stacks;
  SharedArena arena;
  std::mt19937_64 rng;

  // The running block.
  std::vector<std::unique_ptr<Thread>> threads;
  std::vector<WarpState> warps;
  std::deque<int> ready;
  Thread* running = nullptr;
  std::string fault;
};

Emulator& emu() {
  static Emulator e;
  return e;
}

std::string where_string(Where where) {
  std::ostringstream out;
  const char* slash = std::strrchr(where.file, '/');
  out << (slash ? slash + 1 : where.file) << ":" << where.line;
  return out.str();
}

std::string thread_name(const Thread& t) {
  std::ostringstream out;
  out << "block (" << block_idx.x << "," << block_idx.y << "," << block_idx.z << ") thread ("
      << t.thread_idx.x << "," << t.thread_idx.y << "," << t.thread_idx.z << ")";
  return out.str();
}

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kShflIdx:
      return "__shfl_sync";
    case WarpOp::kShflUp:
      return "__shfl_up_sync";
    case WarpOp::kShflDown:
      return "__shfl_down_sync";
    case WarpOp::kShflXor:
      return "__shfl_xor_sync";
    case WarpOp::kBallot:
      return "__ballot_sync";
    case WarpOp::kAny:
      return "__any_sync";
    case WarpOp::kAll:
      return "__all_sync";
    case WarpOp::kSyncWarp:
      return "__syncwarp";
    case WarpOp::kMma:
      return "mma.sync";
    case WarpOp::kLdmatrix:
      return "ldmatrix";
  }
  return "?";
}

void make_ready(Emulator& e, Thread& t) {
  t.status = Status::kReady;
  e.ready.push_back(t.linear);
}

// Hands control from the running fiber back to the scheduler.
void yield(Thread& t) { t.scheduler = std::move(t.scheduler).resume(); }

// Records the first fault of the block and stops the calling fiber for good (the scheduler
// unwinds it).
[[noreturn]] void fault_here(const std::string& message) {
  Emulator& e = emu();
  Thread& t = *e.running;
  if (e.fault.empty()) e.fault = message;
  t.status = Status::kFaulted;
  yield(t);
  std::abort();  // never resumed: the scheduler destroys faulted blocks
}

void land(const std::vector<AsyncCopy>& group) {
  for (const AsyncCopy& c : group) {
    std::memcpy(c.dst, c.src, static_cast<size_t>(c.src_size));
    std::memset(static_cast<char*>(c.dst) + c.src_size, 0,
                static_cast<size_t>(c.cp_size - c.src_size));
  }
}

bool in_shared(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  if (__start_cuemu_shared != nullptr && c >= __start_cuemu_shared &&
      c + n <= __stop_cuemu_shared) {
    return true;
  }
  return emu().arena.contains(p, n);
}

// Source lane of a shuffle for `lane`, or -1 when the lane keeps its own value (PTX shfl.sync
// with clamp c = width - 1 and segment mask for up/down/xor/idx).
int shuffle_source(WarpOp op, int lane, int arg, int width) {
  const int segment = lane & ~(width - 1);
  switch (op) {
    case WarpOp::kShflIdx:
      return segment + (arg & (width - 1));
    case WarpOp::kShflUp:
      return lane - arg >= segment ? lane - arg : -1;
    case WarpOp::kShflDown:
      return lane + arg < segment + width ? lane + arg : -1;
    case WarpOp::kShflXor: {
      const int src = lane ^ arg;
      return src >= segment && src < segment + width ? src : -1;
    }
    default:
      return -1;
  }
}

// Completes the warp collective every lane of `mask` has arrived at.
void complete_warp_op(Emulator& e, int warp, unsigned mask);

void finish_block(Emulator& e) {
  // Destroying a suspended fiber unwinds its stack.
  for (auto& t : e.threads) t->fiber = ctx::fiber();
  e.threads.clear();
  e.ready.clear();
  e.running = nullptr;
}

std::string describe_stall(Emulator& e) {
  std::ostringstream out;
  int shown = 0;
  for (auto& t : e.threads) {
    if (t->status == Status::kExited || shown >= 6) continue;
    ++shown;
    out << "; " << thread_name(*t) << " waits at "
        << (t->status == Status::kAtBarrier ? "__syncthreads" : op_name(t->request.op)) << " ("
        << where_string(t->where) << ")";
    if (t->status == Status::kAtWarpOp) {
      out << " with mask 0x" << std::hex << t->request.mask << std::dec;
    }
  }
  return out.str();
}

// Names the lanes the first stalled warp collective waits for, and what they do instead.
std::string describe_missing_lanes(Emulator& e) {
  std::ostringstream out;
  for (auto& t : e.threads) {
    if (t->status != Status::kAtWarpOp) continue;
    out << op_name(t->request.op) << " at " << where_string(t->where) << " with mask 0x" << std::hex
        << t->request.mask << std::dec << " waits for";
    const int base = t->warp * 32;
    for (int l = 0; l < 32; ++l) {
      if (!(t->request.mask >> l & 1u)) continue;
      const Thread& u = *e.threads[base + l];
      if (u.status == Status::kExited) {
        out << " lane " << l << " (has exited)";
      } else if (u.status == Status::kAtBarrier) {
        out << " lane " << l << " (waits at __syncthreads, " << where_string(u.where) << ")";
      } else if (u.request.op != t->request.op || u.request.mask != t->request.mask) {
        out << " lane " << l << " (at " << op_name(u.request.op) << ", " << where_string(u.where)
            << ")";
      }
    }
    break;
  }
  return out.str();
}

// Runs one block to completion; returns an empty string or the fault that stopped it.
void run_block(Emulator& e, const std::function<void()>& body, int num_threads) {
  e.threads.clear();
  e.ready.clear();
  e.fault.clear();
  e.warps.assign(static_cast<size_t>((num_threads + 31) / 32), WarpState{});
  for (int i = 0; i < num_threads; ++i) {
    auto t = std::make_unique<Thread>();
    t->linear = i;
    t->thread_idx.x = static_cast<unsigned>(i % static_cast<int>(block_dim.x));
    t->thread_idx.y =
        static_cast<unsigned>(i / static_cast<int>(block_dim.x) % static_cast<int>(block_dim.y));
    t->thread_idx.z = static_cast<unsigned>(i / static_cast<int>(block_dim.x * block_dim.y));
    t->lane = i % 32;
    t->warp = i / 32;
    Thread* self = t.get();
    t->fiber = ctx::fiber(std::allocator_arg, PooledStack{&e.stacks},
                          [self, &body](ctx::fiber&& scheduler) {
                            self->scheduler = std::move(scheduler);
                            body();
                            // A returning thread lands its outstanding copies (they complete on
                            // a GPU too).
                            for (auto& g : self->groups) land(g);
                            land(self->open_copies);
                            self->status = Status::kExited;
                            emu().warps[self->warp].exited |= 1u << self->lane;
                            return std::move(self->scheduler);
                          });
    e.threads.push_back(std::move(t));
  }
  for (int i = 0; i < num_threads; ++i) {
    e.ready.push_back(e.schedule.schedule == Schedule::kReverse ? num_threads - 1 - i : i);
  }

  while (e.fault.empty()) {
    if (e.ready.empty()) {
      // Nobody can run: every live thread waits at a barrier (release it), or the block is
      // stuck, or it is done.
      int at_barrier = 0, exited = 0, at_warp = 0;
      const Thread* gone = nullptr;
      for (auto& t : e.threads) {
        if (t->status == Status::kAtBarrier) ++at_barrier;
        if (t->status == Status::kAtWarpOp) ++at_warp;
        if (t->status == Status::kExited) {
          ++exited;
          if (gone == nullptr) gone = t.get();
        }
      }
      if (exited == num_threads) break;
      if (at_warp > 0 || (at_barrier > 0 && exited > 0)) {
        std::ostringstream out;
        if (at_warp > 0) {
          out << "deadlock: " << describe_missing_lanes(e);
        } else {
          out << "__syncthreads is not reached by every thread: " << thread_name(*gone)
              << " exited while " << at_barrier << " threads wait";
        }
        out << describe_stall(e);
        e.fault = out.str();
        break;
      }
      int count = 0;
      for (auto& t : e.threads) count += t->predicate != 0;
      std::vector<int> order;
      for (int i = 0; i < num_threads; ++i) order.push_back(i);
      if (e.schedule.schedule == Schedule::kReverse) std::reverse(order.begin(), order.end());
      for (WarpState& w : e.warps) w.at_barrier = 0;
      for (int i : order) {
        Thread& t = *e.threads[i];
        if (t.count != nullptr) *t.count = count;
        make_ready(e, t);
      }
      continue;
    }
    size_t pick = 0;
    if (e.schedule.schedule == Schedule::kRandom) {
      pick = std::uniform_int_distribution<size_t>(0, e.ready.size() - 1)(e.rng);
      // Land a random thread's oldest committed cp.async group now and then.
      if (std::uniform_int_distribution<int>(0, kLandOneIn - 1)(e.rng) == 0) {
        Thread& t = *e.threads[std::uniform_int_distribution<size_t>(0, num_threads - 1)(e.rng)];
        if (!t.groups.empty()) {
          land(t.groups.front());
          t.groups.pop_front();
        }
      }
    }
    const int id = e.ready[pick];
    std::swap(e.ready[pick], e.ready.front());
    e.ready.pop_front();
    Thread& t = *e.threads[id];
    t.status = Status::kRunning;
    e.running = &t;
    current_thread = &t;
    t.fiber = std::move(t.fiber).resume();
    e.running = nullptr;
  }
  std::string fault = std::move(e.fault);
  e.fault.clear();
  finish_block(e);
  if (!fault.empty()) throw KernelFault(fault);
}

void complete_warp_op(Emulator& e, int warp, unsigned mask) {
  Thread* lanes[32] = {};
  for (int l = 0; l < 32; ++l) {
    if (mask >> l & 1u) lanes[l] = e.threads[warp * 32 + l].get();
  }
  const WarpRequest& first = lanes[__builtin_ctz(mask)]->request;
  switch (first.op) {
    case WarpOp::kShflIdx:
    case WarpOp::kShflUp:
    case WarpOp::kShflDown:
    case WarpOp::kShflXor:
      for (int l = 0; l < 32; ++l) {
        if (lanes[l] == nullptr) continue;
        const WarpRequest& r = lanes[l]->request;
        const int src = shuffle_source(r.op, l, r.arg, r.width);
        if (src >= 0 && !(mask >> src & 1u)) {
          std::ostringstream out;
          out << op_name(r.op) << " at " << where_string(lanes[l]->where) << ": lane " << l
              << " reads lane " << src << ", which is not in mask 0x" << std::hex << mask;
          fault_here(out.str());
        }
        const Thread& from = src >= 0 ? *lanes[src] : *lanes[l];
        std::memcpy(r.out, from.request.in, sizeof(uint32_t) * static_cast<size_t>(r.in_words));
      }
      break;
    case WarpOp::kBallot:
    case WarpOp::kAny:
    case WarpOp::kAll:
    case WarpOp::kSyncWarp: {
      uint32_t ballot = 0;
      for (int l = 0; l < 32; ++l) {
        if (lanes[l] != nullptr && lanes[l]->request.in[0] != 0) ballot |= 1u << l;
      }
      const uint32_t result = first.op == WarpOp::kBallot ? ballot
                              : first.op == WarpOp::kAny  ? (ballot != 0)
                              : first.op == WarpOp::kAll  ? (ballot == mask)
                                                          : 0;
      for (int l = 0; l < 32; ++l) {
        if (lanes[l] != nullptr) *lanes[l]->request.out = result;
      }
      break;
    }
    case WarpOp::kMma:
    case WarpOp::kLdmatrix: {
      // The lanes' operands as one [32][in_words] array; the op's model fills [32][out_words].
      uint32_t in[32][16] = {};
      uint32_t out[32][16] = {};
      for (int l = 0; l < 32; ++l) {
        std::memcpy(in[l], lanes[l]->request.in,
                    sizeof(uint32_t) * static_cast<size_t>(first.in_words));
      }
      tensor_core_model(first, in, out);
      for (int l = 0; l < 32; ++l) {
        std::memcpy(lanes[l]->request.out, out[l],
                    sizeof(uint32_t) * static_cast<size_t>(first.out_words));
      }
      break;
    }
  }
  const bool reverse = e.schedule.schedule == Schedule::kReverse;
  for (int i = 0; i < 32; ++i) {
    const int l = reverse ? 31 - i : i;
    if (lanes[l] != nullptr) make_ready(e, *lanes[l]);
  }
}

}  // namespace

void warp_collective(const WarpRequest& request, Where where) {
  Emulator& e = emu();
  Thread& t = *e.running;
  t.request = request;
  t.where = where;
  const unsigned mask = request.mask;
  const int warp_base = t.warp * 32;
  const bool full_tensor_op = request.op == WarpOp::kMma || request.op == WarpOp::kLdmatrix;
  const auto fail = [&](const std::string& problem) {
    fault_here(std::string(op_name(request.op)) + " at " + where_string(where) + " by " +
               thread_name(t) + ": " + problem);
  };
  const auto hex = [](unsigned v) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "0x%x", v);
    return std::string(buf);
  };
  const int block_threads = static_cast<int>(e.threads.size());
  if (!(mask >> t.lane & 1u)) {
    fail("lane " + std::to_string(t.lane) + " is not in its own mask " + hex(mask));
  } else if (full_tensor_op && mask != 0xffffffffu) {
    fail("tensor-core instructions need all 32 lanes");
  } else if (request.width < 1 || request.width > 32 ||
             (request.width & (request.width - 1)) != 0) {
    fail("width " + std::to_string(request.width) + " is not a power of two in [1, 32]");
  } else if (warp_base + 32 > block_threads && (mask >> (block_threads - warp_base)) != 0) {
    fail("mask " + hex(mask) + " names lanes past the end of the block");
  }
  WarpState& w = e.warps[t.warp];
  const auto first_lane = [](unsigned m) { return std::to_string(__builtin_ctz(m)); };
  if (mask & w.exited) {
    fail("lane " + first_lane(mask & w.exited) + " of mask " + hex(mask) + " has exited");
  }
  if (mask & w.at_barrier) {
    const Thread& u = *e.threads[warp_base + __builtin_ctz(mask & w.at_barrier)];
    fail("lane " + first_lane(mask & w.at_barrier) + " waits at __syncthreads (" +
         where_string(u.where) + ")");
  }
  PendingCollective* mine = nullptr;
  for (PendingCollective& c : w.pending) {
    if ((c.mask & mask) == 0) continue;
    if (c.mask != mask || c.op != request.op) {
      const Thread& u =
          *e.threads[warp_base + __builtin_ctz(c.arrived & mask ? c.arrived & mask : c.arrived)];
      fail("lane " + std::to_string(u.lane) + " is at " + op_name(c.op) + " (" +
           where_string(u.where) + ") with mask " + hex(c.mask));
    }
    mine = &c;
  }
  if (mine == nullptr) {
    w.pending.push_back({request.op, mask, 0});
    mine = &w.pending.back();
  }
  mine->arrived |= 1u << t.lane;
  const bool complete = mine->arrived == mask;
  if (complete) w.pending.erase(w.pending.begin() + (mine - w.pending.data()));
  t.status = Status::kAtWarpOp;
  if (complete) complete_warp_op(e, t.warp, mask);
  yield(t);
}

void syncthreads(int predicate, int* count, Where where) {
  Thread& t = *emu().running;
  t.status = Status::kAtBarrier;
  emu().warps[t.warp].at_barrier |= 1u << t.lane;
  t.where = where;
  t.predicate = predicate;
  t.count = count;
  yield(t);
}

void trap(Where where) {
  fault_here("__trap() at " + where_string(where) + " by " + thread_name(*emu().running));
}

void fault(const std::string& what, Where where) {
  fault_here(what + " at " + where_string(where) + " by " + thread_name(*emu().running));
}

void require_shared(const void* p, size_t n, const char* what, Where where) {
  if (!in_shared(p, n)) fault(std::string(what) + ": address not in shared memory", where);
}

void* dynamic_shared_base() { return emu().arena.base(); }

void run_grid(const void* kernel, const std::function<void()>& body, dim3 grid, dim3 block,
              size_t dynamic_shared, const char* file, int line) {
  const std::string where = where_string({file, line});
  Emulator& e = emu();
  DeviceState& device = device_state();
  const DeviceModel& d = device.model;
  std::ostringstream problem;
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const auto limit = device.max_dynamic_shared.find(kernel);
  const size_t shared_limit = limit != device.max_dynamic_shared.end()
                                  ? static_cast<size_t>(limit->second)
                                  : d.max_shared_per_block;
  if (threads == 0 || threads > static_cast<uint64_t>(d.max_threads_per_block) || block.x > 1024 ||
      block.y > 1024 || block.z > 64) {
    problem << "block (" << block.x << "," << block.y << "," << block.z << ") is not a valid "
            << "block of at most " << d.max_threads_per_block << " threads";
  } else if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
             grid.z > 65535) {
    problem << "grid (" << grid.x << "," << grid.y << "," << grid.z << ") is out of range";
  } else if (dynamic_shared > shared_limit) {
    problem << dynamic_shared << " bytes of dynamic shared memory exceed the kernel's limit of "
            << shared_limit << " (cudaFuncAttributeMaxDynamicSharedMemorySize)";
  }
  if (!problem.str().empty()) {
    device.last_error = cudaErrorInvalidConfiguration;
    throw KernelFault("launch at " + where + " on " + d.name + ": " + problem.str());
  }
  e.launched.insert(kernel);
  e.rng.seed(e.schedule.seed);
  grid_dim = grid;
  block_dim = block;
  const uint64_t num_blocks = uint64_t{grid.x} * grid.y * grid.z;
  std::vector<uint64_t> order(num_blocks);
  for (uint64_t i = 0; i < num_blocks; ++i) order[i] = i;
  if (e.schedule.schedule == Schedule::kReverse) std::reverse(order.begin(), order.end());
  if (e.schedule.schedule == Schedule::kRandom) std::shuffle(order.begin(), order.end(), e.rng);
  const size_t static_bytes = static_cast<size_t>(__stop_cuemu_shared - __start_cuemu_shared);
  for (uint64_t b : order) {
    block_idx.x = static_cast<unsigned>(b % grid.x);
    block_idx.y = static_cast<unsigned>(b / grid.x % grid.y);
    block_idx.z = static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y));
    if (static_bytes > 0) std::memset(__start_cuemu_shared, kPoisonByte, static_bytes);
    e.arena.prepare((dynamic_shared + 15) / 16 * 16);
    try {
      run_block(e, body, static_cast<int>(threads));
    } catch (const KernelFault& f) {
      device.last_error = cudaErrorLaunchFailure;
      throw KernelFault("kernel launched at " + where + ": " + f.what());
    }
  }
}

}  // namespace detail

ScheduleConfig set_schedule(ScheduleConfig config) {
  return std::exchange(detail::emu().schedule, config);
}

const char* schedule_name(Schedule schedule) {
  switch (schedule) {
    case Schedule::kForward:
      return "forward";
    case Schedule::kReverse:
      return "reverse";
    case Schedule::kRandom:
      return "random";
  }
  return "?";
}

void cp_async(void* dst, const void* src, int cp_size, int src_size, Where where) {
  using detail::emu;
  auto& t = *emu().running;
  const auto addr = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  const auto fail = [&](const std::string& problem) {
    detail::fault("cp.async: " + problem, where);
  };
  if (cp_size != 4 && cp_size != 8 && cp_size != 16) {
    fail("cp-size " + std::to_string(cp_size) + " is not 4, 8 or 16");
  } else if (src_size < 0 || src_size > cp_size) {
    fail("src-size " + std::to_string(src_size) + " is outside [0, cp-size]");
  } else if (addr(dst) % static_cast<uintptr_t>(cp_size) != 0 ||
             (src_size > 0 && addr(src) % static_cast<uintptr_t>(cp_size) != 0)) {
    fail("addresses must be " + std::to_string(cp_size) + "-byte aligned");
  } else if (!detail::in_shared(dst, static_cast<size_t>(cp_size))) {
    fail("the destination is not in shared memory");
  }
  t.open_copies.push_back({dst, src, cp_size, src_size});
}

void cp_async_commit() {
  auto& t = *detail::emu().running;
  t.groups.push_back(std::move(t.open_copies));
  t.open_copies.clear();
}

void cp_async_wait(int pending_groups, Where where) {
  auto& t = *detail::emu().running;
  if (pending_groups < 0) {
    detail::fault_here("cp.async.wait_group at " + detail::where_string(where) +
                       ": negative group count");
  }
  while (static_cast<int>(t.groups.size()) > pending_groups) {
    detail::land(t.groups.front());
    t.groups.pop_front();
  }
}

}  // namespace cuemu
