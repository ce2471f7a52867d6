#pragma once
// The recurrent kernel behind both recurrent_prefill and decode (§2, §3, §5).
//
// One warp owns one (sequence n, value head j, V tile of BV = 4 * COL_LANES columns) for the
// whole sequence. Lane = rg * COL_LANES + cg: cg picks 4 consecutive columns v0 = tile*BV + 4*cg,
// rg (one of RL = 32 / COL_LANES row groups) picks RPL rows of K in chunks of 4:
// k = 4 * (rg + RL * m) + e (m < RPL / 4, e < 4). So each thread holds S[k][v0..v0+3] for its
// RPL rows (RPL * 4 fp32 registers), every access is a 16-byte vector of 4 consecutive floats
// (along V in the K-major layout, along K in the V-major one), and a warp instruction touches
// whole 32-byte sectors in either layout.
//
// Per token, with raw k, q and the decayed-state identities
//   S_dec = a S,  S_dec^T k^ = a (S^T k) ik,  o = S_new^T (s q^) = a (S^T q) s iq + (k^.q^) s u
// (ik, iq: inverse l2 norms, s: scale), all reductions of a token (S^T k, S^T q per column,
// |k|^2, |q|^2, k.q) are done in ONE butterfly over the RL row lanes (xor offsets COL_LANES..16):
// a fixed order that gives every lane the same bits and depends on nothing but K and the tile,
// never on the batch. Then u = beta (v - S_dec^T k^) and S = a S + k^ u^T in registers.
// No atomics, no shared memory, no inter-warp communication: deterministic and batch invariant.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/faults/planted_faults.hpp"
#include "cuda/recurrent/recurrent_params.hpp"

namespace gdn::cuda::detail {

template <class T>
struct Element;
template <>
struct Element<float> {
  static __device__ __forceinline__ float load(const float* p) { return *p; }
  static __device__ __forceinline__ void load4(const float* p, float out[4]) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
  }
  static __device__ __forceinline__ void store(float* p, float x) { *p = x; }
  static __device__ __forceinline__ void store4(float* p, const float x[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  }
};
template <>
struct Element<__nv_bfloat16> {
  static __device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  static __device__ __forceinline__ void load4(const __nv_bfloat16* p, float out[4]) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
    const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
    out[0] = __low2float(lo), out[1] = __high2float(lo), out[2] = __low2float(hi), out[3] = __high2float(hi);
  }
  static __device__ __forceinline__ void store(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }
  static __device__ __forceinline__ void store4(__nv_bfloat16* p, const float x[4]) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(x[0], x[1]);
    __nv_bfloat162 hi = __floats2bfloat162_rn(x[2], x[3]);
    uint2 raw;
    raw.x = *reinterpret_cast<unsigned*>(&lo);
    raw.y = *reinterpret_cast<unsigned*>(&hi);
    *reinterpret_cast<uint2*>(p) = raw;
  }
};
template <>
struct Element<__half> {
  static __device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }
  static __device__ __forceinline__ void load4(const __half* p, float out[4]) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const __half2 lo = *reinterpret_cast<const __half2*>(&raw.x);
    const __half2 hi = *reinterpret_cast<const __half2*>(&raw.y);
    out[0] = __low2float(lo), out[1] = __high2float(lo), out[2] = __low2float(hi), out[3] = __high2float(hi);
  }
  static __device__ __forceinline__ void store(__half* p, float x) { *p = __float2half_rn(x); }
  static __device__ __forceinline__ void store4(__half* p, const float x[4]) {
    __half2 lo = __floats2half2_rn(x[0], x[1]);
    __half2 hi = __floats2half2_rn(x[2], x[3]);
    uint2 raw;
    raw.x = *reinterpret_cast<unsigned*>(&lo);
    raw.y = *reinterpret_cast<unsigned*>(&hi);
    *reinterpret_cast<uint2*>(p) = raw;
  }
};

// Four elements in their storage type, as held in registers between load and use (16-bit
// types stay packed: half the registers for the prefetched token).
template <class T>
struct Raw4 {
  uint2 bits;
  __device__ __forceinline__ void unpack(float out[4]) const;
};
template <>
struct Raw4<float> {
  float4 x;
  __device__ __forceinline__ void unpack(float out[4]) const { out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w; }
};
template <>
__device__ __forceinline__ void Raw4<__nv_bfloat16>::unpack(float out[4]) const {
  const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&bits.x);
  const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&bits.y);
  out[0] = __low2float(lo), out[1] = __high2float(lo), out[2] = __low2float(hi), out[3] = __high2float(hi);
}
template <>
__device__ __forceinline__ void Raw4<__half>::unpack(float out[4]) const {
  const __half2 lo = *reinterpret_cast<const __half2*>(&bits.x);
  const __half2 hi = *reinterpret_cast<const __half2*>(&bits.y);
  out[0] = __low2float(lo), out[1] = __high2float(lo), out[2] = __low2float(hi), out[3] = __high2float(hi);
}

// Two elements in their storage type (the narrow tile's v: two columns per lane).
template <class T>
struct Raw2 {
  unsigned bits;
  __device__ __forceinline__ void unpack(float out[2]) const;
};
template <>
struct Raw2<float> {
  float2 x;
  __device__ __forceinline__ void unpack(float out[2]) const { out[0] = x.x, out[1] = x.y; }
};
template <>
__device__ __forceinline__ void Raw2<__nv_bfloat16>::unpack(float out[2]) const {
  const __nv_bfloat162 pair = *reinterpret_cast<const __nv_bfloat162*>(&bits);
  out[0] = __low2float(pair), out[1] = __high2float(pair);
}
template <>
__device__ __forceinline__ void Raw2<__half>::unpack(float out[2]) const {
  const __half2 pair = *reinterpret_cast<const __half2*>(&bits);
  out[0] = __low2float(pair), out[1] = __high2float(pair);
}
__device__ __forceinline__ Raw2<float> load_raw2_plain(const float* p) {
  Raw2<float> r;
  r.x = *reinterpret_cast<const float2*>(p);
  return r;
}
template <class T>
__device__ __forceinline__ Raw2<T> load_raw2_plain(const T* p) {
  Raw2<T> r;
  r.bits = *reinterpret_cast<const unsigned*>(p);
  return r;
}
__device__ __forceinline__ Raw2<float> masked(const Raw2<float>& x, bool valid) {
  Raw2<float> r;
  r.x = valid ? x.x : make_float2(0.f, 0.f);
  return r;
}
template <class T>
__device__ __forceinline__ Raw2<T> masked(const Raw2<T>& x, bool valid) {
  Raw2<T> r;
  r.bits = valid ? x.bits : 0u;
  return r;
}
// Two adjacent elements (8- or 4-byte aligned), rounded to nearest.
__device__ __forceinline__ void store_pair(float* p, const float x[2]) {
  *reinterpret_cast<float2*>(p) = make_float2(x[0], x[1]);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* p, const float x[2]) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x[0], x[1]);
}
__device__ __forceinline__ void store_pair(__half* p, const float x[2]) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x[0], x[1]);
}

__device__ __forceinline__ unsigned short raw_bits(const __nv_bfloat16* p) {
  return *reinterpret_cast<const unsigned short*>(p);
}
__device__ __forceinline__ unsigned short raw_bits(const __half* p) {
  return *reinterpret_cast<const unsigned short*>(p);
}

// 4 consecutive elements at p of which the first `valid` exist (zeros beyond), kept raw.
__device__ __forceinline__ Raw4<float> load_raw(const float* p, int valid, bool vector_ok) {
  Raw4<float> r;
  if (valid >= 4 && vector_ok) {
    r.x = *reinterpret_cast<const float4*>(p);
  } else {
    r.x.x = valid > 0 ? p[0] : 0.f;
    r.x.y = valid > 1 ? p[1] : 0.f;
    r.x.z = valid > 2 ? p[2] : 0.f;
    r.x.w = valid > 3 ? p[3] : 0.f;
  }
  return r;
}
template <class T>
__device__ __forceinline__ Raw4<T> load_raw(const T* p, int valid, bool vector_ok) {
  Raw4<T> r;
  if (valid >= 4 && vector_ok) {
    r.bits = *reinterpret_cast<const uint2*>(p);
  } else {
    unsigned e[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) e[i] = i < valid ? raw_bits(p + i) : 0u;  // +0 in bf16 and f16
    r.bits.x = e[0] | (e[1] << 16);
    r.bits.y = e[2] | (e[3] << 16);
  }
  return r;
}

// One unconditional vector load from an address that is always valid (the caller clamps it);
// a run outside the tensor is zeroed by masked() where it is used, not here (see load_gate_bits).
__device__ __forceinline__ Raw4<float> load_raw_plain(const float* p) {
  Raw4<float> r;
  r.x = *reinterpret_cast<const float4*>(p);
  return r;
}
template <class T>
__device__ __forceinline__ Raw4<T> load_raw_plain(const T* p) {
  Raw4<T> r;
  r.bits = *reinterpret_cast<const uint2*>(p);
  return r;
}
__device__ __forceinline__ Raw4<float> masked(const Raw4<float>& x, bool valid) {
  Raw4<float> r;
  r.x = valid ? x.x : make_float4(0.f, 0.f, 0.f, 0.f);
  return r;
}
template <class T>
__device__ __forceinline__ Raw4<T> masked(const Raw4<T>& x, bool valid) {
  Raw4<T> r;
  r.bits = valid ? x.bits : make_uint2(0u, 0u);
  return r;
}

// 4 consecutive elements starting at p, of which the first `valid` exist; zeros beyond.
template <class T>
__device__ __forceinline__ void load_run(const T* p, int valid, bool vector_ok, float out[4]) {
  if (valid >= 4 && vector_ok) {
    Element<T>::load4(p, out);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) out[e] = e < valid ? Element<T>::load(p + e) : 0.f;
  }
}
template <class T>
__device__ __forceinline__ void store_run(T* p, int valid, bool vector_ok, const float x[4]) {
  if (valid >= 4 && vector_ok) {
    Element<T>::store4(p, x);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (e < valid) Element<T>::store(p + e, x[e]);
  }
}

// Branch-free (selects and predicated loads): a switch here put each gate load in its own
// basic block, and ptxas waits for a load at the join. The load and the conversion are
// separate: a prefetched token keeps its raw bits, converted only where step() uses them (a
// conversion next to the load makes the warp wait for the load there, which defeated the
// prefetch: ncu put the largest share of the stall samples on such instructions).
__device__ __forceinline__ unsigned load_gate_bits(const void* p, int type, std::int64_t i) {
  const bool wide = type == int(ElementType::f32);
  return wide ? static_cast<const unsigned*>(p)[i] : static_cast<unsigned>(static_cast<const unsigned short*>(p)[i]);
}
__device__ __forceinline__ float gate_value(unsigned bits, int type) {
  const bool wide = type == int(ElementType::f32);
  const float bf16_value = __uint_as_float(bits << 16);
  const float f16_value = __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  return wide ? __uint_as_float(bits) : (type == int(ElementType::bf16) ? bf16_value : f16_value);
}

// One token's inputs as loaded: k, q and v in their storage type, the two gate inputs (g and
// beta, or a and b with fused gates) as raw bits. Nothing here is used before step().
// CPL: the tile's columns per lane (4, or 2 for the narrow tile), v's elements per lane.
template <class In, int RPL, int CPL = 4>
struct Token {
  Raw4<In> k[RPL / 4];
  Raw4<In> q[RPL / 4];
  std::conditional_t<CPL == 4, Raw4<In>, Raw2<In>> v;
  unsigned gate0;
  unsigned gate1;
};

// ALIGNED: K % 4 == 0 and V % 4 == 0, so every run of 4 is either wholly inside the tensor or
// wholly outside. Then every access is one unconditional 16-byte (8-byte) vector access to a
// clamped address, masked by a select: straight-line code in which all of a thread's loads are
// in flight together. (With a branch per run, ptxas waits for each load at the join: the loads
// then go out one latency after another, which cost the first version most of its bandwidth.)
// EAGER: load_token resolves the token at once (masks applied, gates converted to fp32 and kept
// as their bits in gate0/gate1), as the first version did. The streamed decode kernel uses it:
// at its 168-register cap (9 warps, one block per SM) deferred resolution spills, and its
// prefetched token is waited for at the stage barrier anyway. The prefill kernel defers (the
// default): deferred masks and gates, then step() masking k once and resolving the gates before
// the dot products, each made one long sequence markedly faster. Same values either way.
// SPLIT = 2: the tile reproduces, bit for bit, the sums of the tile with half the column lanes
// and twice the row lanes, (COL_LANES / 2, RPL / 2). Chunk m = 2 m' + h of lane rg here holds the
// rows of chunk m' of that tile's lane rg + RL h; each lane keeps one partial sum per h, in that
// lane's order, runs that tile's butterflies but its last (same lane bits, shifted by one), and
// adds its two partials in place of the last (IEEE addition is commutative: both lanes of that
// butterfly get the same bits). Why: a warp of the streamed decode kernel then owns 32 columns,
// whole 128-byte lines of a K-major state, and its bits stay those of the default tile, so that
// decode == prefill still holds bit for bit.
// KF, VF (0: runtime): K and V known at compile time, so that row addresses become the tile's
// base plus immediate offsets and bounds tests fold away (the K = V = 128 instances of
// Qwen3-Next / Qwen3.5: ncu at one request put nearly half of the (4, 16) kernels'
// instructions on 64-bit address arithmetic, bounds tests and selects). Same operations on the values, in the
// same order: the same bits as the runtime-size instance.
// CPL = 2 (the narrow tile): each lane holds 2 columns instead of 4, so a warp owns 2 *
// COL_LANES columns and a V tile needs twice the warps. A lane keeps the same rows, sums them in
// the same order and runs the same butterflies: every column gets the bits of the CPL = 4 tile.
// Why: where few warps share the SMs, one warp's serial chain sets the time (a prefill with one
// long sequence); half the columns halve its arithmetic. Where many warps share the SMs the 1.4x
// instructions lose, and decode never gained (launch.cpp, narrow_tile_applies).
// Aligned, K-major or V-major.
template <class In, int COL_LANES, int RPL, bool ALIGNED, bool EAGER = false, int SPLIT = 1, int KF = 0,
          int VF = 0, int CPL = 4>
struct Tile {
  static constexpr int RL = 32 / COL_LANES;  // row lanes
  static constexpr int BV = CPL * COL_LANES;   // columns per warp
  static constexpr int CHUNKS = RPL / 4;
  static_assert(RPL % 4 == 0, "rows per lane come in chunks of 4");
  static_assert(SPLIT == 1 || (SPLIT == 2 && COL_LANES >= 4 && CHUNKS % 2 == 0), "SPLIT is 1, or 2 of an even tile");
  static_assert(CPL == 4 || (CPL == 2 && ALIGNED && SPLIT == 1), "the narrow tile is aligned, SPLIT 1");
  using TokenT = Token<In, RPL, CPL>;

  const RecurrentParams& p;
  int rg, cg, v0, h, j;

  __device__ __forceinline__ int dim_k() const {
    if constexpr (KF > 0) return KF;
    else return p.K;
  }
  __device__ __forceinline__ int dim_v() const {
    if constexpr (VF > 0) return VF;
    else return p.V;
  }

  __device__ Tile(const RecurrentParams& params, int lane, int tile, int head)
      : p(params), rg(lane / COL_LANES), cg(lane % COL_LANES), v0(tile * BV + CPL * (lane % COL_LANES)),
        h(head / params.group), j(head) {}

  __device__ __forceinline__ int k_of(int m) const { return 4 * (rg + RL * m); }

  // The state layout: read from the parameters (kRuntimeLayout), or fixed by the caller.
  static constexpr int kRuntimeLayout = 0, kKMajor = 1, kVMajor = 2;
  template <int LAYOUT>
  __device__ __forceinline__ bool v_major() const {
    if constexpr (LAYOUT == kRuntimeLayout) return p.v_major != 0;
    else return LAYOUT == kVMajor;
  }

  // S of one (row, head) of a [rows, HV, K, V] (or V-major) fp32 tensor. With the layout fixed
  // (decode_token_kernel), the loads are straight-line code into the registers step() uses; with
  // the runtime branch, ptxas gives the two paths' loads different registers and joins them
  // with ~64 moves, which wait for the loads (the warp stops there, not at the first use).
  template <int LAYOUT = kRuntimeLayout>
  __device__ void load_state(const float* base, float s[RPL][CPL]) const {
    const int K = dim_k(), V = dim_v();
    if constexpr (ALIGNED) {
      // The layout branch stays outside the loops: one basic block of loads, all in flight.
      if (!v_major<LAYOUT>()) {
#pragma unroll
        for (int m = 0; m < CHUNKS; ++m)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int kk = k_of(m) + e;
            const bool valid = kk < K && v0 < V;
            const float* at = valid ? base + std::int64_t(kk) * V + v0 : base;
            if constexpr (CPL == 4) {
              const float4 x = *reinterpret_cast<const float4*>(at);
              s[4 * m + e][0] = valid ? x.x : 0.f;
              s[4 * m + e][1] = valid ? x.y : 0.f;
              s[4 * m + e][2] = valid ? x.z : 0.f;
              s[4 * m + e][3] = valid ? x.w : 0.f;
            } else {
              const float2 x = *reinterpret_cast<const float2*>(at);
              s[4 * m + e][0] = valid ? x.x : 0.f;
              s[4 * m + e][1] = valid ? x.y : 0.f;
            }
          }
      } else {
#pragma unroll
        for (int m = 0; m < CHUNKS; ++m)
#pragma unroll
          for (int c = 0; c < CPL; ++c) {
            const int k0 = k_of(m);
            const bool valid = v0 + c < V && k0 < K;
            const float4 x = *reinterpret_cast<const float4*>(valid ? base + std::int64_t(v0 + c) * K + k0 : base);
            s[4 * m + 0][c] = valid ? x.x : 0.f;
            s[4 * m + 1][c] = valid ? x.y : 0.f;
            s[4 * m + 2][c] = valid ? x.z : 0.f;
            s[4 * m + 3][c] = valid ? x.w : 0.f;
          }
      }
      return;
    } else {
#pragma unroll
    for (int m = 0; m < CHUNKS; ++m) {
      const int k0 = k_of(m);
      if (!p.v_major) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int kk = k0 + e;
          if (kk < K && v0 < V) load_run(base + std::int64_t(kk) * V + v0, V - v0, p.vector_v, s[4 * m + e]);
          else s[4 * m + e][0] = s[4 * m + e][1] = s[4 * m + e][2] = s[4 * m + e][3] = 0.f;
        }
      } else {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float run[4] = {0.f, 0.f, 0.f, 0.f};
          if (v0 + c < V && k0 < K) load_run(base + std::int64_t(v0 + c) * K + k0, K - k0, p.vector_k, run);
#pragma unroll
          for (int e = 0; e < 4; ++e) s[4 * m + e][c] = run[e];
        }
      }
    }
    }
  }

  // STREAMING: the aligned path's stores carry the evict-first (.cs) cache hint.
  template <bool STREAMING = false, int LAYOUT = kRuntimeLayout>
  __device__ void store_state(float* base, const float s[RPL][CPL]) const {
    const int K = dim_k(), V = dim_v();
    const auto put = [](float* at, float4 x) {
      if constexpr (STREAMING) __stcs(reinterpret_cast<float4*>(at), x);
      else *reinterpret_cast<float4*>(at) = x;
    };
    if constexpr (ALIGNED) {
      if (!v_major<LAYOUT>()) {
#pragma unroll
        for (int m = 0; m < CHUNKS; ++m)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (k_of(m) + e < K && v0 < V) {
              float* const at = base + std::int64_t(k_of(m) + e) * V + v0;
              if constexpr (CPL == 4) {
                put(at, make_float4(s[4 * m + e][0], s[4 * m + e][1], s[4 * m + e][2], s[4 * m + e][3]));
              } else {
                const float2 x = make_float2(s[4 * m + e][0], s[4 * m + e][1]);
                if constexpr (STREAMING) __stcs(reinterpret_cast<float2*>(at), x);
                else *reinterpret_cast<float2*>(at) = x;
              }
            }
      } else {
#pragma unroll
        for (int m = 0; m < CHUNKS; ++m)
#pragma unroll
          for (int c = 0; c < CPL; ++c)
            if (v0 + c < V && k_of(m) < K)
              put(base + std::int64_t(v0 + c) * K + k_of(m),
                  make_float4(s[4 * m + 0][c], s[4 * m + 1][c], s[4 * m + 2][c], s[4 * m + 3][c]));
      }
      return;
    } else {
#pragma unroll
    for (int m = 0; m < CHUNKS; ++m) {
      const int k0 = k_of(m);
      if (!p.v_major) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int kk = k0 + e;
          if (kk < K && v0 < V) store_run(base + std::int64_t(kk) * V + v0, V - v0, p.vector_v, s[4 * m + e]);
        }
      } else {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          if (v0 + c < V && k0 < K) {
            float run[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) run[e] = s[4 * m + e][c];
            store_run(base + std::int64_t(v0 + c) * K + k0, K - k0, p.vector_k, run);
          }
        }
      }
    }
    }
  }

  __device__ void load_token(std::int64_t t, TokenT& x) const {
    const int K = dim_k(), V = dim_v();
    const In* kp = static_cast<const In*>(p.k) + (t * p.H + h) * K;
    const In* qp = static_cast<const In*>(p.q) + (t * p.H + h) * K;
    const In* vp = static_cast<const In*>(p.v) + (t * p.HV + j) * V;
    if constexpr (ALIGNED) {
#pragma unroll
      for (int m = 0; m < CHUNKS; ++m) {
        const int k0 = k_of(m) < K ? k_of(m) : 0;  // clamped; masked in step() (or here, EAGER)
        x.k[m] = load_raw_plain(kp + k0);
        x.q[m] = load_raw_plain(qp + k0);
        if constexpr (EAGER) {
          x.k[m] = masked(x.k[m], k_of(m) < K);
          x.q[m] = masked(x.q[m], k_of(m) < K);
        }
      }
      if constexpr (CPL == 4) x.v = load_raw_plain(vp + (v0 < V ? v0 : 0));
      else x.v = load_raw2_plain(vp + (v0 < V ? v0 : 0));
      if constexpr (EAGER) x.v = masked(x.v, v0 < V);
    } else if constexpr (CPL == 4) {
#pragma unroll
      for (int m = 0; m < CHUNKS; ++m) {
        const int k0 = k_of(m);
        const int valid = k0 < K ? K - k0 : 0;
        x.k[m] = load_raw(kp + k0, valid, p.vector_k);
        x.q[m] = load_raw(qp + k0, valid, p.vector_k);
      }
      x.v = load_raw(vp + v0, v0 < V ? V - v0 : 0, p.vector_v);
    }
    const std::int64_t gi = t * p.HV + j;
    x.gate0 = load_gate_bits(p.fused_gates ? p.a : p.g, p.gate_type, gi);
    x.gate1 = load_gate_bits(p.fused_gates ? p.b : p.beta, p.gate_type, gi);
    if constexpr (EAGER) {
      float g, beta;
      resolve_gates(x, g, beta);
      x.gate0 = __float_as_uint(g);
      x.gate1 = __float_as_uint(beta);
    }
  }

  // The token's g and beta (already resolved by an EAGER load_token).
  __device__ __forceinline__ void gates(const TokenT& x, float& g, float& beta) const {
    if constexpr (EAGER) {
      g = __uint_as_float(x.gate0);
      beta = __uint_as_float(x.gate1);
    } else {
      resolve_gates(x, g, beta);
    }
  }
  // g and beta from the raw gate inputs.
  __device__ __forceinline__ void resolve_gates(const TokenT& x, float& g, float& beta) const {
    if (!p.fused_gates) {
      g = gate_value(x.gate0, p.gate_type);
      beta = gate_value(x.gate1, p.gate_type);
    } else if constexpr (EAGER) {
      // Through fused_gates() in the streamed kernel's eager token loads: the same operations,
      // but ptxas then schedules that kernel's loop better (measured: a larger fraction of the
      // copy bandwidth, the SASS differing only through this call).
      fused_gates(x, p.dt_bias[j], p.A_log[j], g, beta);
    } else {
      // §3 in fp32: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b) (x2: negative
      // eigenvalues). softplus(x) = x for x > 20, as the reference does. Written out: through
      // fused_gates() the prefill token loop's schedule changed and lost (see step()).
      const float a = gate_value(x.gate0, p.gate_type) + p.dt_bias[j];
      const float softplus = a > 20.f ? a : log1pf(expf(a));
      g = -expf(p.A_log[j]) * softplus;
      const float sig = 1.f / (1.f + expf(-gate_value(x.gate1, p.gate_type)));
      beta = p.negative_eigenvalues ? 2.f * sig : sig;
    }
  }
  // resolve_gates()'s fused branch with dt_bias and A_log given (decode_token_kernel loads them
  // with the token, not after the token's gate input arrives).
  __device__ __forceinline__ void fused_gates(const TokenT& x, float dt_bias, float A_log, float& g,
                                              float& beta) const {
    const float a = gate_value(x.gate0, p.gate_type) + dt_bias;
    const float softplus = a > 20.f ? a : log1pf(expf(a));
    g = -expf(A_log) * softplus;
    const float sig = 1.f / (1.f + expf(-gate_value(x.gate1, p.gate_type)));
    beta = p.negative_eigenvalues ? 2.f * sig : sig;
  }

  // k and q of chunk m as step() uses them: zero where the chunk lies beyond K.
  __device__ __forceinline__ Raw4<In> k_at(const TokenT& x, int m) const {
    if constexpr (ALIGNED && !EAGER) return masked(x.k[m], k_of(m) < dim_k());
    else return x.k[m];
  }
  __device__ __forceinline__ Raw4<In> q_at(const TokenT& x, int m) const {
    if constexpr (ALIGNED && !EAGER) return masked(x.q[m], k_of(m) < dim_k());
    else return x.q[m];
  }

  // One step of §2 on the registers; writes this token's o columns. Its tail (u, o, the update)
  // is finish()'s, written out: the same operations through the finish() call made ptxas
  // schedule the general kernel's prefill token loop differently, and it ran much slower
  // (Nsight Compute: the same instruction count, more cycles per instruction stalled on global
  // loads). Keep the two in step.
  __device__ __forceinline__ void step(const TokenT& x, float s[RPL][CPL], float o[CPL]) const {
    // Gates first, while few registers are live (the fused ones are a dozen instructions).
    float g, beta;
    gates(x, g, beta);
    // The masked k once: both loops below use it (the raw loads are dead after this).
    Raw4<In> kr[CHUNKS];
#pragma unroll
    for (int m = 0; m < CHUNKS; ++m) kr[m] = k_at(x, m);
    float sk[SPLIT], sq[SPLIT], kq[SPLIT], p1[SPLIT][CPL], p2[SPLIT][CPL];
#pragma unroll
    for (int h = 0; h < SPLIT; ++h) {
      sk[h] = sq[h] = kq[h] = 0.f;
#pragma unroll
      for (int c = 0; c < CPL; ++c) p1[h][c] = p2[h][c] = 0.f;
    }
#pragma unroll
    for (int m = 0; m < CHUNKS; ++m) {
      const int h = m % SPLIT;
      float k[4], q[4];
      kr[m].unpack(k);
      q_at(x, m).unpack(q);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * m + e;
        sk[h] = fmaf(k[e], k[e], sk[h]);
        sq[h] = fmaf(q[e], q[e], sq[h]);
        kq[h] = fmaf(k[e], q[e], kq[h]);
#pragma unroll
        for (int c = 0; c < CPL; ++c) {
          p1[h][c] = fmaf(s[i][c], k[e], p1[h][c]);
          p2[h][c] = fmaf(s[i][c], q[e], p2[h][c]);
        }
      }
    }
#pragma unroll
    for (int offset = COL_LANES; offset < 32; offset <<= 1) {
#pragma unroll
      for (int h = 0; h < SPLIT; ++h) {
        sk[h] += __shfl_xor_sync(0xffffffffu, sk[h], offset);
        sq[h] += __shfl_xor_sync(0xffffffffu, sq[h], offset);
        kq[h] += __shfl_xor_sync(0xffffffffu, kq[h], offset);
#pragma unroll
        for (int c = 0; c < CPL; ++c) {
          p1[h][c] += __shfl_xor_sync(0xffffffffu, p1[h][c], offset);
          p2[h][c] += __shfl_xor_sync(0xffffffffu, p2[h][c], offset);
        }
      }
    }
    if constexpr (SPLIT == 2) {
      sk[0] += sk[1];
      sq[0] += sq[1];
      kq[0] += kq[1];
#pragma unroll
      for (int c = 0; c < CPL; ++c) {
        p1[0][c] += p1[1][c];
        p2[0][c] += p2[1][c];
      }
    }
    float ik = 1.f, iq = 1.f;
    if (p.l2norm) {
      ik = 1.f / sqrtf(sk[0] + 1e-6f);
      iq = 1.f / sqrtf(sq[0] + 1e-6f);
#if GDN_KERNEL_FAULTS
      if (GDN_PLANTED(p, recurrent_l2norm_eps_outside)) {
        ik = 1.f / (sqrtf(sk[0]) + 1e-6f);
        iq = 1.f / (sqrtf(sq[0]) + 1e-6f);
      }
#endif
    }
    const float alpha = expf(g);
    const float qs = p.scale * iq;
    const float kqs = kq[0] * ik * qs;
    float v[CPL], u[CPL];
    if constexpr (ALIGNED && !EAGER) masked(x.v, v0 < dim_v()).unpack(v);
    else x.v.unpack(v);
#pragma unroll
    for (int c = 0; c < CPL; ++c) {
      u[c] = beta * (v[c] - alpha * (p1[0][c] * ik));
      o[c] = alpha * (p2[0][c] * qs) + kqs * u[c];
    }
#pragma unroll
    for (int m = 0; m < CHUNKS; ++m) {
      float k[4];
      kr[m].unpack(k);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float kn = k[e] * ik;
#pragma unroll
        for (int c = 0; c < CPL; ++c) s[4 * m + e][c] = fmaf(kn, u[c], alpha * s[4 * m + e][c]);
      }
    }
  }

  // The inverse l2 norms of k and q (1 without l2norm).
  __device__ __forceinline__ void inverse_norms(float sk, float sq, float& ik, float& iq) const {
    ik = 1.f, iq = 1.f;
    if (p.l2norm) {
      ik = 1.f / sqrtf(sk + 1e-6f);
      iq = 1.f / sqrtf(sq + 1e-6f);
#if GDN_KERNEL_FAULTS
      if (GDN_PLANTED(p, recurrent_l2norm_eps_outside)) {
        ik = 1.f / (sqrtf(sk) + 1e-6f);
        iq = 1.f / (sqrtf(sq) + 1e-6f);
      }
#endif
    }
  }

  // The end of a step, once the sums are reduced: u, o and the state update.
  __device__ __forceinline__ void finish(const TokenT& x, const Raw4<In> (&kr)[CHUNKS], float g, float beta, float ik,
                                         float iq, float kq, const float (&p1)[CPL], const float (&p2)[CPL],
                                         float s[RPL][CPL], float o[CPL]) const {
    const float alpha = expf(g);
    const float qs = p.scale * iq;
    const float kqs = kq * ik * qs;
    float v[CPL], u[CPL];
    if constexpr (ALIGNED && !EAGER) masked(x.v, v0 < dim_v()).unpack(v);
    else x.v.unpack(v);
#pragma unroll
    for (int c = 0; c < CPL; ++c) {
      u[c] = beta * (v[c] - alpha * (p1[c] * ik));
      o[c] = alpha * (p2[c] * qs) + kqs * u[c];
    }
#pragma unroll
    for (int m = 0; m < CHUNKS; ++m) {
      float k[4];
      kr[m].unpack(k);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float kn = k[e] * ik;
#pragma unroll
        for (int c = 0; c < CPL; ++c) s[4 * m + e][c] = fmaf(kn, u[c], alpha * s[4 * m + e][c]);
      }
    }
  }

  // step() in two halves for a state that is still in flight (decode_token_kernel): first
  // everything that needs only the token (gates, |k|^2, |q|^2, k.q and their butterflies, the
  // inverse norms), then the state's products, their butterflies and finish(). Each sum keeps
  // its own order and its own butterfly, so the bits are step()'s; what changes is that the
  // first half runs while the state loads are in flight (the warp issues in order, and in
  // step() the first FMA on the state came before most of the token's own arithmetic).
  struct TokenPart {
    float g, beta, ik, iq, kq;
    Raw4<In> kr[CHUNKS];
  };
  // head_gates: this head's dt_bias and A_log, loaded by the caller with the token (fused gates
  // only; resolve_gates loads them only once it gets there, one dependent load after another).
  __device__ __forceinline__ void token_part(const TokenT& x, const float (&head_gates)[2], TokenPart& t) const {
    static_assert(SPLIT == 1 && !EAGER, "the two-part step is for SPLIT = 1 tiles that defer the gates");
    if (p.fused_gates) {
      fused_gates(x, head_gates[0], head_gates[1], t.g, t.beta);
    } else {
      t.g = gate_value(x.gate0, p.gate_type);
      t.beta = gate_value(x.gate1, p.gate_type);
    }
#pragma unroll
    for (int m = 0; m < CHUNKS; ++m) t.kr[m] = k_at(x, m);
    float sk = 0.f, sq = 0.f, kq = 0.f;
#pragma unroll
    for (int m = 0; m < CHUNKS; ++m) {
      float k[4], q[4];
      t.kr[m].unpack(k);
      q_at(x, m).unpack(q);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sk = fmaf(k[e], k[e], sk);
        sq = fmaf(q[e], q[e], sq);
        kq = fmaf(k[e], q[e], kq);
      }
    }
#pragma unroll
    for (int offset = COL_LANES; offset < 32; offset <<= 1) {
      sk += __shfl_xor_sync(0xffffffffu, sk, offset);
      sq += __shfl_xor_sync(0xffffffffu, sq, offset);
      kq += __shfl_xor_sync(0xffffffffu, kq, offset);
    }
    inverse_norms(sk, sq, t.ik, t.iq);
    t.kq = kq;
  }
  __device__ __forceinline__ void state_part(const TokenT& x, const TokenPart& t, float s[RPL][CPL], float o[CPL]) const {
    float p1[CPL], p2[CPL];
#pragma unroll
    for (int c = 0; c < CPL; ++c) p1[c] = p2[c] = 0.f;
#pragma unroll
    for (int m = 0; m < CHUNKS; ++m) {
      float k[4], q[4];
      t.kr[m].unpack(k);
      q_at(x, m).unpack(q);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
#pragma unroll
        for (int c = 0; c < CPL; ++c) {
          p1[c] = fmaf(s[4 * m + e][c], k[e], p1[c]);
          p2[c] = fmaf(s[4 * m + e][c], q[e], p2[c]);
        }
      }
    }
#pragma unroll
    for (int offset = COL_LANES; offset < 32; offset <<= 1) {
#pragma unroll
      for (int c = 0; c < CPL; ++c) {
        p1[c] += __shfl_xor_sync(0xffffffffu, p1[c], offset);
        p2[c] += __shfl_xor_sync(0xffffffffu, p2[c], offset);
      }
    }
    finish(x, t.kr, t.g, t.beta, t.ik, t.iq, t.kq, p1, p2, s, o);
  }

  __device__ void store_o(std::int64_t t, const float o[CPL]) const {
    if (rg == 0 && v0 < dim_v()) {
      In* out = static_cast<In*>(p.o) + (t * p.HV + j) * dim_v() + v0;
      if constexpr (CPL == 2) store_pair(out, o);
      else if constexpr (ALIGNED) Element<In>::store4(out, o);
      else store_run(out, dim_v() - v0, p.vector_v, o);
    }
  }

  __device__ float* intermediate_at(std::int64_t t) const {
    return p.intermediate + (t * p.HV + j) * std::int64_t(dim_k()) * dim_v();
  }
};

// WPB: warps per block (kWarpsPerBlock; 1 for the smallest decode batches, see launch_instance).
// CPL: columns per lane (2: the narrow tile, same bits; p.num_tiles and p.items count its tiles).
// INDEX32: the item -> (n, j, tile) arithmetic in 32 bits (the K = V = 128 decode instances).
// It makes a one-request decode faster, but the same change in the prefill instance made ptxas
// keep fewer registers and reload constants in the token loop, which made one long sequence
// slower. Hence a template switch, not a rewrite.
template <class In, int COL_LANES, int RPL, bool ALIGNED, int KF = 0, int VF = 0, int WPB = kWarpsPerBlock,
          int CPL = 4, bool INDEX32 = false>
__global__ void __launch_bounds__(WPB * 32) recurrent_kernel(const __grid_constant__ RecurrentParams p) {
  using TileT = Tile<In, COL_LANES, RPL, ALIGNED, false, 1, KF, VF, CPL>;
  const int lane = threadIdx.x & 31;
  int tile, j, n;
  if constexpr (INDEX32) {
    // 32-bit item arithmetic (the host keeps items below 2^31): a 64-bit division by a runtime
    // value is a long subroutine, and the first loads wait for n and j. With V fixed the tile
    // count is a compile-time power of two.
    const unsigned item = blockIdx.x * unsigned(WPB) + (threadIdx.x >> 5);
    // Whole warps leave together: every shuffle below runs with all 32 lanes.
    if (item >= static_cast<unsigned>(p.items)) return;
    if (p.status != nullptr && *p.status != 0) return;
    unsigned tile_u, nj;
    if constexpr (VF > 0) {
      constexpr unsigned kTiles = (VF + TileT::BV - 1) / TileT::BV;
      tile_u = item % kTiles;
      nj = item / kTiles;
    } else {
      tile_u = item % static_cast<unsigned>(p.num_tiles);
      nj = item / static_cast<unsigned>(p.num_tiles);
    }
    tile = int(tile_u);
    j = int(nj % static_cast<unsigned>(p.HV));
    n = int(nj / static_cast<unsigned>(p.HV));
  } else {
    const std::int64_t item = std::int64_t(blockIdx.x) * WPB + (threadIdx.x >> 5);
    if (item >= p.items) return;
    if (p.status != nullptr && *p.status != 0) return;
    tile = int(item % p.num_tiles);
    const std::int64_t nj = item / p.num_tiles;
    j = int(nj % p.HV);
    n = int(nj / p.HV);
  }

  // The slot index goes out first, before any address arithmetic: the state loads wait for it
  // and nothing else does. (Issued after the token loads, it left ~150 instructions of address
  // setup between the kernel's start and the one dependent load of a one-request decode.)
  std::int64_t row = n;
  if (p.use_cache) row = p.state_indices[n];

  std::int64_t bos, eos;
  if (p.cu_seqlens == nullptr) {
    bos = n * p.tokens_per_sequence;
    eos = bos + p.tokens_per_sequence;
  } else if (p.cu_seqlens_64) {
    bos = static_cast<const std::int64_t*>(p.cu_seqlens)[n];
    eos = static_cast<const std::int64_t*>(p.cu_seqlens)[n + 1];
  } else {
    bos = static_cast<const std::int32_t*>(p.cu_seqlens)[n];
    eos = static_cast<const std::int32_t*>(p.cu_seqlens)[n + 1];
  }
#if GDN_KERNEL_FAULTS
  if (GDN_PLANTED(p, recurrent_overrun_last_sequence) && p.cu_seqlens != nullptr && n == p.N - 1) eos += 1;
#endif

  const TileT tl(p, lane, tile, j);
  const std::int64_t state_elems = std::int64_t(p.K) * p.V;
  // The first token does not depend on the slot: its loads go out before the state loads, so
  // decode waits for one dependent load (the index), not three.
  typename TileT::TokenT cur;
  if (bos < eos) tl.load_token(bos, cur);
#if GDN_KERNEL_FAULTS
  if (GDN_PLANTED(p, decode_padding_uses_slot0) && row == -1) row = 0;
#endif
  if (p.use_cache) {
    if (row == -1) {
      // Padding (§5): read and write nothing in the cache; output rows are zeros.
      float zeros[CPL], zero_state[RPL][CPL];
#pragma unroll
      for (int c = 0; c < CPL; ++c) zeros[c] = 0.f;
#pragma unroll
      for (int i = 0; i < RPL; ++i)
#pragma unroll
        for (int c = 0; c < CPL; ++c) zero_state[i][c] = 0.f;
      for (std::int64_t t = bos; t < eos; ++t) {
        tl.store_o(t, zeros);
        if (p.store_intermediate) tl.store_state(tl.intermediate_at(t), zero_state);
      }
      return;
    }
    // Out of range: an error (reported by the status pre-pass or the host check); never touch
    // memory through it.
    if (row < 0 || row >= p.state_slots) return;
  }

  float s[RPL][CPL];
  if (p.has_h0) {
    const float* base = (p.use_cache ? p.state_cache : p.h0) + (row * p.HV + j) * state_elems;
    tl.load_state(base, s);
  } else {
#pragma unroll
    for (int i = 0; i < RPL; ++i)
#pragma unroll
      for (int c = 0; c < CPL; ++c) s[i][c] = 0.f;
  }

  if (bos < eos) {
    // The next token's inputs are loaded before the current token's arithmetic so that their
    // latency overlaps it (the chain through the state is serial in t).
    for (std::int64_t t = bos; t < eos; ++t) {
      typename TileT::TokenT next;
      const bool has_next = t + 1 < eos;
      if (RPL <= 16 && has_next) tl.load_token(t + 1, next);
      float o[CPL];
      tl.step(cur, s, o);
#if GDN_KERNEL_FAULTS
      if (!(GDN_PLANTED(p, recurrent_last_row_unwritten) && t + 1 == eos)) tl.store_o(t, o);
      if (p.store_intermediate)
        tl.store_state(tl.intermediate_at(GDN_PLANTED(p, recurrent_intermediate_shifted) && t > bos ? t - 1 : t), s);
#else
      tl.store_o(t, o);
      if (p.store_intermediate) tl.store_state(tl.intermediate_at(t), s);
#endif
      if (has_next) {
        if (RPL <= 16) cur = next;
        else tl.load_token(t + 1, cur);
      }
    }
  }

  if (p.has_hT) {
    float* base = (p.use_cache ? p.state_cache : p.hT) + (row * p.HV + j) * state_elems;
    tl.store_state(base, s);
  }
}

// One token per request (the decode step of a serving engine) at K = V = 128, default (4, 16)
// tile: the general kernel's Tile, the same operations in the same order on the same lanes (so
// the same bits: decode == prefill and batch invariance hold across kernels), scheduled for
// latency, since at small batches one warp's serial path is the whole launch:
// - the item's (n, j) by multiply-high (FastDivisor), so the slot index, the one load the state
//   waits for, goes out a few instructions after the start;
// - the token's loads next, then the state's, then the token-only half of the step (gates,
//   norms and their butterflies) while the state is in flight (Tile::token_part), then the
//   state's half (Tile::state_part);
// - no sequence bounds, no token loop, no intermediate states (the host routes those launches
//   to recurrent_kernel).
template <class In, int WPB, bool V_MAJOR>
__global__ void __launch_bounds__(WPB * 32) decode_token_kernel(const __grid_constant__ RecurrentParams p) {
  using TileT = Tile<In, 4, 16, true, false, 1, 128, 128, 4>;
  constexpr int kLayout = V_MAJOR ? TileT::kVMajor : TileT::kKMajor;
  constexpr unsigned kTiles = 128 / TileT::BV;
  const int lane = threadIdx.x & 31;
  const unsigned item = blockIdx.x * unsigned(WPB) + (threadIdx.x >> 5);
  // Whole warps leave together: every shuffle below runs with all 32 lanes.
  if (item >= static_cast<unsigned>(p.items)) return;
  if (p.status != nullptr && *p.status != 0) return;
  const unsigned nj = item / kTiles;
  const unsigned n = p.hv_divisor.divide(nj);
  const int j = int(nj - n * unsigned(p.HV));
  std::int64_t row = n;
  if (p.use_cache) row = p.state_indices[n];

  const TileT tl(p, lane, int(item % kTiles), j);
  typename TileT::TokenT x;
  tl.load_token(n, x);  // request n's one token is token n
  float head_gates[2] = {0.f, 0.f};
  if (p.fused_gates) head_gates[0] = p.dt_bias[j], head_gates[1] = p.A_log[j];
#if GDN_KERNEL_FAULTS
  if (GDN_PLANTED(p, decode_padding_uses_slot0) && row == -1) row = 0;
#endif
  if (p.use_cache) {
    if (row == -1) {
      // Padding (§5): read and write nothing in the cache; the output row is zeros.
      const float zeros[4] = {0.f, 0.f, 0.f, 0.f};
      tl.store_o(n, zeros);
      return;
    }
    if (row < 0 || row >= p.state_slots) return;  // an error, reported by the host or the status pre-pass
  }
  constexpr std::int64_t kStateElems = 128 * 128;
  float s[16][4];
  if (p.has_h0) {
    tl.template load_state<kLayout>((p.use_cache ? p.state_cache : p.h0) + (row * p.HV + j) * kStateElems, s);
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
  }
  typename TileT::TokenPart part;
  tl.token_part(x, head_gates, part);
  float o[4];
  tl.state_part(x, part, s, o);
#if GDN_KERNEL_FAULTS
  if (!GDN_PLANTED(p, recurrent_last_row_unwritten))
#endif
  tl.store_o(n, o);
  if (p.has_hT) tl.template store_state<false, kLayout>((p.use_cache ? p.state_cache : p.hT) + (row * p.HV + j) * kStateElems, s);
}

template <class In, bool V_MAJOR>
void launch_decode_token(const RecurrentParams& params, cudaStream_t stream) {
  if (params.items <= kSmallLaunchWarps) {
    decode_token_kernel<In, 1, V_MAJOR><<<dim3(static_cast<unsigned>(params.items)), 32, 0, stream>>>(params);
  } else {
    const std::int64_t blocks = (params.items + kWarpsPerBlock - 1) / kWarpsPerBlock;
    decode_token_kernel<In, kWarpsPerBlock, V_MAJOR>
        <<<dim3(static_cast<unsigned>(blocks)), kWarpsPerBlock * 32, 0, stream>>>(params);
  }
}

// The K = V = 128 instances of the default (4, 16) tile, standard (CPL 4) or narrow (CPL 2),
// decode ones with 32-bit item arithmetic (INDEX32). Launches of at most kSmallLaunchWarps
// default-tile warps' worth run one warp per block, so that the warps spread over all SMs.
template <class In, int CPL, bool DECODE>
void launch_fixed(const RecurrentParams& params, cudaStream_t stream) {
  if constexpr (DECODE && CPL == 4) {
    if (params.token_kernel) {
      if (params.v_major) launch_decode_token<In, true>(params, stream);
      else launch_decode_token<In, false>(params, stream);
      return;
    }
  }
  if (params.items <= kSmallLaunchWarps * (4 / CPL)) {
    recurrent_kernel<In, 4, 16, true, 128, 128, 1, CPL, DECODE>
        <<<dim3(static_cast<unsigned>(params.items)), 32, 0, stream>>>(params);
  } else {
    const std::int64_t blocks = (params.items + kWarpsPerBlock - 1) / kWarpsPerBlock;
    recurrent_kernel<In, 4, 16, true, 128, 128, kWarpsPerBlock, CPL, DECODE>
        <<<dim3(static_cast<unsigned>(blocks)), kWarpsPerBlock * 32, 0, stream>>>(params);
  }
}

template <class In, int COL_LANES, int RPL>
void launch_instance(const RecurrentParams& params, cudaStream_t stream) {
  const std::int64_t blocks = (params.items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  // K = V = 128 at the default K = 128 tile: the fixed-size instance (same bits, see Tile),
  // measured faster than the runtime-size one for prefill and for a one-request decode (the
  // benchmarks' runtime_sizes rows). Up to kSmallLaunchWarps warps (one or two decode
  // requests at HV = 32) it runs one warp per block, so that the warps spread over all SMs.
  if constexpr (COL_LANES == 4 && RPL == 16) {
    if (params.K == 128 && params.V == 128 && !params.runtime_sizes) {
      const bool decode = params.cu_seqlens == nullptr;
      if (params.narrow) {
        // The narrow tile (Tile's CPL = 2, same bits): twice the tiles.
        RecurrentParams narrow = params;
        narrow.num_tiles = 2 * params.num_tiles;
        narrow.items = 2 * params.items;
        if (decode) launch_fixed<In, 2, true>(narrow, stream);
        else launch_fixed<In, 2, false>(narrow, stream);
      } else {
        if (decode) launch_fixed<In, 4, true>(params, stream);
        else launch_fixed<In, 4, false>(params, stream);
      }
      return;
    }
  }
  if (params.vector_k && params.vector_v)
    recurrent_kernel<In, COL_LANES, RPL, true><<<dim3(static_cast<unsigned>(blocks)), kWarpsPerBlock * 32, 0, stream>>>(params);
  else
    recurrent_kernel<In, COL_LANES, RPL, false><<<dim3(static_cast<unsigned>(blocks)), kWarpsPerBlock * 32, 0, stream>>>(params);
}

// The instantiated (COL_LANES, RPL) set: COL_LANES 2 reaches K = 256 with RPL 16; 4 reaches
// K = 256 with RPL 32; 8 reaches K = 128 with RPL 32 (more would spill).
template <class In>
bool launch_for_type(int column_lanes, int rows_per_lane, const RecurrentParams& params,
                     cudaStream_t stream) {
#define GDN_CASE(CL, RPL)                                   \
  if (column_lanes == CL && rows_per_lane == RPL) {         \
    launch_instance<In, CL, RPL>(params, stream);           \
    return true;                                            \
  }
  GDN_CASE(2, 4) GDN_CASE(2, 8) GDN_CASE(2, 16)
  GDN_CASE(4, 4) GDN_CASE(4, 8) GDN_CASE(4, 16) GDN_CASE(4, 32)
  GDN_CASE(8, 4) GDN_CASE(8, 8) GDN_CASE(8, 16) GDN_CASE(8, 32)
#undef GDN_CASE
  return false;
}

}  // namespace gdn::cuda::detail
