#pragma once
// The chunked (WY) forward of docs/semantics.md §4 on the GPU in two kernels (what flash-linear-attention does
// with its separate kernels), plus a one-block kernel for the chunk offsets:
//
//   chunked_offsets   ws_offsets[n] = first global chunk of sequence n (sequence order), from the
//                     device cu_seqlens, total at [N]. Integer scan: deterministic.
//   chunked_prepare   one block per (global chunk, pair of value heads j, j + 1) when the GVA
//                     group is even, else per (global chunk, value head j). Everything that
//                     depends only on the chunk's inputs (q, k, gates of head j), not on the
//                     state: the gates, the gamma scan, the norms, A, P, T. A pair shares q, k,
//                     the norms and the raw products K K^T, Q K^T, and runs its two inverses side
//                     by side. It writes one workspace record per (chunk, j): T hi, T lo, P (input
//                     dtype; bf16/fp16 also P lo), beta, r_q, r_k, e_start, e_end and the chunk decay (fp32), and the
//                     debug A / T (once per (chunk, j)).
//   chunked_forward_wg  (bf16, fp16: chunked_wgmma.cuh) one block per (sequence, value head j,
//   chunked_forward     V tile) (fp32: below), walking its sequence's chunks of 64 tokens in
//                     order with the K x BV slice of the state in registers (fp32). Per chunk
//                     only what needs the state: the two S0 products, T X, P Vnew and the state
//                     update, with the chunk's Q, K, V and its prepass record brought in ahead
//                     of use (fp32: cp.async; bf16/fp16: the tensor memory accelerator, tensor
//                     copies of Q, K, V and bulk copies of the record). The bf16/fp16 kernel runs
//                     its products on Hopper's warpgroup MMA (wgmma), two warpgroups each owning
//                     half of the V tile.
//   chunked_forward_wgt<..., kFused>  (ChunkedSchedule::fused, named, bf16 K 128 x BV 128
//                     unsplit) the two kernels in one: a third warpgroup runs the prepass of
//                     chunk i + 1 (prepare_chunk, the same function and bits as chunked_prepare's)
//                     into the record buffer while the state's two warpgroups run chunk i, so
//                     the records never go through global memory (chunked_wgmma_transposed.cuh).
//   chunked_combine   (sequence split only) between the forward's affine pass and its output
//                     pass: S_start(s + 1) = M_s S_start(s) + B_s per sequence and value head,
//                     fp32 (ChunkedParams has the split's three steps).
//
// Why split: the state recurrence is the only serial chain; the V-independent work (the gates,
// A, P and the 16x16 inverse with its merges, about half the per-chunk time and most of its
// barriers) sat in that chain and was recomputed by every V tile. The prepass runs it once per
// (chunk, head), in parallel over the whole batch.
//
//   gamma      segmented inclusive scan of g (restarting at reset tokens, exp(g) == 0, like the
//              chunked reference), e_start = exp(gamma), e_end = exp(gamma_c - gamma)
//   r_q, r_k   1/|q|, 1/|k| (l2norm) or 1; the matrix operands stay the raw q, k, exactly as
//              stored, and the norms are applied as fp32 row/column scales in the epilogues:
//              no rounding of normalised vectors to the input dtype
//   A          beta_i e^(gamma_i - gamma_j) r_i r_j (k_i . k_j), strictly lower   (fp32, prepass)
//   P          e^(gamma_i - gamma_j) r^q_i r_j (q_i . k_j), lower incl. diagonal (input dtype, prepass)
//   T          (I + A)^-1: four 16x16 diagonal blocks by forward substitution, then block
//              merges T_ij = -T_ii sum_k A_ik T_kj in three levels        (fp32; stored hi + lo, prepass)
//   X          diag(beta) (V - diag(e_start r) K S0)                    (fp32, then input dtype)
//   Vnew       T X  (= U - W S0 of the spec: the same algebra without forming W or U)
//   O          scale (diag(e_start r^q) Q S0 + P Vnew)     (P Vnew_hi + P Vnew_lo + P_lo Vnew_hi)
//   S_end      e_start(c) S0 + K^T diag(e_end r) Vnew
//
// Matrix products: bf16/fp16 inputs on tensor cores (fp32 accumulation; the prepass's K K^T and
// Q K^T on mma.sync m16n8k16, the forward's on wgmma m64nNk16).
// The raw q, k, v are exact operands; every computed operand is split into hi + lo in the input
// dtype wherever it enters a product (S0 in K S0 and in Q S0, T and X in T X, the decayed Vnew
// in the state update, Vnew in P Vnew, and P in P Vnew), so the state path keeps about
// 16 bits (bf16) instead of 8 and o is computed from operands of about that precision.
// Per 16-wide k step into one fp32 accumulator: Q S0 hi, then lo;
// P Vnew_hi, P Vnew_lo, then P_lo Vnew_hi. o is stored in the input dtype.
// Why (a CPU model of these roundings, reference/operand_model.hpp, model.chunked.split_all,
// reproduces the kernel's accuracy, and the failures of the earlier designs that the CLI fuzz
// of the chunked space found on the GPU; python/tests/test_peer_findings.py regenerates them):
//   - Vnew hi + lo in P Vnew: where P Vnew cancels (sum |P Vnew| ~ 9 |o|: small K, beta up to 2,
//     no decay) one rounding of Vnew costs too much: with it, fp16 failed the GPU suite's
//     conformance, and so did bf16 in the model (K 16, fused gates with negative eigenvalues, no
//     decay), and neither does with the split.
//   - S0 hi + lo in Q S0 (8 of a warpgroup's wgmma per chunk at K 128): with S0 hi alone there
//     (the design before) bf16 cases of K 16 went past o's budget; with the split they pass.
//   - P hi + lo (a fourth record tile, 4 wgmma a warpgroup per chunk): with P rounded once, an
//     fp16 case and later a bf16 one (K 16, no decay, beta near 2) went past o's budget; with
//     P lo both pass (docs/cuda_chunked.md, "bf16's P rounded once"). The K 128 x BV 128 bf16
//     plan is the transposed one, which has the room.
//   - S0 lo in K S0: without it the state keeps about 12 bits, not 16 (the model's hT error
//     grows by about two orders of magnitude).
// The sequence split's affine pass has no P Vnew (WgPlan<..., kAffine>: no Vnew lo tile).
// fp32 inputs use plain fp32 FMAs in the same fragment layout (no TF32; the record holds T in
// fp32, no lo part).
// fp16's state update and its exponent: the decayed Vnew, diag(e_end r) Vnew, is an fp16
// operand of the state update (hi + lo, or hi alone in the single mode), and e_end =
// exp(gamma_c - gamma_i) has no lower bound, so rows below fp16's range (6e-8) flushed to zero.
// When such rows carried the whole state (the chunk's last keys zero after strong decays) hT
// came out 0 against a reference of about 1e-12: relative error 1 (the fuzzer's failure in the
// default and split modes, reports/results/h100/fuzz_chunked). The prepass now takes e_end and
// the chunk decay at 2^m, m bringing the largest e_end of a nonzero key into [1, 2), and the
// forward multiplies the updated state by 2^-m (rescale_state_update): exact powers of two,
// m = 0 (no bit changed) whenever the chunk's last key is nonzero. bf16 has fp32's exponent
// range and needs none of it. The operand model (reference/operand_model, scaled_state_update)
// does the same and keeps the state (operand_model_test). Still open: S0 as the fp16 operand of
// K S0 and Q S0 flushes the same way once the state itself is below 6e-8 (unseen so far).
// Each output element is reduced over k in one fixed order that does not depend on the V tile,
// the warp layout or the batch: the V tile (chosen from the batch shape) changes no bit of any
// output. A prepass record depends only on its (chunk, head): the batch changes none of its bits
// either. No atomics.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/ptx/bulk_copy.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/mma.cuh"
#include "cuda/chunked/chunked_params.hpp"
#include "cuda/common/element.cuh"
#include "cuda/faults/planted_faults.hpp"

namespace gdn::cuda::detail::chunked {

constexpr int kC = kChunkedChunk;
constexpr int kThreads = kChunkedThreads;

template <class E>
struct Elem;
// split_pv: Vnew enters the intra-chunk term P Vnew as hi + lo in chunked_forward's Plan (which
// serves fp32 only now); the wgmma forward of bf16 and fp16 always splits it (WgPlan).
template <>
struct Elem<float> {
  static constexpr bool tensor = false;
  static constexpr bool split_pv = false;
  static constexpr int pad = 4;  // elements of row padding (16 bytes)
};
template <>
struct Elem<__nv_bfloat16> {
  static constexpr bool tensor = true;
  static constexpr bool split_pv = false;
  static constexpr int pad = 8;
};
template <>
struct Elem<__half> {
  static constexpr bool tensor = true;
  static constexpr bool split_pv = true;
  static constexpr int pad = 8;
};

template <class E>
__device__ __forceinline__ E from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// Two adjacent elements (4- or 8-byte aligned), rounded to nearest.
__device__ __forceinline__ void store2(float* p, float a, float b) { *reinterpret_cast<float2*>(p) = make_float2(a, b); }
__device__ __forceinline__ void store2(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store2(__half* p, float a, float b) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}

// (x0, x1) rounded to nearest in the input dtype at hi, and what that rounding left out, rounded
// again, at lo: the hi + lo split of a computed operand, from one packed conversion per part
// (the single-element F2F conversions it replaces were a visible share of the stall samples).
__device__ __forceinline__ void store_split(__nv_bfloat16* hi, __nv_bfloat16* lo, float x0, float x1) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const unsigned bits = *reinterpret_cast<const unsigned*>(&h);
  const float h0 = __uint_as_float(bits << 16), h1 = __uint_as_float(bits & 0xffff0000u);
  *reinterpret_cast<__nv_bfloat162*>(hi) = h;
  *reinterpret_cast<__nv_bfloat162*>(lo) = __floats2bfloat162_rn(x0 - h0, x1 - h1);
}
__device__ __forceinline__ void store_split(__half* hi, __half* lo, float x0, float x1) {
  const __half2 h = __floats2half2_rn(x0, x1);
  const float2 f = __half22float2(h);
  *reinterpret_cast<__half2*>(hi) = h;
  *reinterpret_cast<__half2*>(lo) = __floats2half2_rn(x0 - f.x, x1 - f.y);
}
__device__ __forceinline__ float read_scalar(const void* base, int type, std::int64_t i) {
  switch (type) {
    case 1: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case 2: return __half2float(static_cast<const __half*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ std::int64_t seq_boundary(const ChunkedParams& p, int n) {
  return p.cu_seqlens_64 ? static_cast<const std::int64_t*>(p.cu_seqlens)[n]
                         : static_cast<std::int64_t>(static_cast<const std::int32_t*>(p.cu_seqlens)[n]);
}

// ----- one warp's part of a block matrix product --------------------------------------------
// acc[MT][NT] (16 x 8 tiles in the mma accumulator layout: element pairs (row g, cols 2t, 2t+1)
// and (row g + 8, same cols), g = lane / 4, t = lane % 4) += A B over KSTEPS * 16 of k, for the
// warp's output origin (row0, col0). A(m, k) = A[m * lda + k], or A[k * lda + m] when A_TRANS;
// B(k, n) = B[n * ldb + k], or B[k * ldb + n] when B_KN. The k order is fixed: 16-wide steps
// in increasing k (fp32: single k in increasing order within each step, into a partial added
// to acc per step), whatever MT, NT and the origin are.
template <int MT, int NT, int KSTEPS, bool A_TRANS, bool B_KN, class E>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NT][4], const E* A, int lda, const E* B, int ldb,
                                          int row0, int col0, int lane) {
  if constexpr (Elem<E>::tensor) {
    const int i = lane >> 3, r = lane & 7;
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
      const int k0 = ks * 16;
      std::uint32_t af[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int m0 = row0 + mt * 16;
        if constexpr (!A_TRANS) {
          ptx::ldsm_x4(af[mt], A + (m0 + (lane & 15)) * lda + k0 + ((lane >> 4) << 3));
        } else {
          ptx::ldsm_x4_t(af[mt], A + (k0 + r + ((i >> 1) << 3)) * lda + m0 + ((i & 1) << 3));
        }
      }
      std::uint32_t bf[NT][2];
#pragma unroll
      for (int nt = 0; nt + 1 < NT; nt += 2) {
        const int n0 = col0 + nt * 8;
        std::uint32_t tmp[4];
        if constexpr (!B_KN) {
          ptx::ldsm_x4(tmp, B + (n0 + r + ((i >> 1) << 3)) * ldb + k0 + ((i & 1) << 3));
        } else {
          ptx::ldsm_x4_t(tmp, B + (k0 + r + ((i & 1) << 3)) * ldb + n0 + ((i >> 1) << 3));
        }
        bf[nt][0] = tmp[0];
        bf[nt][1] = tmp[1];
        bf[nt + 1][0] = tmp[2];
        bf[nt + 1][1] = tmp[3];
      }
      if constexpr (NT % 2 == 1) {
        const int n0 = col0 + (NT - 1) * 8;
        std::uint32_t tmp[2];
        if constexpr (!B_KN) {
          ptx::ldsm_x2(tmp, B + (n0 + r) * ldb + k0 + ((i & 1) << 3));
        } else {
          ptx::ldsm_x2_t(tmp, B + (k0 + r + ((i & 1) << 3)) * ldb + n0);
        }
        bf[NT - 1][0] = tmp[0];
        bf[NT - 1][1] = tmp[1];
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) ptx::mma_m16n8k16(acc[mt][nt], af[mt], bf[nt], E{});
    }
  } else {
    // fp32: each 16-wide step is summed in increasing k into a fresh partial that is then added
    // to the accumulator, the same blocking as the tensor-core path. A plain sequential sum over
    // K = 128 terms gave a one-token fp32 case twice the rounding error of the (blocked) float
    // emulation in the fuzz campaign; blocking bounds the error growth by 16 + K / 16 terms.
    const int g = lane >> 2, t = lane & 3;
#pragma unroll 1
    for (int ks = 0; ks < KSTEPS; ++ks) {
      float part[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) part[mt][nt][0] = part[mt][nt][1] = part[mt][nt][2] = part[mt][nt][3] = 0.f;
#pragma unroll 4
      for (int k = ks * 16; k < ks * 16 + 16; ++k) {
        float a[MT][2], b[NT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const int m = row0 + mt * 16 + g;
          a[mt][0] = A_TRANS ? A[k * lda + m] : A[m * lda + k];
          a[mt][1] = A_TRANS ? A[k * lda + m + 8] : A[(m + 8) * lda + k];
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int n = col0 + nt * 8 + 2 * t;
          b[nt][0] = B_KN ? B[k * ldb + n] : B[n * ldb + k];
          b[nt][1] = B_KN ? B[k * ldb + n + 1] : B[(n + 1) * ldb + k];
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            part[mt][nt][0] = fmaf(a[mt][0], b[nt][0], part[mt][nt][0]);
            part[mt][nt][1] = fmaf(a[mt][0], b[nt][1], part[mt][nt][1]);
            part[mt][nt][2] = fmaf(a[mt][1], b[nt][0], part[mt][nt][2]);
            part[mt][nt][3] = fmaf(a[mt][1], b[nt][1], part[mt][nt][3]);
          }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mt][nt][e] += part[mt][nt][e];
    }
  }
}

// acc += A (Bhi + Blo) on tensor cores, for the fp16 P Vnew: A(m, k) = A[m * lda + k],
// Bhi(k, n) = Bhi[k * ldb + n], Blo alike. Each 16-wide k step, in increasing k, adds A Bhi, then
// A Blo from the same A fragments: one fixed order per element, as in warp_gemm. A function of its
// own so warp_gemm (bf16's every product) stays as it was, to the bit of its binary. The two
// passes stay a rolled loop: unrolled, fp16 K 64 x BV 128 spilled 8 bytes (as two warp_gemm
// calls: 24); rolled, 248 registers and no spill.
template <int MT, int NT, int KSTEPS, class E>
__device__ __forceinline__ void warp_gemm_split_b(float (&acc)[MT][NT][4], const E* A, int lda, const E* Bhi,
                                                  const E* Blo, int ldb, int row0, int col0, int lane) {
  static_assert(Elem<E>::tensor, "tensor-core operands");
  const int i = lane >> 3, r = lane & 7;
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks) {
    const int k0 = ks * 16;
    std::uint32_t af[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      ptx::ldsm_x4(af[mt], A + (row0 + mt * 16 + (lane & 15)) * lda + k0 + ((lane >> 4) << 3));
#pragma unroll 1
    for (int pass = 0; pass < 2; ++pass) {
      const E* const B = pass ? Blo : Bhi;
      std::uint32_t bf[NT][2];
#pragma unroll
      for (int nt = 0; nt + 1 < NT; nt += 2) {
        std::uint32_t tmp[4];
        ptx::ldsm_x4_t(tmp, B + (k0 + r + ((i & 1) << 3)) * ldb + col0 + nt * 8 + ((i >> 1) << 3));
        bf[nt][0] = tmp[0];
        bf[nt][1] = tmp[1];
        bf[nt + 1][0] = tmp[2];
        bf[nt + 1][1] = tmp[3];
      }
      if constexpr (NT % 2 == 1) {
        std::uint32_t tmp[2];
        ptx::ldsm_x2_t(tmp, B + (k0 + r + ((i & 1) << 3)) * ldb + col0 + (NT - 1) * 8);
        bf[NT - 1][0] = tmp[0];
        bf[NT - 1][1] = tmp[1];
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) ptx::mma_m16n8k16(acc[mt][nt], af[mt], bf[nt], E{});
    }
  }
}

// Calls f(row, col, x0, x1) for every element pair (row, col), (row, col + 1) the lane holds.
template <int MT, int NT, class F>
__device__ __forceinline__ void for_each_pair(float (&acc)[MT][NT][4], int row0, int col0, int lane, F&& f) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        f(row0 + mt * 16 + g + 8 * half, col0 + nt * 8 + 2 * t, acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
}

// ----- swizzled tiles -----------------------------------------------------------------------

// Element offset of (row, col) in a tile of 64 rows of a 2-byte type laid out as the tensor
// memory accelerator writes a box with swizzle ROW_BYTES (32, 64 or 128: the box's row, in
// bytes): rows of ROW_BYTES, slabs of ROW_BYTES / 2 columns one after another, and within each
// 1024-byte group of rows the 16-byte piece index XORed with address bits 7 and up. Conflict-free
// for ldmatrix without padding, and what one tensor copy (or one bulk copy of a record tile the
// prepass stored this way) delivers. Tiles start on 1024 bytes.
template <int ROW_BYTES>
__device__ __forceinline__ int swizzled(int row, int col) {
  static_assert(ROW_BYTES == 32 || ROW_BYTES == 64 || ROW_BYTES == 128, "TMA swizzle widths");
  constexpr int slab_cols = ROW_BYTES / 2;
  const int slab = col / slab_cols, c = col % slab_cols;
  int o = row * ROW_BYTES + c * 2;
  o ^= ((o >> 7) & (ROW_BYTES / 16 - 1)) << 4;
  return slab * (kC * slab_cols) + (o >> 1);
}
// Where the prepass puts element (row, col) of a record tile: swizzled for the bf16/fp16 forward
// (one bulk copy per tile, read by ldmatrix), rows of 64 for fp32.
template <class E>
__device__ __forceinline__ int record_at(int row, int col) {
  if constexpr (Elem<E>::tensor)
    return swizzled<128>(row, col);
  else
    return row * kC + col;
}

// acc[0][NT][4] += A B^T over KSTEPS * 16 of k on tensor cores, A(m, k) and B(n, k) both in
// swizzled<128> tiles (the prepass's q and k as the tensor copies leave them): warp_gemm's
// fragments, k order and bits for !A_TRANS, !B_KN, MT = 1.
template <int NT, int KSTEPS, class E>
__device__ __forceinline__ void warp_gemm_swizzled(float (&acc)[1][NT][4], const E* A, const E* B, int row0, int col0,
                                                   int lane) {
  static_assert(Elem<E>::tensor && NT % 2 == 0, "bf16/fp16, pairs of n tiles");
  const int i = lane >> 3, r = lane & 7;
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks) {
    const int k0 = ks * 16;
    std::uint32_t af[4];
    ptx::ldsm_x4(af, A + swizzled<128>(row0 + (lane & 15), k0 + ((lane >> 4) << 3)));
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      std::uint32_t tmp[4];
      ptx::ldsm_x4(tmp, B + swizzled<128>(col0 + nt * 8 + r + ((i >> 1) << 3), k0 + ((i & 1) << 3)));
      const std::uint32_t b0[2] = {tmp[0], tmp[1]}, b1[2] = {tmp[2], tmp[3]};
      ptx::mma_m16n8k16(acc[0][nt], af, b0, E{});
      ptx::mma_m16n8k16(acc[0][nt + 1], af, b1, E{});
    }
  }
}

// ----- shared memory plans -----------------------------------------------------------------

constexpr std::size_t align128(std::size_t x) { return (x + 127) / 128 * 128; }

// The prepass: one (chunk, pair of value heads) per block where the GVA group is even (one head
// otherwise). The two heads of a pair share q, k, their norms and the raw products K K^T and
// Q K^T; the gates, A, P, T, the scalars and the record are per head, and the two heads'
// inverses run side by side (warps 0-3 and 4-7), so fewer warps wait at the barriers of the
// inverse's serial steps.
template <class E, int KP, int HEADS = 2>
struct PrepPlan {
  static constexpr int pad = Elem<E>::pad;
  static constexpr int ldk = KP + pad;   // q, k rows
  static constexpr int ldf = kC + 4;     // A, T rows (fp32)
  static constexpr bool split = Elem<E>::tensor;  // T stored as hi + lo
  static constexpr std::size_t es = sizeof(E);
  static constexpr int heads = HEADS;  // value heads per block

  // bf16/fp16: q and k by tensor copies (the forward's maps), unpadded swizzled tiles
  // (swizzled<128>, 1024-byte aligned); fp32: cp.async into rows of ldk.
  static constexpr bool tma = Elem<E>::tensor;
  static constexpr std::size_t q_bytes =
      tma ? std::size_t(KP) * kC * es : align128(std::size_t(kC) * ldk * es);
  static constexpr std::size_t f_bytes = align128(std::size_t(kC) * ldf * 4);
  // gamma in double (64), then beta, r_q, r_k, e_start, e_end, segment (64 each), chunk decay.
  // r_q and r_k are the pair's (head 0's arrays serve both).
  static constexpr std::size_t scalar_bytes = align128(kC * 8 + 6 * kC * 4 + 4);

  // The T's live where Q and K were: they are dead after phase 1 (A and P), T is first
  // written in phase 2, after the barrier between them (ncu: the prepass was limited by shared
  // memory, and this makes one head's block a fifth smaller).
  static constexpr std::size_t off_q = 0;
  static constexpr std::size_t off_k = off_q + q_bytes;
  static constexpr std::size_t off_t = off_q;  // + head * f_bytes
  static constexpr std::size_t qkt_bytes = 2 * q_bytes > heads * f_bytes ? 2 * q_bytes : heads * f_bytes;
  // P goes from the registers of its product straight to the record, and the merges exchange
  // their partial products by shuffles: neither needs shared memory, so a pair's block takes
  // 72 KB and three blocks fit an SM (ncu: with two resident blocks the issue slots were mostly
  // idle, the warps waiting on the inverse's serial steps and the barriers around them).
  static constexpr std::size_t off_a = off_q + qkt_bytes;              // + head * f_bytes
  static constexpr std::size_t off_scalar = off_a + heads * f_bytes;    // + head * scalar_bytes
  // fp16 only: which of the chunk's keys are nonzero (int per row), for the state update's
  // exponent (rescale_state_update).
  static constexpr bool live_keys = std::is_same_v<E, __half>;
  static constexpr std::size_t off_live = off_scalar + heads * scalar_bytes;
  static constexpr std::size_t live_bytes = live_keys ? align128(kC * 4) : 0;
  static constexpr std::size_t off_bar = off_live + live_bytes;  // the copies' mbarrier
  static constexpr std::size_t bytes = off_bar + 8;
  // Three where shared memory allows (bf16/fp16; fp32's q, k tiles are twice as large: two).
  static constexpr int smem_blocks = int(kChunkedSmemPerSM / (bytes + kChunkedSmemReservedPerBlock));
  static constexpr int min_blocks = smem_blocks < 3 ? (smem_blocks < 1 ? 1 : smem_blocks) : 3;
  static_assert(!Elem<E>::tensor || min_blocks == 3, "bf16/fp16: three blocks per SM");
  static_assert(bytes <= 227 * 1024, "prepass shared-memory plan exceeds the per-block limit");

  // The workspace record (global memory, unpadded rows of 64): T hi | T lo | P | scalars. For
  // bf16/fp16 each tile is stored swizzled (record_at), as the forward's ldmatrix reads it after
  // one bulk copy per tile.
  static constexpr std::size_t tile_bytes = std::size_t(kC) * kC * es;
  static constexpr std::size_t rec_t = 0;
  static constexpr std::size_t rec_tlo = tile_bytes;  // split only
  static constexpr std::size_t rec_p = (split ? 2 : 1) * tile_bytes;
  static constexpr std::size_t rec_scalar = rec_p + tile_bytes;
  static constexpr std::size_t scalars_end = rec_scalar + 6 * kC * 4;
  // bf16/fp16: P lo, what P's rounding left out (P Vnew takes P as hi + lo; the header says
  // why), after the scalars at a swizzled tile's alignment. Not written in the single mode.
  static constexpr bool p_lo = Elem<E>::tensor;
  static constexpr std::size_t rec_plo = p_lo ? (scalars_end + 1023) / 1024 * 1024 : 0;
  static constexpr std::size_t record_bytes = p_lo ? rec_plo + tile_bytes : scalars_end;
  static_assert(record_bytes == chunked_record_bytes(es, split, p_lo), "record layout and host size disagree");
  static_assert(record_bytes % 128 == 0, "records keep 128-byte alignment");
};

// The forward: one (sequence, value head, V tile) per block.
template <class E, int KP, int BV>
struct Plan {
  using Rec = PrepPlan<E, KP>;
  static constexpr int pad = Elem<E>::pad;
  static constexpr int ldk = KP + pad;   // q, k rows
  static constexpr int ldv = BV + pad;   // v, state, X, Vnew rows
  static constexpr int ldc = kC + pad;   // T, P rows (input dtype)
  static constexpr bool split = Elem<E>::tensor;  // state operand, T, X, decayed Vnew as hi + lo
  static constexpr bool split_pv = Elem<E>::split_pv;  // Vnew as hi + lo in P Vnew too (fp16)
  static constexpr std::size_t es = sizeof(E);

  static constexpr std::size_t q_bytes = align128(std::size_t(kC) * ldk * es);
  static constexpr std::size_t v_bytes = align128(std::size_t(kC) * ldv * es);
  static constexpr std::size_t s_bytes = align128(std::size_t(KP) * ldv * es);
  static constexpr std::size_t c_bytes = align128(std::size_t(kC) * ldc * es);
  // R1: X hi, X lo | then Vnew, decayed Vnew lo.
  static constexpr std::size_t r1_bytes = (split ? 2 : 1) * v_bytes;
  // One record buffer W: T hi | T lo | P | scalars (beta, r_q, r_k, e_start, e_end, decay),
  // rows padded to ldc. The decayed Vnew hi replaces T hi (+ lo) of the current buffer.
  static constexpr std::size_t w_off_t = 0;
  static constexpr std::size_t w_off_tlo = c_bytes;  // split only
  static constexpr std::size_t w_off_p = (split ? 2 : 1) * c_bytes;
  static constexpr std::size_t w_off_scalar = w_off_p + c_bytes;
  static constexpr std::size_t w_bytes = w_off_scalar + 6 * kC * 4;
  static_assert(v_bytes <= w_off_p, "the decayed Vnew hi must fit where T hi (+ lo) was");
  static_assert(w_bytes % 128 == 0, "record buffers keep 128-byte alignment");

  static constexpr std::size_t off_q = 0;
  static constexpr std::size_t off_k0 = off_q + q_bytes;
  static constexpr std::size_t off_k1 = off_k0 + q_bytes;
  static constexpr std::size_t off_v = off_k1 + q_bytes;
  static constexpr std::size_t off_shi = off_v + v_bytes;
  static constexpr std::size_t off_slo = off_shi + s_bytes;
  static constexpr std::size_t off_r1 = off_slo + (split ? s_bytes : 0);
  static constexpr std::size_t off_w0 = off_r1 + r1_bytes;
  static constexpr std::size_t off_w1 = off_w0 + w_bytes;
  // Vnew lo (fp16) goes beside the decayed Vnew hi where T hi + lo were when both fit there
  // (BV <= 64: no extra shared memory), else (BV = 128) into a tile of its own.
  static constexpr bool vnlo_in_w = 2 * v_bytes <= w_off_p;
  static constexpr std::size_t vnlo_bytes = (split_pv && !vnlo_in_w) ? v_bytes : 0;
  static constexpr std::size_t off_vnlo = off_w1 + w_bytes;
  static constexpr std::size_t bytes = off_vnlo + vnlo_bytes;
  // Hopper: at most 227 KB of shared memory per block (bf16 K 128, BV 128 uses exactly that;
  // fp16 K 128 would need 244 KB at BV 128 and has no such instance: for_instance).
  static_assert(bytes <= 227 * 1024, "shared-memory plan exceeds the per-block limit");
  // Two resident blocks leave 128 registers a thread. The shared memory allows two for
  // bf16/fp16 K <= 64 with BV 16 and 32, but BV 32 then spills (ptxas: 128 registers + 28-32
  // bytes of stack); K 64 x BV 16 fits (85-111 registers, no spill). Everything else: one.
  static constexpr int min_blocks = (chunked_blocks_per_sm(bytes) == 2 && KP * BV <= 64 * 16) ? 2 : 1;
};

// ----- small helpers ------------------------------------------------------------------------

__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// sum += x^2 for the 16 bytes' elements, in order.
__device__ __forceinline__ void sum_squares(uint4 v, float& sum, __nv_bfloat16) {
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float a = __uint_as_float(w[e] << 16), b = __uint_as_float(w[e] & 0xffff0000u);
    sum = fmaf(a, a, sum);
    sum = fmaf(b, b, sum);
  }
}
__device__ __forceinline__ void sum_squares(uint4 v, float& sum, __half) {
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[e]));
    sum = fmaf(f.x, f.x, sum);
    sum = fmaf(f.y, f.y, sum);
  }
}
__device__ __forceinline__ void sum_squares(uint4 v, float& sum, float) {
  const float f[4] = {__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w)};
#pragma unroll
  for (int e = 0; e < 4; ++e) sum = fmaf(f[e], f[e], sum);
}

// Raw gate inputs of one chunk, two tokens per lane (warp 0 only uses them).
struct GateInputs {
  float g[2] = {0.f, 0.f}, b[2] = {0.f, 0.f};
};
__device__ __forceinline__ GateInputs load_gate_inputs(const ChunkedParams& p, int j, std::int64_t start, int c,
                                                       int lane) {
  GateInputs r;
  const void* const gsrc = p.fused_gates ? p.a : p.g;
  const void* const bsrc = p.fused_gates ? p.b : p.beta;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int i = 2 * lane + e;
    if (i < c) {
      const std::int64_t idx = (start + i) * p.HV + j;
      r.g[e] = read_scalar(gsrc, p.gate_type, idx);
      r.b[e] = read_scalar(bsrc, p.gate_type, idx);
    }
  }
  return r;
}

// ----- the chunk offsets --------------------------------------------------------------------

constexpr int kOffsetThreads = 1024;

// One block: ws_offsets[n] = sum over m < n of ceil(len(m) / 64), ws_offsets[N] = the total;
// with the sequence split on, seg_offsets likewise from each sequence's segments (at least one,
// so that an empty sequence still gets the block that writes its hT = h0).
// A template (on the input type, unused) so that each input type's translation unit has its own.
template <class E>
__global__ void __launch_bounds__(kOffsetThreads) chunked_offsets(const ChunkedParams p) {
  __shared__ std::int64_t part[kOffsetThreads];
  const int tid = threadIdx.x, N = p.N;
  const int per = (N + kOffsetThreads - 1) / kOffsetThreads;
  const int b = tid * per < N ? tid * per : N;
  const int e = b + per < N ? b + per : N;
  auto chunks = [&](int s) {
    const std::int64_t len = seq_boundary(p, s + 1) - seq_boundary(p, s);
    return (len + kC - 1) / kC;
  };
  auto segments = [&](int s) {
    const std::int64_t c = chunks(s);
    return c == 0 ? std::int64_t(1) : (c + p.split_chunks - 1) / p.split_chunks;
  };
  // Exclusive scan of count over the sequences into out[0..N], deterministic (integers).
  auto scan = [&](auto&& count, std::int64_t* out) {
    std::int64_t sum = 0;
    for (int s = b; s < e; ++s) sum += count(s);
    part[tid] = sum;
    __syncthreads();
    for (int d = 1; d < kOffsetThreads; d <<= 1) {
      const std::int64_t x = tid >= d ? part[tid - d] : 0;
      __syncthreads();
      part[tid] += x;
      __syncthreads();
    }
    std::int64_t run = tid == 0 ? 0 : part[tid - 1];
    for (int s = b; s < e; ++s) {
      out[s] = run;
      run += count(s);
    }
    if (tid == kOffsetThreads - 1) out[N] = part[kOffsetThreads - 1];
    __syncthreads();  // part is reused by the next scan
  };
  scan(chunks, p.ws_offsets);
  if (p.split_chunks > 0) scan(segments, p.seg_offsets);
  if (p.served_offsets) scan([&](int s) { return std::int64_t(chunks(s) > p.served_above_chunks ? 1 : 0); }, p.served_offsets);
}

// Where block unit `unit` of the forward works: sequence n, its segment ls of nseg, the tokens
// [bos, eos) and the global index of its first chunk. Without the split a unit is a sequence.
struct SegmentPlace {
  int n = 0;
  std::int64_t ls = 0, nseg = 1, bos = 0, eos = 0, first_chunk = 0;
  bool valid = false;  // false: the device cu_seqlens disagree with the host's Problem, or the
                       // sequence is the other launch's (ChunkedParams::served)
};
__device__ __forceinline__ SegmentPlace locate_segment(const ChunkedParams& p, std::int64_t unit) {
  SegmentPlace s;
  if (p.split_chunks == 0) {
    s.n = static_cast<int>(unit);
    if (p.served == 1) {  // two V tiles, the long sequences' launch: unit = rank among them
      const std::int64_t* const offs = p.served_offsets;
      if (unit >= offs[p.N]) return s;
      int lo = 0, hi = p.N - 1;  // the last n with offs[n] <= unit: the long one of that rank
      while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (offs[mid] <= unit)
          lo = mid;
        else
          hi = mid - 1;
      }
      s.n = lo;
    }
    s.bos = seq_boundary(p, s.n);
    s.eos = seq_boundary(p, s.n + 1);
    if (p.served != 0) {  // two V tiles: this launch serves the longer or the shorter sequences
      const bool longer = (s.eos - s.bos + kC - 1) / kC > p.served_above_chunks;
      if (longer != (p.served == 1)) return s;  // not valid here: the other launch's sequence
    }
  } else {
    const std::int64_t* const offs = p.seg_offsets;
    if (unit >= offs[p.N] || offs[p.N] > p.segments) return s;
    int lo = 0, hi = p.N - 1;  // the last n with offs[n] <= unit
    while (lo < hi) {
      const int mid = lo + (hi - lo + 1) / 2;
      if (offs[mid] <= unit)
        lo = mid;
      else
        hi = mid - 1;
    }
    s.n = lo;
    s.ls = unit - offs[lo];
    s.nseg = offs[lo + 1] - offs[lo];
    const std::int64_t span = std::int64_t(p.split_chunks) * kC;
    const std::int64_t seq_bos = seq_boundary(p, lo), seq_eos = seq_boundary(p, lo + 1);
    s.bos = seq_bos + s.ls * span < seq_eos ? seq_bos + s.ls * span : seq_eos;
    s.eos = s.bos + span < seq_eos ? s.bos + span : seq_eos;
  }
#if GDN_KERNEL_FAULTS
  if (GDN_PLANTED(p, chunked_partial_chunk_dropped)) s.eos = s.bos + (s.eos - s.bos) / kC * kC;
#endif
  s.first_chunk = s.bos < s.eos ? p.ws_offsets[s.n] + s.ls * (p.split_chunks > 0 ? p.split_chunks : 0) : 0;
  s.valid = !(s.bos < s.eos && s.first_chunk + (s.eos - s.bos + kC - 1) / kC > p.ws_chunks);
  return s;
}

// The split's fix-up, between the affine pass and the output pass: for each sequence in
// segment order, S_in(s + 1) = M_s S_in(s) + B_s, written over B_s (S_in(1) = B_0: segment 0's
// affine pass starts from h0). One block per (sequence, value head, 8 columns of V); fp32 FMAs.
//
// Why this shape: the steps are a serial chain (one per segment of the longest sequence), so a
// step's latency is what counts. The first version (16 columns, M copied a step ahead into
// shared memory, each thread 8 rows of one column) ran 1024 FMAs a thread per step and took
// the same time a step whether 64 or 256 blocks ran: latency, not throughput. Here each row of the tile belongs to two threads of one warp, each holding
// half of M_s's row (interleaved pieces of 4 columns, at most 64 floats) in registers, loaded
// from global memory a whole step before use; the step is then 512 FMAs a thread at K 128 with
// S(s) read from shared memory as broadcasts, four shuffles, and one barrier.
// S tiles in shared memory: rows of 8 floats (32 bytes), so rows k and k + 4 share banks; the
// two 4-column halves of rows with bit 2 set are swapped (s_slot), so that in each load the
// half-0 threads (rows with bit 2 clear) and half-1 threads (bit 2 set) use different banks.
//
// Order of every element's sum, fixed: each thread's half in increasing k (pieces h, h + 2, ...
// of 4 columns), then (half 0 + half 1) + B_s. It depends on nothing but K: deterministic, and a
// sequence's bits depend on nothing else in the batch. (The bits differ from the first
// version's, whose order was B, then k increasing; both are within the split's budget.)
constexpr int kCombineThreads = 256, kCombineColumns = 8;
constexpr int kCombinePieces = 128 / 4 / 2;  // a thread's pieces of 4 columns of M's row (K <= 128)
template <class E>
__global__ void __launch_bounds__(kCombineThreads, 1) chunked_combine(const ChunkedParams p) {
  __shared__ __align__(16) float s_tile[2][128 * kCombineColumns];  // S(s) and S(s + 1): [k][column], s_slot
  // Where columns [4 g, 4 g + 4) of row r sit in its 8 floats.
  auto s_slot = [](int r, int g) { return r * kCombineColumns + 4 * (g ^ ((r >> 2) & 1)); };
  const int K = p.K, W = p.K + p.V;
  const int tiles = p.V / kCombineColumns;
  const int ct = static_cast<int>(blockIdx.x % static_cast<unsigned>(tiles));
  const int pair = static_cast<int>(blockIdx.x / static_cast<unsigned>(tiles));
  const int j = pair % p.HV, n = pair / p.HV;
  const std::int64_t* const offs = p.seg_offsets;
  if (offs[p.N] > p.segments) return;  // cu_seqlens disagree with the Problem
  const std::int64_t u0 = offs[n], nseg = offs[n + 1] - offs[n];
  if (nseg < 3) return;  // S(1) = B_0 as it is
  const int tid = threadIdx.x;
  const int row = tid >> 1, half = tid & 1;  // the two threads of a row are neighbouring lanes
  const bool active = row < K;
  const int pieces = K / 8;  // this thread's pieces of 4 columns of M's row (K is a multiple of 16)
  const int column0 = K + ct * kCombineColumns + 4 * half;  // this thread's 4 columns of B
  const std::int64_t rec_elems = std::int64_t(K) * W;
  auto record = [&](std::int64_t s) { return p.ws_affine + ((u0 + s) * p.HV + j) * rec_elems; };
  // This thread's half row of M_s and its 4 columns of B_s, into registers (plain loads:
  // ld.global.nc needs memory that stays read-only for the whole kernel, and B is written).
  auto load_step = [&](std::int64_t s, float4 (&m)[kCombinePieces], float4& b) {
    if (!active) return;
    const float* const src = record(s) + std::int64_t(row) * W;
#pragma unroll
    for (int i = 0; i < kCombinePieces; ++i)
      if (i < pieces) m[i] = *reinterpret_cast<const float4*>(src + 4 * (2 * i + half));
    b = *reinterpret_cast<const float4*>(src + column0);
  };
  float4 m_now[kCombinePieces], m_next[kCombinePieces];
  float4 b_now = make_float4(0.f, 0.f, 0.f, 0.f), b_next = b_now;
#pragma unroll
  for (int i = 0; i < kCombinePieces; ++i) m_now[i] = m_next[i] = b_now;
  // S(1) = B_0's columns; step 1's M and B.
  if (active) {
    const float4 b0 = *reinterpret_cast<const float4*>(record(0) + std::int64_t(row) * W + column0);
    *reinterpret_cast<float4*>(&s_tile[0][s_slot(row, half)]) = b0;
  }
  load_step(1, m_now, b_now);
  __syncthreads();
  for (std::int64_t s = 1; s + 1 < nseg; ++s) {
    // The next step's operands are in flight during this step's FMAs.
    if (s + 2 < nseg) load_step(s + 1, m_next, b_next);
    const float* const Ss = s_tile[(s - 1) & 1];  // S(s)
    float* const Sn = s_tile[s & 1];              // S(s + 1)
    float part[kCombineColumns];
#pragma unroll
    for (int c = 0; c < kCombineColumns; ++c) part[c] = 0.f;
#pragma unroll
    for (int i = 0; i < kCombinePieces; ++i) {
      if (i < pieces) {
        const int k = 4 * (2 * i + half);
        const float mk[4] = {m_now[i].x, m_now[i].y, m_now[i].z, m_now[i].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          // Bit 2 of row k + e is `half` (k = 4 (2 i + half)): columns 0-3 are in slot half.
          const float4 lo = *reinterpret_cast<const float4*>(Ss + (k + e) * kCombineColumns + 4 * half);
          const float4 hi = *reinterpret_cast<const float4*>(Ss + (k + e) * kCombineColumns + 4 * (half ^ 1));
          part[0] = fmaf(mk[e], lo.x, part[0]);
          part[1] = fmaf(mk[e], lo.y, part[1]);
          part[2] = fmaf(mk[e], lo.z, part[2]);
          part[3] = fmaf(mk[e], lo.w, part[3]);
          part[4] = fmaf(mk[e], hi.x, part[4]);
          part[5] = fmaf(mk[e], hi.y, part[5]);
          part[6] = fmaf(mk[e], hi.z, part[6]);
          part[7] = fmaf(mk[e], hi.w, part[7]);
        }
      }
    }
    // Half 0 keeps columns 0-3 and half 1 columns 4-7: each sends the other the partial sums
    // of the other's columns. Each adds half 0's and half 1's (the same bits either way round:
    // an fp32 sum is commutative).
    float out[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float mine = part[4 * half + c];
      const float theirs = __shfl_xor_sync(0xffffffffu, part[4 * (half ^ 1) + c], 1);
      out[c] = mine + theirs;
    }
    if (active) {
#if GDN_KERNEL_FAULTS
      const float4 next = GDN_PLANTED(p, chunked_split_carry_lost)
                              ? b_now
                              : make_float4(out[0] + b_now.x, out[1] + b_now.y, out[2] + b_now.z, out[3] + b_now.w);
#else
      const float4 next = make_float4(out[0] + b_now.x, out[1] + b_now.y, out[2] + b_now.z, out[3] + b_now.w);
#endif
      // S(s + 1) over B_s in the workspace (the output pass reads it) and for the next step.
      *reinterpret_cast<float4*>(record(s) + std::int64_t(row) * W + column0) = next;
      *reinterpret_cast<float4*>(Sn + s_slot(row, half)) = next;
    }
    __syncthreads();  // S(s + 1) complete; S(s) no longer read (it is step s + 1's output tile)
#pragma unroll
    for (int i = 0; i < kCombinePieces; ++i) m_now[i] = m_next[i];
    b_now = b_next;
  }
}

// ----- the prepass --------------------------------------------------------------------------

// fp16's state update, S_end = decay S0 + K^T diag(e_end r) Vnew, takes the decayed Vnew as an
// fp16 operand, and e_end = exp(gamma_c - gamma_i) has no lower bound: where the chunk's last
// keys are zero (their rows contribute nothing) and the decays before them are strong, every
// row that does contribute lies below fp16's range (6e-8) and flushes, and the state comes out
// 0 where it is about 1e-12 (the fuzzer's case, reports/results/h100/fuzz_chunked). So the
// operand is taken at 2^m, with m the exponent that brings the largest e_end of a nonzero key
// into [1, 2) (0 when that is already 1 or more, at most 126), and the sum comes back by 2^-m:
//   S_end = 2^-m ((2^m decay) S0 + K^T diag(2^m e_end r) Vnew).
// Powers of two: exact in fp32 wherever the values stay in its range, so with m = 0 (the last
// key nonzero: e_end = 1) every bit is what it was. With m > 0 a zero key's row takes e_end = 0:
// 2^m e_end could pass fp16's range there, and inf times its zero key is NaN. One warp per
// head (the scanner), its rows 2 lane and 2 lane + 1; the maximum is exact, so the scale
// depends only on the chunk. decay[1] receives 2^-m.
__device__ __forceinline__ void rescale_state_update(float* e_end, float* decay, const int* live, int lane) {
  const float a = live[2 * lane] ? e_end[2 * lane] : 0.f, b = live[2 * lane + 1] ? e_end[2 * lane + 1] : 0.f;
  float largest = fmaxf(a, b);
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, d));
  int m = 0;
  if (largest > 0.f && largest < 1.f) {
    const int biased = static_cast<int>((__float_as_uint(largest) >> 23) & 0xffu);  // 0: subnormal
    m = biased == 0 ? 126 : (127 - biased < 126 ? 127 - biased : 126);
  }
  if (m == 0) {
    if (lane == 0) decay[1] = 1.f;
    return;
  }
  const float up = __uint_as_float(static_cast<unsigned>(127 + m) << 23);
  const float down = __uint_as_float(static_cast<unsigned>(127 - m) << 23);
  e_end[2 * lane] = live[2 * lane] ? e_end[2 * lane] * up : 0.f;
  e_end[2 * lane + 1] = live[2 * lane + 1] ? e_end[2 * lane + 1] * up : 0.f;
  if (lane == 0) {
    decay[0] *= up;
    decay[1] = down;
  }
}

// Where one prepass body works in shared memory: the chunk's q and k tiles (swizzled<128> for
// bf16/fp16, rows of PrepPlan::ldk for fp32; rows past the chunk's tokens zero), A and T of each
// head (fp32, rows of PrepPlan::ldf, PrepPlan::f_bytes apart), each head's scalars
// (PrepPlan::scalar_bytes apart) and, fp16 only, which keys are nonzero.
template <class E>
struct PrepSmem {
  const E* Qs;
  const E* Ks;
  unsigned char* a;
  unsigned char* t;
  unsigned char* scalar;
  int* live;
};

// The prepass of one chunk for HEADS value heads j0, j0 + 1 (phases 0 to 3 and the records) by
// WARPS warps, threads tid = 0 .. 32 WARPS - 1; sync() is a barrier over exactly those threads.
// record_of(head) is where head's record goes: the workspace (chunked_prepare) or the fused
// forward's record buffer in shared memory (chunked_forward_wgt), in the same layout. gates,
// A_log and dt_bias are the scanner warps' (warp 0 for head 0, warp 4 for head 1). Every element
// is computed by the same operations in the same order whatever WARPS is (4 warps take the
// column halves of phase 1 and the row groups of the norms one after another), so that the
// records are the same bits either way.
// stamp(point) marks the end of each phase (1 to 7: norms, A and P, diagonal blocks, three merge
// levels, records) for a profiling build's phase clock; a no-op otherwise.
struct NoStamp {
  __device__ void operator()(int) const {}
};
template <class E, int KP, int HEADS, int WARPS, class RecordOf, class Sync, class Stamp = NoStamp>
__device__ __forceinline__ void prepare_chunk(const ChunkedParams& p, const PrepSmem<E>& sm, RecordOf record_of, int j0,
                                              int c, const GateInputs& gates, float A_log, float dt_bias,
                                              std::int64_t debug_chunk, int tid, Sync sync, Stamp stamp = {}) {
  using L = PrepPlan<E, KP, HEADS>;
  static_assert(WARPS == 8 || (WARPS == 4 && HEADS == 1), "8 warps, or 4 for one head");
  constexpr int ldk = L::ldk, ldf = L::ldf, kWThreads = 32 * WARPS;
  const E* const Qs = sm.Qs;
  const E* const Ks = sm.Ks;
  auto Af = [&](int head) { return reinterpret_cast<float*>(sm.a + head * L::f_bytes); };
  auto Tf = [&](int head) { return reinterpret_cast<float*>(sm.t + head * L::f_bytes); };
  // Per head: gamma (double), beta, r_q, r_k, e_start, e_end (float), segment (int), chunk decay.
  auto gam = [&](int head) { return reinterpret_cast<double*>(sm.scalar + head * L::scalar_bytes); };
  auto bet = [&](int head) { return reinterpret_cast<float*>(gam(head) + kC); };
  auto est = [&](int head) { return bet(head) + 3 * kC; };
  auto een = [&](int head) { return bet(head) + 4 * kC; };
  auto seg = [&](int head) { return reinterpret_cast<int*>(bet(head) + 5 * kC); };
  auto chunk_decay = [&](int head) { return reinterpret_cast<float*>(seg(head) + kC); };
  float* const rq = bet(0) + kC;  // the norms: head 0's arrays, for both heads
  float* const rk = bet(0) + 2 * kC;
  const int lane = tid & 31, warp = tid >> 5;
  const int row0 = (warp & 3) * 16;
  constexpr int heads = HEADS;
  const int my_head = heads == 2 ? warp >> 2 : 0;
  const int hw = heads == 2 ? warp & 3 : warp;
  const bool scanner = hw == 0 && my_head < heads;
  const float decay_rate = p.fused_gates ? expf(A_log) : 0.f;
  (void)ldk;

  // --- phase 0: gates, cumulative decay (per head), norms (shared) ----------------------------
  if (scanner) {
    double* const gm = gam(my_head);
    float* const bt = bet(my_head);
    float* const es = est(my_head);
    float* const ee = een(my_head);
    int* const sg = seg(my_head);
    float gv[2], bv[2];
    bool reset[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#if GDN_KERNEL_FAULTS
      const bool valid = 2 * lane + e < c && !(GDN_PLANTED(p, chunked_last_token_gate_lost) && 2 * lane + e == kC - 1);
#else
      const bool valid = 2 * lane + e < c;
#endif
      if (p.fused_gates) {
        gv[e] = valid ? -decay_rate * softplus(gates.g[e] + dt_bias) : 0.f;
        bv[e] = valid ? (p.negative_eigenvalues ? 2.f : 1.f) / (1.f + expf(-gates.b[e])) : 0.f;
      } else {
        gv[e] = gates.g[e];
        bv[e] = gates.b[e];
      }
      reset[e] = valid && expf(gv[e]) == 0.f;
    }
    // Segmented inclusive scan: a reset token starts a new segment at gamma = 0. In double:
    // the decays are exp(gamma_i - gamma_j) of nearby tokens, and a tree scan in fp32 would
    // give gamma_i and gamma_j independent roundings of |gamma| u_f32 (1e-5 relative at
    // gamma ~ -200, the strong-decay regime), where a sequential fp32 sum shares them.
    const double va = reset[0] ? 0.0 : double(gv[0]), vb = reset[1] ? 0.0 : double(gv[1]);
    bool flag = reset[0] || reset[1];
    double sum = reset[1] ? vb : va + vb;
    int last_reset = reset[1] ? 2 * lane + 1 : (reset[0] ? 2 * lane : -1);
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const double so = __shfl_up_sync(0xffffffffu, sum, d);
      const int fo = __shfl_up_sync(0xffffffffu, flag ? 1 : 0, d);
      const int ro = __shfl_up_sync(0xffffffffu, last_reset, d);
      if (lane >= d) {
        sum = flag ? sum : so + sum;
        flag = flag || fo;
        last_reset = ro > last_reset ? ro : last_reset;
      }
    }
    double before = __shfl_up_sync(0xffffffffu, sum, 1);
    int seg_before = __shfl_up_sync(0xffffffffu, last_reset, 1);
    if (lane == 0) {
      before = 0.0;
      seg_before = -1;
    }
    const double ga = reset[0] ? 0.0 : before + va;
    const double gb = reset[1] ? 0.0 : ga + vb;
    const int sa = reset[0] ? 2 * lane : seg_before;
    const int sb = reset[1] ? 2 * lane + 1 : sa;
    const double g_last = __shfl_sync(0xffffffffu, gb, 31);
    const int s_last = __shfl_sync(0xffffffffu, sb, 31);
    const float ea = sa < 0 ? expf(float(ga)) : 0.f, eb = sb < 0 ? expf(float(gb)) : 0.f;
    gm[2 * lane] = ga;
    gm[2 * lane + 1] = gb;
    sg[2 * lane] = sa;
    sg[2 * lane + 1] = sb;
    bt[2 * lane] = bv[0];
    bt[2 * lane + 1] = bv[1];
    es[2 * lane] = ea;
    es[2 * lane + 1] = eb;
    ee[2 * lane] = sa == s_last ? expf(float(g_last - ga)) : 0.f;
    ee[2 * lane + 1] = sb == s_last ? expf(float(g_last - gb)) : 0.f;
    if (lane == 31) *chunk_decay(my_head) = eb;
  }
  // The norms: 4 lanes per row (a warp's 8 rows at once), each summing a quarter of the row in
  // increasing k from 16-byte loads, then the 4 partial sums in a fixed butterfly. (One row per
  // warp step with a 32-lane butterfly was a large share of this kernel's stall samples.)
#pragma unroll
  for (int pass = 0; pass < 8 / WARPS; ++pass) {  // 8 rows a warp and pass
    const int row = (warp + pass * WARPS) * (kC / 8) + (lane >> 2), part = lane & 3;
    if (p.l2norm) {
      constexpr int per = 16 / sizeof(E);  // elements per 16-byte load
      float sq = 0.f, sk = 0.f;
#pragma unroll
      for (int m = 0; m < KP / 4; m += per) {
        const int col = part * (KP / 4) + m;
        const int at = L::tma ? swizzled<128>(row, col) : row * ldk + col;
        sum_squares(*reinterpret_cast<const uint4*>(Qs + at), sq, E{});
        sum_squares(*reinterpret_cast<const uint4*>(Ks + at), sk, E{});
      }
#pragma unroll
      for (int d = 1; d < 4; d <<= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, d);
        sk += __shfl_xor_sync(0xffffffffu, sk, d);
      }
      if (part == 0) {
        rq[row] = 1.f / sqrtf(sq + 1e-6f);
        rk[row] = 1.f / sqrtf(sk + 1e-6f);
#if GDN_KERNEL_FAULTS
        if (GDN_PLANTED(p, chunked_l2norm_eps_outside)) {
          rq[row] = 1.f / (sqrtf(sq) + 1e-6f);
          rk[row] = 1.f / (sqrtf(sk) + 1e-6f);
        }
#endif
      }
    } else if (part == 0) {
      rq[row] = 1.f;
      rk[row] = 1.f;
    }
    if constexpr (L::live_keys) {  // any nonzero bit of the key's row but the signs (-0 is zero)
      unsigned any = 0u;
#pragma unroll
      for (int m = 0; m < KP / 4; m += 8) {
        const int col = part * (KP / 4) + m;
        const int at = L::tma ? swizzled<128>(row, col) : row * ldk + col;
        const uint4 w = *reinterpret_cast<const uint4*>(Ks + at);
        any |= (w.x | w.y | w.z | w.w) & 0x7fff7fffu;
      }
#pragma unroll
      for (int d = 1; d < 4; d <<= 1) any |= __shfl_xor_sync(0xffffffffu, any, d);
      // Rows past the chunk's tokens may hold the next sequence's keys: not this chunk's.
      if (part == 0) sm.live[row] = any != 0u && row < c ? 1 : 0;
    }
  }
#if GDN_KERNEL_FAULTS
  if (!GDN_PLANTED(p, chunked_prepass_barrier_removed))
#endif
  sync(); stamp(1);
  if constexpr (L::live_keys) {
    // Read next by the records, several barriers on: this warp's e_end, decay and scale only.
    if (scanner)
      rescale_state_update(een(my_head), chunk_decay(my_head), sm.live, lane);
  }

  // --- phase 1: A = masked K K^T (fp32), P = masked Q K^T (input dtype), per head from one
  // product each ------------------------------------------------------------------------------
#pragma unroll 1
  for (int pass = 0; pass < 8 / WARPS; ++pass) {  // 32 columns a warp and pass
    const int wn = WARPS == 8 ? warp >> 2 : pass;
    float kk[1][4][4], qk[1][4][4];
    zero(kk);
    zero(qk);
    if constexpr (L::tma) {
      warp_gemm_swizzled<4, KP / 16>(kk, Ks, Ks, row0, wn * 32, lane);
      warp_gemm_swizzled<4, KP / 16>(qk, Qs, Ks, row0, wn * 32, lane);
    } else {
      warp_gemm<1, 4, KP / 16, false, false>(kk, Ks, ldk, Ks, ldk, row0, wn * 32, lane);
      warp_gemm<1, 4, KP / 16, false, false>(qk, Qs, ldk, Ks, ldk, row0, wn * 32, lane);
    }
    // A and P of each head from the same decays exp(gamma_i - gamma_j) (P's mask holds A's and
    // the diagonal): one exp per element and head. The lane's 8 columns' r_k and gamma are loaded
    // once (the stores to A in between kept the compiler from reusing them across rows).
    const int g8 = lane >> 2, t4 = lane & 3;
    float rk_col[4][2];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int u = 0; u < 2; ++u) rk_col[nt][u] = rk[wn * 32 + nt * 8 + 2 * t4 + u];
#pragma unroll 1
    for (int head = 0; head < heads; ++head) {
      const double* const gm = gam(head);
      const int* const sg = seg(head);
      const float* const bt = bet(head);
      float* const Ah = Af(head);
      // P to its record from the registers.
      E* const Ph = reinterpret_cast<E*>(record_of(head) + L::rec_p);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = row0 + g8 + 8 * half;
        const int s = sg[i] > 0 ? sg[i] : 0;
        const double gi = gm[i];
        const float base_a = bt[i] * rk[i], base_p = rq[i];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int col = wn * 32 + nt * 8 + 2 * t4;
          float a[2], q[2];
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            // Outside the mask the exponent is -inf (exp gives 0): no branch around the exp,
            // and no overflow from the upper triangle's positive gamma_i - gamma_j.
            const bool inside = col + u <= i && col + u >= s;
            const float w = expf(inside ? float(gi - gm[col + u]) : -INFINITY) * rk_col[nt][u];
            // Selects, not products with 0: a NaN in a later token's q or k stays out of row i.
            a[u] = (inside && col + u < i) ? base_a * w * kk[0][nt][2 * half + u] : 0.f;
            q[u] = inside ? base_p * w * qk[0][nt][2 * half + u] : 0.f;
          }
          *reinterpret_cast<float2*>(Ah + i * ldf + col) = make_float2(a[0], a[1]);
          if constexpr (L::p_lo) {
            if (!p.single_rounding)
              store_split(Ph + record_at<E>(i, col), Ph + (L::rec_plo - L::rec_p) / sizeof(E) + record_at<E>(i, col), q[0], q[1]);
            else
              store2(Ph + record_at<E>(i, col), q[0], q[1]);
          } else {
            store2(Ph + record_at<E>(i, col), q[0], q[1]);
          }
        }
      }
    }
  }
  sync(); stamp(2);

  // --- phase 2: T = (I + A)^-1, diagonal 16 x 16 blocks (warps 0-3: head 0, 4-7: head 1) -------
  if (hw < 4 && my_head < heads && lane < 16) {
    const int b = hw, col = lane;
    const float* Ab = Af(my_head) + (16 * b) * ldf + 16 * b;
    float* const Th = Tf(my_head);
    float tcol[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float s = (i == col) ? 1.f : 0.f;
#pragma unroll
      for (int q = 0; q < i; ++q) s = fmaf(-Ab[i * ldf + q], tcol[q], s);
      tcol[i] = s;
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) Th[(16 * b + i) * ldf + 16 * b + col] = tcol[i];
  }
  sync(); stamp(3);

  // --- phase 3: block merges T_ij = -T_ii Y_ij, Y_ij = sum_{k=j}^{i-1} A_ik T_kj --------------------
  // Three levels, each warp of a head busy at each: the terms of Y whose T_kj is already known
  // are summed a level early by a warp that would otherwise wait, and the warp keeps Y in its
  // registers to finish it (k increasing, the same order and bits as one merge), so the last
  // level sums one term instead of three:
  //   level 1: T10, T21, T32; warp 3: Y20 += A20 T00
  //   level 2: warp 3: Y20 += A21 T10, T20; warp 1: T31; warp 0: Y30 += A30 T00 + A31 T10
  //   level 3: warp 0: Y30 += A32 T20, T30
  const int rr = lane >> 1, c0 = (lane & 1) * 8;
  auto accumulate = [&](int bi, int bj, int kb_begin, int kb_end, float (&y)[8]) {
    const float* const Ah = Af(my_head);
    const float* const Th = Tf(my_head);
    for (int kb = kb_begin; kb < kb_end; ++kb) {
      const float* arow = Ah + (16 * bi + rr) * ldf + 16 * kb;
      const float* tb = Th + (16 * kb) * ldf + 16 * bj + c0;
#pragma unroll
      for (int k4 = 0; k4 < 16; k4 += 4) {
        // A's row in 16-byte pieces (rows of ldf floats start on 16 bytes, as do the blocks).
        const float4 a4 = *reinterpret_cast<const float4*>(arow + k4);
        const float as[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int kk = k4 + u;
          const float a = as[u];
          const float4 t0 = *reinterpret_cast<const float4*>(tb + kk * ldf);
          const float4 t1 = *reinterpret_cast<const float4*>(tb + kk * ldf + 4);
          y[0] = fmaf(a, t0.x, y[0]);
          y[1] = fmaf(a, t0.y, y[1]);
          y[2] = fmaf(a, t0.z, y[2]);
          y[3] = fmaf(a, t0.w, y[3]);
          y[4] = fmaf(a, t1.x, y[4]);
          y[5] = fmaf(a, t1.y, y[5]);
          y[6] = fmaf(a, t1.z, y[6]);
          y[7] = fmaf(a, t1.w, y[7]);
        }
      }
    }
  };
  auto finish = [&](int bi, int bj, const float (&y)[8]) {
    float* const Th = Tf(my_head);
    // Row kk of Y is held by lanes 2 kk (columns 0-7) and 2 kk + 1 (8-15). It goes through
    // T_ij's own place, which nothing reads before the next level's barrier: each lane stores
    // its piece, then reads rows kk in increasing order, two 16-byte loads per kk where eight
    // shuffles were (the same products in the same order: the same bits).
    float* const out = Th + (16 * bi + rr) * ldf + 16 * bj + c0;
    *reinterpret_cast<float4*>(out) = make_float4(y[0], y[1], y[2], y[3]);
    *reinterpret_cast<float4*>(out + 4) = make_float4(y[4], y[5], y[6], y[7]);
    __syncwarp();
    float z[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) z[e] = 0.f;
    const float* const trow = Th + (16 * bi + rr) * ldf + 16 * bi;
    const float* const ycol = Th + (16 * bi) * ldf + 16 * bj + c0;
#pragma unroll
    for (int k4 = 0; k4 < 16; k4 += 4) {
      const float4 a4 = *reinterpret_cast<const float4*>(trow + k4);
      const float as[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float4 y0 = *reinterpret_cast<const float4*>(ycol + (k4 + u) * ldf);
        const float4 y1 = *reinterpret_cast<const float4*>(ycol + (k4 + u) * ldf + 4);
        const float ys[8] = {y0.x, y0.y, y0.z, y0.w, y1.x, y1.y, y1.z, y1.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) z[e] = fmaf(as[u], ys[e], z[e]);
      }
    }
    __syncwarp();  // every lane's reads of Y, before T_ij takes its place
    *reinterpret_cast<float4*>(out) = make_float4(-z[0], -z[1], -z[2], -z[3]);
    *reinterpret_cast<float4*>(out + 4) = make_float4(-z[4], -z[5], -z[6], -z[7]);
    __syncwarp();
  };
  const bool merger = my_head < heads;
  float y[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) y[e] = 0.f;
  if (merger) {  // level 1
    if (hw < 3) {
      accumulate(hw + 1, hw, hw, hw + 1, y);
      finish(hw + 1, hw, y);
    } else if (hw == 3) {
      accumulate(2, 0, 0, 1, y);
    }
  }
  sync(); stamp(4);
  if (merger) {  // level 2
    if (hw == 3) {
      accumulate(2, 0, 1, 2, y);
      finish(2, 0, y);
    } else if (hw == 1) {
#pragma unroll
      for (int e = 0; e < 8; ++e) y[e] = 0.f;
      accumulate(3, 1, 1, 3, y);
      finish(3, 1, y);
    } else if (hw == 0) {
#pragma unroll
      for (int e = 0; e < 8; ++e) y[e] = 0.f;
      accumulate(3, 0, 0, 2, y);
    }
  }
  sync(); stamp(5);
  if (merger && hw == 0) {  // level 3
    accumulate(3, 0, 2, 3, y);
    finish(3, 0, y);
  }
  sync(); stamp(6);

  // --- the records of (g, j0 + head), and the debug A, T -------------------------------------------
  for (int head = 0; head < heads; ++head) {
    const int j = j0 + head;
    const float* const Ah = Af(head);
    const float* const Th = Tf(head);
    unsigned char* const rec = record_of(head);
    if (p.debug_A) {
      float* da = p.debug_A + (debug_chunk * p.HV + j) * kC * kC;
      float* dt = p.debug_T + (debug_chunk * p.HV + j) * kC * kC;
      for (int idx = tid; idx < kC * kC; idx += kWThreads) {
        const int i = idx / kC, col = idx % kC;
        da[idx] = Ah[i * ldf + col];
        dt[idx] = (col / 16 <= i / 16) ? Th[i * ldf + col] : 0.f;
      }
    }
    // T to the input dtype (tensor-core operand), as hi + lo: T entries can be large with
    // cancellation in T X (small K, beta near 2, no decay): one rounding of T or X to bf16 then
    // costs more than the input dtype's u in Vnew, so both are split and the forward computes
    // Vnew = T_hi X_hi + T_hi X_lo + T_lo X_hi (about 16 bits for bf16). Upper blocks are zero.
    // Eight elements (16 bytes of each part) per thread and step: 16-byte global stores (4-byte
    // ones were most of this phase's instructions).
    {
      E* const gt = reinterpret_cast<E*>(rec + L::rec_t);
      E* const gtlo = reinterpret_cast<E*>(rec + L::rec_tlo);
      for (int idx = tid; idx < kC * (kC / 8); idx += kWThreads) {
        const int i = idx / (kC / 8), col = 8 * (idx % (kC / 8));
        float t[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (col / 16 <= i / 16) {
          const float4 a = *reinterpret_cast<const float4*>(Th + i * ldf + col);
          const float4 b = *reinterpret_cast<const float4*>(Th + i * ldf + col + 4);
          t[0] = a.x, t[1] = a.y, t[2] = a.z, t[3] = a.w, t[4] = b.x, t[5] = b.y, t[6] = b.z, t[7] = b.w;
        }
        if constexpr (L::split) {
          alignas(16) E hi[8], lo[8];
#pragma unroll
          for (int e = 0; e < 8; e += 2) store_split(hi + e, lo + e, t[e], t[e + 1]);
          *reinterpret_cast<uint4*>(gt + record_at<E>(i, col)) = *reinterpret_cast<const uint4*>(hi);
          // Single rounding reads no T lo (the forward's copies skip it): not written.
          if (!p.single_rounding) *reinterpret_cast<uint4*>(gtlo + record_at<E>(i, col)) = *reinterpret_cast<const uint4*>(lo);
        } else {
#pragma unroll
          for (int e = 0; e < 8; e += 2) store2(gt + record_at<E>(i, col + e), t[e], t[e + 1]);
        }
      }
    }
    if (tid < kC) {
      float* const gs = reinterpret_cast<float*>(rec + L::rec_scalar);
      gs[tid] = bet(head)[tid];
      gs[kC + tid] = rq[tid];
      gs[2 * kC + tid] = rk[tid];
      gs[3 * kC + tid] = est(head)[tid];
      gs[4 * kC + tid] = een(head)[tid];
      // fp16: the state update's 2^-m after the chunk decay (rescale_state_update).
      gs[5 * kC + tid] = tid == 0 ? *chunk_decay(head) : (tid == 1 && L::live_keys ? chunk_decay(head)[1] : 0.f);
    }
  }
  stamp(7);
}

template <class E, int KP, int HEADS>
__global__ void __launch_bounds__(kThreads, PrepPlan<E, KP, HEADS>::min_blocks)
    chunked_prepare(const __grid_constant__ ChunkedParams p) {
  using L = PrepPlan<E, KP, HEADS>;
  static_assert(KP % 64 == 0 && KP <= 128, "KP is 64 or 128");
  constexpr int ldk = L::ldk;
  extern __shared__ __align__(1024) unsigned char smem[];
  E* const Qs = reinterpret_cast<E*>(smem + L::off_q);
  E* const Ks = reinterpret_cast<E*>(smem + L::off_k);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Block = global chunk g (sequence order) x group of `heads` value heads j0, j0 + 1, ...
  constexpr int heads = HEADS;  // the launch picks 2 when the group is even
  const unsigned groups = static_cast<unsigned>(p.HV / heads);
  const int j0 = static_cast<int>(blockIdx.x % groups) * heads;
  const std::int64_t g = static_cast<std::int64_t>(blockIdx.x / groups);
  // The head and the index within it of this warp's share of the per-head serial phases.
  const int my_head = heads == 2 ? warp >> 2 : 0;
  const int hw = heads == 2 ? warp & 3 : warp;
  const std::int64_t* const offs = p.ws_offsets;
  if (g >= offs[p.N] || g >= p.ws_chunks) return;  // cu_seqlens disagreeing with the Problem
  int lo = 0, hi = p.N - 1;  // the last n with offs[n] <= g: empty sequences share their offset
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (offs[mid] <= g)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int n = lo;
  const std::int64_t ci = g - offs[n];
  const std::int64_t eos = seq_boundary(p, n + 1);
  const std::int64_t start = seq_boundary(p, n) + ci * kC;
  const int c = static_cast<int>(eos - start < kC ? eos - start : kC);
#if GDN_KERNEL_FAULTS
  const int h = GDN_PLANTED(p, chunked_gva_head_map) ? j0 % p.H : j0 / p.group;
#else
  const int h = j0 / p.group;  // the pair's heads share it: group is even, j0 too
#endif

  std::uint64_t* const copied = reinterpret_cast<std::uint64_t*>(smem + L::off_bar);
  if constexpr (L::tma) {
    // One thread issues the chunk's q and k boxes (zeros past K and past T): the block's other
    // threads issue nothing (16-byte cp.async from every thread stalled them while the copy
    // queue drained, as in the forward).
    if (tid == 0) {
      ptx::bulk::barrier_init(copied, 1);
      ptx::bulk::fence_barrier_init();
      ptx::bulk::arrive_expect_tx(copied, unsigned(2 * L::q_bytes));
#pragma unroll
      for (int slab = 0; slab < KP / 64; ++slab) {
        ptx::bulk::tensor_load_3d(Qs + slab * 64 * kC, &p.tmap_q, 64 * slab, h, static_cast<int>(start), copied);
        ptx::bulk::tensor_load_3d(Ks + slab * 64 * kC, &p.tmap_k, 64 * slab, h, static_cast<int>(start), copied);
      }
    }
  } else {
    const E* const qg = static_cast<const E*>(p.q);
    const E* const kg = static_cast<const E*>(p.k);
    constexpr int per = 16 / sizeof(E);
    constexpr int pieces_k = KP / per;
    for (int idx = tid; idx < kC * pieces_k; idx += kThreads) {
      const int row = idx / pieces_k, col = (idx % pieces_k) * per;
      const bool ok = row < c && col < p.K;
      const std::int64_t off = ok ? ((start + row) * p.H + h) * p.K + col : 0;
      ptx::cp_async16(Qs + row * ldk + col, qg + off, ok);
      ptx::cp_async16(Ks + row * ldk + col, kg + off, ok);
    }
    ptx::cp_async_commit();
  }
  // Warp 0 scans head 0's gates, warp 4 head 1's.
  const bool scanner = hw == 0 && my_head < heads;
  const int jg = j0 + my_head;
  GateInputs gates;
  if (scanner) gates = load_gate_inputs(p, jg, start, c, lane);
  const float A_log = p.fused_gates && scanner ? p.A_log[jg] : 0.f;
  const float dt_bias = p.fused_gates && scanner ? p.dt_bias[jg] : 0.f;
  if constexpr (L::tma) {
    __syncthreads();  // the barrier's initialisation, before anyone waits on it
    ptx::bulk::wait(copied, 0);
    if (c < kC) {  // the next sequence's tokens: zeros (uniform over the block)
      constexpr int pieces = 8;  // 16-byte pieces per 128-byte row of a slab
      const int per_slab = (kC - c) * pieces;
      for (int idx = tid; idx < 2 * (KP / 64) * per_slab; idx += kThreads) {
        const int tile = idx / per_slab, rest = idx % per_slab;  // tile: Q slabs, then K slabs
        E* const base = (tile < KP / 64 ? Qs : Ks) + (tile % (KP / 64)) * 64 * kC;
        *reinterpret_cast<uint4*>(base + (c + rest / pieces) * 64 + (rest % pieces) * 8) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  } else {
    ptx::cp_async_wait_all();
  }
  __syncthreads();

  const std::int64_t debug_chunk = p.debug_A ? p.chunk_offsets[n] + ci : 0;
  const PrepSmem<E> places{Qs, Ks, smem + L::off_a, smem + L::off_t, smem + L::off_scalar,
                           reinterpret_cast<int*>(smem + L::off_live)};
  prepare_chunk<E, KP, HEADS, 8>(
      p, places, [&](int head) { return p.ws_records + (g * p.HV + j0 + head) * static_cast<std::int64_t>(L::record_bytes); },
      j0, c, gates, A_log, dt_bias, debug_chunk, tid, [] { __syncthreads(); });
}

// The fp32 forward's per-chunk copies of Q, K and the block's V columns (bf16/fp16 use tensor
// copies, chunked_wgmma.cuh), with each thread's
// share fixed once: thread tid copies the same 16-byte pieces (same row within its pass, same
// column) of every chunk, so the index arithmetic is done here and a chunk adds only its start
// (ncu at the low-parallelism shape put a third of the forward's instructions on recomputing it
// per piece and per chunk). Same pieces, same copies as a flat loop over idx = tid, tid + kThreads,
// ... would make.
template <class E, int KP, int BV>
struct ChunkCopies {
  static constexpr int per = 16 / sizeof(E);
  static constexpr int pieces_k = KP / per;  // 16-byte pieces of a q/k row
  static constexpr int pieces_v = BV / per;
  static_assert(kThreads % pieces_k == 0 && (kC * pieces_k) % kThreads == 0, "q/k pieces tile the block");
  static_assert(kThreads % pieces_v == 0, "v pieces tile the block");
  static constexpr int rows_pass_k = kThreads / pieces_k, passes_k = kC / rows_pass_k;
  static constexpr int rows_pass_v = kThreads / pieces_v, passes_v = (kC + rows_pass_v - 1) / rows_pass_v;

  const E* qg;
  const E* kg;
  const E* vg;
  int qk_row, qk_col, v_row, v_col;
  std::int64_t qk_row_stride, v_row_stride;
  bool qk_col_ok;
  bool v_ok;  // false: the V tile is zero-filled (the split's transition tiles: v = 0)
  const E* q_thread;
  const E* k_thread;
  const E* v_thread;

  __device__ __forceinline__ ChunkCopies(const ChunkedParams& p, int tid, int h, int j, int v0, bool v_valid = true)
      : qg(static_cast<const E*>(p.q)),
        kg(static_cast<const E*>(p.k)),
        vg(static_cast<const E*>(p.v)),
        qk_row(tid / pieces_k),
        qk_col((tid % pieces_k) * per),
        v_row(tid / pieces_v),
        v_col((tid % pieces_v) * per),
        qk_row_stride(std::int64_t(p.H) * p.K),
        v_row_stride(std::int64_t(p.HV) * p.V),
        qk_col_ok(qk_col < p.K),
        v_ok(v_valid),
        q_thread(qg + qk_row * qk_row_stride + h * p.K + qk_col),
        k_thread(kg + qk_row * qk_row_stride + h * p.K + qk_col),
        v_thread(vg + v_row * v_row_stride + j * p.V + v0 + v_col) {}

  // Q, K, V of the chunk at `start` (rows >= c and columns >= K zero-filled). No commit.
  __device__ __forceinline__ void issue(std::int64_t start, int c, E* Qs, E* Kdst, E* Vs, int ldk, int ldv) const {
    const E* const qs = q_thread + start * qk_row_stride;
    const E* const ks = k_thread + start * qk_row_stride;
#pragma unroll
    for (int pass = 0; pass < passes_k; ++pass) {
      const int row = qk_row + pass * rows_pass_k;
      const bool ok = row < c && qk_col_ok;
      const std::int64_t off = ok ? pass * rows_pass_k * qk_row_stride : 0;
      ptx::cp_async16(Qs + row * ldk + qk_col, ok ? qs + off : qg, ok);
      ptx::cp_async16(Kdst + row * ldk + qk_col, ok ? ks + off : kg, ok);
    }
    const E* const vs = v_thread + start * v_row_stride;
#pragma unroll
    for (int pass = 0; pass < passes_v; ++pass) {
      const int row = v_row + pass * rows_pass_v;
      if (rows_pass_v * passes_v == kC || row < kC) {
        const bool ok = row < c && v_ok;
        ptx::cp_async16(Vs + row * ldv + v_col, ok ? vs + pass * rows_pass_v * v_row_stride : vg, ok);
      }
    }
  }
};

// ----- the forward --------------------------------------------------------------------------

template <class E, int KP, int BV>
__global__ void __launch_bounds__(kThreads, Plan<E, KP, BV>::min_blocks) chunked_forward(const ChunkedParams p) {
  using L = Plan<E, KP, BV>;
  using R = typename L::Rec;
  static_assert(KP % 64 == 0 && KP <= 128, "KP is 64 or 128");
  static_assert(BV % 16 == 0 && BV <= 128, "BV is 16, 32, 64 or 128");
  constexpr int ldk = L::ldk, ldv = L::ldv, ldc = L::ldc;
  constexpr int MTS = KP / 64;  // state m-tiles per warp (4 warps down K)
  constexpr int NTV = BV / 16;  // n-tiles per warp on BV (2 warps across)
  // The same 1024-byte alignment as the other kernels' declarations of `smem` (one symbol:
  // a different alignment here is a warning and means nothing to the fp32 plan, which needs 128).
  extern __shared__ __align__(1024) unsigned char smem[];
  E* const Qs = reinterpret_cast<E*>(smem + L::off_q);
  E* const Ks0 = reinterpret_cast<E*>(smem + L::off_k0);
  E* const Ks1 = reinterpret_cast<E*>(smem + L::off_k1);
  E* const Vs = reinterpret_cast<E*>(smem + L::off_v);
  E* const Shi = reinterpret_cast<E*>(smem + L::off_shi);
  E* const Slo = reinterpret_cast<E*>(smem + L::off_slo);
  // R1: X hi, X lo | then Vnew, decayed Vnew lo. The decayed Vnew hi goes where the current
  // record buffer's T hi (+ lo) was, once T X is done.
  E* const Xs = reinterpret_cast<E*>(smem + L::off_r1);
  E* const Xlo = reinterpret_cast<E*>(smem + L::off_r1 + L::v_bytes);
  E* const Vns = Xs;
  E* const Vndlo = Xlo;
  E* const Vnlo_own = reinterpret_cast<E*>(smem + L::off_vnlo);  // fp16 at BV 128 only
  unsigned char* const W0 = smem + L::off_w0;
  unsigned char* const W1 = smem + L::off_w1;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp & 3, wn = warp >> 2;
  const int vt = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.value_tiles));
  const int pair = static_cast<int>(blockIdx.x / static_cast<unsigned>(p.value_tiles));
  const int j = pair % p.HV, n = pair / p.HV;
  const int h = j / p.group;
  const int v0 = vt * BV;
#if GDN_KERNEL_FAULTS
  const std::int64_t bos = seq_boundary(p, n),
                     eos = GDN_PLANTED(p, chunked_partial_chunk_dropped)
                               ? bos + (seq_boundary(p, n + 1) - bos) / kC * kC
                               : seq_boundary(p, n + 1);
#else
  const std::int64_t bos = seq_boundary(p, n), eos = seq_boundary(p, n + 1);
#endif
  const int srow0 = wm * 16 * MTS, col0 = wn * (BV / 2), row0 = wm * 16;
  const std::int64_t state_base = (static_cast<std::int64_t>(n) * p.HV + j) * p.K * p.V + v0;
  // The sequence's first global chunk: its records are (first_chunk + i) * HV + j.
  const std::int64_t first_chunk = bos < eos ? p.ws_offsets[n] : 0;
  if (bos < eos && first_chunk + (eos - bos + kC - 1) / kC > p.ws_chunks) return;  // cu_seqlens disagree

  float S[MTS][NTV][4];
  for_each_pair(S, srow0, col0, lane, [&](int r, int c, float& x0, float& x1) {
    x0 = x1 = 0.f;
    if (p.has_h0 && r < p.K) {
      const float2 s = *reinterpret_cast<const float2*>(p.h0 + state_base + static_cast<std::int64_t>(r) * p.V + c);
      x0 = s.x;
      x1 = s.y;
    }
  });
  auto write_state_operand = [&]() {
    for_each_pair(S, srow0, col0, lane, [&](int r, int c, float& x0, float& x1) {
      store2(Shi + r * ldv + c, x0, x1);
      if constexpr (L::split) {
        const float h0v = to_float(from_float<E>(x0)), h1v = to_float(from_float<E>(x1));
        store2(Slo + r * ldv + c, x0 - h0v, x1 - h1v);
      }
    });
  };
  write_state_operand();

  const ChunkCopies<E, KP, BV> copies(p, tid, h, j, v0);
  auto issue_loads = [&](std::int64_t start, int c, E* Kdst) { copies.issue(start, c, Qs, Kdst, Vs, ldk, ldv); };
  // The prepass record of global chunk `chunk` (head j) into buffer `Wdst`: the tiles' rows of
  // 64 into rows of ldc, then the scalars. A record is contiguous: thread tid copies its pieces
  // tid, tid + kThreads, ... of it. No commit.
  constexpr int tiles = L::split ? 3 : 2;
  constexpr int row_pieces = kC * sizeof(E) / 16;
  constexpr int rows_pass_w = kThreads / row_pieces, passes_w = tiles * kC / rows_pass_w;
  static_assert(kThreads % row_pieces == 0 && kC % rows_pass_w == 0, "record pieces tile the block");
  const int w_row = tid / row_pieces, w_piece = tid % row_pieces;
  const int w_dst_thread = w_row * (ldc * sizeof(E)) + w_piece * 16;
  auto issue_record = [&](std::int64_t chunk, unsigned char* Wdst) {
    const unsigned char* const src = p.ws_records + (chunk * p.HV + j) * static_cast<std::int64_t>(R::record_bytes);
#pragma unroll
    for (int pass = 0; pass < passes_w; ++pass) {
      // Global row pass * rows_pass_w + w_row of the tiles: tile and row within it.
      const int first_row = pass * rows_pass_w;  // a multiple of rows_pass_w: w_row stays in its tile
      const int tile = first_row / kC, row0_in_tile = first_row % kC;
      ptx::cp_async16(Wdst + tile * L::c_bytes + row0_in_tile * (ldc * sizeof(E)) + w_dst_thread,
                 src + std::size_t(pass) * kThreads * 16 + std::size_t(tid) * 16, true);
    }
    if (tid < 6 * kC * 4 / 16) ptx::cp_async16(Wdst + L::w_off_scalar + tid * 16, src + R::rec_scalar + tid * 16, true);
  };

  if (bos < eos) {
    const int c = static_cast<int>(eos - bos < kC ? eos - bos : kC);
    issue_loads(bos, c, Ks0);
    issue_record(first_chunk, W0);
    ptx::cp_async_commit();
  }

  int chunk_index = 0;
  for (std::int64_t start = bos; start < eos; start += kC, ++chunk_index) {
    const int c = static_cast<int>(eos - start < kC ? eos - start : kC);
    E* const Kc = (chunk_index & 1) ? Ks1 : Ks0;
    E* const Kn = (chunk_index & 1) ? Ks0 : Ks1;
    unsigned char* const Wc = (chunk_index & 1) ? W1 : W0;
    unsigned char* const Wn = (chunk_index & 1) ? W0 : W1;
    const E* const Ts = reinterpret_cast<const E*>(Wc + L::w_off_t);
    const E* const Tlo = reinterpret_cast<const E*>(Wc + L::w_off_tlo);
    const E* const Ps = reinterpret_cast<const E*>(Wc + L::w_off_p);
    const float* const bet = reinterpret_cast<const float*>(Wc + L::w_off_scalar);
    const float* const rq = bet + kC;
    const float* const rk = rq + kC;
    const float* const est = rk + kC;  // e_start
    const float* const een = est + kC;  // e_end
    const float* const chunk_decay = een + kC;
    E* const Vnds = reinterpret_cast<E*>(Wc + L::w_off_t);  // after T X: replaces T hi (+ lo)
    E* const Vnlo = L::vnlo_in_w ? reinterpret_cast<E*>(Wc + L::w_off_t + L::v_bytes) : Vnlo_own;  // fp16
    const std::int64_t debug_chunk = p.chunk_offsets ? p.chunk_offsets[n] + chunk_index : 0;
    ptx::cp_async_wait_all();
    __syncthreads();

    // --- the S0 products: X = diag(beta) (V - diag(e_start r_k) K S0), O = diag(e_start r_q) Q S0
    float X[1][NTV][4], O[1][NTV][4];
    zero(X);
    warp_gemm<1, NTV, KP / 16, false, true>(X, Kc, ldk, Shi, ldv, row0, col0, lane);
    if constexpr (L::split) warp_gemm<1, NTV, KP / 16, false, true>(X, Kc, ldk, Slo, ldv, row0, col0, lane);
    for_each_pair(X, row0, col0, lane, [&](int i, int col, float& x0, float& x1) {
      const float w = est[i] * rk[i];
      x0 = bet[i] * (to_float(Vs[i * ldv + col]) - w * x0);
      x1 = bet[i] * (to_float(Vs[i * ldv + col + 1]) - w * x1);
    });
    zero(O);
    warp_gemm<1, NTV, KP / 16, false, true>(O, Qs, ldk, Shi, ldv, row0, col0, lane);
    if constexpr (L::split) warp_gemm<1, NTV, KP / 16, false, true>(O, Qs, ldk, Slo, ldv, row0, col0, lane);
    for_each_pair(O, row0, col0, lane, [&](int i, int, float& x0, float& x1) {
      const float w = est[i] * rq[i];
      x0 *= w;
      x1 *= w;
    });
    if (p.debug_S0) {
      float* dst = p.debug_S0 + (debug_chunk * p.HV + j) * p.K * p.V + v0;
      for_each_pair(S, srow0, col0, lane, [&](int r, int col, float& x0, float& x1) {
        if (r < p.K) *reinterpret_cast<float2*>(dst + static_cast<std::int64_t>(r) * p.V + col) = make_float2(x0, x1);
      });
    }
    __syncthreads();

    // Q, V, the other K buffer and the other record buffer are free (their last readers: the
    // products above, and the previous chunk): fetch the next chunk while this one finishes.
    if (start + kC < eos) {
      const int cn = static_cast<int>(eos - start - kC < kC ? eos - start - kC : kC);
      issue_loads(start + kC, cn, Kn);
      issue_record(first_chunk + chunk_index + 1, Wn);
      ptx::cp_async_commit();
    }

    // --- X to the input dtype (tensor-core operand), as hi + lo (see the header) ---------------
    for_each_pair(X, row0, col0, lane, [&](int i, int col, float& x0, float& x1) {
      store2(Xs + i * ldv + col, x0, x1);
      if constexpr (L::split)
        store2(Xlo + i * ldv + col, x0 - to_float(from_float<E>(x0)), x1 - to_float(from_float<E>(x1)));
    });
    __syncthreads();

    // --- Vnew = T X --------------------------------------------------------------------------
    {
      float Vn[1][NTV][4];
      zero(Vn);
      warp_gemm<1, NTV, kC / 16, false, true>(Vn, Ts, ldc, Xs, ldv, row0, col0, lane);
      if constexpr (L::split) {
        warp_gemm<1, NTV, kC / 16, false, true>(Vn, Ts, ldc, Xlo, ldv, row0, col0, lane);
        warp_gemm<1, NTV, kC / 16, false, true>(Vn, Tlo, ldc, Xs, ldv, row0, col0, lane);
      }
      __syncthreads();  // Vnew replaces X in R1; the decayed Vnew hi (and fp16 Vnew lo, BV <= 64) T
      float* dv = p.debug_Vnew ? p.debug_Vnew + (debug_chunk * p.HV + j) * kC * p.V + v0 : nullptr;
      for_each_pair(Vn, row0, col0, lane, [&](int i, int col, float& x0, float& x1) {
        store2(Vns + i * ldv + col, x0, x1);
        if constexpr (L::split_pv)
          store2(Vnlo + i * ldv + col, x0 - to_float(from_float<E>(x0)), x1 - to_float(from_float<E>(x1)));
        const float w = een[i] * rk[i];
        const float d0 = w * x0, d1 = w * x1;
        store2(Vnds + i * ldv + col, d0, d1);
        if constexpr (L::split)
          store2(Vndlo + i * ldv + col, d0 - to_float(from_float<E>(d0)), d1 - to_float(from_float<E>(d1)));
        if (dv) *reinterpret_cast<float2*>(dv + static_cast<std::int64_t>(i) * p.V + col) = make_float2(x0, x1);
      });
    }
    __syncthreads();

    // --- O = scale (e_start Q S0 + P Vnew); S_end = e_start(c) S0 + K^T (e_end Vnew) -----------
    if constexpr (L::split_pv)
      warp_gemm_split_b<1, NTV, kC / 16>(O, Ps, ldc, Vns, Vnlo, ldv, row0, col0, lane);
    else
      warp_gemm<1, NTV, kC / 16, false, true>(O, Ps, ldc, Vns, ldv, row0, col0, lane);
    {
      E* og = static_cast<E*>(p.o);
      const float scale = p.scale;
      for_each_pair(O, row0, col0, lane, [&](int i, int col, float& x0, float& x1) {
        if (i < c) store2(og + ((start + i) * p.HV + j) * p.V + v0 + col, scale * x0, scale * x1);
      });
    }
    {
      const float decay = *chunk_decay;
#pragma unroll
      for (int mt = 0; mt < MTS; ++mt)
#pragma unroll
        for (int nt = 0; nt < NTV; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) S[mt][nt][e] *= decay;
    }
    warp_gemm<MTS, NTV, kC / 16, true, true>(S, Kc, ldk, Vnds, ldv, srow0, col0, lane);
    if constexpr (L::split) warp_gemm<MTS, NTV, kC / 16, true, true>(S, Kc, ldk, Vndlo, ldv, srow0, col0, lane);
    if (p.debug_S_end) {
      float* dst = p.debug_S_end + (debug_chunk * p.HV + j) * p.K * p.V + v0;
      for_each_pair(S, srow0, col0, lane, [&](int r, int col, float& x0, float& x1) {
        if (r < p.K) *reinterpret_cast<float2*>(dst + static_cast<std::int64_t>(r) * p.V + col) = make_float2(x0, x1);
      });
    }
    // S0 operand of the next chunk: its last readers (the S0 products) are behind 4 barriers.
    write_state_operand();
  }

  if (p.has_hT) {
    for_each_pair(S, srow0, col0, lane, [&](int r, int col, float& x0, float& x1) {
      if (r < p.K)
        *reinterpret_cast<float2*>(p.hT + state_base + static_cast<std::int64_t>(r) * p.V + col) = make_float2(x0, x1);
    });
  }
}

}  // namespace gdn::cuda::detail::chunked

#include "cuda/chunked/chunked_wgmma.cuh"  // chunked_forward_wg: the bf16 / fp16 forward on wgmma
#include "cuda/chunked/chunked_wgmma_transposed.cuh"  // chunked_forward_wgt: bf16 K 128 x BV 128, transposed

namespace gdn::cuda::detail::chunked {

// ----- instances and launches ---------------------------------------------------------------

template <class E, int KP, int BV>
struct Instance {
  // bf16 / fp16: the wgmma forward; fp32: chunked_forward (FMAs).
  using F = std::conditional_t<Elem<E>::tensor, WgPlan<E, KP, BV>, Plan<E, KP, BV>>;
  // The sequence split's affine pass (bf16 / fp16): its own plan, without the Vnew lo tile.
  using FA = std::conditional_t<Elem<E>::tensor, WgPlan<E, KP, BV, true>, Plan<E, KP, BV>>;
  using P = PrepPlan<E, KP, 2>;   // pairs of value heads (even GVA groups)
  using P1 = PrepPlan<E, KP, 1>;  // one value head per block
  static constexpr std::size_t shared_bytes = F::bytes;
  static constexpr int blocks_per_sm = F::min_blocks;
  // bf16 at K 128 x BV 128: the output pass transposed (chunked_wgmma_transposed.cuh); its
  // affine pass and debug mode stay chunked_forward_wg's.
  static constexpr bool transposed = std::is_same_v<E, __nv_bfloat16> && KP == 128 && BV == 128;
  static constexpr std::size_t output_bytes = [] {
    if constexpr (transposed)
      return WgtPlan<E, KP, BV>::bytes;
    else
      return F::bytes;
  }();
  // kSingle: ChunkedRounding::single (bf16 / fp16 only; fp32 has one kernel, and the host
  // rejects single rounding for it).
  template <bool kSingle = false>
  static constexpr auto forward() {
    if constexpr (transposed)
      return &chunked_forward_wgt<E, KP, BV, kSingle>;
    else if constexpr (Elem<E>::tensor)
      return &chunked_forward_wg<E, KP, BV, WgMode::output, kSingle>;
    else
      return &chunked_forward<E, KP, BV>;
  }
  // The sequence split's affine pass and the debug mode (bf16/fp16: instances of their own;
  // fp32's one kernel does both of its modes and has no split).
  template <bool kSingle = false>
  static constexpr auto affine_forward() {
    if constexpr (Elem<E>::tensor)
      return &chunked_forward_wg<E, KP, BV, WgMode::affine, kSingle>;
    else
      return &chunked_forward<E, KP, BV>;
  }
  // The fused forward (chunked_wgmma_transposed.cuh, kFused): the transposed instance only.
  static constexpr bool fusable = transposed;
  static constexpr std::size_t fused_bytes = [] {
    if constexpr (fusable)
      return WgtPlan<E, KP, BV, true>::bytes;
    else
      return std::size_t(0);
  }();
  template <bool kSingle = false>
  static constexpr auto fused_forward() {
    if constexpr (fusable)
      return &chunked_forward_wgt<E, KP, BV, kSingle, true>;
    else
      return forward<kSingle>();
  }
  static constexpr auto debug_forward() {
    if constexpr (Elem<E>::tensor)
      return &chunked_forward_wg<E, KP, BV, WgMode::debug>;
    else
      return &chunked_forward<E, KP, BV>;
  }

  // Raises the kernels' dynamic shared-memory limits (and asks for the largest shared-memory
  // carveout, for two resident blocks where the plan allows them) once per process: one device
  // per process is what the tests and benchmarks use.
  static cudaError_t configure() {
    static bool configured = false;
    if (configured) return cudaSuccess;
    cudaError_t code = cudaFuncSetAttribute(forward(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(output_bytes));
    if (code == cudaSuccess)
      code = cudaFuncSetAttribute(forward<true>(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(output_bytes));
    if (code == cudaSuccess)
      code = cudaFuncSetAttribute(affine_forward<true>(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(FA::bytes));
    if (code == cudaSuccess)
      code = cudaFuncSetAttribute(affine_forward<true>(), cudaFuncAttributePreferredSharedMemoryCarveout,
                                  static_cast<int>(cudaSharedmemCarveoutMaxShared));
    if (code == cudaSuccess)
      code = cudaFuncSetAttribute(forward<true>(), cudaFuncAttributePreferredSharedMemoryCarveout,
                                  static_cast<int>(cudaSharedmemCarveoutMaxShared));
    if (code == cudaSuccess)
      code = cudaFuncSetAttribute(debug_forward(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(F::bytes));
    if (code == cudaSuccess)
      code = cudaFuncSetAttribute(affine_forward(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(FA::bytes));
    if (code == cudaSuccess)
      code = cudaFuncSetAttribute(debug_forward(), cudaFuncAttributePreferredSharedMemoryCarveout,
                                  static_cast<int>(cudaSharedmemCarveoutMaxShared));
    if (code == cudaSuccess)
      code = cudaFuncSetAttribute(affine_forward(), cudaFuncAttributePreferredSharedMemoryCarveout,
                                  static_cast<int>(cudaSharedmemCarveoutMaxShared));
    if (code == cudaSuccess)
      code = cudaFuncSetAttribute(forward(), cudaFuncAttributePreferredSharedMemoryCarveout,
                                  static_cast<int>(cudaSharedmemCarveoutMaxShared));
    if constexpr (fusable) {
      for (auto kernel : {fused_forward<false>(), fused_forward<true>()}) {
        if (code == cudaSuccess)
          code = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(fused_bytes));
        if (code == cudaSuccess)
          code = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      static_cast<int>(cudaSharedmemCarveoutMaxShared));
      }
    }
    if (code == cudaSuccess)
      code = cudaFuncSetAttribute(chunked_prepare<E, KP, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(P::bytes));
    if (code == cudaSuccess)
      code = cudaFuncSetAttribute(chunked_prepare<E, KP, 2>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  static_cast<int>(cudaSharedmemCarveoutMaxShared));
    if (code == cudaSuccess)
      code = cudaFuncSetAttribute(chunked_prepare<E, KP, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(P1::bytes));
    if (code == cudaSuccess)
      code = cudaFuncSetAttribute(chunked_prepare<E, KP, 1>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  static_cast<int>(cudaSharedmemCarveoutMaxShared));
    if (code != cudaSuccess) return code;
    configured = true;
    return cudaSuccess;
  }

  // Offsets, prepass, forward, in stream order (no host synchronisation: capturable). With the
  // sequence split (bf16/fp16): the affine pass and the combine before the output pass.
  // `stages` (kChunkedPrepare, kChunkedForward) picks the part to enqueue: with two V tiles the
  // launcher runs the prepare stage once and the forward stage of two instances.
  static void enqueue(const ChunkedParams& params, std::int64_t blocks, std::int64_t prep_blocks, cudaStream_t stream,
                      unsigned stages) {
    if (stages & kChunkedPrepare) prepare(params, prep_blocks, stream);
    if (stages & kChunkedForward) forward_stage(params, blocks, stream);
  }
  static void prepare(const ChunkedParams& params, std::int64_t prep_blocks, cudaStream_t stream) {
    chunked_offsets<E><<<1, kOffsetThreads, 0, stream>>>(params);
    if (params.fused) return;  // the fused forward computes the records itself
    // One prepass block per (chunk, pair of value heads) when the group is even (chunked_prepare).
    if (prep_blocks > 0 && params.group % 2 == 0)
      chunked_prepare<E, KP, 2><<<static_cast<unsigned>(prep_blocks / 2), kThreads, P::bytes, stream>>>(params);
    else if (prep_blocks > 0)
      chunked_prepare<E, KP, 1><<<static_cast<unsigned>(prep_blocks), kThreads, P1::bytes, stream>>>(params);
  }
  static void forward_stage(const ChunkedParams& params, std::int64_t blocks, cudaStream_t stream) {
    if constexpr (Elem<E>::tensor) {
      if (params.split_chunks > 0) {
        const std::int64_t affine_blocks =
            params.segments * params.HV * (std::int64_t(params.affine_tiles) + params.value_tiles);
        (params.single_rounding ? affine_forward<true>() : affine_forward<false>())<<<
            static_cast<unsigned>(affine_blocks), kThreads, FA::bytes, stream>>>(params);
        const std::int64_t combine_blocks = std::int64_t(params.N) * params.HV * (params.V / kCombineColumns);
        chunked_combine<E><<<static_cast<unsigned>(combine_blocks), kCombineThreads, 0, stream>>>(params);
      }
    }
    if (params.chunk_offsets)
      debug_forward()<<<static_cast<unsigned>(blocks), kThreads, F::bytes, stream>>>(params);
    else if (fusable && params.fused)
      (params.single_rounding ? fused_forward<true>() : fused_forward<false>())<<<static_cast<unsigned>(blocks),
                                                                                 kFusedThreads, fused_bytes, stream>>>(params);
    else
      (params.single_rounding ? forward<true>() : forward<false>())<<<static_cast<unsigned>(blocks), kThreads,
                                                                     output_bytes, stream>>>(params);
  }
};

// Calls f(Instance<E, KP, BV>{}) for the instance of (key_pad, value_tile); false when there is
// none. bf16/fp16: K padded to 64 or 128, tiles of 16 to 128 (the launcher's tile_candidates
// agrees); fp32: tiles of 16 and 32 (its fp32 operands need twice the shared memory).
template <class E, class Fn>
bool for_instance(int key_pad, int value_tile, Fn&& f) {
  if (key_pad == 64 && value_tile == 16) return f(Instance<E, 64, 16>{}), true;
  if (key_pad == 64 && value_tile == 32) return f(Instance<E, 64, 32>{}), true;
  if (key_pad == 128 && value_tile == 16) return f(Instance<E, 128, 16>{}), true;
  if (key_pad == 128 && value_tile == 32) return f(Instance<E, 128, 32>{}), true;
  if constexpr (Elem<E>::tensor) {
    if (key_pad == 64 && value_tile == 64) return f(Instance<E, 64, 64>{}), true;
    if (key_pad == 64 && value_tile == 128) return f(Instance<E, 64, 128>{}), true;
    if (key_pad == 128 && value_tile == 64) return f(Instance<E, 128, 64>{}), true;
    if (key_pad == 128 && value_tile == 128) return f(Instance<E, 128, 128>{}), true;
  }
  return false;
}

// The per-type entry points of chunked_dispatch.cu (each input type's translation unit defines
// its three through these).
template <class E>
struct Entry {
  static cudaError_t configure(int key_pad, int value_tile, bool* instantiated) {
    cudaError_t code = cudaSuccess;
    *instantiated = for_instance<E>(key_pad, value_tile, [&](auto i) { code = decltype(i)::configure(); });
    return code;
  }
  static cudaError_t enqueue(int key_pad, int value_tile, const ChunkedParams& params, std::int64_t blocks,
                             std::int64_t prep_blocks, cudaStream_t stream, unsigned stages) {
    if (!for_instance<E>(key_pad, value_tile,
                         [&](auto i) { decltype(i)::enqueue(params, blocks, prep_blocks, stream, stages); }))
      return cudaErrorInvalidValue;
    return cudaGetLastError();
  }
  static std::size_t shared_bytes(int key_pad, int value_tile) {
    std::size_t bytes = 0;
    for_instance<E>(key_pad, value_tile, [&](auto i) { bytes = decltype(i)::shared_bytes; });
    return bytes;
  }
  static int blocks_per_sm(int key_pad, int value_tile) {
    int blocks = 0;
    for_instance<E>(key_pad, value_tile, [&](auto i) { blocks = decltype(i)::blocks_per_sm; });
    return blocks;
  }
  static std::size_t prepare_shared_bytes(int key_pad) {
    return key_pad == 64 ? PrepPlan<E, 64>::bytes : key_pad == 128 ? PrepPlan<E, 128>::bytes : 0;  // pairs
  }
};

}  // namespace gdn::cuda::detail::chunked
