// The chunked backward (docs/cuda_backward.md, "The chunked backward"): the adjoint of the WY
// form of docs/semantics.md §4, stage for stage the algebra of reference/backward_chunked.cpp,
// in fp32, bitwise deterministic and batch invariant. The matrix products of chunk_states,
// chunk_dstates and chunk_gradients run on the tensor cores in 3xTF32 (tf32x3.cuh: fp32's
// accuracy); chunk_prepare's products and every elementwise step run on the CUDA cores.
//
// Per chunk of C = 64 tokens of one (sequence, value head), with gamma the in-chunk cumulative
// log decay (restarting at a token whose exp(g) is 0), a_i = e^gamma_i, b_i = e^(gamma_c -
// gamma_i), E_il = e^(gamma_i - gamma_l) (all zero across a reset), Q = scale q^, K = k^:
//   A = strictly lower (beta_i E_il k_i.k_l),  T = (I + A)^-1,
//   W = T diag(beta a) K,  U = T diag(beta) V,  Vnew = U - W S0,
//   O = diag(a) Q S0 + P Vnew (P = Mask . Q K^T . E),  S_end = a_c S0 + K^T diag(b) Vnew.
//
// Stages, in launch order (between the shared prepare and finish kernels of backward_kernel.cu):
//  1. chunk_table: the chunks of every sequence (one thread; N is small).
//  2. chunk_prepare: per (chunk, value head), everything that does not need the state: gamma,
//     a, b, the segments, beta; P; T and [W | U] by forward substitution on the unit lower
//     triangle, one column per thread.
//  3. chunk_states: per (sequence, value head, 32 columns of V), the chunks in order: S0 of each
//     chunk stored, Vnew = U - W S0 stored, S advanced. The columns of the state evolve
//     independently (the recurrence mixes rows only through sums over K), so a block of columns
//     runs its whole sequence alone.
//  4. chunk_dstates: per (sequence, value head, 32 columns), the chunks in reverse: dS_end
//     stored, dVnew = diag(b) K dS_end + P^T dO stored, dS0 = a_c dS_end + Q^T diag(a) dO -
//     W^T dVnew; dh0 at the end.
//  5. chunk_gradients: per (chunk, value head), every other adjoint of the chunk (the reference's
//     loop body), the sums over V in slabs of 32 columns; dv stored, the value head's shares of
//     dq, dk, dg, dbeta to the workspace for finish_qk / finish_gates (tiles = 1).
//
// Determinism: no atomics; every sum runs in one fixed order (in-thread loops over an index,
// warp butterflies of a fixed pattern, warps in order). Nothing depends on a sequence's
// neighbours: chunks start at the sequence's first token.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/backward/backward_params.hpp"
#include "cuda/backward/tf32x3.cuh"
#include "cuda/common/element.cuh"
#include "cuda/recurrent/recurrent_params.hpp"

namespace gdn::cuda::detail {
namespace {

namespace tc = tf32x3;

constexpr int C = kChunkedBackwardChunk;
constexpr int KM = kChunkedBackwardMaxK;
constexpr int VT = kChunkedBackwardStateColumns;
constexpr int NT = kChunkedBackwardThreads;
constexpr int NS = kChunkedBackwardScalars;
constexpr int KP = KM + 1;  // pitches that keep column walks free of bank conflicts
constexpr int CP = C + 1;
constexpr int VS = 32;      // V columns per slab of chunk_gradients
// chunk_gradients' pitches: multiples of 4 floats, as the tensor cores' tile loads need, and 4
// banks apart from row to row, so a tile's 8 rows x 4 columns of a load meet 32 distinct banks.
constexpr int KQ = KM + 4;
constexpr int CQ = C + 4;
constexpr int VQ = VS + 4;
constexpr int kWarps = NT / 32;
constexpr unsigned kFull = 0xffffffffu;

static_assert(NT == 256 && C == 64 && KM == 128 && VT == 32, "the thread mappings below assume these");

// K (or c) rounded up to the tensor cores' k step of 8 (the operands are 0 past K, past c).
__device__ __forceinline__ int round8(int n) { return (n + 7) & ~7; }

__device__ __forceinline__ std::int64_t boundary(const BackwardParams& p, int n) {
  return p.cu_seqlens_64 ? static_cast<const long long*>(p.cu_seqlens)[n]
                         : static_cast<std::int64_t>(static_cast<const int*>(p.cu_seqlens)[n]);
}

__device__ __forceinline__ void store_as(void* p, int type, std::int64_t i, float x) {
  if (type == static_cast<int>(ElementType::bf16)) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
  else if (type == static_cast<int>(ElementType::f16)) static_cast<__half*>(p)[i] = __float2half_rn(x);
  else static_cast<float*>(p)[i] = x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

// The state element (row, column) of sequence n, value head j in a dense state tensor.
__device__ __forceinline__ std::int64_t state_index(const BackwardParams& p, int n, int j, int row, int column) {
  const std::int64_t head = static_cast<std::int64_t>(n) * p.HV + j;
  return p.v_major ? (head * p.V + column) * p.K + row : (head * p.K + row) * p.V + column;
}

// Offsets of chunk `ck`, value head j in the per-chunk tensors.
__device__ __forceinline__ std::int64_t slot(const BackwardParams& p, int ck, int j) {
  return static_cast<std::int64_t>(ck) * p.HV + j;
}

__global__ void chunk_table(BackwardParams p) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int ck = 0;
  for (int n = 0; n < p.N; ++n) {
    p.sequence_chunk[n] = ck;
    const std::int64_t bos = boundary(p, n), eos = boundary(p, n + 1);
    for (std::int64_t t = bos; t < eos; t += C, ++ck) {
      p.chunk_begin[ck] = t;
      p.chunk_length[ck] = static_cast<int>(eos - t < C ? eos - t : C);
    }
  }
  p.sequence_chunk[p.N] = ck;
}

// Loads the chunk's Q = scale q^ and K = k^ rows (zeros past c and past K) at pitch Pitch.
template <typename In, int Pitch>
__device__ __forceinline__ void load_qk(const BackwardParams& p, std::int64_t t0, int c, int h, float* Qs,
                                        float* Ks) {
  const In* q = static_cast<const In*>(p.q);
  const In* k = static_cast<const In*>(p.k);
  for (int e = threadIdx.x; e < C * KM; e += NT) {
    const int i = e / KM, x = e % KM;
    float qv = 0.f, kv = 0.f;
    if (i < c && x < p.K) {
      const std::int64_t th = (t0 + i) * p.H + h;
      qv = to_float(q[th * p.K + x]) * p.inv_norm_q[th] * p.scale;
      kv = to_float(k[th * p.K + x]) * p.inv_norm_k[th];
    }
    Qs[i * Pitch + x] = qv;
    Ks[i * Pitch + x] = kv;
  }
}

// E_il for l <= i of the staged chunk (1 on the diagonal, 0 across a reset).
__device__ __forceinline__ float decay_between(const float* gamma, const float* segment, int i, int l) {
  if (l == i) return 1.f;
  return segment[i] == segment[l] ? expf(gamma[i] - gamma[l]) : 0.f;
}

template <typename In>
__global__ void __launch_bounds__(NT) chunk_prepare(BackwardParams p) {
  extern __shared__ float shared[];
  float* Qs = shared;             // [C][KP]
  float* Ks = Qs + C * KP;        // [C][KP]
  float* As = Ks + C * KP;        // [C][CP]: A, strictly lower
  float* sc = As + C * CP;        // [NS][C]
  float* gamma = sc, *a = sc + C, *b = sc + 2 * C, *segment = sc + 3 * C, *beta = sc + 4 * C;
  const int ck = blockIdx.x, j = blockIdx.y;
  if (ck >= p.sequence_chunk[p.N]) return;
  const std::int64_t t0 = p.chunk_begin[ck];
  const int c = p.chunk_length[ck];
  const std::int64_t at = slot(p, ck, j);
  // The chunk's gates, loaded by one thread per token (gamma holds g until the scan).
  if (threadIdx.x < C) {
    const int i = threadIdx.x;
    gamma[i] = i < c ? p.gate_g[(t0 + i) * p.HV + j] : 0.f;
    beta[i] = i < c ? p.gate_beta[(t0 + i) * p.HV + j] : 0.f;
  }
  load_qk<In, KP>(p, t0, c, j / p.group, Qs, Ks);
  __syncthreads();
  if (threadIdx.x == 0) {
    // The cumulative log decay in token order, restarting at a token whose exp(g) is 0 in fp32
    // (reference/chunked.cpp: no -inf - (-inf), no differences of huge sums).
    float running = 0.f;
    int seg = -1;
    for (int i = 0; i < C; ++i) {
      if (i < c) {
        const float g = gamma[i];
        if (expf(g) == 0.f) {
          seg = i;
          running = 0.f;
        } else {
          running += g;
        }
        gamma[i] = running;
        segment[i] = static_cast<float>(seg);
      } else {
        segment[i] = -2.f;  // a segment of its own: every decay to or from it is 0
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < C) {
    const int i = threadIdx.x;
    a[i] = (i < c && segment[i] < 0.f) ? expf(gamma[i]) : 0.f;
    b[i] = (i < c && segment[i] == segment[c - 1]) ? expf(gamma[c - 1] - gamma[i]) : 0.f;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < NS * C; e += NT) p.chunk_scalars[at * NS * C + e] = sc[e];
  // A and P: thread (i, l), i = warp + 8 r, l = lane + 32 m; the sums over K in index order.
  {
    constexpr int R = C / kWarps, L = C / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float gk[R][L] = {}, qk[R][L] = {};
    for (int x = 0; x < p.K; ++x) {
      float kl[L];
#pragma unroll
      for (int m = 0; m < L; ++m) kl[m] = Ks[(lane + 32 * m) * KP + x];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float ki = Ks[(warp + kWarps * r) * KP + x], qi = Qs[(warp + kWarps * r) * KP + x];
#pragma unroll
        for (int m = 0; m < L; ++m) {
          gk[r][m] = fmaf(ki, kl[m], gk[r][m]);
          qk[r][m] = fmaf(qi, kl[m], qk[r][m]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int i = warp + kWarps * r;
#pragma unroll
      for (int m = 0; m < L; ++m) {
        const int l = lane + 32 * m;
        float A = 0.f, P = 0.f;
        if (i < c && l <= i) {
          const float E = decay_between(gamma, segment, i, l);
          if (l < i) A = beta[i] * E * gk[r][m];
          P = E * qk[r][m];
        }
        As[i * CP + l] = A;
        p.chunk_P[at * C * C + i * C + l] = P;
      }
    }
  }
  __syncthreads();
  // [T | W | U] = (I + A)^-1 [I | diag(beta a) K | diag(beta) V], one column per thread, by
  // forward substitution (rows in order, the sum over earlier rows in index order). The column
  // lives in registers (both loops unrolled), its right-hand side loaded before the solve.
  const In* v = static_cast<const In*>(p.v);
  const int columns = C + p.K + p.V;
  for (int col = threadIdx.x; col < columns; col += NT) {
    float x[C];
#pragma unroll
    for (int i = 0; i < C; ++i) {
      float r;
      if (i >= c) r = 0.f;
      else if (col < C) r = col == i ? 1.f : 0.f;
      else if (col < C + p.K) r = beta[i] * a[i] * Ks[i * KP + (col - C)];
      else r = beta[i] * to_float(v[((t0 + i) * p.HV + j) * p.V + (col - C - p.K)]);
      x[i] = r;
    }
#pragma unroll
    for (int i = 1; i < C; ++i)
#pragma unroll
      for (int l = 0; l < i; ++l) x[i] = fmaf(-As[i * CP + l], x[l], x[i]);
    if (col < C) {
      for (int i = 0; i < C; ++i) p.chunk_T[(at * C + i) * C + col] = x[i];
    } else if (col < C + p.K) {
      for (int i = 0; i < C; ++i) p.chunk_W[(at * C + i) * p.K + (col - C)] = x[i];
    } else {
      for (int i = 0; i < C; ++i) p.chunk_U[(at * C + i) * p.V + (col - C - p.K)] = x[i];
    }
  }
}

// Loads the chunk's W (C x K, pitch KM) and, per row, K scaled by `scale_of` (pitch KM).
template <typename In>
__device__ __forceinline__ void load_w_and_scaled_k(const BackwardParams& p, std::int64_t at, std::int64_t t0, int c,
                                                    int h, const float* row_scale, float* Ws, float* Kx) {
  const In* k = static_cast<const In*>(p.k);
  for (int e = threadIdx.x; e < C * KM; e += NT) {
    const int i = e / KM, x = e % KM;
    float w = 0.f, kv = 0.f;
    if (x < p.K) {
      w = p.chunk_W[(at * C + i) * p.K + x];
      if (i < c) {
        const std::int64_t th = (t0 + i) * p.H + h;
        kv = to_float(k[th * p.K + x]) * p.inv_norm_k[th] * row_scale[i];
      }
    }
    Ws[e] = w;
    Kx[e] = kv;
  }
}

template <typename In>
__global__ void __launch_bounds__(NT) chunk_states(BackwardParams p) {
  extern __shared__ __align__(128) float shared[];
  float* S = shared;             // [KM][VT]
  float* Ws = S + KM * VT;       // [C][KM]
  float* Kb = Ws + C * KM;       // [C][KM]: diag(b) K
  float* Us = Kb + C * KM;       // [C][VT]
  float* Vn = Us + C * VT;       // [C][VT]
  float* sc = Vn + C * VT;       // [NS][C]
  const int tiles = (p.V + VT - 1) / VT;
  const int n = blockIdx.x / tiles, tile = blockIdx.x % tiles, j = blockIdx.y, h = j / p.group;
  const int c0 = tile * VT, cols = min(VT, p.V - c0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int e = threadIdx.x; e < KM * VT; e += NT) {
    const int x = e / VT, w = e % VT;
    S[e] = (p.h0 != nullptr && x < p.K && w < cols) ? p.h0[state_index(p, n, j, x, c0 + w)] : 0.f;
  }
  for (int ck = p.sequence_chunk[n]; ck < p.sequence_chunk[n + 1]; ++ck) {
    const std::int64_t at = slot(p, ck, j), t0 = p.chunk_begin[ck];
    const int c = p.chunk_length[ck];
    __syncthreads();  // the previous chunk's readers of Ws, Kb, Us, Vn, sc are done
    for (int e = threadIdx.x; e < NS * C; e += NT) sc[e] = p.chunk_scalars[at * NS * C + e];
    __syncthreads();
    load_w_and_scaled_k<In>(p, at, t0, c, h, sc + 2 * C, Ws, Kb);
    for (int e = threadIdx.x; e < C * VT; e += NT) {
      const int i = e / VT, w = e % VT;
      Us[e] = w < cols ? p.chunk_U[(at * C + i) * p.V + c0 + w] : 0.f;
    }
    for (int e = threadIdx.x; e < KM * VT; e += NT) {
      const int x = e / VT, w = e % VT;
      if (x < p.K && w < cols) p.chunk_S0[(at * p.K + x) * p.V + c0 + w] = S[e];
    }
    __syncthreads();
    // Vnew = U - W S0, the warp's 16 x 16 tile (rows 16 (warp % 4), columns 16 (warp / 4)) on the
    // tensor cores in 3xTF32; W and S are 0 past K.
    {
      tc::Acc ws[1];
      tc::zero(ws);
      tc::product<1, tc::RowMajor, tc::RowMajor>(ws, Ws, KM, S, VT, 16 * (warp & 3), 16 * (warp >> 2), round8(p.K));
      tc::store(Vn, VT, 16 * (warp & 3), 16 * (warp >> 2), ws);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < C * VT; e += NT) {
      const int i = e / VT, w = e % VT;
      const float vn = Us[e] - Vn[e];
      Vn[e] = vn;
      if (w < cols) p.chunk_Vnew[(at * C + i) * p.V + c0 + w] = vn;
    }
    __syncthreads();
    // S_end = a_c S0 + K^T diag(b) Vnew: rows 16 warp .. + 15 of S, both column tiles, on the
    // tensor cores (K^T diag(b): Kb's column-major view; Kb and Vnew are 0 past row c). Each warp
    // scales, then updates, only its own rows of S.
    const float ac = sc[C + c - 1];
    for (int e = 16 * warp * VT + lane; e < 16 * (warp + 1) * VT; e += 32) S[e] *= ac;
    __syncwarp();
    {
      tc::Acc s[2];
      tc::load(s, S, VT, 16 * warp, 0);
      tc::product<2, tc::ColMajor, tc::RowMajor>(s, Kb, KM, Vn, VT, 16 * warp, 0, round8(c));
      tc::store(S, VT, 16 * warp, 0, s);
    }
  }
}

template <typename In>
__global__ void __launch_bounds__(NT) chunk_dstates(BackwardParams p) {
  extern __shared__ __align__(128) float shared[];
  float* dS = shared;            // [KM][VT]
  float* Ws = dS + KM * VT;      // [C][KM]
  float* Kb = Ws + C * KM;       // [C][KM]: diag(b) K
  float* Qa = Kb + C * KM;       // [C][KM]: diag(a) Q
  float* Ps = Qa + C * KM;       // [C][C]
  float* dO = Ps + C * C;        // [C][VT]
  float* dVn = dO + C * VT;      // [C][VT]
  float* sc = dVn + C * VT;      // [NS][C]
  const In* dO_in = static_cast<const In*>(p.dO);
  const In* q = static_cast<const In*>(p.q);
  const int tiles = (p.V + VT - 1) / VT;
  const int n = blockIdx.x / tiles, tile = blockIdx.x % tiles, j = blockIdx.y, h = j / p.group;
  const int c0 = tile * VT, cols = min(VT, p.V - c0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int e = threadIdx.x; e < KM * VT; e += NT) {
    const int x = e / VT, w = e % VT;
    dS[e] = (p.dhT != nullptr && x < p.K && w < cols) ? p.dhT[state_index(p, n, j, x, c0 + w)] : 0.f;
  }
  for (int ck = p.sequence_chunk[n + 1] - 1; ck >= p.sequence_chunk[n]; --ck) {
    const std::int64_t at = slot(p, ck, j), t0 = p.chunk_begin[ck];
    const int c = p.chunk_length[ck];
    __syncthreads();
    for (int e = threadIdx.x; e < NS * C; e += NT) sc[e] = p.chunk_scalars[at * NS * C + e];
    __syncthreads();
    load_w_and_scaled_k<In>(p, at, t0, c, h, sc + 2 * C, Ws, Kb);
    for (int e = threadIdx.x; e < C * KM; e += NT) {
      const int i = e / KM, x = e % KM;
      float qv = 0.f;
      if (i < c && x < p.K) {
        const std::int64_t th = (t0 + i) * p.H + h;
        qv = to_float(q[th * p.K + x]) * p.inv_norm_q[th] * p.scale * sc[C + i];
      }
      Qa[e] = qv;
    }
    for (int e = threadIdx.x; e < C * C; e += NT) Ps[e] = p.chunk_P[at * C * C + e];
    for (int e = threadIdx.x; e < C * VT; e += NT) {
      const int i = e / VT, w = e % VT;
      dO[e] = (i < c && w < cols) ? to_float(dO_in[((t0 + i) * p.HV + j) * p.V + c0 + w]) : 0.f;
    }
    for (int e = threadIdx.x; e < KM * VT; e += NT) {
      const int x = e / VT, w = e % VT;
      if (x < p.K && w < cols) p.chunk_dS[(at * p.K + x) * p.V + c0 + w] = dS[e];
    }
    __syncthreads();
    // dVnew = diag(b) K dS_end + P^T dO, the warp's 16 x 16 tile on the tensor cores in 3xTF32
    // (P^T: Ps' column-major view; P is lower triangular and 0 past row c, as K diag(b) is).
    {
      tc::Acc dv[1];
      tc::zero(dv);
      tc::product<1, tc::RowMajor, tc::RowMajor>(dv, Kb, KM, dS, VT, 16 * (warp & 3), 16 * (warp >> 2), round8(p.K));
      tc::product<1, tc::ColMajor, tc::RowMajor>(dv, Ps, C, dO, VT, 16 * (warp & 3), 16 * (warp >> 2), round8(c));
      tc::store(dVn, VT, 16 * (warp & 3), 16 * (warp >> 2), dv);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < C * VT; e += NT) {
      const int i = e / VT, w = e % VT;
      const float v = i < c ? dVn[e] : 0.f;
      dVn[e] = v;
      if (w < cols) p.chunk_dVnew[(at * C + i) * p.V + c0 + w] = v;
    }
    __syncthreads();
    // dS0 = a_c dS_end + Q^T diag(a) dO - W^T dVnew: rows 16 warp .. + 15 of dS, both column
    // tiles (Q^T diag(a), W^T: the column-major views of Qa, Ws). Each warp scales, then
    // updates, only its own rows of dS.
    const float ac = sc[C + c - 1];
    for (int e = 16 * warp * VT + lane; e < 16 * (warp + 1) * VT; e += 32) dS[e] *= ac;
    __syncwarp();
    {
      tc::Acc s[2], t[2];
      tc::load(s, dS, VT, 16 * warp, 0);
      tc::product<2, tc::ColMajor, tc::RowMajor>(s, Qa, KM, dO, VT, 16 * warp, 0, round8(c));
      tc::zero(t);
      tc::product<2, tc::ColMajor, tc::RowMajor>(t, Ws, KM, dVn, VT, 16 * warp, 0, round8(c));
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < t[n].num_elements; ++e) s[n].x[e] -= t[n].x[e];
      tc::store(dS, VT, 16 * warp, 0, s);
    }
  }
  __syncthreads();
  if (p.dh0 != nullptr) {
    for (int e = threadIdx.x; e < KM * VT; e += NT) {
      const int x = e / VT, w = e % VT;
      if (x < p.K && w < cols) p.dh0[state_index(p, n, j, x, c0 + w)] = dS[e];
    }
  }
}

// The fixed-order sum over the block of one value per thread, in every thread.
__device__ __forceinline__ float block_total(float x, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  x = warp_sum(x);
  __syncthreads();
  if (lane == 0) red[warp] = x;
  __syncthreads();
  float s = red[0];
  for (int w = 1; w < kWarps; ++w) s += red[w];
  return s;
}

// chunk_gradients: per (chunk, value head), every other adjoint of the chunk (the reference's loop
// body). Its 12 matrix products run on the tensor cores in 3xTF32 (tf32x3.cuh), each warp owning
// fixed 16 x 16 output tiles: a C x K product's tiles (row tile warp % 4, column tiles
// 4 (warp / 4) .. + 3), a C x C product's (row tile warp % 4, column tiles 2 (warp / 4) .. + 1).
// Products read their operands from shared memory (T from the workspace) and hand results over
// through shared memory; the elementwise steps between them (decays, masks, row dots) stay on the
// CUDA cores. Sums run in one fixed order: the tensor cores' k steps in order, slabs of V in
// order, in-thread loops over an index, fixed warp butterflies.
template <typename In>
__global__ void __launch_bounds__(NT, 1) chunk_gradients(BackwardParams p) {
  extern __shared__ __align__(128) float shared[];
  float* Qs = shared;              // [C][KQ]
  float* Ks = Qs + C * KQ;         // [C][KQ]
  float* QKs = Ks + C * KQ;        // [C][CQ]: Q K^T, later dE
  float* Gks = QKs + C * CQ;       // [C][CQ]: K K^T, later dGk
  float* sc = Gks + C * CQ;        // [NS][C]
  float* gamma = sc, *a = sc + C, *b = sc + 2 * C, *segment = sc + 3 * C, *beta = sc + 4 * C;
  float* da = sc + NS * C;         // [C]
  float* db = da + C;              // [C]
  float* dbeta = db + C;           // [C]
  float* red = dbeta + C;          // [32]
  float* work = red + 32;
  // The slab phase's buffers ...
  float* S0s = work;               // [KM][VQ]
  float* dSs = S0s + KM * VQ;      // [KM][VQ]
  float* dOs = dSs + KM * VQ;      // [C][VQ]
  float* Vns = dOs + C * VQ;       // [C][VQ]
  float* dVns = Vns + C * VQ;      // [C][VQ]
  float* Us = dVns + C * VQ;       // [C][VQ]
  float* Vs = Us + C * VQ;         // [C][VQ]
  float* dYs = Vs + C * VQ;        // [C][VQ]
  // ... and, over them, the closing phase's.
  float* G1s = work;               // [C][KQ]: dO S0^T, then dq's share; later W; later dA [C][CQ]
  float* G2s = G1s + C * KQ;       // [C][KQ]: Vnew dS^T, then dk's share
  float* dWs = G2s + C * KQ;       // [C][KQ]: dW, later dX
  float* dPs = dWs + C * KQ;       // [C][CQ]: dP, later dQK, later dGk + dGk^T
  float* Ws = G1s;
  float* dAs = G1s;

  const In* v_in = static_cast<const In*>(p.v);
  const In* dO_in = static_cast<const In*>(p.dO);
  const int ck = blockIdx.x, j = blockIdx.y;
  if (ck >= p.sequence_chunk[p.N]) return;
  const std::int64_t t0 = p.chunk_begin[ck];
  const int c = p.chunk_length[ck];
  const std::int64_t at = slot(p, ck, j);
  const float* Tg = p.chunk_T + at * C * C;  // T, row-major [C][C]; T^T is its column-major view
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int R = C / kWarps;   // rows per thread in the row steps: i = warp + 8 r
  constexpr int M = KM / 32;      // K columns per thread there: x = lane + 32 m
  const int r0 = 16 * (warp & 3);           // the warp's row tile
  const int xc0 = 64 * (warp >> 2);         // its C x K column tiles: xc0 .. xc0 + 63
  const int lc0 = 32 * (warp >> 2);         // its C x C column tiles: lc0 .. lc0 + 31
  const int k8 = round8(p.K), c8 = round8(c);

  load_qk<In, KQ>(p, t0, c, j / p.group, Qs, Ks);
  for (int e = threadIdx.x; e < NS * C; e += NT) sc[e] = p.chunk_scalars[at * NS * C + e];
  if (threadIdx.x < C) da[threadIdx.x] = db[threadIdx.x] = dbeta[threadIdx.x] = 0.f;
  __syncthreads();
  {
    // K K^T and Q K^T (the B operand K^T is Ks' column-major view).
    tc::Acc gk[2], qk[2];
    tc::zero(gk);
    tc::zero(qk);
    for (int k = 0; k < k8; k += 8) {
      tc::SplitA<tc::RowMajor> ak, aq;
      ak.load(tc::at<tc::RowMajor>(Ks, KQ, r0, k), KQ);
      aq.load(tc::at<tc::RowMajor>(Qs, KQ, r0, k), KQ);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        tc::SplitB<tc::ColMajor> bk;
        bk.load(tc::at<tc::ColMajor>(Ks, KQ, k, lc0 + 16 * n), KQ);
        tc::mma(gk[n], ak, bk);
        tc::mma(qk[n], aq, bk);
      }
    }
    tc::store(Gks, CQ, r0, lc0, gk);
    tc::store(QKs, CQ, r0, lc0, qk);
  }

  // The slab phase: every product that sums over V, in slabs of VS columns.
  tc::Acc G1[4], G2[4], dWn[4], dP[2], dA[2];  // dA holds dY U^T (negated at the end)
  tc::zero(G1);
  tc::zero(G2);
  tc::zero(dWn);
  tc::zero(dP);
  tc::zero(dA);
  float sds = 0.f;          // this thread's share of <dS_end, S0>
  float dbeta_v = 0.f;      // thread i < C: V_i . dY_i over the slabs
  for (int v0 = 0; v0 < p.V; v0 += VS) {
    const int vs = min(VS, p.V - v0);
    __syncthreads();  // the previous slab's readers are done
    for (int e = threadIdx.x; e < KM * VS; e += NT) {
      const int x = e / VS, w = e % VS;
      float s0 = 0.f, ds = 0.f;
      if (x < p.K && w < vs) {
        s0 = p.chunk_S0[(at * p.K + x) * p.V + v0 + w];
        ds = p.chunk_dS[(at * p.K + x) * p.V + v0 + w];
      }
      S0s[x * VQ + w] = s0;
      dSs[x * VQ + w] = ds;
      sds = fmaf(s0, ds, sds);
    }
    for (int e = threadIdx.x; e < C * VS; e += NT) {
      const int i = e / VS, w = e % VS;
      float o = 0.f, vn = 0.f, dvn = 0.f, u = 0.f, vv = 0.f;
      if (w < vs) {
        const std::int64_t row = (at * C + i) * p.V + v0 + w;
        vn = p.chunk_Vnew[row];
        dvn = p.chunk_dVnew[row];
        u = p.chunk_U[row];
        if (i < c) {
          const std::int64_t tv = ((t0 + i) * p.HV + j) * p.V + v0 + w;
          o = to_float(dO_in[tv]);
          vv = to_float(v_in[tv]);
        }
      }
      dOs[i * VQ + w] = o;
      Vns[i * VQ + w] = vn;
      dVns[i * VQ + w] = dvn;
      Us[i * VQ + w] = u;
      Vs[i * VQ + w] = vv;
    }
    __syncthreads();
    {
      // dY = T^T dU (dU = dVnew), the warp's tile (r0, 16 (warp / 4)); T is 0 past row c.
      tc::Acc y[1];
      tc::zero(y);
      tc::product<1, tc::ColMajor, tc::RowMajor>(y, Tg, C, dVns, VQ, r0, 16 * (warp >> 2), c8);
      tc::store(dYs, VQ, r0, 16 * (warp >> 2), y);
    }
    __syncthreads();  // dYs complete
    // dv = diag(beta) dY; dbeta += V . dY (thread i, the columns in order).
    for (int e = threadIdx.x; e < C * VS; e += NT) {
      const int i = e / VS, w = e % VS;
      if (i < c && w < vs) store_as(p.dv, p.input_type, ((t0 + i) * p.HV + j) * p.V + v0 + w, beta[i] * dYs[i * VQ + w]);
    }
    if (threadIdx.x < C) {
      const int i = threadIdx.x;
      for (int w = 0; w < vs; ++w) dbeta_v = fmaf(Vs[i * VQ + w], dYs[i * VQ + w], dbeta_v);
    }
    // dO S0^T, Vnew dS^T, dVnew S0^T (C x K); dO Vnew^T, dY U^T (C x C). The B operands are the
    // column-major views of S0s, dSs, Vns, Us.
    for (int k = 0; k < VS; k += 8) {
      tc::SplitA<tc::RowMajor> ao, avn, advn, ay;
      ao.load(tc::at<tc::RowMajor>(dOs, VQ, r0, k), VQ);
      avn.load(tc::at<tc::RowMajor>(Vns, VQ, r0, k), VQ);
      advn.load(tc::at<tc::RowMajor>(dVns, VQ, r0, k), VQ);
      ay.load(tc::at<tc::RowMajor>(dYs, VQ, r0, k), VQ);
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        tc::SplitB<tc::ColMajor> bs, bd;
        bs.load(tc::at<tc::ColMajor>(S0s, VQ, k, xc0 + 16 * n), VQ);
        bd.load(tc::at<tc::ColMajor>(dSs, VQ, k, xc0 + 16 * n), VQ);
        tc::mma(G1[n], ao, bs);
        tc::mma(dWn[n], advn, bs);
        tc::mma(G2[n], avn, bd);
      }
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        tc::SplitB<tc::ColMajor> bv, bu;
        bv.load(tc::at<tc::ColMajor>(Vns, VQ, k, lc0 + 16 * n), VQ);
        bu.load(tc::at<tc::ColMajor>(Us, VQ, k, lc0 + 16 * n), VQ);
        tc::mma(dP[n], ao, bv);
        tc::mma(dA[n], ay, bu);
      }
    }
  }
  const float dS_dot_S0 = block_total(sds, red);  // its barriers also end the slab phase
  tc::negate(dWn);  // dW = -dVnew S0^T
  tc::store(G1s, KQ, r0, xc0, G1);
  tc::store(G2s, KQ, r0, xc0, G2);
  tc::store(dWs, KQ, r0, xc0, dWn);
  tc::store(dPs, CQ, r0, lc0, dP);
  __syncthreads();

  // da_i = Q_i . (dO S0^T)_i (+ <dS_end, S0> for the last token), db_i = K_i . (Vnew dS^T)_i,
  // dbeta_i = V_i . dY_i so far.
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = warp + kWarps * r;
    float sa = 0.f, sb = 0.f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      sa = fmaf(Qs[i * KQ + lane + 32 * m], G1s[i * KQ + lane + 32 * m], sa);
      sb = fmaf(Ks[i * KQ + lane + 32 * m], G2s[i * KQ + lane + 32 * m], sb);
    }
    sa = warp_sum(sa);
    sb = warp_sum(sb);
    if (lane == 0) {
      da[i] = (i == c - 1) ? sa + dS_dot_S0 : sa;
      db[i] = sb;
    }
  }
  if (threadIdx.x < C) dbeta[threadIdx.x] = dbeta_v;
  __syncthreads();
  // G1 *= a, G2 *= b per row (they become dq's and dk's shares); dQK = dP . E and dE = dP . QK on
  // the lower triangle (in place: dPs, QKs).
  for (int e = threadIdx.x; e < C * KM; e += NT) {
    const int i = e / KM, x = e % KM;
    G1s[i * KQ + x] *= a[i];
    G2s[i * KQ + x] *= b[i];
  }
  for (int e = threadIdx.x; e < C * C; e += NT) {
    const int i = e / C, l = e % C;
    float dqk = 0.f, dE = 0.f;
    if (i < c && l <= i) {
      const float E = decay_between(gamma, segment, i, l);
      dqk = dPs[i * CQ + l] * E;
      dE = dPs[i * CQ + l] * QKs[i * CQ + l];
    }
    dPs[i * CQ + l] = dqk;
    QKs[i * CQ + l] = dE;
  }
  __syncthreads();
  {
    // dX = T^T dW, into dWs once every warp has read dW.
    tc::Acc dX[4];
    tc::zero(dX);
    tc::product<4, tc::ColMajor, tc::RowMajor>(dX, Tg, C, dWs, KQ, r0, xc0, c8);
    // dq's share += dQK K; dk's share += dQK^T Q (dQK^T: dPs' column-major view).
    tc::Acc g[4];
    tc::load(g, G1s, KQ, r0, xc0);
    tc::product<4, tc::RowMajor, tc::RowMajor>(g, dPs, CQ, Ks, KQ, r0, xc0, c8);
    tc::store(G1s, KQ, r0, xc0, g);
    tc::load(g, G2s, KQ, r0, xc0);
    tc::product<4, tc::ColMajor, tc::RowMajor>(g, dPs, CQ, Qs, KQ, r0, xc0, c8);
    tc::store(G2s, KQ, r0, xc0, g);
    __syncthreads();  // every read of dW done
    tc::store(dWs, KQ, r0, xc0, dX);
  }
  __syncthreads();
  // dq's share is complete.
  for (int e = threadIdx.x; e < C * KM; e += NT) {
    const int i = e / KM, x = e % KM;
    if (i < c && x < p.K) p.part_dq[((t0 + i) * p.HV + j) * p.K + x] = G1s[i * KQ + x];
  }
  // kx_i = K_i . dX_i: dbeta_i += a_i kx_i, da_i += beta_i kx_i; dk's share += beta_i a_i dX_i.
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = warp + kWarps * r;
    float kx = 0.f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int x = lane + 32 * m;
      const float dx = dWs[i * KQ + x];
      kx = fmaf(Ks[i * KQ + x], dx, kx);
      G2s[i * KQ + x] = fmaf(beta[i] * a[i], dx, G2s[i * KQ + x]);
    }
    kx = warp_sum(kx);
    if (lane == 0) {
      dbeta[i] = fmaf(a[i], kx, dbeta[i]);
      da[i] = fmaf(beta[i], kx, da[i]);
    }
  }
  __syncthreads();  // dq's share stored: W replaces it
  for (int e = threadIdx.x; e < C * KM; e += NT) {
    const int i = e / KM, x = e % KM;
    Ws[i * KQ + x] = x < p.K ? p.chunk_W[(at * C + i) * p.K + x] : 0.f;
  }
  __syncthreads();
  // dA = -(dY U^T + dX W^T) (W^T: Ws' column-major view), into dAs once every warp has read W.
  tc::product<2, tc::RowMajor, tc::ColMajor>(dA, dWs, KQ, Ws, KQ, r0, lc0, k8);
  tc::negate(dA);
  __syncthreads();
  tc::store(dAs, CQ, r0, lc0, dA);
  __syncthreads();
  // A_il = beta_i E_il (k_i . k_l), strictly lower within the chunk: dbeta_i += dA E Gk (per
  // element, summed below), dE += dA beta Gk, dGk = dA beta E (in place over Gks; dAs keeps the
  // dbeta terms).
  for (int e = threadIdx.x; e < C * C; e += NT) {
    const int i = e / C, l = e % C;
    float dGk = 0.f, term = 0.f;
    if (i < c && l < i) {
      const float E = decay_between(gamma, segment, i, l);
      const float dAv = dAs[i * CQ + l], gk = Gks[i * CQ + l];
      term = dAv * E * gk;
      QKs[i * CQ + l] = fmaf(dAv * beta[i], gk, QKs[i * CQ + l]);
      dGk = dAv * beta[i] * E;
    }
    dAs[i * CQ + l] = term;
    Gks[i * CQ + l] = dGk;
  }
  __syncthreads();
  if (threadIdx.x < C) {
    const int i = threadIdx.x;
    float s = dbeta[i];
    for (int l = 0; l < i; ++l) s += dAs[i * CQ + l];
    dbeta[i] = s;
  }
  // dGk + dGk^T (into dPs: dQK is no longer needed).
  for (int e = threadIdx.x; e < C * C; e += NT) {
    const int i = e / C, l = e % C;
    dPs[i * CQ + l] = Gks[i * CQ + l] + Gks[l * CQ + i];
  }
  __syncthreads();
  {
    // dk's share += (dGk + dGk^T) K.
    tc::Acc g[4];
    tc::load(g, G2s, KQ, r0, xc0);
    tc::product<4, tc::RowMajor, tc::RowMajor>(g, dPs, CQ, Ks, KQ, r0, xc0, c8);
    tc::store(G2s, KQ, r0, xc0, g);
  }
  __syncthreads();  // da, db, dbeta, dE, dk's share complete
  for (int e = threadIdx.x; e < C * KM; e += NT) {
    const int i = e / KM, x = e % KM;
    if (i < c && x < p.K) p.part_dk[((t0 + i) * p.HV + j) * p.K + x] = G2s[i * KQ + x];
  }
  // dg_l = sum_{i >= l} a_i da_i + sum_{m < l} b_m db_m + sum_{m < l <= i} E_im dE_im, in closed
  // form (reference/backward_chunked.cpp says why not from dgamma); 0 for a reset token.
  if (threadIdx.x < c) {
    const int l = threadIdx.x;
    float s = 0.f;
    for (int i = c - 1; i >= l; --i) s = fmaf(a[i], da[i], s);
    for (int m = 0; m < l; ++m) {
      s = fmaf(b[m], db[m], s);
      for (int i = c - 1; i >= l; --i) s = fmaf(decay_between(gamma, segment, i, m), QKs[i * CQ + m], s);
    }
    const bool reset = segment[l] == static_cast<float>(l);
    const std::int64_t tj = (t0 + l) * p.HV + j;
    p.part_dg[tj] = reset ? 0.f : s;
    p.part_dbeta[tj] = dbeta[l];
  }
}

void check_launch(const char* what) {
  const cudaError_t code = cudaGetLastError();
  if (code != cudaSuccess)
    throw std::runtime_error(std::string("gdn::cuda: launching ") + what + ": " + cudaGetErrorString(code));
}

template <typename Kernel>
void allow_shared(Kernel kernel, std::size_t bytes, const char* what) {
  const cudaError_t code = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (code != cudaSuccess)
    throw std::runtime_error(std::string("gdn::cuda: cudaFuncSetAttribute(") + what + "): " + cudaGetErrorString(code));
}

constexpr std::size_t kPrepareShared = sizeof(float) * (2 * C * KP + C * CP + NS * C);
constexpr std::size_t kStatesShared = sizeof(float) * (KM * VT + 2 * C * KM + 2 * C * VT + NS * C);
constexpr std::size_t kDstatesShared = sizeof(float) * (KM * VT + 3 * C * KM + C * C + 2 * C * VT + NS * C);
constexpr std::size_t kSlabFloats = 2 * KM * VQ + 6 * C * VQ;
constexpr std::size_t kClosingFloats = 3 * C * KQ + C * CQ;
constexpr std::size_t kGradientsShared =
    sizeof(float) * (2 * C * KQ + 2 * C * CQ + NS * C + 3 * C + 32 +
                     (kSlabFloats > kClosingFloats ? kSlabFloats : kClosingFloats));
static_assert(kGradientsShared <= 227 * 1024, "chunk_gradients exceeds Hopper's shared memory per block");

template <typename In>
void launch_stages(const BackwardParams& p, cudaStream_t stream) {
  allow_shared(chunk_prepare<In>, kPrepareShared, "chunk_prepare");
  allow_shared(chunk_states<In>, kStatesShared, "chunk_states");
  allow_shared(chunk_dstates<In>, kDstatesShared, "chunk_dstates");
  allow_shared(chunk_gradients<In>, kGradientsShared, "chunk_gradients");
  if (p.N == 0) return;
  chunk_table<<<1, 32, 0, stream>>>(p);
  check_launch("chunk_table");
  if (p.max_chunks == 0) return;
  const dim3 chunks(static_cast<unsigned>(p.max_chunks), static_cast<unsigned>(p.HV));
  const int tiles = (p.V + VT - 1) / VT;
  const dim3 columns(static_cast<unsigned>(static_cast<std::int64_t>(p.N) * tiles), static_cast<unsigned>(p.HV));
  chunk_prepare<In><<<chunks, NT, kPrepareShared, stream>>>(p);
  check_launch("chunk_prepare");
  chunk_states<In><<<columns, NT, kStatesShared, stream>>>(p);
  check_launch("chunk_states");
  chunk_dstates<In><<<columns, NT, kDstatesShared, stream>>>(p);
  check_launch("chunk_dstates");
  chunk_gradients<In><<<chunks, NT, kGradientsShared, stream>>>(p);
  check_launch("chunk_gradients");
}

}  // namespace

void launch_chunked_backward_kernels(const BackwardParams& p, cudaStream_t stream) {
  launch_backward_prepare(p, stream);
  if (p.input_type == static_cast<int>(ElementType::bf16)) launch_stages<__nv_bfloat16>(p, stream);
  else if (p.input_type == static_cast<int>(ElementType::f16)) launch_stages<__half>(p, stream);
  else launch_stages<float>(p, stream);
  launch_backward_finish(p, stream);
}

}  // namespace gdn::cuda::detail
