// Quantization through 128x128 tiles: column-wise (codes of x^T), row+column fused in one pass over
// x (docs/design.md §3: x for fprop and x^T for wgrad, dy for dgrad and dy^T for wgrad), and 2-D blocks
// (16x16, 128x128: the weight blocks shared by w and w^T), with either or both outputs.
//
// Each CTA (512 threads) owns one 128x128 tile of x; a thread owns a 4-row x 8-column patch,
// lanes laid out so that a warp covers 32 rows x 32 columns:
//   row quad  rq = (warp % 4) * 8 + lane % 8   -> rows 4rq .. 4rq+3 of the tile
//   col octet cc = (warp / 4) * 4 + lane / 8   -> columns 8cc .. 8cc+7
// Block maxima: per thread over its patch, then xor-shuffles over the lanes that share a block
// (lane bits 0-2 step rq, bits 3-4 step cc) and, for 128-long blocks, a shared-memory step across
// the 4 warps that share them. Every code is computed in this row-major layout, so SR draws one
// Philox block per patch row (8 consecutive elements of a row), exactly the reference's blocks. Codes of
// x^T go to shared memory transposed (one 32-bit / 16-bit store per patch column, conflict-free
// with the padded pitch) and leave as coalesced 32-bit stores along the rows of x^T.
// __launch_bounds__(512, 2) caps registers at 64 so that two CTAs share an SM and one loads while
// the other computes (a few bytes spill on 16-bit inputs, more on float32).
// Four instantiations per (input, element, rounding) (TileKind): kAny takes 1-D blocks of any length
// and reads its blocks and outputs from the arguments; kRowCol128 (the layer's hot case: both outputs
// of 1x128 blocks), kSquare (2-D blocks, the weights') and kHadamard fix theirs at compile time, so the
// compiler drops the other cases' code and live ranges, which spill under the 64-register cap; the
// same arithmetic, so the same bits. In kRowCol128 every tile row and column is one block, so one
// thread per row and per column computes the block's scale and divisor (two IEEE divisions) once and
// leaves them in shared memory, instead of every thread of the block again. In kSquare a thread's
// patch lies in one block, so it computes that block's scale and divisor once; and as an element of
// x and of x^T has the same block, value and divisor, its x^T code is its x code wherever both draw
// the same random bits (RNE, or SR with equal offsets): the x^T codes are then the x codes transposed.
// The Hadamard variant (kHadamard: column output only, 1x16 blocks, nvfp4_train's wgrad operands) quantizes
// (T x)^T: a 16-row group is 4 row quads, lanes lane ^ 1 and lane ^ 2 of one another, so the
// transform's first two butterfly stages run inside a thread's patch and the last two through
// shuffles; it keeps the transformed patch in float32 (32 more registers).
#include <algorithm>

#include "kernel_launch.cuh"
#include "quant/hadamard.cuh"
#include "quant/launch_dispatch.cuh"
#include "quant/quant_io.cuh"

namespace snip::quant {
namespace {

constexpr int kTile = 128;
constexpr int kThreads = 512;
constexpr int kPatchRows = 4;
constexpr int kPatchCols = 8;

__device__ __forceinline__ uint32_t warp_max(uint32_t v, int lane_bits) {
#pragma unroll
  for (int m = 1; m < 32; m *= 2)
    if (lane_bits & m) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, m));
  return v;
}

// Lane bits that step through `n` row quads (n <= 8) or `n` column octets (n <= 4, bits 3-4).
__host__ __device__ constexpr int rq_bits(int n) { return n - 1; }
__host__ __device__ constexpr int cc_bits(int n) { return (n - 1) << 3; }

// T x of the thread's patch (hadamard.cuh, bit for bit): rows 4rq .. 4rq+3 are group positions
// 4 (rq % 4) .. 4 (rq % 4) + 3; the partners of butterfly stages 4 and 8 are the row quads rq ^ 1 and
// rq ^ 2, which are the lanes lane ^ 1 and lane ^ 2 (rq's low three bits are lane's). The lower
// partner of a pair keeps a + b, the upper a - b, a being the lower one's value.
template <typename T>
__device__ __forceinline__ void hadamard_patch(float (&h)[kPatchRows][kPatchCols], const Run<T, kPatchCols> (&v)[kPatchRows],
                                               uint32_t signs, int rq, int lane) {
#pragma unroll
  for (int j = 0; j < kPatchRows; ++j) {
    const float s = hadamard_sign(signs, (kPatchRows * rq + j) % kHadamardSize);
#pragma unroll
    for (int i = 0; i < kPatchCols; ++i) h[j][i] = mul_rn(v[j][i], s);
  }
#pragma unroll
  for (int i = 0; i < kPatchCols; ++i) {  // stages 1 and 2: positions (0, 1), (2, 3), then (0, 2), (1, 3)
    const float b0 = add_rn(h[0][i], h[1][i]), b1 = sub_rn(h[0][i], h[1][i]);
    const float b2 = add_rn(h[2][i], h[3][i]), b3 = sub_rn(h[2][i], h[3][i]);
    h[0][i] = add_rn(b0, b2);
    h[2][i] = sub_rn(b0, b2);
    h[1][i] = add_rn(b1, b3);
    h[3][i] = sub_rn(b1, b3);
  }
#pragma unroll
  for (int m = 1; m <= 2; m *= 2) {  // stages 4 and 8
    const bool upper = lane & m;
#pragma unroll
    for (int j = 0; j < kPatchRows; ++j)
#pragma unroll
      for (int i = 0; i < kPatchCols; ++i) {
        const float o = __shfl_xor_sync(0xFFFFFFFFu, h[j][i], m);
        h[j][i] = upper ? sub_rn(o, h[j][i]) : add_rn(h[j][i], o);
      }
  }
#pragma unroll
  for (int j = 0; j < kPatchRows; ++j)
#pragma unroll
    for (int i = 0; i < kPatchCols; ++i) h[j][i] = mul_rn(h[j][i], 0.25f);
}

enum class TileKind { kAny, kRowCol128, kSquare, kHadamard };

struct Flags {
  bool vec_in;     // x rows 16-byte aligned
  bool vec_row;    // code rows of x allow one 8-byte (FP8) / 4-byte (FP4) store per patch row
  bool vec_col;    // code rows of x^T allow 32-bit stores
};

template <typename T, Elem E, bool kSR, TileKind kKind>
__global__ void __launch_bounds__(kThreads, 2)
quantize_tile_kernel(const Args a, const Flags f) {
  constexpr bool kHad = kKind == TileKind::kHadamard, kRowCol128 = kKind == TileKind::kRowCol128;
  constexpr bool two_d = kKind == TileKind::kSquare;
  constexpr bool kFp4 = E == Elem::kE2M1;
  constexpr int kBits = kCodeBits<E>;
  // x^T codes of the tile: one row per tile column; +4 bytes make the pitch an odd number of words.
  constexpr int kPitch = kTile * kBits / 8 + 4;
  __shared__ __align__(16) uint8_t tcodes[kTile * kPitch];
  __shared__ uint32_t red_row[4][kTile];  // per tile row, partial maxima of the 4 column quarters
  __shared__ uint32_t red_col[4][kTile];  // per tile column, partial maxima of the 4 row quarters
  // kRowCol128: each tile row's and column's block divisor, computed once (see "scales" below).
  __shared__ Divisor row_div[kRowCol128 ? kTile : 1], col_div[kRowCol128 ? kTile : 1];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rq = (warp % 4) * 8 + lane % 8;
  const int cc = (warp / 4) * 4 + lane / 8;
  const int64_t tiles_c = (max(a.cols, a.row.inner_store) + kTile - 1) / kTile;
  const int64_t tile_r = int64_t(blockIdx.x) / tiles_c * kTile, tile_c = int64_t(blockIdx.x) % tiles_c * kTile;
  const int64_t r0 = tile_r + kPatchRows * rq, c0 = tile_c + kPatchCols * cc;
  // What the kinds fix (their launchers check the arguments agree); kAny reads it from the arguments.
  const bool rows_out = kRowCol128 || (!kHad && a.row.codes != nullptr);
  const bool cols_out = kRowCol128 || kHad || a.col.codes != nullptr;
  // 1-D: block length, along x's rows for x, its columns for x^T
  const int B = kRowCol128 ? kTile : kHad ? kHadamardSize : a.spec.block_cols;

  Run<T, kPatchCols> v[kPatchRows];
#pragma unroll
  for (int j = 0; j < kPatchRows; ++j) {
    const bool in = r0 + j < a.rows;
    load_run(v[j], static_cast<const T*>(a.x) + (in ? r0 + j : 0) * a.ld, c0, in ? a.cols : 0, f.vec_in);
  }
  // The values the column output quantizes: x's, or T x's (kHad; `h` is unused otherwise).
  [[maybe_unused]] float h[kPatchRows][kPatchCols];
  if constexpr (kHad) hadamard_patch(h, v, a.hadamard_signs, rq, lane);
  const auto col_value = [&](int j, int i) -> float {
    if constexpr (kHad) {
      return h[j][i];
    } else {
      return v[j][i];
    }
  };
  uint32_t rmax[kPatchRows] = {}, cmax[kPatchCols] = {};
  if constexpr (kHad || sizeof(T) == 4) {
#pragma unroll
    for (int j = 0; j < kPatchRows; ++j)
#pragma unroll
      for (int i = 0; i < kPatchCols; ++i) {
        rmax[j] = max(rmax[j], abs_bits(v[j][i]));
        cmax[i] = max(cmax[i], abs_bits(col_value(j, i)));
      }
  } else {  // 16-bit x: the packed maxima of quant_io.cuh, along rows and down column pairs
    uint32_t cpair[kPatchCols / 2] = {};
#pragma unroll
    for (int j = 0; j < kPatchRows; ++j) {
      uint32_t rpair = 0;
#pragma unroll
      for (int k = 0; k < kPatchCols / 2; ++k) {
        const uint32_t a = abs_pair<T>(pair_word(v[j], k));
        rpair = max_u16x2(rpair, a);
        cpair[k] = max_u16x2(cpair[k], a);
      }
      rmax[j] = abs_bits_of16<T>(max(rpair & 0xFFFFu, rpair >> 16));
    }
#pragma unroll
    for (int k = 0; k < kPatchCols / 2; ++k) {
      cmax[2 * k] = abs_bits_of16<T>(cpair[k] & 0xFFFFu);
      cmax[2 * k + 1] = abs_bits_of16<T>(cpair[k] >> 16);
    }
  }

  // ---- block maxima ----
  if constexpr (two_d) {
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < kPatchRows; ++j) m = max(m, rmax[j]);
    if (a.spec.block_rows == kTile) {  // one block per tile: whole warp, then all 16 warps
      m = warp_max(m, 31);
      if (lane == 0) red_row[0][warp] = m;
      __syncthreads();
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) m = max(m, red_row[0][w]);
    } else {  // 16x16: 4 row quads x 2 column octets, inside the warp
      m = warp_max(m, rq_bits(4) | cc_bits(2));
    }
#pragma unroll
    for (int j = 0; j < kPatchRows; ++j) rmax[j] = m;
#pragma unroll
    for (int i = 0; i < kPatchCols; ++i) cmax[i] = m;
  } else {
    const int nc = B / kPatchCols, nr = B / kPatchRows;  // patches per block along a row / a column
    if (rows_out) {
#pragma unroll
      for (int j = 0; j < kPatchRows; ++j) rmax[j] = warp_max(rmax[j], cc_bits(min(nc, 4)));
    }
    if (cols_out) {
#pragma unroll
      for (int i = 0; i < kPatchCols; ++i) cmax[i] = warp_max(cmax[i], rq_bits(min(nr, 8)));
    }
    if (B == kTile) {  // 128-long blocks span the 4 warps of a quarter: combine through shared memory
      if (rows_out && lane / 8 == 0) {
#pragma unroll
        for (int j = 0; j < kPatchRows; ++j) red_row[warp / 4][kPatchRows * rq + j] = rmax[j];
      }
      if (cols_out && lane % 8 == 0) {
#pragma unroll
        for (int i = 0; i < kPatchCols; ++i) red_col[warp % 4][kPatchCols * cc + i] = cmax[i];
      }
      __syncthreads();
      if constexpr (!kRowCol128) {  // kRowCol128 combines them once per row and column (scales, below)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (rows_out) {
#pragma unroll
            for (int j = 0; j < kPatchRows; ++j) rmax[j] = max(rmax[j], red_row[q][kPatchRows * rq + j]);
          }
          if (cols_out) {
#pragma unroll
            for (int i = 0; i < kPatchCols; ++i) cmax[i] = max(cmax[i], red_col[q][kPatchCols * cc + i]);
          }
        }
      }
    }
  }

  // ---- scales: element scales kept, stored bits written by one thread per (output row, block) ----
  const float ts = tensor_scale_of(a);
  if (blockIdx.x == 0 && threadIdx.x == 0 && a.tensor_scale != nullptr) *a.tensor_scale = ts;
  const int br = two_d ? a.spec.block_rows : B;  // block length along x's columns for x^T
  float rs[kPatchRows], cs[kPatchCols];
  // kSquare: the patch's one block (every rmax[j] and cmax[i] is its maximum).
  [[maybe_unused]] BlockScale block_bs;
  [[maybe_unused]] Divisor block_div;
  if constexpr (two_d) {
    block_bs = block_scale(rmax[0], a.spec.scale, E, ts);
    block_div = divisor_of(block_bs.s, kReciprocalChecked<T>);
  }
  const auto scale_of = [&](uint32_t m) { return two_d ? block_bs : block_scale(m, a.spec.scale, E, ts); };
  if constexpr (kRowCol128) {
    // Every tile row is one block of x, every tile column one of x^T: 128 threads compute the row
    // blocks' scales and divisors, 128 the columns', once each, instead of each of the 16 (or 32)
    // threads that share a block computing them again (the block scale and the reciprocal are two
    // IEEE divisions: a large share of the kernel's instructions otherwise).
    if (threadIdx.x < 2 * kTile) {
      const bool row = threadIdx.x < kTile;
      const int t = threadIdx.x % kTile;
      uint32_t m = 0;
#pragma unroll
      for (int q = 0; q < 4; ++q) m = max(m, row ? red_row[q][t] : red_col[q][t]);
      const BlockScale bs = block_scale(m, a.spec.scale, E, ts);
      (row ? row_div : col_div)[t] = divisor_of(bs.s, kReciprocalChecked<T>);
      if (row && tile_r + t < a.rows && tile_c < a.row.inner_store)
        store_scale(a.row, a.spec.scale, tile_r + t, tile_c / kTile, bs.stored);
      if (!row && tile_c + t < a.cols && tile_r < a.col.inner_store)
        store_scale(a.col, a.spec.scale, tile_c + t, tile_r / kTile, bs.stored);
    }
    __syncthreads();
  } else if (rows_out) {
    // 2-D plain: one scale per block; otherwise one per row of a block (the Blackwell layout
    // repeats a 16x16 block's scale on each of its rows).
    const bool per_row = !two_d || a.row.layout == ScaleLayout::kBlackwell;
    const bool writer = cc % (B / kPatchCols) == 0 && c0 < a.row.inner_store &&
                        (per_row || rq % (br / kPatchRows) == 0);
#pragma unroll
    for (int j = 0; j < kPatchRows; ++j) {
      const BlockScale bs = scale_of(rmax[j]);
      rs[j] = bs.s;
      if (writer && r0 + j < a.rows && (per_row || j == 0))
        store_scale(a.row, a.spec.scale, per_row ? r0 + j : r0 / br, c0 / B, bs.stored);
    }
  }
  if (!kRowCol128 && cols_out) {
    const bool per_row = !two_d || a.col.layout == ScaleLayout::kBlackwell;
    const bool writer = rq % (br / kPatchRows) == 0 && r0 < a.col.inner_store &&
                        (per_row || cc % (B / kPatchCols) == 0);
#pragma unroll
    for (int i = 0; i < kPatchCols; ++i) {
      const BlockScale bs = scale_of(cmax[i]);
      cs[i] = bs.s;
      if (writer && c0 + i < a.cols && (per_row || i == 0))
        store_scale(a.col, a.spec.scale, per_row ? c0 + i : c0 / B, r0 / br, bs.stored);
    }
  }

  // ---- codes ----
  // T x's values are float32 sums, outside the significands `quotient`'s reciprocal was checked on.
  constexpr bool kColReciprocal = !kHad && kReciprocalChecked<T>;
  // x^T codes of patch column i, rows 4rq .. 4rq+3 packed (row 4rq + j at bits j * kBits): one
  // shared-memory store per column once the patch is done.
  uint32_t tcol[kPatchCols] = {};
  // SR goes row by row (a row's Philox blocks). Keeping 8 column reciprocals in registers as well
  // spills under the 64-register cap, so the other kinds divide; kRowCol128 reads each column's
  // divisor from shared memory where it is used. RNE goes column by column, one reciprocal at a time.
  // Both outputs draw the same bits when their offsets agree: one Philox stream then serves both.
  const bool same_bits = rows_out && a.row.offset == a.col.offset;
  // kSquare: x^T codes are x codes, transposed (see the top), where both draw the same bits.
  const bool codes_shared = two_d && rows_out && cols_out && (!kSR || same_bits);
  // Block divisors: kRowCol128 reads them from shared memory, kSquare has its block's, the other kinds
  // compute them.
  const auto row_divisor = [&](int j) -> Divisor {
    if constexpr (kRowCol128) {
      return row_div[kPatchRows * rq + j];
    } else if constexpr (two_d) {
      return block_div;
    } else {
      return divisor_of(rs[j], kReciprocalChecked<T>);
    }
  };
  const auto col_divisor = [&](int i) -> Divisor {
    if constexpr (kRowCol128) {
      // volatile: read where used; hoisted out of SR's row loop, the 8 divisors would spill.
      const volatile Divisor& d = col_div[kPatchCols * cc + i];
      return Divisor{d.s, d.r};
    } else if constexpr (two_d) {
      return block_div;
    } else {
      return divisor_of(cs[i], kColReciprocal);
    }
  };
#pragma unroll
  for (int j = 0; j < kPatchRows; ++j) {
    uint32_t w[kPatchCols / 2] = {};
    if (kSR && rows_out && r0 + j < a.rows) run_bits<kPatchCols>(w, r0 + j, c0, a.cols, a.seed, a.row.offset);
    const bool row_store = rows_out && r0 + j < a.rows && c0 < a.row.inner_store;
    if (row_store || codes_shared) {
      constexpr int kWords = kPatchCols * kBits / 32;
      uint32_t codes[kWords];  // rows past x's end are zeros: their codes are 0, as x^T's padding wants
      run_codes<E, kSR>(codes, v[j], row_divisor(j), w);
      if (codes_shared) {
#pragma unroll
        for (int i = 0; i < kPatchCols; ++i)
          tcol[i] |= ((codes[i * kBits / 32] >> (i * kBits % 32)) & ((1u << kBits) - 1)) << (j * kBits);
      }
      if (!row_store) continue;
      uint8_t* dst = static_cast<uint8_t*>(a.row.codes) + (r0 + j) * a.row.ld + c0 * kBits / 8;
      if (f.vec_row && c0 + kPatchCols <= a.row.inner_store) {
        if constexpr (kWords == 2) {
          *reinterpret_cast<uint2*>(dst) = make_uint2(codes[0], codes[1]);
        } else {
          *reinterpret_cast<uint32_t*>(dst) = codes[0];
        }
      } else {
#pragma unroll
        for (int b = 0; b < kWords * 4; ++b)
          if (c0 + b * (8 / kBits) < a.row.inner_store) dst[b] = uint8_t(codes[b / 4] >> (8 * (b % 4)));
      }
    }
    if constexpr (kSR) {
      if (cols_out && !codes_shared) {
        // T x has a row for each row of the padded x (its SR index runs over them).
        const int64_t sr_rows = kHad ? a.col.inner_store : a.rows;
        if (!same_bits && r0 + j < sr_rows) run_bits<kPatchCols>(w, r0 + j, c0, a.cols, a.seed, a.col.offset);
#pragma unroll
        for (int i = 0; i < kPatchCols; ++i) {
          float q;
          if constexpr (kRowCol128 || two_d) {
            const Divisor d = col_divisor(i);
            if (!(fabsf(d.s) < INFINITY)) continue;
            q = quotient(col_value(j, i), d);
          } else {
            if (!(fabsf(cs[i]) < INFINITY)) continue;
            q = div_rn(col_value(j, i), cs[i]);
          }
          tcol[i] |= round_to_code(q, format_of(E), true, bits_of(w, i)) << (j * kBits);
        }
      }
    }
  }
  if (!cols_out) return;
  if (!kSR && !codes_shared) {  // RNE: rows (j, j + 1) of a column share the scale, so convert them as a pair
#pragma unroll
    for (int i = 0; i < kPatchCols; ++i) {
      const Divisor d = col_divisor(i);
      if (!(fabsf(d.s) < INFINITY)) continue;
      with_quotient<kColReciprocal>(d, [&](auto quotient_of) {
#pragma unroll
        for (int j = 0; j < kPatchRows; j += 2)
          tcol[i] |= rne_codes2<E>(quotient_of(col_value(j, i)), quotient_of(col_value(j + 1, i))) << (j * kBits);
      });
    }
  }
  // Bank check (words): FP8 (8cc + i) * 33 + rq, FP4 (8cc + i) * 17 + rq / 2 -> distinct per warp.
#pragma unroll
  for (int i = 0; i < kPatchCols; ++i) {
    uint8_t* dst = tcodes + (kPatchCols * cc + i) * kPitch + kPatchRows * rq * kBits / 8;
    if constexpr (kFp4) {
      *reinterpret_cast<uint16_t*>(dst) = uint16_t(tcol[i]);
    } else {
      *reinterpret_cast<uint32_t*>(dst) = tcol[i];
    }
  }
  __syncthreads();

  // ---- x^T codes: shared memory -> rows of x^T, 32-bit words ----
  constexpr int kRowWords = kTile * kBits / 32;        // 32 (FP8) or 16 (FP4) words per tile row
  constexpr int kRowsPerPass = kThreads / kRowWords;   // 16 or 32
  const int wi = threadIdx.x % kRowWords;
  const int64_t row_bytes = kFp4 ? (a.col.inner_store + 1) / 2 : a.col.inner_store;
  const int64_t b0 = tile_r * kBits / 8 + 4 * wi;     // byte offset of this word in its x^T row
#pragma unroll
  for (int p = 0; p < kTile / kRowsPerPass; ++p) {
    const int trow = threadIdx.x / kRowWords + p * kRowsPerPass;
    const int64_t c = tile_c + trow;
    if (c >= a.cols || b0 >= row_bytes) continue;
    const uint32_t word = *reinterpret_cast<const uint32_t*>(tcodes + trow * kPitch + 4 * wi);
    uint8_t* dst = static_cast<uint8_t*>(a.col.codes) + c * a.col.ld + b0;
    if (f.vec_col && b0 + 4 <= row_bytes) {
      *reinterpret_cast<uint32_t*>(dst) = word;
    } else {
      for (int b = 0; b < 4 && b0 + b < row_bytes; ++b) dst[b] = uint8_t(word >> (8 * b));
    }
  }
}

template <typename T, Elem E, bool kSR, TileKind kKind>
cudaError_t launch(const Args& a, cudaStream_t stream) {
  const int64_t rows = a.col.codes ? std::max(a.rows, a.col.inner_store) : a.rows;
  const int64_t cols = a.row.codes ? std::max(a.cols, a.row.inner_store) : a.cols;
  const int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  if (tiles > 0x7FFFFFFF) return cudaErrorInvalidValue;
  constexpr int kRowBytes = kPatchCols * kCodeBits<E> / 8;
  Flags f;
  f.vec_in = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && (a.ld * int64_t(sizeof(T))) % 16 == 0;
  f.vec_row = reinterpret_cast<uintptr_t>(a.row.codes) % kRowBytes == 0 && a.row.ld % kRowBytes == 0;
  f.vec_col = reinterpret_cast<uintptr_t>(a.col.codes) % 4 == 0 && a.col.ld % 4 == 0;
  launch_kernel(quantize_tile_kernel<T, E, kSR, kKind>, unsigned(tiles), kThreads, 0, stream, a, f);
  return cudaGetLastError();
}

// kSquare for 2-D blocks, kRowCol128 where it applies, else kAny.
template <typename T, Elem E, bool kSR>
cudaError_t launch_any(const Args& a, cudaStream_t stream) {
  if (a.spec.block_rows > 1) return launch<T, E, kSR, TileKind::kSquare>(a, stream);
  if (a.spec.block_cols == kTile && a.row.codes != nullptr && a.col.codes != nullptr)
    return launch<T, E, kSR, TileKind::kRowCol128>(a, stream);
  return launch<T, E, kSR, TileKind::kAny>(a, stream);
}

}  // namespace

cudaError_t launch_quantize_tile(const Args& a, cudaStream_t stream) {
  const int br = a.spec.block_rows, bc = a.spec.block_cols;
  const bool one_d = br == 1 && (bc == 16 || bc == 32 || bc == 128);
  const bool two_d = br == bc && (bc == 16 || bc == 128);
  if (!(one_d || two_d) || (a.row.codes == nullptr && a.col.codes == nullptr)) return cudaErrorInvalidValue;
  if (a.hadamard) {
    if (a.row.codes != nullptr || a.col.codes == nullptr || br != 1 || bc != kHadamardSize) return cudaErrorInvalidValue;
    return dispatch_quantize(a, [&]<typename T, Elem E, bool kSR>() {
      return launch<T, E, kSR, TileKind::kHadamard>(a, stream);
    });
  }
  return dispatch_quantize(a, [&]<typename T, Elem E, bool kSR>() {
    return launch_any<T, E, kSR>(a, stream);
  });
}

}  // namespace snip::quant
