// Quantization through 128x128 tiles: column-wise (codes of x^T), row+column fused in one pass over
// x (docs/design.md §3: x for fprop and x^T for wgrad, dy for dgrad and dy^T for wgrad), and 2-D blocks
// (16x16, 128x128: the weight blocks shared by w and w^T), with either or both outputs.
//
// CTAs (512 threads, as many as are resident at once) stride over the 128x128 tiles of x: while a CTA
// quantizes one tile, each thread's patch of its next tile is already on its way into shared memory
// (cp.async into the thread's own stage slots; no barrier, as no other thread reads them), so that
// the loads of x overlap the arithmetic instead of following it. Edge tiles and unaligned rows are
// loaded when their turn comes. Within a tile a thread owns a 4-row x 8-column patch,
// lanes laid out so that a warp covers 32 rows x 32 columns:
//   row quad  rq = (warp % 4) * 8 + lane % 8   -> rows 4rq .. 4rq+3 of the tile
//   col octet cc = (warp / 4) * 4 + lane / 8   -> columns 8cc .. 8cc+7
// Block maxima: per thread over its patch, then xor-shuffles over the lanes that share a block
// (lane bits 0-2 step rq, bits 3-4 step cc) and, for 128-long blocks, a shared-memory step across
// the 4 warps that share them. Every code is computed in this row-major layout, so SR draws one
// Philox block per patch row (8 consecutive elements of a row), exactly the reference's blocks. Codes of
// x^T go to shared memory transposed (one 32-bit / 16-bit store per patch column, conflict-free
// with the padded pitch) and leave as coalesced 32-bit stores along the rows of x^T.
// __launch_bounds__(512, 2) caps registers at 64 so that two CTAs share an SM (float32 inputs spill a
// few bytes in some kinds; 16-bit inputs none in the layer's kinds, which scripts/check_sass.sh holds to
// that, and a few in kAny with SR).
// Four kinds per (input, element, rounding) (TileKind; kHadamard for E2M1 only): kAny takes 1-D blocks of any length
// and reads its blocks and outputs from the arguments; kRowCol128 (the layer's hot case: both outputs
// of 1x128 blocks), kSquare (2-D blocks, the weights') and kHadamard fix theirs at compile time, so the
// compiler drops the other cases' code and live ranges, which spill under the 64-register cap; the
// same arithmetic, so the same bits. With 1-D blocks one thread per block computes the block's scale
// and divisor (IEEE divisions) once and leaves the divisor in shared memory, instead of every thread
// that shares the block (8 to 32 of them) computing them again. In kSquare a thread's
// patch lies in one block, so it computes that block's scale and divisor once; and as an element of
// x and of x^T has the same block, value and divisor, its x^T code is its x code wherever both draw
// the same random bits (RNE, or SR with equal offsets): the x^T codes are then the x codes transposed.
// The Hadamard variant (kHadamard: column output only, E2M1 in 1x16 blocks, nvfp4_train's wgrad operands) quantizes
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
  int64_t tiles;   // 128x128 tiles of the grid-stride loop
  bool vec_in;     // x rows 16-byte aligned
  bool vec_row;    // code rows of x allow one 8-byte (FP8) / 4-byte (FP4) store per patch row
  bool vec_col;    // code rows of x^T allow 32-bit stores
};

// 16-byte vectors of a patch row, and the CTA's stage: every thread's patch of the next tile.
template <typename T> constexpr int kRowVecs = int(sizeof(Run<T, kPatchCols>) / 16);
template <typename T> constexpr size_t kStageBytes = size_t(kPatchRows) * kRowVecs<T> * 16 * kThreads;

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
  // 1-D blocks: each block's divisor, computed once (see "scales" below), for tile row (x) or column
  // (x^T) t and its block b at slot(t, b); the odd pitch spreads a warp's reads over the banks.
  constexpr int kSlotPitch = kRowCol128 ? 1 : kTile / 16 + 1;
  constexpr int kSlots = two_d ? 1 : kTile * kSlotPitch;
  __shared__ Divisor row_div[kHad ? 1 : kSlots], col_div[kSlots];
  const auto slot = [](int t, int b) { return t * kSlotPitch + b; };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rq = (warp % 4) * 8 + lane % 8;
  const int cc = (warp / 4) * 4 + lane / 8;
  const int64_t tiles_c = (max(a.cols, a.row.inner_store) + kTile - 1) / kTile;
  // What the kinds fix (their launchers check the arguments agree); kAny reads it from the arguments.
  const bool rows_out = kRowCol128 || (!kHad && a.row.codes != nullptr);
  const bool cols_out = kRowCol128 || kHad || a.col.codes != nullptr;
  // 1-D: block length, along x's rows for x, its columns for x^T
  const int B = kRowCol128 ? kTile : kHad ? kHadamardSize : a.spec.block_cols;
  // log2(B) (B is 16, 32 or 128): the block arithmetic below shifts and masks rather than divides.
  const int lgB = kRowCol128 ? 7 : kHad ? 4 : B == 16 ? 4 : B == 32 ? 5 : 7;
  // Tile t's first row and column.
  const auto tile_row = [&](int64_t t) { return t / tiles_c * kTile; };
  const auto tile_col = [&](int64_t t) { return t % tiles_c * kTile; };
  // The thread's stage slot for vector q of patch row j: the same slot of every thread side by side,
  // so that a warp's 16-byte accesses are conflict-free.
  uint4* const stage = dynamic_shared<uint4>() + threadIdx.x;
  const auto stage_slot = [&](int j, int q) { return stage + (j * kRowVecs<T> + q) * kThreads; };
  // Starts the loads of the thread's patch of tile t into its stage slots; false where the patch is
  // not whole 16-byte vectors inside x (edge tiles, unaligned rows): that tile loads it directly.
  const auto stage_patch = [&](int64_t t) -> bool {
    const int64_t pr = tile_row(t) + kPatchRows * rq, pc = tile_col(t) + kPatchCols * cc;
    if (!f.vec_in || pr + kPatchRows > a.rows || pc + kPatchCols > a.cols) return false;
#pragma unroll
    for (int j = 0; j < kPatchRows; ++j)
#pragma unroll
      for (int q = 0; q < kRowVecs<T>; ++q)
        copy_async16(stage_slot(j, q),
                     reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + (pr + j) * a.ld + pc) + q);
    return true;
  };

  // Quantizes tile (tile_r, tile_c), the thread's patch (r0, c0) in v.
  const auto quantize_patch = [&](const int64_t tile_r, const int64_t tile_c, const int64_t r0, const int64_t c0,
                                  const Run<T, kPatchCols> (&v)[kPatchRows]) {
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

    // ---- block maxima, scales ----
    const float ts = tensor_scale_of(a);
    if (tile_r == 0 && tile_c == 0 && threadIdx.x == 0 && a.tensor_scale != nullptr) *a.tensor_scale = ts;
    // T x's values are float32 sums, outside the significands `quotient`'s reciprocal was checked on.
    constexpr bool kColReciprocal = !kHad && kReciprocalChecked<T>;
    // kSquare: the patch's one block (every rmax[j] and cmax[i] is its maximum).
    [[maybe_unused]] Divisor block_div;
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
      const int br = a.spec.block_rows;
      const BlockScale bs = block_scale(m, a.spec.scale, E, ts);
      block_div = divisor_of(bs.s, kReciprocalChecked<T>);
      // The block's scale in output o, whose rows start at the patch's outer0 (kN of them, up to
      // outer_end) and whose blocks along a row at inner0. Plain: one scale per block, stored by the
      // patch at its corner; Blackwell: one per row of a block (its layout repeats a 16x16 block's
      // scale on each of its rows), stored by the patches at the block's first inner index.
      const auto store_block_scale = [&]<int kN>(const Output& o, int64_t outer0, int64_t outer_end, int64_t inner0,
                                                 bool first_inner, bool first_outer) {
        if (inner0 >= o.inner_store || !first_inner) return;
        const bool per_row = o.layout == ScaleLayout::kBlackwell;
#pragma unroll
        for (int k = 0; k < kN; ++k)
          if (outer0 + k < outer_end && (per_row || (k == 0 && first_outer)))
            store_scale(o, a.spec.scale, per_row ? outer0 + k : outer0 / br, inner0 / br, bs.stored);
      };
      const bool first_cc = cc % (br / kPatchCols) == 0, first_rq = rq % (br / kPatchRows) == 0;
      if (rows_out) store_block_scale.template operator()<kPatchRows>(a.row, r0, a.rows, c0, first_cc, first_rq);
      if (cols_out) store_block_scale.template operator()<kPatchCols>(a.col, c0, a.cols, r0, first_rq, first_cc);
    } else {
      // 1-D: the shuffles leave each block's maximum with all the lanes that share the block; 128-long
      // blocks span the 4 warps of a quarter, whose partial maxima meet in red_row / red_col. Then one
      // thread per block (nb = 128 / B blocks per tile row and per tile column) computes its scale
      // (an IEEE division, for NVFP4 two and a rounding) and divisor (another) once, stores the scale
      // and leaves the divisor in row_div / col_div, instead of each of the B / 8 (rows) or B / 4
      // (columns) threads that share the block computing them again.
      const int nc = B / kPatchCols, nr = B / kPatchRows;  // patches per block along a row / a column
      const int nb = kTile >> lgB;
      if (rows_out) {
#pragma unroll
        for (int j = 0; j < kPatchRows; ++j) rmax[j] = warp_max(rmax[j], cc_bits(min(nc, 4)));
      }
      if (cols_out) {
#pragma unroll
        for (int i = 0; i < kPatchCols; ++i) cmax[i] = warp_max(cmax[i], rq_bits(min(nr, 8)));
      }
      if (B == kTile) {
        if (rows_out && lane / 8 == 0) {
#pragma unroll
          for (int j = 0; j < kPatchRows; ++j) red_row[warp / 4][kPatchRows * rq + j] = rmax[j];
        }
        if (cols_out && lane % 8 == 0) {
#pragma unroll
          for (int i = 0; i < kPatchCols; ++i) red_col[warp % 4][kPatchCols * cc + i] = cmax[i];
        }
      } else {  // the block's maximum, as float bits in its divisor slot until the divisor replaces it
        if (rows_out && (cc & (nc - 1)) == 0) {
#pragma unroll
          for (int j = 0; j < kPatchRows; ++j)
            row_div[slot(kPatchRows * rq + j, (kPatchCols * cc) >> lgB)].s = u2f(rmax[j]);
        }
        if (cols_out && (rq & (nr - 1)) == 0) {
#pragma unroll
          for (int i = 0; i < kPatchCols; ++i)
            col_div[slot(kPatchCols * cc + i, (kPatchRows * rq) >> lgB)].s = u2f(cmax[i]);
        }
      }
      __syncthreads();
      const int row_blocks = rows_out ? kTile * nb : 0;
      const int blocks = row_blocks + (cols_out ? kTile * nb : 0);
      for (int k = threadIdx.x; k < blocks; k += kThreads) {
        const bool row = k < row_blocks;
        const int kk = row ? k : k - row_blocks;
        const int t = kk >> (7 - lgB), b = kk & (nb - 1);  // tile row (column), its block
        Divisor& d = (row ? row_div : col_div)[slot(t, b)];
        uint32_t m = 0;
        if (B == kTile) {
#pragma unroll
          for (int q = 0; q < 4; ++q) m = max(m, row ? red_row[q][t] : red_col[q][t]);
        } else {
          m = f2u(d.s);
        }
        const BlockScale bs = block_scale(m, a.spec.scale, E, ts);
        d = divisor_of(bs.s, row ? kReciprocalChecked<T> : kColReciprocal);
        if (row && tile_r + t < a.rows && tile_c + (b << lgB) < a.row.inner_store)
          store_scale(a.row, a.spec.scale, tile_r + t, (tile_c >> lgB) + b, bs.stored);
        if (!row && tile_c + t < a.cols && tile_r + (b << lgB) < a.col.inner_store)
          store_scale(a.col, a.spec.scale, tile_c + t, (tile_r >> lgB) + b, bs.stored);
      }
      __syncthreads();
    }

    // ---- codes ----
    // x^T codes of patch column i, rows 4rq .. 4rq+3 packed (row 4rq + j at bits j * kBits): one
    // shared-memory store per column once the patch is done.
    uint32_t tcol[kPatchCols] = {};
    // SR goes row by row (a row's Philox blocks), reading each column's divisor from shared memory
    // where it is used (hoisted out of the row loop, the 8 divisors spill under the 64-register cap).
    // RNE goes column by column, one divisor at a time.
    // Both outputs draw the same bits when their offsets agree: one Philox stream then serves both.
    const bool same_bits = rows_out && a.row.offset == a.col.offset;
    // kSquare: x^T codes are x codes, transposed (see the top), where both draw the same bits.
    const bool codes_shared = two_d && rows_out && cols_out && (!kSR || same_bits);
    const auto row_divisor = [&](int j) -> Divisor {
      if constexpr (two_d) {
        return block_div;
      } else {
        return row_div[slot(kPatchRows * rq + j, (kPatchCols * cc) >> lgB)];
      }
    };
    const auto col_divisor = [&](int i) -> Divisor {
      if constexpr (two_d) {
        return block_div;
      } else {
        const volatile Divisor& d = col_div[slot(kPatchCols * cc + i, (kPatchRows * rq) >> lgB)];
        return Divisor{d.s, d.r};
      }
    };
    // SR's column codes skip two branches per element where every column divisor of the patch is finite
    // and (16-bit inputs) holds its reciprocal, as nearly always: one check per patch instead.
    bool cols_fast = false;
    if constexpr (kSR) {
      if (cols_out && !codes_shared) {
        cols_fast = true;
#pragma unroll
        for (int i = 0; i < kPatchCols; ++i) {
          const Divisor d = col_divisor(i);
          cols_fast = cols_fast && fabsf(d.s) < INFINITY && (!kColReciprocal || d.r != 0.0f);
        }
      }
    }
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
          const auto col_codes = [&]<bool kFast>() {
#pragma unroll
            for (int i = 0; i < kPatchCols; ++i) {
              const Divisor d = col_divisor(i);
              if (!kFast && !(fabsf(d.s) < INFINITY)) continue;
              const float x = col_value(j, i);
              const float q = !kColReciprocal ? div_rn(x, d.s) : kFast ? reciprocal_quotient(x, d) : quotient(x, d);
              tcol[i] |= round_to_code(q, format_of(E), true, bits_of(w, i)) << (j * kBits);
            }
          };
          if (cols_fast) {
            col_codes.template operator()<true>();
          } else {
            col_codes.template operator()<false>();
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
  };

  // Grid-stride over tiles, the next tile's patch loading while this one is quantized.
  bool staged = stage_patch(blockIdx.x);
  for (int64_t tile = blockIdx.x; tile < f.tiles; tile += gridDim.x) {
    const int64_t tile_r = tile_row(tile), tile_c = tile_col(tile);
    const int64_t r0 = tile_r + kPatchRows * rq, c0 = tile_c + kPatchCols * cc;
    Run<T, kPatchCols> v[kPatchRows];
    if (staged) {
      wait_async_copies();
#pragma unroll
      for (int j = 0; j < kPatchRows; ++j)
#pragma unroll
        for (int q = 0; q < kRowVecs<T>; ++q) v[j].raw[q] = *stage_slot(j, q);
    } else {
#pragma unroll
      for (int j = 0; j < kPatchRows; ++j) {
        const bool in = r0 + j < a.rows;
        load_run(v[j], static_cast<const T*>(a.x) + (in ? r0 + j : 0) * a.ld, c0, in ? a.cols : 0, f.vec_in);
      }
    }
    // The slots are free again (this thread alone reads them): start the next tile's loads.
    staged = tile + gridDim.x < f.tiles && stage_patch(tile + gridDim.x);
    quantize_patch(tile_r, tile_c, r0, c0, v);
    // The next turn's shared-memory writes wait until every thread is done with this tile's.
    __syncthreads();
  }
}

template <typename T, Elem E, bool kSR, TileKind kKind>
cudaError_t launch(const Args& a, cudaStream_t stream) {
  const int64_t rows = a.col.codes ? std::max(a.rows, a.col.inner_store) : a.rows;
  const int64_t cols = a.row.codes ? std::max(a.cols, a.row.inner_store) : a.cols;
  const int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  if (tiles > 0x7FFFFFFF) return cudaErrorInvalidValue;
  if (tiles == 0) return cudaSuccess;
  constexpr int kRowBytes = kPatchCols * kCodeBits<E> / 8;
  Flags f;
  f.tiles = tiles;
  f.vec_in = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && (a.ld * int64_t(sizeof(T))) % 16 == 0;
  f.vec_row = reinterpret_cast<uintptr_t>(a.row.codes) % kRowBytes == 0 && a.row.ld % kRowBytes == 0;
  f.vec_col = reinterpret_cast<uintptr_t>(a.col.codes) % 4 == 0 && a.col.ld % 4 == 0;
  constexpr auto kernel = quantize_tile_kernel<T, E, kSR, kKind>;
  int64_t ctas = 0;
  const cudaError_t e = resident_ctas<kernel>(kThreads, kStageBytes<T>, tiles, ctas);
  if (e != cudaSuccess) return e;
  launch_kernel(kernel, unsigned(ctas), kThreads, kStageBytes<T>, stream, a, f);
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
    return dispatch_quantize(a, [&]<typename T, Elem E, bool kSR>() -> cudaError_t {
      if constexpr (E == Elem::kE2M1) {  // the transform is fused for FP4 only (quantize_op.cpp refuses others)
        return launch<T, E, kSR, TileKind::kHadamard>(a, stream);
      } else {
        return cudaErrorInvalidValue;
      }
    });
  }
  return dispatch_quantize(a, [&]<typename T, Elem E, bool kSR>() {
    return launch_any<T, E, kSR>(a, stream);
  });
}

}  // namespace snip::quant
