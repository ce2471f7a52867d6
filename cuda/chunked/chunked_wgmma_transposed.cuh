#pragma once
// Part of chunked_kernel.cuh (included after chunked_wgmma.cuh): the bf16 output pass at K 128
// and V tile 128 with every product transposed, so that S0, X and Vnew never go through shared
// memory.
//
// chunked_forward_wg computes X = K S0, Vnew = T X, O = Q S0 + P Vnew and S += K^T Vnew_d with
// the tokens (or K) as wgmma's M and the warpgroup's value columns as N: S0, X and Vnew are B
// operands, so each chunk writes them to shared memory (hi + lo), fences, and synchronises the
// warpgroup before the next product can read them. At V tile 128 the phase clock put about a
// quarter of a chunk's cycles there (the S0 operand, the X and Vnew epilogues, barriers).
// Here the warpgroup's 64 value columns are M instead:
//   X^T    = S0^T K^T        A: S0^T hi / lo, from the state's own accumulator registers
//   Vnew^T = X^T T^T         A: X^T hi / lo, from the X accumulator's registers
//   O^T    = S0^T Q^T + Vnew^T P^T  (S0 hi only in Q S0; Vnew^T hi / lo per k step, as
//                                    chunked_forward_wg)
//   S^T   += Vnew_d^T K      A: Vnew_d^T hi / lo from registers; B = K, MN-major (N = K = 128)
// and K, Q, T and P are B operands read by the wgmma from the tiles the copies deliver (K-major,
// 128-byte swizzle: the descriptor a_desc_sw128 already builds for them as A operands; the
// state update reads K MN-major). A wgmma accumulator's 16-column slice is, register for
// register, the A fragment of a 16-wide k step (the mma.sync m16n8k16 layout), so each
// operand is rounded (hi + lo) in registers, where it was stored.
// Same products, same hi / lo passes in the same order, same epilogue arithmetic per element
// as chunked_forward_wg; which operand is A and which is B is the only difference, and the
// V-tile invariance tests say whether the tensor cores reduce a k step in the same order
// either way. With no B tiles per warpgroup, two buffers of every copy fit (Q, K, V and the
// record), so the warpgroups run out of step as the small tiles do (chunked_forward_wg,
// dephase), with the same release counters.
// Not (yet) for the sequence split's affine pass or the debug mode: chunked_forward_wg serves
// those.
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/ptx/bulk_copy.cuh"
#include "cuda/ptx/mma.cuh"
#include "cuda/ptx/sync.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace gdn::cuda::detail::chunked {

namespace wgt {

// (x0, x1) as bf16x2 (x0 in the low half, the lower column), and its hi + lo split: the bits
// store_split stores.
__device__ __forceinline__ std::uint32_t pack(float x0, float x1) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  return *reinterpret_cast<const std::uint32_t*>(&h);
}
// GDN_LO_FAULT: the planted fault chunked_state_lo_dropped in a fault-campaign build
// (cuda/faults/planted_faults.hpp), nothing otherwise.
#if GDN_KERNEL_FAULTS
#define GDN_LO_FAULT , GDN_PLANTED(p, chunked_state_lo_dropped)
__device__ __forceinline__ void split(float x0, float x1, std::uint32_t& hi, std::uint32_t& lo, bool drop_lo) {
  hi = pack(x0, x1);
  const float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
  lo = drop_lo ? 0u : pack(x0 - h0, x1 - h1);
}
#else
#define GDN_LO_FAULT
#endif
__device__ __forceinline__ void split(float x0, float x1, std::uint32_t& hi, std::uint32_t& lo) {
  hi = pack(x0, x1);
  const float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
  lo = pack(x0 - h0, x1 - h1);
}

}  // namespace wgt

// The fused forward (kFused): a third warpgroup, the producer, computes each chunk's record
// (chunked_prepare's work, prepare_chunk) into the record buffer while the two warpgroups of the
// state (the consumers) run the chunk before it, so that the prepass's workspace round trip
// (about 34 KB a chunk and head written, then read back) and its launch are gone. Registers: the
// entry count of 384 threads is 168; the producer gives its warpgroup's down to
// kFusedProducerRegisters and the consumers take kFusedConsumerRegisters (2 x 224 + 56 = 3 x 168:
// setmaxnreg.inc waits until the pool has them).
constexpr int kFusedThreads = 384;
constexpr int kFusedConsumerRegisters = 224, kFusedProducerRegisters = 56;
static_assert(2 * kFusedConsumerRegisters + kFusedProducerRegisters == 3 * (65536 / kFusedThreads / 8 * 8),
              "the warpgroups' registers are the entry allocation's");

// Phase clock of the fused forward (profiling builds only, GDN_CHUNKED_PHASE_CLOCK): block 0's
// producer (thread 256) stamps clock64() per chunk at points 0 (loop top), 8 (its Q K V landed),
// 9 (tail rows zeroed), 1 to 7 (prepare_chunk's phases) and 10 (record handed over); its first
// consumer thread (0) at 11 (loop top), 12 (Q K V landed), 13 (record landed), 14 (buffer
// released). Read back with chunked_fused_clock_bf16 (chunked_bf16.cu); the benchmark prints it.
constexpr int kFusedClockPoints = 16;
#ifdef GDN_CHUNKED_PHASE_CLOCK
static __device__ long long fused_clock[kPhaseChunks * kFusedClockPoints];
#define GDN_FUSED_STAMP(thread, index, point)                                                       \
  do {                                                                                               \
    if (blockIdx.x == 0 && tid == (thread) && (index) < kPhaseChunks)                                \
      fused_clock[(index) * kFusedClockPoints + (point)] = clock64();                                \
  } while (0)
#else
#define GDN_FUSED_STAMP(thread, index, point) \
  do {                                        \
  } while (0)
#endif

// Shared memory: two buffers of Q, K, V and the record; each warpgroup's O staging tile; fused:
// the producer's A, T and scalars (PrepPlan<E, KP, 1>'s tiles, prepare_chunk).
template <class E, int KP, int BV, bool kFused = false>
struct WgtPlan {
  using Rec = PrepPlan<E, KP>;
  static_assert(KP == 128 && BV == 128 && sizeof(E) == 2, "K 128, V tile 128, 2-byte inputs");
  static constexpr std::size_t q_bytes = std::size_t(KP) * kC * 2;
  static constexpr std::size_t v_bytes = std::size_t(BV) * kC * 2;
  static constexpr std::size_t align1024(std::size_t x) { return (x + 1023) / 1024 * 1024; }
  static constexpr std::size_t w_off_t = 0, w_off_tlo = Rec::rec_tlo, w_off_p = Rec::rec_p, w_off_scalar = Rec::rec_scalar,
                               w_off_plo = Rec::rec_plo;
  static_assert(Rec::p_lo, "the record has P lo (P Vnew takes P hi + lo)");
  static constexpr std::size_t q_slot = align1024(q_bytes), v_slot = align1024(v_bytes),
                               w_slot = align1024(Rec::record_bytes);
  static constexpr std::size_t off_q = 0;                     // + buffer * q_slot
  static constexpr std::size_t off_k = off_q + 2 * q_slot;    // + buffer * q_slot
  static constexpr std::size_t off_v = off_k + 2 * q_slot;    // + buffer * v_slot
  static constexpr std::size_t off_w = off_v + 2 * v_slot;    // + buffer * w_slot
  // O of a warpgroup: 64 tokens x 64 columns, rows of 128 bytes, swizzled<128> (stmatrix and the
  // 16-byte reads for the global stores are conflict-free).
  static constexpr std::size_t o_tile = std::size_t(kC) * 64 * 2;
  static constexpr std::size_t off_o = off_w + 2 * w_slot;    // + group * o_tile
  // One mbarrier per buffer for its copies, then (fused) one per buffer for its record and one
  // per buffer for its release by the state warpgroups.
  static constexpr std::size_t off_bar = off_o + 2 * o_tile;
  static constexpr std::size_t off_release = off_bar + 6 * sizeof(std::uint64_t);
  using Prep = PrepPlan<E, KP, 1>;
  static constexpr std::size_t off_prep = align128(off_release + 2 * sizeof(unsigned));  // A, T, scalars, live
  static constexpr std::size_t prep_bytes = kFused ? 2 * Prep::f_bytes + Prep::scalar_bytes + Prep::live_bytes : 0;
  static constexpr std::size_t bytes = off_prep + prep_bytes;
  static_assert(bytes <= 227 * 1024, "shared-memory plan exceeds the per-block limit");
  static constexpr int min_blocks = 1;
};

// kSingle: ChunkedRounding::single, as chunked_forward_wg's (no lo pass; the lo fragments are
// then never computed). kFused: the producer warpgroup computes the records (see above), and
// the copies bring Q, K and V only.
template <class E, int KP, int BV, bool kSingle = false, bool kFused = false>
__global__ void __launch_bounds__(kFused ? kFusedThreads : kThreads, 1)
    chunked_forward_wgt(const __grid_constant__ ChunkedParams p) {
  using L = WgtPlan<E, KP, BV, kFused>;
  using R = typename L::Rec;
  static_assert(std::is_same_v<E, __nv_bfloat16>, "bf16 (fp16 at K 128 has no V tile 128)");
  static_assert(kThreads == 256, "two warpgroups");
  constexpr int KS = KP / 16, CS = kC / 16;  // k steps over K, over the chunk's tokens
  constexpr int NK = KP / 8;                 // the state's 8-column tiles (columns = K)
  constexpr int NC = kC / 8;                 // X's, Vnew's and O's 8-column tiles (columns = tokens)
  extern __shared__ __align__(1024) unsigned char smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int group = warp >> 2, wl = warp & 3;
  const int g = lane >> 2, t = lane & 3;

  const int tiles = p.value_tiles;
  const int tile = static_cast<int>(blockIdx.x % static_cast<unsigned>(tiles));
  const std::int64_t pair = blockIdx.x / static_cast<unsigned>(tiles);
  const int j = static_cast<int>(pair % p.HV);
  const SegmentPlace place = locate_segment(p, pair / p.HV);
  if (!place.valid) return;
  const int n = place.n;
  const int h = j / p.group;
  const int v0 = tile * BV;
  const int wcol0 = v0 + group * 64;  // the warpgroup's first value column
  const std::int64_t bos = place.bos, eos = place.eos;
  const std::int64_t first_chunk = place.first_chunk;
  const bool last_segment = place.ls + 1 == place.nseg;
  const std::int64_t affine_stride = std::int64_t(p.K) + p.V;
  const std::int64_t unit = pair / p.HV;
  const std::int64_t dense = (static_cast<std::int64_t>(n) * p.HV + j) * p.K * p.V + wcol0;
  const float* init = nullptr;
  std::int64_t init_stride = p.V;
  if (place.ls == 0 && p.has_h0) {
    init = p.h0 + dense;
  } else if (place.ls > 0) {
    init = p.ws_affine + ((unit - 1) * p.HV + j) * p.K * affine_stride + p.K + wcol0;
    init_stride = affine_stride;
  }

  // The warpgroup's state, transposed: S^T[v][k] with v = 16 wl + g (+ 8) of its 64 columns
  // (rows of the accumulator) and k = 8 nk + 2 t (+ 1) (its columns).
  float S[NK][4];
  auto for_each_state = [&](auto&& f) {
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        f(16 * wl + g + 8 * half, 8 * nk + 2 * t, S[nk][2 * half], S[nk][2 * half + 1]);
  };

  std::uint64_t* const full = reinterpret_cast<std::uint64_t*>(smem + L::off_bar);
  // Fused: ready[b], the producer's record of buffer b's chunk (each producer thread arrives
  // after its own stores and proxy fence); empty[b], the state warpgroups done with buffer b
  // (each of their threads arrives after its last read), before the producer writes it again.
  std::uint64_t* const ready = full + 2;
  std::uint64_t* const empty = full + 4;
  unsigned* const released = reinterpret_cast<unsigned*>(smem + L::off_release);
  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      ptx::bulk::barrier_init(full + b, 1);
      ptx::bulk::barrier_init(ready + b, 128);
      ptx::bulk::barrier_init(empty + b, 256);
    }
    released[0] = released[1] = 0u;
    ptx::bulk::fence_barrier_init();
  }
  __syncthreads();
  const int chunks = static_cast<int>((eos - bos + kC - 1) / kC);
  if constexpr (kFused) {
    if (group == 2) {
      // The producer: chunk i's record into buffer i & 1 once the state warpgroups are done with
      // chunk i - 2 there (empty) and chunk i's Q, K and V have landed (full).
      ptx::setmaxnreg_dec<kFusedProducerRegisters>();
      using P1 = typename L::Prep;
      const int ptid = tid - 2 * 128;
      unsigned char* const prep = smem + L::off_prep;
      const PrepSmem<E> places{nullptr, nullptr, prep, prep + P1::f_bytes, prep + 2 * P1::f_bytes,
                               reinterpret_cast<int*>(prep + 2 * P1::f_bytes + P1::scalar_bytes)};
      const bool scanner = ptid < 32;
      const float A_log = p.fused_gates && scanner ? p.A_log[j] : 0.f;
      const float dt_bias = p.fused_gates && scanner ? p.dt_bias[j] : 0.f;
      auto sync = [] { ptx::bar_sync<4, 128>(); };
      for (int index = 0; index < chunks; ++index) {
        const std::int64_t start = bos + std::int64_t(index) * kC;
        const int c = static_cast<int>(eos - start < kC ? eos - start : kC);
        const int b = index & 1;
        GDN_FUSED_STAMP(256, index, 0);
        GateInputs gates;
        if (scanner) gates = load_gate_inputs(p, j, start, c, lane);
        if (index >= 2) ptx::bulk::wait(empty + b, (static_cast<unsigned>(index >> 1) & 1u) ^ 1u);
        ptx::bulk::wait(full + b, static_cast<unsigned>(index >> 1) & 1u);
        GDN_FUSED_STAMP(256, index, 8);
        unsigned char* const Qb = smem + L::off_q + b * L::q_slot;
        unsigned char* const Kb = smem + L::off_k + b * L::q_slot;
        unsigned char* const Vb = smem + L::off_v + b * L::v_slot;
        unsigned char* const Wb = smem + L::off_w + b * L::w_slot;
        if (c < kC) {  // the next sequence's tokens: zeros, for the record and the consumers
          constexpr int slabs = 2 * (KP / 64) + BV / 64;  // Q, K, then V slabs
          const int per_slab = (kC - c) * 8;
          for (int idx = ptid; idx < slabs * per_slab; idx += 128) {
            const int slab = idx / per_slab, rest = idx % per_slab;
            unsigned char* const base = slab < KP / 64       ? Qb + slab * 8192
                                        : slab < 2 * (KP / 64) ? Kb + (slab - KP / 64) * 8192
                                                               : Vb + (slab - 2 * (KP / 64)) * 8192;
            *reinterpret_cast<uint4*>(base + (c + rest / 8) * 128 + (rest % 8) * 16) = make_uint4(0u, 0u, 0u, 0u);
          }
          sync();
        }
        GDN_FUSED_STAMP(256, index, 9);
        PrepSmem<E> at = places;
        at.Qs = reinterpret_cast<const E*>(Qb);
        at.Ks = reinterpret_cast<const E*>(Kb);
        prepare_chunk<E, KP, 1, 4>(p, at, [&](int) { return Wb; }, j, c, gates, A_log, dt_bias, 0, ptid, sync,
                                   [&](int point) { GDN_FUSED_STAMP(256, index, point); });
        // Each producer thread's stores (the record, the zeroed rows) before the consumers'
        // wgmma read them and before the copies two chunks on overwrite them; then the scratch
        // tiles are free for the next chunk once every producer thread is past them (sync).
        ptx::fence_proxy_async_shared();
        ptx::bulk::arrive(ready + b);
        sync();
        GDN_FUSED_STAMP(256, index, 10);
      }
      return;
    }
    ptx::setmaxnreg_inc<kFusedConsumerRegisters>();
  }
  for_each_state([&](int v, int k, float& x0, float& x1) {
    x0 = x1 = 0.f;
    if (init && k < p.K) {
      x0 = init[static_cast<std::int64_t>(k) * init_stride + v];
      x1 = init[static_cast<std::int64_t>(k + 1) * init_stride + v];
    }
  });

  auto record_src = [&](std::int64_t chunk) {
    return p.ws_records + (chunk * p.HV + j) * static_cast<std::int64_t>(R::record_bytes);
  };
  // Chunk `index`'s Q, K, V and whole record into buffer index & 1, on that buffer's barrier
  // (single rounding: the record without T lo and P lo, which the prepass then does not write).
  constexpr unsigned record_copied =
      unsigned(kSingle ? R::scalars_end - (R::rec_p - R::rec_tlo) : R::record_bytes);
  auto issue_chunk = [&](int index) {
    const int b = index & 1;
    const int token = static_cast<int>(bos + std::int64_t(index) * kC);
    ptx::fence_proxy_async_shared();
    ptx::bulk::arrive_expect_tx(full + b, unsigned(2 * L::q_bytes + L::v_bytes) + (kFused ? 0u : record_copied));
#pragma unroll
    for (int slab = 0; slab < KP / 64; ++slab) {
      ptx::bulk::tensor_load_3d(smem + L::off_q + b * L::q_slot + slab * 8192, &p.tmap_q, 64 * slab, h, token, full + b);
      ptx::bulk::tensor_load_3d(smem + L::off_k + b * L::q_slot + slab * 8192, &p.tmap_k, 64 * slab, h, token, full + b);
    }
#pragma unroll
    for (int slab = 0; slab < BV / 64; ++slab)
      ptx::bulk::tensor_load_3d(smem + L::off_v + b * L::v_slot + slab * 8192, &p.tmap_v, v0 + 64 * slab, j, token, full + b);
    if constexpr (kFused) {
      // the producer writes the record
    } else if constexpr (kSingle) {
      ptx::bulk::bulk_load(smem + L::off_w + b * L::w_slot, record_src(first_chunk + index), unsigned(R::rec_tlo), full + b);
      ptx::bulk::bulk_load(smem + L::off_w + b * L::w_slot + R::rec_p, record_src(first_chunk + index) + R::rec_p,
                      unsigned(R::scalars_end - R::rec_p), full + b);
    } else {
      ptx::bulk::bulk_load(smem + L::off_w + b * L::w_slot, record_src(first_chunk + index), unsigned(R::record_bytes), full + b);
    }
  };
  if (tid == 0)
    for (int index = 0; index < 2 && index < chunks; ++index) issue_chunk(index);
  // Rows [c, 64) of a tile of 64-row slabs of 128-byte rows, zeroed by the block.
  auto zero_rows = [&](unsigned char* tile_base, int slabs, int c) {
    const int per_slab = (kC - c) * 8;
    for (int idx = tid; idx < slabs * per_slab; idx += kThreads) {
      const int slab = idx / per_slab, rest = idx % per_slab;
      *reinterpret_cast<uint4*>(tile_base + slab * 8192 + (c + rest / 8) * 128 + (rest % 8) * 16) =
          make_uint4(0u, 0u, 0u, 0u);
    }
  };
  // Out of step, as chunked_forward_wg's small tiles (see there): warpgroup 1 starts once
  // warpgroup 0 has its first X (sequences of at least one whole chunk), and the second
  // warpgroup done with a buffer refills it two chunks ahead.
  const bool stagger = eos - bos >= kC;
  if (stagger && group == 1) ptx::bar_sync<3, 256>();
  auto second_release = [&](int b) {
    if ((tid & 127) != 0) return false;
    return (ptx::atomic_inc_acq_rel_block(released + b) & 1u) != 0u;
  };
  unsigned char* const Ot = smem + L::off_o + group * L::o_tile;

  int chunk_index = 0;
  for (std::int64_t start = bos; start < eos; start += kC, ++chunk_index) {
    const int c = static_cast<int>(eos - start < kC ? eos - start : kC);
    const int buf = chunk_index & 1;
    unsigned char* const Qc = smem + L::off_q + buf * L::q_slot;
    unsigned char* const Kc = smem + L::off_k + buf * L::q_slot;
    unsigned char* const Vc = smem + L::off_v + buf * L::v_slot;
    unsigned char* const Wc = smem + L::off_w + buf * L::w_slot;
    const float* const sc = reinterpret_cast<const float*>(Wc + L::w_off_scalar);
    // The scalars of tokens (2 q, 2 q + 1): beta, r_q, r_k, e_start, e_end.
    auto scalar2 = [&](int which, int token) { return *reinterpret_cast<const float2*>(sc + which * kC + token); };
    if constexpr (kFused) GDN_FUSED_STAMP(0, chunk_index, 11);
    ptx::bulk::wait(full + buf, static_cast<unsigned>(chunk_index >> 1) & 1u);
    if constexpr (kFused) GDN_FUSED_STAMP(0, chunk_index, 12);
    if constexpr (kFused) ptx::bulk::wait(ready + buf, static_cast<unsigned>(chunk_index >> 1) & 1u);
    if constexpr (kFused) GDN_FUSED_STAMP(0, chunk_index, 13);
    if (!kFused && c < kC) {  // the next sequence's tokens: zeros (a sequence's last chunk only)
      zero_rows(Qc, KP / 64, c);
      zero_rows(Kc, KP / 64, c);
      zero_rows(Vc, BV / 64, c);
      ptx::fence_proxy_async_shared();
      __syncthreads();
    }

    // --- X^T = S0^T K^T and O^T = S0^T Q^T (S0 as hi + lo: all hi k steps, then all lo) --------
    float X[NC][4], O[NC][4];
    zero(X);
    zero(O);
    std::uint32_t s_hi[KS][4], s_lo[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      wgt::split(S[2 * ks][0], S[2 * ks][1], s_hi[ks][0], s_lo[ks][0] GDN_LO_FAULT);
      wgt::split(S[2 * ks][2], S[2 * ks][3], s_hi[ks][1], s_lo[ks][1] GDN_LO_FAULT);
      wgt::split(S[2 * ks + 1][0], S[2 * ks + 1][1], s_hi[ks][2], s_lo[ks][2] GDN_LO_FAULT);
      wgt::split(S[2 * ks + 1][2], S[2 * ks + 1][3], s_hi[ks][3], s_lo[ks][3] GDN_LO_FAULT);
    }
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) wg::mma_rs_kb(X, s_hi[ks], wg::a_desc_sw128(Kc, ks), __nv_bfloat16{});
    if constexpr (!kSingle)
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) wg::mma_rs_kb(X, s_lo[ks], wg::a_desc_sw128(Kc, ks), __nv_bfloat16{});
    wg::commit();
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) wg::mma_rs_kb(O, s_hi[ks], wg::a_desc_sw128(Qc, ks), __nv_bfloat16{});
    if constexpr (!kSingle)  // S0 lo after all hi k steps, as chunked_forward_wg
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) wg::mma_rs_kb(O, s_lo[ks], wg::a_desc_sw128(Qc, ks), __nv_bfloat16{});
    wg::commit();
    wg::wait_group<1>();
    wg::fence_operand(X);
    if (stagger && group == 0 && chunk_index == 0) ptx::bar_arrive<3, 256>();

    // X^T[v][s] = beta_s (V[s][v] - e_start_s r_k_s X), rounded hi + lo in registers as the A
    // fragments of T X. V^T in the accumulator's layout from ldmatrix.trans of the V tile (this
    // warpgroup's 64-column slab; rows = tokens).
    std::uint32_t x_hi[CS][4], x_lo[CS][4];
    {
      const unsigned char* const vslab = Vc + group * 8192;
      const int i8 = lane >> 3, r8 = lane & 7;
#pragma unroll
      for (int m = 0; m < NC / 2; ++m) {  // tokens 16 m .. 16 m + 15 = k step m of T X
        std::uint32_t vr[4];
        // Matrix i8: tokens 8 (2 m + (i8 >> 1)) + r8, columns 16 wl + 8 (i8 & 1) .. + 7.
        ptx::ldsm_x4_t(vr, reinterpret_cast<const E*>(vslab) +
                          swizzled<128>(8 * (2 * m + (i8 >> 1)) + r8, 16 * wl + 8 * (i8 & 1)));
        float xv[2][2][2];  // [nt within the step][half][u]
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int nt = 2 * m + q, tok = 8 * nt + 2 * t;
          const float2 beta = scalar2(0, tok), r_k = scalar2(2, tok), e_start = scalar2(3, tok);
          const float w0 = e_start.x * r_k.x, w1 = e_start.y * r_k.y;
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const std::uint32_t bits = vr[2 * q + half];
            const float2 vf = to_float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
            xv[q][half][0] = beta.x * (vf.x - w0 * X[nt][2 * half]);
            xv[q][half][1] = beta.y * (vf.y - w1 * X[nt][2 * half + 1]);
          }
        }
        wgt::split(xv[0][0][0], xv[0][0][1], x_hi[m][0], x_lo[m][0] GDN_LO_FAULT);
        wgt::split(xv[0][1][0], xv[0][1][1], x_hi[m][1], x_lo[m][1] GDN_LO_FAULT);
        wgt::split(xv[1][0][0], xv[1][0][1], x_hi[m][2], x_lo[m][2] GDN_LO_FAULT);
        wgt::split(xv[1][1][0], xv[1][1][1], x_hi[m][3], x_lo[m][3] GDN_LO_FAULT);
      }
    }

    // Q S0 ran on under the X epilogue: done with it here, so that the S0 fragments' registers
    // are free before T X's are taken.
    wg::wait_all();
    wg::fence_operand(O);
    wg::fence_operand(s_hi);
    if constexpr (!kSingle) wg::fence_operand(s_lo);

    // --- Vnew^T = X^T (T hi + T lo)^T: X hi T hi, X lo T hi, X hi T lo -------------------------
    const unsigned char* const Tc = Wc + L::w_off_t;
    const unsigned char* const Tloc = Wc + L::w_off_tlo;
    const unsigned char* const Pc = Wc + L::w_off_p;
    const unsigned char* const Ploc = Wc + L::w_off_plo;  // but single
    float Vacc[NC][4];
    zero(Vacc);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < CS; ++ks) wg::mma_rs_kb(Vacc, x_hi[ks], wg::a_desc_sw128(Tc, ks), __nv_bfloat16{});
    if constexpr (!kSingle) {
#pragma unroll
      for (int ks = 0; ks < CS; ++ks) wg::mma_rs_kb(Vacc, x_lo[ks], wg::a_desc_sw128(Tc, ks), __nv_bfloat16{});
#pragma unroll
      for (int ks = 0; ks < CS; ++ks) wg::mma_rs_kb(Vacc, x_hi[ks], wg::a_desc_sw128(Tloc, ks), __nv_bfloat16{});
    }
    wg::commit();
    wg::wait_all();
    wg::fence_operand(Vacc);
    wg::fence_operand(x_hi);
    if constexpr (!kSingle) wg::fence_operand(x_lo);

    // O's column scales e_start r_q (Q S0 is done); Vnew (hi + lo, for P Vnew) and
    // Vnew_d = e_end r_k Vnew (hi + lo, for the state update) as A fragments.
    std::uint32_t vn[CS][4], vn_lo[CS][4], vd_hi[CS][4], vd_lo[CS][4];
#pragma unroll
    for (int m = 0; m < CS; ++m) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int nt = 2 * m + q, tok = 8 * nt + 2 * t;
        const float2 r_q = scalar2(1, tok), r_k = scalar2(2, tok), e_start = scalar2(3, tok), e_end = scalar2(4, tok);
        const float wq0 = e_start.x * r_q.x, wq1 = e_start.y * r_q.y;
        const float wd0 = e_end.x * r_k.x, wd1 = e_end.y * r_k.y;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          O[nt][2 * half] *= wq0;
          O[nt][2 * half + 1] *= wq1;
          const float x0 = Vacc[nt][2 * half], x1 = Vacc[nt][2 * half + 1];
          wgt::split(x0, x1, vn[m][2 * q + half], vn_lo[m][2 * q + half] GDN_LO_FAULT);
          wgt::split(wd0 * x0, wd1 * x1, vd_hi[m][2 * q + half], vd_lo[m][2 * q + half] GDN_LO_FAULT);
        }
      }
    }

    // --- S^T = decay S^T + Vnew_d^T K (hi, then lo); O^T += Vnew^T (P hi + P lo)^T: per k step
    // P Vnew hi, P Vnew lo, P lo Vnew hi (chunked_forward_wg's order) ----------------------------
    const float decay = sc[5 * kC];
#pragma unroll
    for (int nk = 0; nk < NK; ++nk)
#pragma unroll
      for (int e = 0; e < 4; ++e) S[nk][e] *= decay;
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < CS; ++ks) wg::mma_rs(S, vd_hi[ks], wg::b_desc_mn_sw128(Kc, ks), __nv_bfloat16{});
    if constexpr (!kSingle)
#pragma unroll
      for (int ks = 0; ks < CS; ++ks) wg::mma_rs(S, vd_lo[ks], wg::b_desc_mn_sw128(Kc, ks), __nv_bfloat16{});
    wg::commit();
#pragma unroll
    for (int ks = 0; ks < CS; ++ks) {
      wg::mma_rs_kb(O, vn[ks], wg::a_desc_sw128(Pc, ks), __nv_bfloat16{});
      if constexpr (!kSingle) {
        wg::mma_rs_kb(O, vn_lo[ks], wg::a_desc_sw128(Pc, ks), __nv_bfloat16{});
        wg::mma_rs_kb(O, vn[ks], wg::a_desc_sw128(Ploc, ks), __nv_bfloat16{});
      }
    }
    wg::commit();
    wg::wait_all();
    wg::fence_operand(S);
    wg::fence_operand(O);
    wg::fence_operand(vn);
    if constexpr (!kSingle) wg::fence_operand(vn_lo);
    wg::fence_operand(vd_hi);
    if constexpr (!kSingle) wg::fence_operand(vd_lo);
    // This warpgroup is done with the chunk's buffer: chunk index + 2 goes into it once the
    // other warpgroup is done too.
    if constexpr (kFused) ptx::bulk::arrive(empty + buf);  // this thread's reads of the buffer are done
    warpgroup_sync(group);
    if (second_release(buf) && chunk_index + 2 < chunks) issue_chunk(chunk_index + 2);
    if constexpr (kFused) GDN_FUSED_STAMP(0, chunk_index, 14);

    // O^T through the warpgroup's staging tile, transposed by stmatrix into rows of tokens, then
    // 16-byte global stores of the chunk's rows.
    {
      const float scale = p.scale;
      const int i8 = lane >> 3, r8 = lane & 7;
#pragma unroll
      for (int m = 0; m < NC / 2; ++m) {
        // Matrix i8: tokens 8 (2 m + (i8 >> 1)) .. + 7 (rows in memory), columns 16 wl + 8 (i8 & 1).
        const int nt0 = 2 * m, nt1 = 2 * m + 1;
        ptx::stsm_x4_t(reinterpret_cast<E*>(Ot) + swizzled<128>(8 * (2 * m + (i8 >> 1)) + r8, 16 * wl + 8 * (i8 & 1)),
                       wgt::pack(scale * O[nt0][0], scale * O[nt0][1]), wgt::pack(scale * O[nt0][2], scale * O[nt0][3]),
                       wgt::pack(scale * O[nt1][0], scale * O[nt1][1]), wgt::pack(scale * O[nt1][2], scale * O[nt1][3]));
      }
    }
    warpgroup_sync(group);
    {
      E* const og = static_cast<E*>(p.o);
      const int u = tid & 127;
#pragma unroll
      for (int idx = u; idx < kC * 8; idx += 128) {
        const int r = idx >> 3, piece = idx & 7;
        if (r < c)
          *reinterpret_cast<uint4*>(og + ((start + r) * p.HV + j) * p.V + wcol0 + 8 * piece) =
              *reinterpret_cast<const uint4*>(reinterpret_cast<const E*>(Ot) + swizzled<128>(r, 8 * piece));
      }
    }
    // The next chunk's stmatrix into the staging tile comes after its own barriers (at least
    // the T X wait and this warpgroup's release barrier), which follow every read above.
  }

  if (last_segment && p.has_hT) {
    float* const out = p.hT + dense;
    for_each_state([&](int v, int k, float& x0, float& x1) {
      if (k < p.K) {
        out[static_cast<std::int64_t>(k) * p.V + v] = x0;
        out[static_cast<std::int64_t>(k + 1) * p.V + v] = x1;
      }
    });
  }
}

}  // namespace gdn::cuda::detail::chunked
