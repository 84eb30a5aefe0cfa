// Row-wise quantization with 1-D blocks (1x16, 1x32, 1x128 along the columns): the activation /
// gradient path of fprop and dgrad, and every MX / NVFP4 operand along K.
//
// Work split: a thread owns a run of R consecutive elements of a row, R = 32 where the block length
// B is a multiple of 32, else 16 (1x16 blocks); the B/R threads of a block are consecutive lanes, so
// the block amax is 0 to 3 xor-shuffles. A thread's fixed work (its indices, the block amax and scale,
// the scale store) is shared by R elements, and each thread has R elements' loads in flight. Per
// element: one 16-byte-vector load share, the quotient by the block scale (a multiply and two fused
// multiply-adds for 16-bit inputs, an IEEE divide for float32; quant_math.cuh), the rounding
// (hardware cvt for RNE where it exists, integer arithmetic otherwise; SR adds one Philox4x32-10 block
// per 8 elements), and one vector store share (16 bytes of FP8 or 8 bytes of FP4 codes per thread).
#include "kernel_launch.cuh"
#include "quant/launch_dispatch.cuh"
#include "quant/quant_io.cuh"

namespace snip::quant {
namespace {

constexpr int kThreads = 256;

// The run length for a block length: the longer run wherever it divides the block.
constexpr int run_for(int64_t block_cols) { return block_cols % 32 == 0 ? 32 : 16; }

// vec_in: x rows start 16-byte aligned; vec_out: code rows allow 16-byte vector stores per thread.
template <typename T, Elem E, bool kSR, int kRun>
__global__ void __launch_bounds__(kThreads)
quantize_rows_kernel(const Args a, const bool vec_in, const bool vec_out) {
  constexpr int kWords = kRun * kCodeBits<E> / 32;
  const Output& o = a.row;
  const int group = a.spec.block_cols / kRun;  // threads per block: 1, 2, 4 or 8
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t blk = t >> (__ffs(group) - 1);
  const int sub = int(t & (group - 1));
  const int64_t nblocks = a.rows * o.nblk;
  const bool live = blk < nblocks;  // no early return: the whole warp shuffles below
  int64_t row = 0, k = 0;
  if (live) {  // 32-bit division where it fits: a 64-bit one costs several times more
    if (nblocks <= 0xFFFFFFFFll) {
      row = uint32_t(blk) / uint32_t(o.nblk);
    } else {
      row = blk / o.nblk;
    }
    k = blk - row * o.nblk;
  }
  const int64_t c0 = k * a.spec.block_cols + int64_t(sub) * kRun;

  Run<T, kRun> v;
  load_run(v, static_cast<const T*>(a.x) + row * a.ld, c0, live ? a.cols : 0, vec_in);
  uint32_t amax = run_max_bits(v);
  for (int m = group / 2; m > 0; m /= 2) amax = max(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, m));

  const float ts = tensor_scale_of(a);
  const BlockScale bs = block_scale(amax, a.spec.scale, E, ts);
  if (live && sub == 0) store_scale(o, a.spec.scale, row, k, bs.stored);
  if (t == 0 && a.tensor_scale != nullptr) *a.tensor_scale = ts;
  if (!live || c0 >= o.inner_store) return;

  uint32_t codes[kWords];
  const Divisor d = divisor_of(bs.s, kReciprocalChecked<T>);
  if constexpr (kSR) {
    // One Philox block's bits at a time: holding the whole run's would keep 16 more registers live.
    constexpr int kGroups = kRun / kElemsPerBlock, kGroupWords = kWords / kGroups;
    constexpr int kGroupRaw = int(sizeof(v.raw) / 16) / kGroups;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      uint32_t w[kElemsPerBlock / 2];
      run_bits<kElemsPerBlock>(w, row, c0 + g * kElemsPerBlock, a.cols, a.key, o.offset);
      Run<T, kElemsPerBlock> part;
#pragma unroll
      for (int q = 0; q < kGroupRaw; ++q) part.raw[q] = v.raw[g * kGroupRaw + q];
      uint32_t part_codes[kGroupWords];
      run_codes<E, kSR>(part_codes, part, d, w);
#pragma unroll
      for (int q = 0; q < kGroupWords; ++q) codes[g * kGroupWords + q] = part_codes[q];
    }
  } else {
    const uint32_t w[kRun / 2] = {};
    run_codes<E, kSR>(codes, v, d, w);
  }

  constexpr int kBytes = kWords * 4;
  uint8_t* dst = static_cast<uint8_t*>(o.codes) + row * o.ld + c0 * kCodeBits<E> / 8;
  if (vec_out && c0 + kRun <= o.inner_store) {
    if constexpr (kWords % 4 == 0) {
#pragma unroll
      for (int q = 0; q < kWords / 4; ++q)
        reinterpret_cast<uint4*>(dst)[q] = make_uint4(codes[4 * q], codes[4 * q + 1], codes[4 * q + 2], codes[4 * q + 3]);
    } else {
      *reinterpret_cast<uint2*>(dst) = make_uint2(codes[0], codes[1]);
    }
  } else {
    // The partial run at the end of a row: store the bytes that hold elements < inner_store.
    const int64_t elems_per_byte = 8 / kCodeBits<E>;
#pragma unroll
    for (int b = 0; b < kBytes; ++b)
      if (c0 + b * elems_per_byte < o.inner_store) dst[b] = uint8_t(codes[b / 4] >> (8 * (b % 4)));
  }
}

template <typename T, Elem E, bool kSR, int kRun>
cudaError_t launch(const Args& a, cudaStream_t stream) {
  const int64_t threads = a.rows * a.row.nblk * (a.spec.block_cols / kRun);
  const int64_t ctas = (threads + kThreads - 1) / kThreads;
  if (ctas > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const bool vec_in = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && (a.ld * int64_t(sizeof(T))) % 16 == 0;
  constexpr int kVecBytes = std::min(kRun * kCodeBits<E> / 8, 16);  // one store's bytes
  const bool vec_out = reinterpret_cast<uintptr_t>(a.row.codes) % kVecBytes == 0 && a.row.ld % kVecBytes == 0;
  launch_kernel(quantize_rows_kernel<T, E, kSR, kRun>, unsigned(ctas), kThreads, 0, stream, keyed(a), vec_in,
                vec_out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_quantize_rows(const Args& a, cudaStream_t stream) {
  const int run = run_for(a.spec.block_cols);
  if (a.spec.block_rows != 1 || a.spec.block_cols % run != 0 || 32 % (a.spec.block_cols / run) != 0 ||
      a.row.codes == nullptr || a.col.codes != nullptr)
    return cudaErrorInvalidValue;
  return dispatch_quantize(a, [&]<typename T, Elem E, bool kSR>() {
    return run == 32 ? launch<T, E, kSR, 32>(a, stream) : launch<T, E, kSR, 16>(a, stream);
  });
}

}  // namespace snip::quant
