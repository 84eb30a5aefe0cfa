// The host shim's runtime (cuda_host_shim.h): runs a CUDA grid on the CPU, one block after the
// other, the threads of a block as cooperative fibers (ucontext) on the calling OS thread, under
// one legal schedule: a thread runs until it waits at __syncthreads or at a warp shuffle, or exits;
// then the next ready thread (round robin) runs. __syncthreads releases once every thread that has
// not exited waits at it; a shuffle completes once every lane of its mask has reached it.
//
// What would hang or fault on a GPU fails the launch instead (cudaGetLastError gives
// cudaErrorLaunchFailure, snip_cuda_host_error() the message): a deadlock, __syncthreads reached at
// different places, a shuffle whose mask names an exited lane or lanes at another shuffle, a
// misaligned, null or out-of-bounds access (the kernels' translation units are built with
// -fsanitize=alignment,null,bounds, whose checks call the handlers at the end of this file).
// A failing thread unwinds its own fiber; the other fibers of its block are never resumed (kernels
// hold no resources).
#include "cuda_host_shim.h"

#include <link.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace snip_cuda_host {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxThreads = 1024;
constexpr size_t kStackBytes = size_t(128) << 10;
constexpr size_t kMaxDynamicSmemBytes = size_t(227) << 10;  // Hopper's and Blackwell's opt-in limit per block

enum class State { kReady, kBarrier, kShuffle, kExited };

struct Thread {
  ucontext_t context;
  State state;
  const char* file;  // where it waits
  unsigned line;
  uint32_t mask;     // shuffle: the mask, this lane's xor operand, value and result
  int lane_mask;
  uint64_t value, result;
};

struct Runtime {
  Thread* threads = nullptr;  // kMaxThreads, never moved (a context points into itself)
  char* stacks = nullptr;
  size_t guard_bytes = 0;
  int count = 0;              // threads per block
  int current = -1;           // the running thread, -1 in the scheduler
  ucontext_t scheduler;
  void (*body)(const void*) = nullptr;
  const void* closure = nullptr;
  bool block_failed = false;
  cudaError_t error = cudaSuccess;
  std::string message;
  bool skip_barriers = false;
  std::vector<uint4> dynamic_smem;  // uint4: the 16-byte alignment a GPU gives it
};

Runtime rt;
std::mutex launch_mutex;  // one grid at a time: the runtime and shared memory are per module

void enter(int i) {
  rt.current = i;
  threadIdx = uint3{unsigned(i) % blockDim.x, unsigned(i) / blockDim.x % blockDim.y,
                    unsigned(i) / (blockDim.x * blockDim.y)};
}

std::string thread_name(int i) { return "thread " + std::to_string(i); }

// Thrown inside a failing thread and caught at the base of its fiber, which then hands over to the
// scheduler for good: the fiber's frames are unwound, the rest of the block is abandoned.
struct LaunchFailure {};

// Ends the launch with `cudaErrorLaunchFailure` and "block (x, y, z): <what>".
[[noreturn]] void fail_with(const std::string& what) {
  if (rt.current < 0) {  // not inside a kernel: nothing to unwind to
    std::fprintf(stderr, "cuda_host_shim: %s\n", what.c_str());
    std::abort();
  }
  if (!rt.block_failed) {
    rt.message = "block (" + std::to_string(blockIdx.x) + ", " + std::to_string(blockIdx.y) + ", " +
                 std::to_string(blockIdx.z) + "): " + what;
    rt.block_failed = true;
    rt.error = cudaErrorLaunchFailure;
  }
  throw LaunchFailure{};
}

std::string format(const char* fmt, va_list args) {
  char buf[1024];
  std::vsnprintf(buf, sizeof buf, fmt, args);
  return buf;
}

// A failure of the running thread (its name leads the message).
[[noreturn]] void fail(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  const std::string what = format(fmt, args);
  va_end(args);
  fail_with(thread_name(rt.current) + ": " + what);
}

// A failure of the block as a whole (deadlock, divergent barrier): the message names the threads.
[[noreturn]] void fail_block(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  const std::string what = format(fmt, args);
  va_end(args);
  fail_with(what);
}

std::string state_of(const Thread& t) {
  switch (t.state) {
    case State::kExited: return "has exited";
    case State::kReady: return "is ready";
    case State::kBarrier: return std::string("waits at __syncthreads at ") + t.file + ":" + std::to_string(t.line);
    case State::kShuffle: return std::string("waits at __shfl_xor_sync at ") + t.file + ":" + std::to_string(t.line);
  }
  return "";
}

// Why the shuffle that thread `i` waits at cannot complete: the first lane of its mask elsewhere.
std::string missing_lane(int i) {
  const Thread& t = rt.threads[i];
  const int warp0 = i - i % kWarp;
  for (int l = 0; l < kWarp; ++l) {
    const int j = warp0 + l;
    if (((t.mask >> l) & 1u) && rt.threads[j].state != State::kShuffle)
      return "; lane " + std::to_string(l) + " " + state_of(rt.threads[j]);
  }
  return "";
}

// No thread is ready: release the barrier if every live thread waits at the same one. Returns the
// first thread to run, or -1 when every thread has exited.
int release_barrier() {
  int first = -1;
  for (int i = 0; i < rt.count; ++i) {
    const Thread& t = rt.threads[i];
    if (t.state == State::kShuffle) {
      fail_block("deadlock: %s %s%s", thread_name(i).c_str(), state_of(t).c_str(), missing_lane(i).c_str());
    }
    if (t.state != State::kBarrier) continue;
    if (first < 0) first = i;
    const Thread& f = rt.threads[first];
    if (t.line != f.line || std::strcmp(t.file, f.file) != 0) {
      fail_block("divergent __syncthreads: %s waits at %s:%u, %s at %s:%u", thread_name(first).c_str(), f.file,
                 f.line, thread_name(i).c_str(), t.file, t.line);
    }
  }
  for (int i = first; i >= 0 && i < rt.count; ++i)
    if (rt.threads[i].state == State::kBarrier) rt.threads[i].state = State::kReady;
  return first;
}

// Thread `me` has just blocked or exited: switch to the next ready thread after it, releasing a
// barrier when none is. Returns at once if that is `me`, or if the block has finished.
void run_next(int me) {
  int next = -1;
  for (int k = 1; k <= rt.count && next < 0; ++k) {
    const int i = (me + k) % rt.count;
    if (rt.threads[i].state == State::kReady) next = i;
  }
  if (next < 0) next = release_barrier();
  if (next == me || next < 0) return;
  enter(next);
  swapcontext(&rt.threads[me].context, &rt.threads[next].context);
}

void thread_main() {
  try {
    rt.body(rt.closure);
    const int me = rt.current;
    rt.threads[me].state = State::kExited;
    run_next(me);  // returns once the whole block has exited; an exited thread is never resumed
  } catch (const LaunchFailure&) {
  }
  rt.current = -1;
  setcontext(&rt.scheduler);
}

// This module's thread-local storage holds exactly the kernels' __shared__ variables (the shim's
// own state is not thread-local), so filling it fills every kernel's shared memory.
thread_local char tls_anchor;  // touching it allocates the module's TLS block in this thread

struct TlsBlock {
  void* data = nullptr;
  size_t bytes = 0;
};

int find_tls_block(dl_phdr_info* info, size_t, void* out) {
  const auto self = reinterpret_cast<ElfW(Addr)>(&launch);
  bool mine = false;
  const ElfW(Phdr)* tls = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& p = info->dlpi_phdr[i];
    const ElfW(Addr) start = info->dlpi_addr + p.p_vaddr;
    if (p.p_type == PT_LOAD && self >= start && self < start + p.p_memsz) mine = true;
    if (p.p_type == PT_TLS) tls = &p;
  }
  if (!mine) return 0;
  if (tls != nullptr) *static_cast<TlsBlock*>(out) = TlsBlock{info->dlpi_tls_data, tls->p_memsz};
  return 1;
}

TlsBlock shared_memory() {
  *static_cast<volatile char*>(&tls_anchor) = 0;
  TlsBlock block;
  dl_iterate_phdr(find_tls_block, &block);
  if (block.data == nullptr) fail_block("no thread-local storage (the kernels' shared memory) in this module");
  return block;
}

void allocate_threads() {
  if (rt.threads != nullptr) return;
  rt.guard_bytes = size_t(sysconf(_SC_PAGESIZE));
  const size_t per_thread = kStackBytes + rt.guard_bytes;
  void* stacks = mmap(nullptr, per_thread * kMaxThreads, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (stacks == MAP_FAILED) fail_block("cannot map %d fiber stacks", kMaxThreads);
  rt.stacks = static_cast<char*>(stacks);
  for (int i = 0; i < kMaxThreads; ++i)  // a stack overflow faults instead of writing into the next stack
    mprotect(rt.stacks + i * per_thread, rt.guard_bytes, PROT_NONE);
  rt.threads = new Thread[kMaxThreads];
  for (int i = 0; i < kMaxThreads; ++i) getcontext(&rt.threads[i].context);
}

}  // namespace

void launch(dim3 grid, dim3 block, size_t dynamic_smem_bytes, void (*body)(const void*), const void* closure) {
  const std::lock_guard<std::mutex> lock(launch_mutex);
  rt.message.clear();
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > kMaxThreads || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 0x7FFFFFFFu || grid.y > 65535 || grid.z > 65535) {
    rt.error = cudaErrorInvalidConfiguration;
    rt.message = "invalid launch configuration: grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) +
                 ", " + std::to_string(grid.z) + "), block (" + std::to_string(block.x) + ", " +
                 std::to_string(block.y) + ", " + std::to_string(block.z) + ")";
    return;
  }
  if (dynamic_smem_bytes > kMaxDynamicSmemBytes) {
    rt.error = cudaErrorInvalidValue;
    rt.message = "dynamic shared memory of " + std::to_string(dynamic_smem_bytes) + " bytes: more than a block may have";
    return;
  }
  rt.dynamic_smem.assign((dynamic_smem_bytes + 15) / 16, uint4{});
  allocate_threads();
  const TlsBlock smem = shared_memory();
  blockDim = block;
  gridDim = grid;
  rt.body = body;
  rt.closure = closure;
  rt.count = int(threads);
  rt.block_failed = false;
  const size_t per_thread = kStackBytes + rt.guard_bytes;
  for (unsigned z = 0; z < grid.z && !rt.block_failed; ++z)
    for (unsigned y = 0; y < grid.y && !rt.block_failed; ++y)
      for (unsigned x = 0; x < grid.x && !rt.block_failed; ++x) {
        blockIdx = uint3{x, y, z};
        std::memset(smem.data, 0xFF, smem.bytes);
        if (!rt.dynamic_smem.empty()) std::memset(rt.dynamic_smem.data(), 0xFF, rt.dynamic_smem.size() * 16);
        for (int i = 0; i < rt.count; ++i) {
          Thread& t = rt.threads[i];
          t.state = State::kReady;
          t.context.uc_stack.ss_sp = rt.stacks + i * per_thread + rt.guard_bytes;
          t.context.uc_stack.ss_size = kStackBytes;
          t.context.uc_link = nullptr;
          makecontext(&t.context, thread_main, 0);
        }
        enter(0);
        swapcontext(&rt.scheduler, &rt.threads[0].context);
      }
  rt.current = -1;
}

void* dynamic_shared() { return rt.dynamic_smem.empty() ? nullptr : rt.dynamic_smem.data(); }

void barrier(const char* file, unsigned line) {
  if (rt.skip_barriers) return;
  const int me = rt.current;
  Thread& t = rt.threads[me];
  t.state = State::kBarrier;
  t.file = file;
  t.line = line;
  run_next(me);
}

uint64_t shuffle_xor(uint32_t mask, uint64_t value, int lane_mask, const char* file, unsigned line) {
  const int me = rt.current;
  const int lane = me % kWarp, warp0 = me - lane;
  if (!((mask >> lane) & 1u)) {
    fail("%s:%u: __shfl_xor_sync by lane %d, which mask %#x leaves out", file, line, lane, mask);
  }
  if (lane_mask < 0 || lane_mask >= kWarp) {
    fail("%s:%u: __shfl_xor_sync lane mask %d is not a lane", file, line, lane_mask);
  }
  Thread& t = rt.threads[me];
  t.state = State::kShuffle;
  t.file = file;
  t.line = line;
  t.mask = mask;
  t.lane_mask = lane_mask;
  t.value = value;
  bool complete = true;
  for (int l = 0; l < kWarp; ++l) {
    if (!((mask >> l) & 1u)) continue;
    if (warp0 + l >= rt.count) fail("%s:%u: mask %#x names lane %d, past the block's threads", file, line, mask, l);
    const Thread& p = rt.threads[warp0 + l];
    if (p.state == State::kExited) fail("%s:%u: lane %d of mask %#x has exited", file, line, l, mask);
    if (p.state == State::kShuffle && (p.line != line || p.mask != mask || std::strcmp(p.file, file) != 0)) {
      fail("divergent shuffles in a warp: lane %d at %s:%u (mask %#x), lane %d at %s:%u (mask %#x)", lane, file,
           line, mask, l, p.file, p.line, p.mask);
    }
    complete = complete && p.state == State::kShuffle;
  }
  if (!complete) {
    run_next(me);
    return t.result;
  }
  for (int l = 0; l < kWarp; ++l) {
    if (!((mask >> l) & 1u)) continue;
    Thread& p = rt.threads[warp0 + l];
    const int src = l ^ p.lane_mask;
    if (!((mask >> src) & 1u)) {
      fail("%s:%u: lane %d reads lane %d, which mask %#x leaves out", file, line, l, src, mask);
    }
    p.result = rt.threads[warp0 + src].value;
  }
  for (int l = 0; l < kWarp; ++l)
    if ((mask >> l) & 1u) rt.threads[warp0 + l].state = State::kReady;
  return t.result;
}

}  // namespace snip_cuda_host

cudaError_t cudaGetLastError() {
  const cudaError_t e = snip_cuda_host::rt.error;
  snip_cuda_host::rt.error = cudaSuccess;
  return e;
}

// The message of the last launch's failure ("" if it succeeded).
extern "C" const char* snip_cuda_host_error() { return snip_cuda_host::rt.message.c_str(); }

// Fault injection for the shim's own tests: __syncthreads returns at once.
extern "C" void snip_cuda_host_skip_barriers(int skip) { snip_cuda_host::rt.skip_barriers = skip != 0; }

// ---- the checks of -fsanitize=alignment,null,bounds (the ABI of GCC's and Clang's UBSan calls) ----

namespace {

struct SourceLocation {
  const char* file;
  uint32_t line, column;
};

struct TypeDescriptor {
  uint16_t kind, info;
  char name[1];
};

struct TypeMismatchData {
  SourceLocation location;
  const TypeDescriptor* type;
  unsigned char log_alignment;
  unsigned char type_check_kind;
};

struct OutOfBoundsData {
  SourceLocation location;
  const TypeDescriptor* array_type;
  const TypeDescriptor* index_type;
};

}  // namespace

extern "C" void __ubsan_handle_type_mismatch_v1(const TypeMismatchData* d, uintptr_t pointer) {
  const SourceLocation& at = d->location;
  if (pointer == 0) snip_cuda_host::fail("%s:%u: null pointer access to %s", at.file, at.line, d->type->name);
  snip_cuda_host::fail("%s:%u: misaligned access to %s at %#lx, which needs %u-byte alignment", at.file, at.line,
                       d->type->name, static_cast<unsigned long>(pointer), 1u << d->log_alignment);
}

extern "C" void __ubsan_handle_out_of_bounds(const OutOfBoundsData* d, uintptr_t index) {
  const SourceLocation& at = d->location;
  snip_cuda_host::fail("%s:%u: index %ld out of bounds of %s", at.file, at.line, static_cast<long>(index),
                       d->array_type->name);
}
