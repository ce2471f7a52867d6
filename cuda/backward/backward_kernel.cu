// The backward of the gated delta rule (docs/semantics.md §6, docs/cuda_backward.md): the
// reverse sweep of the sequential adjoint, in fp32, bitwise deterministic.
//
// Kernels, in launch order:
//  1. prepare_norms / prepare_gates: per (token, head) the inverse l2 norms of q and k and per
//     (token, value head) g and beta in fp32 (given, or from the fused gates of §3).
//  2. backward_sweep: one block per (sequence, value head, tile of 16 V columns), one thread
//     per row of K holding its 16 columns of the state in registers. The columns of the state
//     evolve independently (§2 mixes rows only through p = Sd^T k, a sum over K), so a tile is
//     the whole recurrence of its columns; only the gradients summed over V (dq, dk, dg, dbeta)
//     need the other tiles, and each tile writes its share to the workspace.
//     The states the reverse sweep needs are recomputed: a forward pass stores the state every
//     64 tokens in the workspace; per segment of 64 tokens a second pass stores it every 8 tokens
//     in shared memory (each thread its own row); per chunk of 8 tokens a third pass keeps the
//     8 decayed states Sd_t in registers, and the reverse steps of §6 run over them.
//  3. finish_qk: per (token, q/k head), the tiles' and the group's value heads' shares of dq and
//     dk summed in a fixed order, the scale, the l2norm's Jacobian.
//     finish_gates: per (token, value head), dg and dbeta summed over the tiles, the fused
//     gates' chain rule. head_sums: dA_log and ddt_bias, one block per value head.
//
// Determinism: no atomics anywhere; every sum has one fixed order (in-thread loops, warp
// butterflies of a fixed pattern, then the warps' partial sums added in warp order), and no
// order depends on the batch: a sequence's gradients are the same bits whatever its neighbours.
// (dA_log and ddt_bias are sums over all tokens of the batch by definition.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/backward/backward_params.hpp"
#include "cuda/common/element.cuh"
#include "cuda/recurrent/recurrent_params.hpp"

namespace gdn::cuda::detail {
namespace {

constexpr int W = kBackwardTileColumns;
constexpr int C = kBackwardChunk;
constexpr int L = kBackwardSegment;
constexpr int kMaxWarps = kBackwardMaxThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

static_assert(W == 16, "column_sum's butterfly maps 16 columns onto 32 lanes");
static_assert(C == 8, "chunk_sum's butterfly maps 8 tokens onto 32 lanes");
static_assert(L % C == 0, "a segment is whole chunks");

__device__ __forceinline__ float load_float(const void* p, int type, std::int64_t i) {
  if (type == static_cast<int>(ElementType::bf16)) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if (type == static_cast<int>(ElementType::f16)) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

__device__ __forceinline__ void store_float(void* p, int type, std::int64_t i, float x) {
  if (type == static_cast<int>(ElementType::bf16)) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
  else if (type == static_cast<int>(ElementType::f16)) static_cast<__half*>(p)[i] = __float2half_rn(x);
  else static_cast<float*>(p)[i] = x;
}

__device__ __forceinline__ std::int64_t boundary(const BackwardParams& p, int n) {
  return p.cu_seqlens_64 ? static_cast<const long long*>(p.cu_seqlens)[n]
                         : static_cast<std::int64_t>(static_cast<const int*>(p.cu_seqlens)[n]);
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }

// One round of a halving butterfly: lanes with `offset` set keep the upper half of the N
// values, the others the lower half, each adding its partner's copy of the half it keeps.
template <int N, int Len>
__device__ __forceinline__ void halve(float (&x)[Len], int lane, int offset) {
  const bool upper = (lane & offset) != 0;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const float send = upper ? x[i] : x[i + N / 2];
    const float keep = upper ? x[i + N / 2] : x[i];
    x[i] = keep + __shfl_xor_sync(kFull, send, offset);
  }
}

// out[w] = the sum of x[w] over the block's threads, for each of the W columns, in every
// thread. Within a warp a halving butterfly (lane l ends with column (l >> 1) & 15, summed over
// the warp), then the warps' sums added in warp order from shared memory. `red` has two
// buffers of kMaxWarps x W; alternating them between calls needs one barrier per call.
__device__ __forceinline__ void column_sum(float (&x)[W], float (&out)[W], float* red, int& buffer, int warp,
                                           int lane, int warps) {
  halve<16>(x, lane, 16);
  halve<8>(x, lane, 8);
  halve<4>(x, lane, 4);
  halve<2>(x, lane, 2);
  x[0] += __shfl_xor_sync(kFull, x[0], 1);
  float* r = red + buffer * kMaxWarps * W;
  if ((lane & 1) == 0) r[warp * W + ((lane >> 1) & 15)] = x[0];
  __syncthreads();
#pragma unroll
  for (int w = 0; w < W; ++w) out[w] = r[w];
  for (int i = 1; i < warps; ++i) {
#pragma unroll
    for (int w = 0; w < W; ++w) out[w] += r[i * W + w];
  }
  buffer ^= 1;
}

// The sum over the block of one value per thread, in every thread (same pattern as above).
__device__ __forceinline__ float block_sum(float x, float* red, int warp, int lane, int warps) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  if (lane == 0) red[warp] = x;
  __syncthreads();
  float s = red[0];
  for (int i = 1; i < warps; ++i) s += red[i];
  return s;
}

__global__ void prepare_norms(BackwardParams p) {
  const std::int64_t item = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (item >= p.T * p.H) return;  // uniform per warp
  if (!p.l2norm) {
    if (lane == 0) p.inv_norm_q[item] = p.inv_norm_k[item] = 1.f;
    return;
  }
  float sq = 0.f, sk = 0.f;
  const std::int64_t base = item * p.K;
  for (int i = lane; i < p.K; i += 32) {
    const float xq = load_float(p.q, p.input_type, base + i);
    const float xk = load_float(p.k, p.input_type, base + i);
    sq = fmaf(xq, xq, sq);
    sk = fmaf(xk, xk, sk);
  }
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) {
    sq += __shfl_xor_sync(kFull, sq, o);
    sk += __shfl_xor_sync(kFull, sk, o);
  }
  if (lane == 0) {
    p.inv_norm_q[item] = 1.f / sqrtf(sq + 1e-6f);
    p.inv_norm_k[item] = 1.f / sqrtf(sk + 1e-6f);
  }
}

__global__ void prepare_gates(BackwardParams p) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.T * p.HV) return;
  const int j = static_cast<int>(i % p.HV);
  float g, beta;
  if (!p.fused_gates) {
    g = load_float(p.g, p.gate_type, i);
    beta = load_float(p.beta, p.gate_type, i);
  } else {
    // §3: g = -exp(A_log) softplus(a + dt_bias) (softplus(x) = x for x > 20, as the reference),
    // beta = sigmoid(b), x2 with negative eigenvalues.
    const float x = load_float(p.a, p.gate_type, i) + p.dt_bias[j];
    const float softplus = x > 20.f ? x : log1pf(expf(x));
    g = -expf(p.A_log[j]) * softplus;
    beta = sigmoid_f(load_float(p.b, p.gate_type, i)) * (p.negative_eigenvalues ? 2.f : 1.f);
  }
  p.gate_g[i] = g;
  p.gate_beta[i] = beta;
}

// The state element (row, column) of sequence n, value head j in a dense state tensor.
__device__ __forceinline__ std::int64_t state_index(const BackwardParams& p, int n, int j, int row, int column) {
  const std::int64_t head = static_cast<std::int64_t>(n) * p.HV + j;
  return p.v_major ? (head * p.V + column) * p.K + row : (head * p.K + row) * p.V + column;
}

template <typename In>
__global__ void __launch_bounds__(kBackwardMaxThreads) backward_sweep(BackwardParams p) {
  extern __shared__ float shared[];
  float* red = shared;                          // [2][kMaxWarps][W]: column_sum
  float* chunk_red = red + 2 * kMaxWarps * W;   // [kMaxWarps][C]: the chunk's dg sums
  float* us = chunk_red + kMaxWarps * C;        // [C][W]: u_t of the chunk's tokens
  float* ps = us + C * W;                       // [C][W]: p_t
  float* vs = ps + C * W;                       // [C][W]: the chunk's v tile (staged)
  float* dos = vs + C * W;                      // [C][W]: the chunk's dO tile (staged)
  float* alphas = dos + C * W;                  // [C]: exp(g) of the chunk's tokens
  float* betas = alphas + C;                    // [C]: beta
  float* ks = betas + C;                        // [C][threads]: k^ of the chunk (each thread its row)
  float* qs_all = ks + C * blockDim.x;          // [C][threads]: scale q^
  float* sub = qs_all + C * blockDim.x;         // [L / C][W][threads]: states at chunk starts

  const In* q_in = static_cast<const In*>(p.q);
  const In* k_in = static_cast<const In*>(p.k);
  const In* v_in = static_cast<const In*>(p.v);
  const In* dO_in = static_cast<const In*>(p.dO);
  const int n = static_cast<int>(blockIdx.x / p.tiles);
  const int tile = static_cast<int>(blockIdx.x % p.tiles);
  const int j = blockIdx.y;
  const int h = j / p.group;
  const int row = threadIdx.x, warp = row >> 5, lane = row & 31, warps = blockDim.x >> 5;
  const int threads = blockDim.x;
  const bool active = row < p.K;
  const int c0 = tile * W;
  const int columns = min(W, p.V - c0);
  const std::int64_t bos = boundary(p, n), eos = boundary(p, n + 1), len = eos - bos;
  int buffer = 0;

  // Phase 0: the state before the sequence (h0, or zero) and dS = dhT (or zero).
  auto load_dense = [&](const float* source, float (&x)[W]) {
#pragma unroll
    for (int w = 0; w < W; ++w)
      x[w] = (source != nullptr && active && w < columns) ? source[state_index(p, n, j, row, c0 + w)] : 0.f;
  };
  // Checkpoint i >= 1 of the sequence (the state before token bos + i L): slot bos / L + i - 1.
  // The slots of consecutive sequences do not overlap (floor((bos + len) / L) >=
  // floor(bos / L) + floor((len - 1) / L)) and there are at most T / L of them.
  auto checkpoint = [&](std::int64_t i, int w) -> std::int64_t {
    const std::int64_t slot = bos / L + i - 1;
    return ((slot * p.HV + j) * p.K + row) * p.V + c0 + w;
  };

  // Stages the inputs of the `count` tokens from cb on into shared memory, every load issued
  // before any is used, so that a chunk waits for one round of global latency rather than a
  // chain of them per token. The leading barrier keeps the previous chunk's readers ahead of the
  // writes; the trailing one publishes the stage. Tokens past `count` stage zeros.
  auto stage = [&](std::int64_t cb, int count, bool reverse) {
    float kr[C], qr[C];
#pragma unroll
    for (int i = 0; i < C; ++i) {
      const std::int64_t th = (cb + i) * p.H + h;
      const bool live = active && i < count;
      kr[i] = live ? to_float(k_in[th * p.K + row]) * p.inv_norm_k[th] : 0.f;
      qr[i] = (live && reverse) ? to_float(q_in[th * p.K + row]) * p.inv_norm_q[th] * p.scale : 0.f;
    }
    // The C x W tile: element e = i W + w, thread row takes e = row + r threads (at most
    // C W / 32 of them, with 32 threads).
    constexpr int kTileLoads = (C * W + 31) / 32;
    float vr[kTileLoads], dr[kTileLoads];
#pragma unroll
    for (int r = 0; r < kTileLoads; ++r) {
      const int e = row + r * threads, i = e / W, w = e % W;
      const bool live = e < C * W && i < count && w < columns;
      const std::int64_t at = ((cb + i) * p.HV + j) * p.V + c0 + w;
      vr[r] = live ? to_float(v_in[at]) : 0.f;
      dr[r] = (live && reverse) ? to_float(dO_in[at]) : 0.f;
    }
    float ar = 0.f, br = 0.f;
    if (row < C && row < count) {
      const std::int64_t tj = (cb + row) * p.HV + j;
      ar = expf(p.gate_g[tj]);
      br = p.gate_beta[tj];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < C; ++i) {
      ks[i * threads + row] = kr[i];
      qs_all[i * threads + row] = qr[i];
    }
#pragma unroll
    for (int r = 0; r < kTileLoads; ++r) {
      const int e = row + r * threads;
      if (e < C * W) {
        vs[e] = vr[r];
        dos[e] = dr[r];
      }
    }
    if (row < C) {
      alphas[row] = ar;
      betas[row] = br;
    }
    __syncthreads();
  };

  // One forward step of §2 for the staged token i on the state tile S; Sd (optional) receives
  // alpha S_{t-1}, and with `record`, threads < W store u_t and p_t of their column at slot i.
  auto step = [&](int i, float (&S)[W], float* Sd_out, bool record) {
    const float kk = ks[i * threads + row];
    const float alpha = alphas[i];
    const float beta = betas[i];
    float x[W], pc[W];
#pragma unroll
    for (int w = 0; w < W; ++w) {
      S[w] = alpha * S[w];
      x[w] = S[w] * kk;
    }
    if (Sd_out != nullptr) {
#pragma unroll
      for (int w = 0; w < W; ++w) Sd_out[w] = S[w];
    }
    column_sum(x, pc, red, buffer, warp, lane, warps);
    float u_mine = 0.f, p_mine = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float u = beta * (vs[i * W + w] - pc[w]);
      S[w] = fmaf(kk, u, S[w]);
      if (w == row) {
        u_mine = u;
        p_mine = pc[w];
      }
    }
    if (record && row < W) {
      us[i * W + row] = u_mine;
      ps[i * W + row] = p_mine;
    }
  };

  const std::int64_t segments = (len + L - 1) / L;
  float S[W];
  load_dense(p.h0, S);
  // Phase 1: forward over all segments but the last, storing the state at each segment start.
  for (std::int64_t i = 1; i < segments; ++i) {
    for (std::int64_t cb = bos + (i - 1) * L; cb < bos + i * L; cb += C) {
      stage(cb, C, false);
      for (int t = 0; t < C; ++t) step(t, S, nullptr, false);
    }
    if (active) {
#pragma unroll
      for (int w = 0; w < W; ++w)
        if (w < columns) p.checkpoints[checkpoint(i, w)] = S[w];
    }
  }

  // Phase 2: the reverse sweep, segment by segment, chunk by chunk.
  float dS[W];
  load_dense(p.dhT, dS);
  for (std::int64_t seg = segments - 1; seg >= 0; --seg) {
    if (seg == 0) {
      load_dense(p.h0, S);
    } else {
#pragma unroll
      for (int w = 0; w < W; ++w) S[w] = (active && w < columns) ? p.checkpoints[checkpoint(seg, w)] : 0.f;
    }
    const std::int64_t sb = bos + seg * L, se = sb + L < eos ? sb + L : eos;
    const int chunks = static_cast<int>((se - sb + C - 1) / C);
    // The state at every chunk start of the segment, in shared memory (this thread's row).
    for (int c = 0; c < chunks; ++c) {
#pragma unroll
      for (int w = 0; w < W; ++w) sub[(c * W + w) * threads + row] = S[w];
      if (c + 1 < chunks) {
        stage(sb + c * C, C, false);
        for (int i = 0; i < C; ++i) step(i, S, nullptr, false);
      }
    }
    for (int c = chunks - 1; c >= 0; --c) {
      const std::int64_t cb = sb + c * C;
      const int count = static_cast<int>(se - cb < C ? se - cb : C);
      stage(cb, count, true);
#pragma unroll
      for (int w = 0; w < W; ++w) S[w] = sub[(c * W + w) * threads + row];
      // The chunk's decayed states Sd_t, kept in registers for the reverse steps.
      float Sd[C][W];
#pragma unroll
      for (int i = 0; i < C; ++i)
        if (i < count) step(i, S, Sd[i], true);
      __syncthreads();  // us, ps visible to every thread
      float chunk_dg[C];
#pragma unroll
      for (int i = C - 1; i >= 0; --i) {
        chunk_dg[i] = 0.f;
        if (i >= count) continue;
        const std::int64_t t = cb + i, tj = t * p.HV + j;
        const float qs = qs_all[i * threads + row];
        const float kk = ks[i * threads + row];
        const float alpha = alphas[i];
        const float beta = betas[i];
        // The read o = S^T qs: dS += qs dO^T, dqs = S_t dO with S_t = Sd + k u^T.
        float dqs = 0.f;
        float x[W], du[W];
#pragma unroll
        for (int w = 0; w < W; ++w) {
          const float dO = dos[i * W + w];
          const float St = fmaf(kk, us[i * W + w], Sd[i][w]);
          dS[w] = fmaf(qs, dO, dS[w]);
          dqs = fmaf(St, dO, dqs);
        }
        // The write S = Sd + k u^T: du = dS^T k (a sum over K), dk = dS u.
#pragma unroll
        for (int w = 0; w < W; ++w) x[w] = dS[w] * kk;
        column_sum(x, du, red, buffer, warp, lane, warps);
        float dk = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) dk = fmaf(dS[w], us[i * W + w], dk);
        // The delta u = beta (v - p), p = Sd^T k, and the decay Sd = alpha S_{t-1}.
        float dg = 0.f;
        float dv_mine = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) {
          const float dp = -beta * du[w];
          const float dSd = fmaf(kk, dp, dS[w]);
          dk = fmaf(Sd[i][w], dp, dk);
          dg = fmaf(dSd, Sd[i][w], dg);
          dS[w] = alpha * dSd;
          if (w == row) dv_mine = beta * du[w];
        }
        chunk_dg[i] = dg;
        const std::int64_t part = (static_cast<std::int64_t>(tile) * p.T + t) * p.HV + j;
        if (active) {
          p.part_dq[part * p.K + row] = dqs;
          p.part_dk[part * p.K + row] = dk;
        }
        if (row < columns) store_float(p.dv, p.input_type, tj * p.V + c0 + row, dv_mine);
        if (row == 0) {
          float dbeta = 0.f;
#pragma unroll
          for (int w = 0; w < W; ++w) dbeta = fmaf(du[w], vs[i * W + w] - ps[i * W + w], dbeta);
          p.part_dbeta[part] = dbeta;
        }
      }
      // dg of the chunk's tokens: the same butterfly for 8 values (lane l ends with token
      // (l >> 2) & 7), then the warps in order.
      halve<8>(chunk_dg, lane, 16);
      halve<4>(chunk_dg, lane, 8);
      halve<2>(chunk_dg, lane, 4);
      chunk_dg[0] += __shfl_xor_sync(kFull, chunk_dg[0], 2);
      chunk_dg[0] += __shfl_xor_sync(kFull, chunk_dg[0], 1);
      if ((lane & 3) == 0) chunk_red[warp * C + ((lane >> 2) & 7)] = chunk_dg[0];
      __syncthreads();
      if (row < count) {
        float s = chunk_red[row];
        for (int i = 1; i < warps; ++i) s += chunk_red[i * C + row];
        p.part_dg[(static_cast<std::int64_t>(tile) * p.T + cb + row) * p.HV + j] = s;
      }
    }
  }
  // dh0 = the gradient with respect to the state before the sequence.
  if (p.dh0 != nullptr && active) {
#pragma unroll
    for (int w = 0; w < W; ++w)
      if (w < columns) p.dh0[state_index(p, n, j, row, c0 + w)] = dS[w];
  }
}

// dq and dk of one (token, q/k head): the shares of the tiles and of the group's value heads,
// the scale (q), and the l2norm's Jacobian dx = (dx^ - x^ (x^ . dx^)) / r.
__global__ void __launch_bounds__(kBackwardMaxThreads) finish_qk(BackwardParams p) {
  __shared__ float red[2][kMaxWarps];
  const std::int64_t item = blockIdx.x;  // t * H + h
  const std::int64_t t = item / p.H;
  const int h = static_cast<int>(item % p.H);
  const int row = threadIdx.x, warp = row >> 5, lane = row & 31, warps = blockDim.x >> 5;
  const bool active = row < p.K;
  float sq = 0.f, sk = 0.f;
  if (active) {
    for (int jj = 0; jj < p.group; ++jj) {
      const int j = h * p.group + jj;
      for (int tile = 0; tile < p.tiles; ++tile) {
        const std::int64_t part = ((static_cast<std::int64_t>(tile) * p.T + t) * p.HV + j) * p.K + row;
        sq += p.part_dq[part];
        sk += p.part_dk[part];
      }
    }
  }
  float dq = p.scale * sq, dk = sk;
  if (p.l2norm) {
    const float iq = p.inv_norm_q[item], ik = p.inv_norm_k[item];
    const float xq = active ? load_float(p.q, p.input_type, item * p.K + row) * iq : 0.f;
    const float xk = active ? load_float(p.k, p.input_type, item * p.K + row) * ik : 0.f;
    const float dot_q = block_sum(xq * dq, red[0], warp, lane, warps);
    const float dot_k = block_sum(xk * dk, red[1], warp, lane, warps);
    dq = (dq - xq * dot_q) * iq;
    dk = (dk - xk * dot_k) * ik;
  }
  if (active) {
    store_float(p.dq, p.input_type, item * p.K + row, dq);
    store_float(p.dk, p.input_type, item * p.K + row, dk);
  }
}

// dg and dbeta of one (token, value head), summed over the tiles; with fused gates their chain
// rule: da = -exp(A_log) sigmoid(x) dg (1 instead of sigmoid(x) for x > 20), db = dbeta c
// sigmoid(b) (1 - sigmoid(b)).
__global__ void finish_gates(BackwardParams p) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.T * p.HV) return;
  float dg = 0.f, dbeta = 0.f;
  for (int tile = 0; tile < p.tiles; ++tile) {
    dg += p.part_dg[static_cast<std::int64_t>(tile) * p.T * p.HV + i];
    dbeta += p.part_dbeta[static_cast<std::int64_t>(tile) * p.T * p.HV + i];
  }
  if (!p.fused_gates) {
    store_float(p.dg, p.gate_type, i, dg);
    store_float(p.dbeta, p.gate_type, i, dbeta);
    return;
  }
  const int j = static_cast<int>(i % p.HV);
  const float x = load_float(p.a, p.gate_type, i) + p.dt_bias[j];
  const float dsoftplus = x > 20.f ? 1.f : sigmoid_f(x);
  const float da = -expf(p.A_log[j]) * dsoftplus * dg;
  const float sb = sigmoid_f(load_float(p.b, p.gate_type, i));
  const float db = dbeta * (p.negative_eigenvalues ? 2.f : 1.f) * sb * (1.f - sb);
  store_float(p.da, p.gate_type, i, da);
  store_float(p.db, p.gate_type, i, db);
  p.total_dg[i] = p.gate_g[i] * dg;
  p.total_da[i] = da;
}

// dA_log[j] = sum_t g dg and ddt_bias[j] = sum_t da over every token of the batch: thread r
// adds tokens r, r + 256, ... in order, then the block's fixed reduction.
__global__ void __launch_bounds__(kBackwardMaxThreads) head_sums(BackwardParams p) {
  __shared__ float red[2][kMaxWarps];
  const int j = blockIdx.x;
  const int row = threadIdx.x, warp = row >> 5, lane = row & 31, warps = blockDim.x >> 5;
  float sa = 0.f, sd = 0.f;
  for (std::int64_t t = row; t < p.T; t += blockDim.x) {
    sa += p.total_dg[t * p.HV + j];
    sd += p.total_da[t * p.HV + j];
  }
  sa = block_sum(sa, red[0], warp, lane, warps);
  sd = block_sum(sd, red[1], warp, lane, warps);
  if (row == 0) {
    p.dA_log[j] = sa;
    p.dt_bias_grad[j] = sd;
  }
}

void check_launch(const char* what) {
  const cudaError_t code = cudaGetLastError();
  if (code != cudaSuccess)
    throw std::runtime_error(std::string("gdn::cuda: launching ") + what + ": " + cudaGetErrorString(code));
}

template <typename In>
void launch_sweep(const BackwardParams& p, std::size_t shared, cudaStream_t stream) {
  const cudaError_t attribute = cudaFuncSetAttribute(backward_sweep<In>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     static_cast<int>(shared));
  if (attribute != cudaSuccess)
    throw std::runtime_error(std::string("gdn::cuda: cudaFuncSetAttribute(backward_sweep): ") +
                             cudaGetErrorString(attribute));
  if (p.N > 0) {
    const dim3 grid(static_cast<unsigned>(static_cast<std::int64_t>(p.N) * p.tiles), static_cast<unsigned>(p.HV));
    backward_sweep<In><<<grid, p.threads, shared, stream>>>(p);
    check_launch("backward_sweep");
  }
}

}  // namespace

std::size_t backward_sweep_shared_bytes(int threads) {
  return sizeof(float) * (2 * kMaxWarps * W + kMaxWarps * C + 4 * C * W + 2 * C +
                          (2 * C + (L / C) * W) * static_cast<std::size_t>(threads));
}

void launch_backward_prepare(const BackwardParams& p, cudaStream_t stream) {
  const std::int64_t tokens_heads = p.T * p.H, tokens_value_heads = p.T * p.HV;
  if (tokens_heads > 0) {
    const std::int64_t blocks = (tokens_heads * 32 + 255) / 256;
    prepare_norms<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p);
    check_launch("prepare_norms");
  }
  if (tokens_value_heads > 0) {
    prepare_gates<<<static_cast<unsigned>((tokens_value_heads + 255) / 256), 256, 0, stream>>>(p);
    check_launch("prepare_gates");
  }
}

void launch_backward_finish(const BackwardParams& p, cudaStream_t stream) {
  const std::int64_t tokens_heads = p.T * p.H, tokens_value_heads = p.T * p.HV;
  if (tokens_heads > 0) {
    finish_qk<<<static_cast<unsigned>(tokens_heads), p.threads, 0, stream>>>(p);
    check_launch("finish_qk");
  }
  if (tokens_value_heads > 0) {
    finish_gates<<<static_cast<unsigned>((tokens_value_heads + 255) / 256), 256, 0, stream>>>(p);
    check_launch("finish_gates");
  }
  if (p.fused_gates) {
    head_sums<<<static_cast<unsigned>(p.HV), kBackwardMaxThreads, 0, stream>>>(p);
    check_launch("head_sums");
  }
}

void launch_backward_kernels(const BackwardParams& p, cudaStream_t stream) {
  launch_backward_prepare(p, stream);
  const std::size_t shared = backward_sweep_shared_bytes(p.threads);
  if (p.input_type == static_cast<int>(ElementType::bf16)) launch_sweep<__nv_bfloat16>(p, shared, stream);
  else if (p.input_type == static_cast<int>(ElementType::f16)) launch_sweep<__half>(p, shared, stream);
  else launch_sweep<float>(p, shared, stream);
  launch_backward_finish(p, stream);
}

}  // namespace gdn::cuda::detail
