#pragma once
// Part of chunked_kernel.cuh (included there, after the prepass): the forward kernel of the
// bf16 and fp16 instances on Hopper's warpgroup MMA (wgmma). fp32 keeps chunked_forward (plain
// FMAs, no TF32).
//
// Same algebra as chunked_forward, with the roundings of the computed operands the header of
// chunked_kernel.cuh gives for bf16 / fp16; what differs is how the products run:
//   - 2 warpgroups of 4 warps; warpgroup w owns the value columns [w BV/2, (w + 1) BV/2) of the
//     block's V tile, the K x BV/2 slice of the state in its registers and every product of its
//     columns: X = K S0 and O = Q S0, Vnew = T X, O += P Vnew, S = decay S + K^T Vnew_d. The
//     warpgroups share only the chunk's Q, K, V and prepass record (barriers around their
//     copies, below); their B operands (S0, X, Vnew) are private.
//   - Each product is wgmma.m64nNk16 with N = BV/2, B from shared memory through a matrix
//     descriptor. A (K, Q, T, P) is read by the wgmma from the swizzled tiles the copies
//     deliver (tensor copies of Q, K, V, bulk copies of the record; swizzled<>,
//     chunked_kernel.cuh) through a 128-byte-swizzle descriptor (a_desc_sw128); only K^T of the
//     state update goes through registers (ldmatrix.trans). One warpgroup reads each B tile
//     once per 64 rows, where mma.sync had every warp read its own fragments: chunked_forward
//     moves about 1.15 MB of shared memory per chunk at K = BV = 128 and ncu found it
//     latency-bound (2 warps per scheduler, the tensor pipe mostly idle). A in registers
//     (ldmatrix) pinned up to 32 registers a thread while a product ran on under an epilogue;
//     at BV 128 ptxas then spilled the X epilogue's addresses and ran it one load-use-store at
//     a time (a fifth of a chunk's cycles on the phase clock).
//   - B operands live in wgmma's no-swizzle MN-major layout (below), written by the epilogues
//     with 4-byte stores that are bank-conflict free.
//   - Copies, in step (BV 128, and K 64): one buffer of Q, V and the record (T hi, T lo (not
//     in single rounding), P, scalars), two of K. Each thread keeps its rows' scalars in registers, and the next
//     chunk's T (with its scalars) and P are copied as soon as both warpgroups' products that
//     read this chunk's are done (T X; P Vnew). Q, V and the next K buffer are refilled at
//     the same point as T (Q S0 is done by then, and V was read by the X epilogue).
//   - Copies, out of step (K 128 with V tiles up to 64, WgPlan::dephase): two buffers of
//     everything, chunk i in buffer i & 1, and only warpgroup barriers inside a chunk, so one
//     warpgroup's epilogues overlap the other's products (measured faster on one long
//     sequence at BV 32). A buffer is refilled two chunks ahead by the second warpgroup done
//     with it. With one buffer this gained nothing: the warpgroup ahead waited a large part of
//     each chunk (phase clock) for copies only the one behind could issue.
// Each output element is still reduced in one fixed order (k steps of 16 in increasing k, the
// hi pass before the lo pass) that depends neither on the V tile nor on the batch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/ptx/bulk_copy.cuh"
#include "cuda/ptx/sync.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace gdn::cuda::detail::chunked {

// The PTX layer's warpgroup MMA (cuda/ptx/wgmma.cuh) under the name the forward kernels use.
namespace wg = ptx::wgmma;

template <int NT>
__device__ __forceinline__ void zero(float (&d)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) d[nt][e] = 0.f;
}
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 x) { return __bfloat1622float2(x); }
__device__ __forceinline__ float2 to_float2(__half2 x) { return __half22float2(x); }
// Barrier of one warpgroup: named barriers 1 and 2 (0 is __syncthreads, 3 the out-of-step
// start below).
__device__ __forceinline__ void warpgroup_sync(int group) { ptx::bar_sync<128>(group + 1); }

// Phase clock (profiling builds only, CMake option GDN_CHUNKED_PHASE_CLOCK): the first thread of
// each warpgroup of block 0 of the output pass stamps clock64() at fixed points of the first
// kPhaseChunks chunks, so that a chunk's time can be read phase by phase (ncu's stall samples
// say where warps wait, not how long a phase lasts on the chain). Read back with
// chunked_phase_clock_bf16 (chunked_bf16.cu); the benchmark prints it.
constexpr int kPhaseChunks = 64, kPhases = 20;
#ifdef GDN_CHUNKED_PHASE_CLOCK
static __device__ long long phase_clock[2 * kPhaseChunks * kPhases];
#define GDN_PHASE(point)                                                                              \
  do {                                                                                                \
    if (kMode == WgMode::output && blockIdx.x == 0 && (tid & 127) == 0 && chunk_index < kPhaseChunks) \
      phase_clock[(group * kPhaseChunks + chunk_index) * kPhases + (point)] = clock64();              \
  } while (0)
#else
#define GDN_PHASE(point) \
  do {                   \
  } while (0)
#endif

// Shared memory of the wgmma forward: one (sequence, value head, V tile) per block.
// kAffine: the sequence split's affine pass, which has no P Vnew and so no Vnew lo tile.
template <class E, int KP, int BV, bool kAffine = false>
struct WgPlan {
  using Rec = PrepPlan<E, KP>;
  static_assert(sizeof(E) == 2, "wgmma operands are bf16 or fp16");
  static constexpr int NW = BV / 2;  // value columns per warpgroup
  static constexpr bool split_pv = !kAffine;  // Vnew hi + lo in P Vnew (the kernel header says why)
  static constexpr std::size_t es = sizeof(E);
  // The copied tiles are unpadded and swizzled (tma_offset): Q, K and V as the tensor memory
  // accelerator writes its boxes of 64 tokens (Q, K: slabs of 64 columns, 8 KB each; V: one
  // box of min(BV, 64) columns, two at BV 128), the record's tiles as the prepass stores them.
  static constexpr int v_row_bytes = BV < 64 ? BV * 2 : 128;  // one V box's row
  static constexpr std::size_t q_bytes = std::size_t(KP) * kC * es;
  static constexpr std::size_t v_bytes = std::size_t(BV) * kC * es;
  static constexpr std::size_t c_bytes = std::size_t(kC) * kC * es;
  static constexpr std::size_t align1024(std::size_t x) { return (x + 1023) / 1024 * 1024; }
  // The record buffer: T hi | T lo | P | scalars (beta, r_q, r_k, e_start, e_end, decay), the
  // record's own order and layout, so that T hi + T lo and P are one bulk copy each.
  static constexpr std::size_t w_off_t = 0;
  static constexpr std::size_t w_off_tlo = c_bytes;
  static constexpr std::size_t w_off_p = 2 * c_bytes;
  static constexpr std::size_t w_off_scalar = 3 * c_bytes;
  // P lo after the scalars, where the record has it (PrepPlan::rec_plo; not the single mode).
  static constexpr bool p_lo = Rec::p_lo && !kAffine;
  static constexpr std::size_t w_off_plo = Rec::rec_plo;
  static constexpr std::size_t w_bytes = Rec::p_lo ? Rec::record_bytes : w_off_scalar + 6 * kC * 4;
  static_assert(Rec::rec_tlo == Rec::tile_bytes && Rec::rec_p == 2 * Rec::tile_bytes &&
                    Rec::rec_scalar == 3 * Rec::tile_bytes && Rec::tile_bytes == c_bytes,
                "record tiles in order, unpadded");
  // Per warpgroup: S0 hi, S0 lo (KP x NW), then X hi, X lo (64 x NW) and, but in the affine
  // pass, Vnew lo. Vnew and Vnew_d hi take the places of X hi and X lo once T X is done, and
  // Vnew_d lo the start of S0 lo's: S0 lo is dead from K S0's end (waited for before the X
  // epilogue) to the next S0 operand's write, which comes after the state update (Vnew_d lo's
  // reader) is done. That keeps the K 128, BV 32 plan small enough for a prepass block beside it
  // (the chunk-range pipeline) with the Vnew lo tile in it.
  static constexpr std::size_t s_tile = std::size_t(KP) * NW * es;
  static constexpr std::size_t r_tile = std::size_t(kC) * NW * es;
  static_assert(r_tile <= s_tile, "Vnew_d lo fits in S0 lo's place");
  static constexpr int r_tiles = split_pv ? 3 : 2;
  static constexpr std::size_t wg_bytes = 2 * s_tile + r_tiles * r_tile;
  static_assert(s_tile % 128 == 0 && r_tile % 128 == 0, "B tiles keep 128-byte alignment");

  // Where they fit (K 128, V tiles up to 64), two buffers of every copied tile: the warpgroups
  // then run out of step (chunked_forward_wg, dephase), each buffer refilled two chunks ahead
  // once both are done with it. Elsewhere one (K: two) and the warpgroups in step.
  static constexpr int bufs = (KP == 128 && BV <= 64) ? 2 : 1;
  static constexpr bool dephase = bufs == 2;
  // Swizzled tiles start on 1024 bytes (the swizzle pattern repeats every 8 rows of 128 bytes).
  static constexpr std::size_t q_slot = align1024(q_bytes), v_slot = align1024(v_bytes), w_slot = align1024(w_bytes);
  static constexpr std::size_t off_q = 0;  // + buffer * q_slot
  static constexpr std::size_t off_k0 = off_q + bufs * q_slot;
  static constexpr std::size_t off_k1 = off_k0 + q_slot;
  static constexpr std::size_t off_v = off_k1 + q_slot;  // + buffer * v_slot
  static constexpr std::size_t off_w = off_v + bufs * v_slot;  // + buffer * w_slot
  static constexpr std::size_t off_wg = off_w + bufs * w_slot;
  // The copy groups' mbarriers: Q K V, T (+ scalars), P (in step), or one per buffer (out of
  // step); then the buffers' release counters.
  static constexpr std::size_t off_bar = off_wg + 2 * wg_bytes;
  static constexpr std::size_t off_release = off_bar + 3 * sizeof(std::uint64_t);
  static constexpr std::size_t bytes = off_release + 2 * sizeof(unsigned);
  static_assert(bytes <= 227 * 1024, "shared-memory plan exceeds the per-block limit");
  // Two resident blocks where shared memory allows them and the state slice is small enough
  // for 128 registers a thread (ptxas reports no spill for these).
  static constexpr int min_blocks = (chunked_blocks_per_sm(bytes) == 2 && KP * BV <= 64 * 16) ? 2 : 1;
};

// The kernel's modes, each its own instance so that the output pass carries none of the others'
// code: kAffine is the sequence split's pass 1 (ChunkedParams; as a runtime flag it put a select
// and five predicate operations on every element of the X epilogue, ncu), kDebug writes the
// per-chunk intermediates (its address arithmetic, even never executed, cost the BV 128
// instance 80 bytes of spills in the chunk loop).
enum class WgMode { output, affine, debug };
// kSingle (ChunkedRounding::single, the output and affine modes only): every computed operand
// enters its product once, rounded to the input dtype (its hi part): no lo pass of S0, X, T,
// Vnew or Vnew_d. 32 wgmma a warpgroup per chunk at K 128 instead of 68 (fp16: 72), 20 of them on the
// state's chain instead of 44: the rounding design of reference::emulate_operands(single) and of
// kernels that single-round their operands (fla's among them). The lo tiles keep their places
// in the shared-memory plan (the split one's) but are neither written nor read, and T lo is
// neither copied nor written by the prepass.
template <class E, int KP, int BV, WgMode kMode = WgMode::output, bool kSingle = false>
__global__ void __launch_bounds__(kThreads, WgPlan<E, KP, BV, kMode == WgMode::affine>::min_blocks)
    chunked_forward_wg(const __grid_constant__ ChunkedParams p) {
  static_assert(!kSingle || kMode != WgMode::debug, "the debug mode traces the split design only");
  // A computed B operand into shared memory: hi + lo, or (single rounding) hi alone (store2:
  // the same rounding as store_split's hi); the lo tiles are then neither written nor read.
#if GDN_KERNEL_FAULTS
  auto store_operand = [&p](E* hi, E* lo, float x0, float x1) {
    if constexpr (kSingle) {
      store2(hi, x0, x1);
    } else {
      store_split(hi, lo, x0, x1);
      if (GDN_PLANTED(p, chunked_state_lo_dropped)) store2(lo, 0.f, 0.f);
    }
  };
#else
  auto store_operand = [](E* hi, E* lo, float x0, float x1) {
    if constexpr (kSingle)
      store2(hi, x0, x1);
    else
      store_split(hi, lo, x0, x1);
  };
#endif
  using L = WgPlan<E, KP, BV, kMode == WgMode::affine>;
  using R = typename L::Rec;
  using E2 = std::conditional_t<std::is_same_v<E, __half>, __half2, __nv_bfloat162>;
  static_assert(KP % 64 == 0 && KP <= 128, "KP is 64 or 128");
  static_assert(BV % 16 == 0 && BV <= 128, "BV is 16, 32, 64 or 128");
  static_assert(kThreads == 256, "two warpgroups");
  constexpr int NW = L::NW, NT = NW / 8, MH = KP / 64, KS = KP / 16, CS = kC / 16;
  constexpr int VROW = L::v_row_bytes;
  extern __shared__ __align__(1024) unsigned char smem[];
  E* const Qs = reinterpret_cast<E*>(smem + L::off_q);
  E* const Ks0 = reinterpret_cast<E*>(smem + L::off_k0);
  E* const Ks1 = reinterpret_cast<E*>(smem + L::off_k1);
  E* const Vs = reinterpret_cast<E*>(smem + L::off_v);
  unsigned char* const W = smem + L::off_w;  // (in step: the one record buffer)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int group = warp >> 2, wl = warp & 3;  // warpgroup, warp within it
  const int g = lane >> 2, t = lane & 3;
  unsigned char* const mine = smem + L::off_wg + group * L::wg_bytes;
  E* const Shi = reinterpret_cast<E*>(mine);
  E* const Slo = reinterpret_cast<E*>(mine + L::s_tile);
  E* const Xhi = reinterpret_cast<E*>(mine + 2 * L::s_tile);
  E* const Xlo = reinterpret_cast<E*>(mine + 2 * L::s_tile + L::r_tile);
  E* const Vnlo = reinterpret_cast<E*>(mine + 2 * L::s_tile + 2 * L::r_tile);  // not in the affine pass
  E* const Vn = Xhi;    // after T X
  E* const Vdhi = Xlo;  // after T X
  E* const Vdlo = Slo;  // after K S0, until the state update is done (WgPlan)

  // Block = (unit, value head j, tile): a unit is a sequence, or a segment of one with the
  // sequence split (ChunkedParams). Pass 1 puts ceil(K / BV) transition tiles (the columns of
  // M) before the value tiles and writes no output.
  constexpr bool affine = kMode == WgMode::affine;
  const int tiles = p.value_tiles + (affine ? p.affine_tiles : 0);
  const int tile = static_cast<int>(blockIdx.x % static_cast<unsigned>(tiles));
  const std::int64_t pair = blockIdx.x / static_cast<unsigned>(tiles);
  const int j = static_cast<int>(pair % p.HV);
  const SegmentPlace place = locate_segment(p, pair / p.HV);
  if (!place.valid) return;  // cu_seqlens disagree with the Problem
  const bool transition = affine && tile < p.affine_tiles;
  // Pass 1 has nothing to do for a sequence's last segment (its end state is hT, from pass 0),
  // nor for M of segment 0 (it starts from h0: its B is the next segment's start as it is).
  if (affine && (place.ls + 1 == place.nseg || (transition && place.ls == 0))) return;
  const int n = place.n;
  const int h = j / p.group;
  const int v0 = (affine && !transition ? tile - p.affine_tiles : tile) * BV;  // transition: column of M
  const int wcol0 = v0 + group * NW;  // the warpgroup's first column of V (or of M)
  const std::int64_t bos = place.bos, eos = place.eos;
  const std::int64_t first_chunk = place.first_chunk;
  constexpr bool outputs = !affine;
  const bool last_segment = place.ls + 1 == place.nseg;
  // Where the state starts and ends (rows of `stride` floats, from the warpgroup's first column).
  const std::int64_t affine_stride = std::int64_t(p.K) + p.V;
  auto affine_at = [&](std::int64_t unit, int column) {
    return p.ws_affine + (unit * p.HV + j) * p.K * affine_stride + column;
  };
  const std::int64_t dense = (static_cast<std::int64_t>(n) * p.HV + j) * p.K * p.V + wcol0;
  const std::int64_t unit = pair / p.HV;
  const float* init = nullptr;
  std::int64_t init_stride = p.V;
  if (!transition && place.ls == 0 && p.has_h0) {
    init = p.h0 + dense;
  } else if (!affine && place.ls > 0) {
    init = affine_at(unit - 1, p.K + wcol0);
    init_stride = affine_stride;
  }

  // The warpgroup's state slice: rows 64 mh + 16 wl + g (+ 8), columns 8 nt + 2 t (+ 1).
  float S[MH][NT][4];
  auto for_each_state = [&](auto&& f) {
#pragma unroll
    for (int mh = 0; mh < MH; ++mh)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          f(64 * mh + 16 * wl + g + 8 * half, 8 * nt + 2 * t, S[mh][nt][2 * half], S[mh][nt][2 * half + 1]);
  };
  for_each_state([&](int r, int c, float& x0, float& x1) {
    x0 = x1 = 0.f;
    if (transition) {  // M starts as the identity
      x0 = (r == wcol0 + c && r < p.K) ? 1.f : 0.f;
      x1 = (r == wcol0 + c + 1 && r < p.K) ? 1.f : 0.f;
    } else if (init && r < p.K) {
      const float2 s = *reinterpret_cast<const float2*>(init + static_cast<std::int64_t>(r) * init_stride + c);
      x0 = s.x;
      x1 = s.y;
    }
  });
  auto write_state_operand = [&]() {
    for_each_state([&](int r, int c, float& x0, float& x1) {
      const int at = wg::blocked<NW>(r, c);
      store_operand(Shi + at, Slo + at, x0, x1);
    });
    ptx::fence_proxy_async_shared();
  };
  write_state_operand();

  // The chunk's copies run on the tensor memory accelerator, issued by thread 0 and completing
  // on three mbarriers, one per copy group: Q K V (tensor copies of boxes of 64 tokens through
  // the maps in ChunkedParams, 128-byte swizzle), T hi + T lo with the scalars, and P (bulk
  // copies of the record, which the prepass stored swizzled). Each group is copied once per
  // chunk into its one buffer (K: two), so its barrier completes once per chunk and a chunk
  // waits on parity chunk_index & 1. (With 16-byte cp.async from every thread, the phase clock
  // at H16 HV32 1 x 32768, BV 32, found nearly a quarter of a chunk's cycles in the three
  // points that issue them: the threads stalled while the copy queue drained. One bulk copy per row
  // instead was slower still: ptxas serialises them lane by lane.)
  // The maps zero-fill columns past K and tokens past T; tokens past the sequence's end (the
  // next sequence's, in a packed batch) are zeroed at the top of the chunk that holds them,
  // and the transition tiles' V (v = 0) once here.
  std::uint64_t* const full_qkv = reinterpret_cast<std::uint64_t*>(smem + L::off_bar);
  std::uint64_t* const full_t = full_qkv + 1;
  std::uint64_t* const full_p = full_qkv + 2;
  constexpr bool dephase = L::dephase;
  unsigned* const released = reinterpret_cast<unsigned*>(smem + L::off_release);  // per buffer (out of step)
  if (tid == 0) {
    for (int b = 0; b < 3; ++b) ptx::bulk::barrier_init(full_qkv + b, 1);
    released[0] = released[1] = 0u;
    ptx::bulk::fence_barrier_init();
  }
  if (transition)
    for (int idx = tid; idx < int(L::bufs * L::v_slot / 16); idx += kThreads)
      reinterpret_cast<uint4*>(Vs)[idx] = make_uint4(0u, 0u, 0u, 0u);
  __syncthreads();  // barriers initialised, V zeroed, before any copy
  // Q, K (into Kdst) and V of the 64 tokens from `start`.
  // The tensor copies of Q, K and V of the 64 tokens from `token` into the given tiles.
  // The affine pass has no O products: it copies no Q (q_copies) and no P (issue_record_p).
  constexpr unsigned q_copies = outputs ? 2u : 1u;  // Q and K, or K alone
  auto tensor_boxes = [&](E* Qdst, E* Kdst, E* Vdst, int token, std::uint64_t* full) {
#pragma unroll
    for (int slab = 0; slab < KP / 64; ++slab) {
      if constexpr (outputs) ptx::bulk::tensor_load_3d(Qdst + slab * 64 * kC, &p.tmap_q, 64 * slab, h, token, full);
      ptx::bulk::tensor_load_3d(Kdst + slab * 64 * kC, &p.tmap_k, 64 * slab, h, token, full);
    }
    if (!transition)
#pragma unroll
      for (int slab = 0; slab < (BV > 64 ? 2 : 1); ++slab)
        ptx::bulk::tensor_load_3d(Vdst + slab * 64 * kC, &p.tmap_v, v0 + 64 * slab, j, token, full);
  };
  auto issue_loads = [&](std::int64_t start, E* Kdst) {
    if (tid != 0) return;
    ptx::fence_proxy_async_shared();  // this thread's zeroing of the buffers' tail rows, before they are overwritten
    ptx::bulk::arrive_expect_tx(full_qkv, unsigned(q_copies * L::q_bytes + (transition ? 0 : L::v_bytes)));
    tensor_boxes(Qs, Kdst, Vs, static_cast<int>(start), full_qkv);
  };
  // Rows [c, 64) of a swizzled tile of `bytes` (rows of row_bytes per slab, slabs of 64 rows),
  // zeroed by the block; the rows stay within their 128-byte lines, so the swizzle is moot.
  auto zero_rows = [&](E* tile, int row_bytes, int slabs, int c) {
    const int pieces = row_bytes / 16, per_slab = (kC - c) * pieces;
    for (int idx = tid; idx < slabs * per_slab; idx += kThreads) {
      const int slab = idx / per_slab, rest = idx % per_slab;
      *reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(tile) + slab * kC * row_bytes +
                                (c + rest / pieces) * row_bytes + (rest % pieces) * 16) = make_uint4(0u, 0u, 0u, 0u);
    }
  };
  // The record of global chunk `chunk`: T hi + T lo (contiguous; T hi alone in single rounding)
  // with the scalars, or P.
  auto record_src = [&](std::int64_t chunk) {
    return p.ws_records + (chunk * p.HV + j) * static_cast<std::int64_t>(R::record_bytes);
  };
  // Single rounding: no T lo (the prepass does not write it).
  constexpr unsigned t_parts = kSingle ? 1u : 2u;
  auto issue_record_t = [&](std::int64_t chunk) {
    if (tid != 0) return;
    constexpr unsigned scalar_bytes = 6 * kC * 4;
    ptx::bulk::arrive_expect_tx(full_t, unsigned(t_parts * L::c_bytes) + scalar_bytes);
    ptx::bulk::bulk_load(W + L::w_off_t, record_src(chunk) + R::rec_t, unsigned(t_parts * L::c_bytes), full_t);
    ptx::bulk::bulk_load(W + L::w_off_scalar, record_src(chunk) + R::rec_scalar, scalar_bytes, full_t);
  };
  // But single: P lo too, on the same barrier.
  constexpr bool copy_plo = L::p_lo && !kSingle;
  auto issue_record_p = [&](std::int64_t chunk) {
    if (!outputs || tid != 0) return;
    ptx::bulk::arrive_expect_tx(full_p, unsigned((copy_plo ? 2 : 1) * L::c_bytes));
    ptx::bulk::bulk_load(W + L::w_off_p, record_src(chunk) + R::rec_p, unsigned(L::c_bytes), full_p);
    if constexpr (copy_plo)
      ptx::bulk::bulk_load(W + L::w_off_plo, record_src(chunk) + R::rec_plo, unsigned(L::c_bytes), full_p);
  };

  // Out of step (two buffers): chunk i's Q, K, V and whole record (but T lo in single rounding)
  // into buffer i & 1 on that buffer's barrier (full_qkv[i & 1]), one group; the record is one
  // bulk copy in its own layout (T hi | T lo | P | scalars), or two without T lo.
  auto issue_chunk = [&](int index) {
    const int b = index & 1;
    std::uint64_t* const full = full_qkv + b;
    ptx::fence_proxy_async_shared();
    // Single: T hi, then P and the scalars (no T lo, no P lo).
    constexpr unsigned record_copied = unsigned(kSingle ? L::c_bytes + (R::scalars_end - R::rec_p) : R::record_bytes);
    ptx::bulk::arrive_expect_tx(full, unsigned(q_copies * L::q_bytes + (transition ? 0 : L::v_bytes)) + record_copied);
    tensor_boxes(reinterpret_cast<E*>(smem + L::off_q + b * L::q_slot), b ? Ks1 : Ks0,
                 reinterpret_cast<E*>(smem + L::off_v + b * L::v_slot), static_cast<int>(bos + std::int64_t(index) * kC),
                 full);
    if constexpr (kSingle) {  // T hi, then P and the scalars: no T lo
      ptx::bulk::bulk_load(smem + L::off_w + b * L::w_slot, record_src(first_chunk + index), unsigned(L::c_bytes), full);
      ptx::bulk::bulk_load(smem + L::off_w + b * L::w_slot + L::w_off_p, record_src(first_chunk + index) + R::rec_p,
                      unsigned(R::scalars_end - R::rec_p), full);
    } else {
      ptx::bulk::bulk_load(smem + L::off_w + b * L::w_slot, record_src(first_chunk + index), unsigned(R::record_bytes), full);
    }
  };
  const int chunks = static_cast<int>((eos - bos + kC - 1) / kC);

  // The first chunk's three groups; then per chunk, as soon as their buffers are free: the
  // next Q K V, the next T and scalars, the next P. A chunk waits for its P only before P Vnew.
  // Out of step: the first two chunks.
  if constexpr (dephase) {
    if (tid == 0)
      for (int index = 0; index < 2 && index < chunks; ++index) issue_chunk(index);
  } else if (bos < eos) {
    issue_loads(bos, Ks0);
    issue_record_t(first_chunk);
    issue_record_p(first_chunk);
  }
  // Out of step: warpgroup 1 starts once warpgroup 0 has its first X = K S0 (a sequence of at
  // least one whole chunk: the tail chunk's block barrier must not come first), and a buffer is
  // refilled by whichever warpgroup is the second to be done with it: after its own barrier
  // (every thread of it is past the buffer), its first thread counts the release, and the
  // count's parity says whether the other warpgroup had counted already (acquire-release at
  // block scope, as a consumer's mbarrier arrive and a producer's wait would order the readers
  // before the copy). Each warpgroup counts each buffer once per use, and neither can count a
  // buffer twice before the other: its next use waits for the copy only the second count issues.
  const bool stagger = dephase && eos - bos >= kC;
  if (stagger && group == 1) ptx::bar_sync<3, 256>();
  auto second_release = [&](int b) {
    if ((tid & 127) != 0) return false;
    return (ptx::atomic_inc_acq_rel_block(released + b) & 1u) != 0u;
  };

  int chunk_index = 0;
  for (std::int64_t start = bos; start < eos; start += kC, ++chunk_index) {
    const int c = static_cast<int>(eos - start < kC ? eos - start : kC);
    const bool more = start + kC < eos;
    const std::int64_t next = first_chunk + chunk_index + 1;
    E* const Kc = (chunk_index & 1) ? Ks1 : Ks0;
    E* const Kn = (chunk_index & 1) ? Ks0 : Ks1;
    // This chunk's buffers (out of step: buffer chunk_index & 1; in step: the one buffer).
    const int buf = dephase ? (chunk_index & 1) : 0;
    E* const Qc = reinterpret_cast<E*>(smem + L::off_q + buf * L::q_slot);
    E* const Vc = reinterpret_cast<E*>(smem + L::off_v + buf * L::v_slot);
    unsigned char* const Wc = smem + L::off_w + buf * L::w_slot;
    const E* const Tc = reinterpret_cast<const E*>(Wc + L::w_off_t);
    const E* const Tloc = reinterpret_cast<const E*>(Wc + L::w_off_tlo);
    const E* const Pc = reinterpret_cast<const E*>(Wc + L::w_off_p);
    const E* const Ploc = reinterpret_cast<const E*>(Wc + L::w_off_plo);  // but single
    const float* const scalars_c = reinterpret_cast<const float*>(Wc + L::w_off_scalar);
    // The debug buffers' chunk index: chunk_offsets[n] (the host's) equals ws_offsets[n] (the
    // device's), so that of the segment's chunk is first_chunk + chunk_index.
    constexpr bool debug = kMode == WgMode::debug;
    const std::int64_t debug_chunk = debug ? first_chunk + chunk_index : 0;
    GDN_PHASE(0);
    const unsigned parity = static_cast<unsigned>(dephase ? chunk_index >> 1 : chunk_index) & 1u;
    if constexpr (dephase) {
      ptx::bulk::wait(full_qkv + buf, parity);
    } else {
      ptx::bulk::wait(full_qkv, parity);
      ptx::bulk::wait(full_t, parity);
    }
    if (c < kC) {  // the tokens past the sequence's end: zeros, not the next sequence's
      zero_rows(Qc, 128, KP / 64, c);
      zero_rows(Kc, 128, KP / 64, c);
      if (!transition) zero_rows(Vc, VROW, BV > 64 ? 2 : 1, c);
      ptx::fence_proxy_async_shared();  // before the async proxy overwrites them (next chunk's copies)
      __syncthreads();  // the zeroed rows, for both warpgroups (out of step: a sequence's last chunk only)
    } else if constexpr (dephase) {
      warpgroup_sync(group);  // this warpgroup's S0 operand
    } else {
      __syncthreads();  // the chunk's Q, K, V, T and scalars; every warpgroup's S0 operand
    }
    GDN_PHASE(1);

    // The thread's rows i = 16 wl + g + 8 half: their scalars, kept in registers so that the
    // record buffer can take the next chunk's while this one runs.
    float beta[2], e_start[2], r_q[2], r_k[2], e_end[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * wl + g + 8 * half;
      beta[half] = scalars_c[i];
      r_q[half] = scalars_c[kC + i];
      r_k[half] = scalars_c[2 * kC + i];
      e_start[half] = scalars_c[3 * kC + i];
      e_end[half] = scalars_c[4 * kC + i];
    }
    const float decay = scalars_c[5 * kC];
    // fp16: 2^-m of the state update's exponent (chunked_kernel.cuh, rescale_state_update).
    const float unscale = std::is_same_v<E, __half> ? scalars_c[5 * kC + 1] : 1.f;

    // --- X = K S0 and O = Q S0 (S0 as hi + lo; hi alone in the single mode) ------------------
    float X[NT][4], O[NT][4];
    zero(X);
    zero(O);
    {
      // X (on the state's chain) first; then O, which runs on while the X epilogue does (O is
      // waited for with T X). K and Q are A operands straight from their swizzled tiles.
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) wg::mma_ss(X, wg::a_desc_sw128(Kc, ks), wg::b_desc<NW>(Shi, ks), E{});
      if constexpr (!kSingle)
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) wg::mma_ss(X, wg::a_desc_sw128(Kc, ks), wg::b_desc<NW>(Slo, ks), E{});
      wg::commit();
      wg::wait_all();
      wg::fence_operand(X);
    GDN_PHASE(2);
      if (stagger && group == 0 && chunk_index == 0) ptx::bar_arrive<3, 256>();
      if constexpr (outputs) {
        wg::fence();
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) wg::mma_ss(O, wg::a_desc_sw128(Qc, ks), wg::b_desc<NW>(Shi, ks), E{});
        // S0 lo too (read before T X's wait, so before Vnew_d lo takes its place).
        if constexpr (!kSingle)
#pragma unroll
          for (int ks = 0; ks < KS; ++ks) wg::mma_ss(O, wg::a_desc_sw128(Qc, ks), wg::b_desc<NW>(Slo, ks), E{});
      }
      wg::commit();  // (empty in pass 1)
    }
    GDN_PHASE(3);
    if (debug && p.debug_S0) {
      float* dst = p.debug_S0 + (debug_chunk * p.HV + j) * p.K * p.V + wcol0;
      for_each_state([&](int r, int col, float& x0, float& x1) {
        if (r < p.K) *reinterpret_cast<float2*>(dst + static_cast<std::int64_t>(r) * p.V + col) = make_float2(x0, x1);
      });
    }
    // X = diag(beta) (V - diag(e_start r_k) K S0), to the input dtype as hi + lo. The thread's
    // V pairs are all loaded before any is used.
    {
      E2 v[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          v[nt][half] = *reinterpret_cast<const E2*>(Vc + swizzled<VROW>(16 * wl + g + 8 * half, group * NW + 8 * nt + 2 * t));
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * wl + g + 8 * half, col = 8 * nt + 2 * t;
          const float w = e_start[half] * r_k[half];
          const float2 vf = to_float2(v[nt][half]);
          const float x0 = beta[half] * (vf.x - w * X[nt][2 * half]);
          const float x1 = beta[half] * (vf.y - w * X[nt][2 * half + 1]);
          store_operand(Xhi + wg::blocked<NW>(i, col), Xlo + wg::blocked<NW>(i, col), x0, x1);
        }
    }
    GDN_PHASE(4);
    ptx::fence_proxy_async_shared();
    warpgroup_sync(group);  // X is written
    GDN_PHASE(5);
    GDN_PHASE(6);

    // --- Vnew = T hi X hi + T hi X lo + T lo X hi ------------------------------------------------
    float Vacc[NT][4];
    zero(Vacc);
    {
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < CS; ++ks) wg::mma_ss(Vacc, wg::a_desc_sw128(Tc, ks), wg::b_desc<NW>(Xhi, ks), E{});
      if constexpr (!kSingle) {
#pragma unroll
        for (int ks = 0; ks < CS; ++ks) wg::mma_ss(Vacc, wg::a_desc_sw128(Tc, ks), wg::b_desc<NW>(Xlo, ks), E{});
#pragma unroll
        for (int ks = 0; ks < CS; ++ks) wg::mma_ss(Vacc, wg::a_desc_sw128(Tloc, ks), wg::b_desc<NW>(Xhi, ks), E{});
      }
      wg::commit();
      GDN_PHASE(7);
      wg::wait_all();
      // Both warpgroups' T X and Q S0 are done (their wgmma read T and Q from shared memory),
      // the scalars are in registers and V was read by the X epilogue: the next chunk's Q, K,
      // V and T (K into the other buffer: this chunk's K is read again for K^T).
      if constexpr (!dephase) {
        __syncthreads();
        if (more) {
          issue_loads(start + kC, Kn);
          issue_record_t(next);
        }
      }
      GDN_PHASE(8);
      wg::fence_operand(Vacc);
      wg::fence_operand(O);
      GDN_PHASE(9);
    }
    // O's row scales (Q S0 is done with T X).
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float wq = e_start[half] * r_q[half];
        O[nt][2 * half] *= wq;
        O[nt][2 * half + 1] *= wq;
      }
    warpgroup_sync(group);  // every warp's T X is done: Vnew and Vnew_d hi may take X's places
    GDN_PHASE(10);
    {
      float* dv = debug && p.debug_Vnew ? p.debug_Vnew + (debug_chunk * p.HV + j) * kC * p.V + wcol0 : nullptr;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * wl + g + 8 * half, col = 8 * nt + 2 * t;
          const float x0 = Vacc[nt][2 * half], x1 = Vacc[nt][2 * half + 1];
          const int at = wg::blocked<NW>(i, col);
          if constexpr (L::split_pv)
            store_operand(Vn + at, Vnlo + at, x0, x1);
          else
            store2(Vn + at, x0, x1);
          const float w = e_end[half] * r_k[half];
          store_operand(Vdhi + at, Vdlo + at, w * x0, w * x1);
          if (dv) *reinterpret_cast<float2*>(dv + static_cast<std::int64_t>(i) * p.V + col) = make_float2(x0, x1);
        }
    }
    ptx::fence_proxy_async_shared();
    GDN_PHASE(11);
    if constexpr (dephase) {
      warpgroup_sync(group);  // Vnew, Vnew_d written (this warpgroup); P came with the rest
    } else {
      if constexpr (outputs) ptx::bulk::wait(full_p, parity);  // the chunk's P
      __syncthreads();  // Vnew, Vnew_d written (this warpgroup); P landed (every thread's share)
    }
    GDN_PHASE(12);

    // --- O += P Vnew hi + P Vnew lo per k step; S = decay S + K^T Vnew_d (hi, then lo) -------
    {
      std::uint32_t akt[CS][MH][4];
      const int i8 = lane >> 3, r8 = lane & 7;
#pragma unroll
      for (int ks = 0; ks < CS; ++ks) {
#pragma unroll
        for (int mh = 0; mh < MH; ++mh)
          ptx::ldsm_x4_t(akt[ks][mh], Kc + swizzled<128>(16 * ks + r8 + ((i8 >> 1) << 3), 64 * mh + 16 * wl + ((i8 & 1) << 3)));
      }
#pragma unroll
      for (int mh = 0; mh < MH; ++mh)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) S[mh][nt][e] *= decay;
      wg::fence();
      // Two groups: the state update (the chain) first, then P Vnew, which runs on while the
      // next chunk's S0 operand is written.
#pragma unroll
      for (int mh = 0; mh < MH; ++mh) {
#pragma unroll
        for (int ks = 0; ks < CS; ++ks) wg::mma_rs(S[mh], akt[ks][mh], wg::b_desc<NW>(Vdhi, ks), E{});
        if constexpr (!kSingle)
#pragma unroll
          for (int ks = 0; ks < CS; ++ks) wg::mma_rs(S[mh], akt[ks][mh], wg::b_desc<NW>(Vdlo, ks), E{});
      }
      wg::commit();
      if constexpr (outputs) {
#pragma unroll
        for (int ks = 0; ks < CS; ++ks) {
          wg::mma_ss(O, wg::a_desc_sw128(Pc, ks), wg::b_desc<NW>(Vn, ks), E{});
          if constexpr (L::split_pv && !kSingle) wg::mma_ss(O, wg::a_desc_sw128(Pc, ks), wg::b_desc<NW>(Vnlo, ks), E{});
          if constexpr (copy_plo) wg::mma_ss(O, wg::a_desc_sw128(Ploc, ks), wg::b_desc<NW>(Vn, ks), E{});
        }
      }
      wg::commit();
      GDN_PHASE(13);
      GDN_PHASE(14);
      wg::wait_group<1>();
#pragma unroll
      for (int mh = 0; mh < MH; ++mh) wg::fence_operand(S[mh]);
      if constexpr (std::is_same_v<E, __half>) {
        if (unscale != 1.f)
#pragma unroll
          for (int mh = 0; mh < MH; ++mh)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) S[mh][nt][e] *= unscale;
      }
      GDN_PHASE(15);
    }
    if (debug && p.debug_S_end) {
      float* dst = p.debug_S_end + (debug_chunk * p.HV + j) * p.K * p.V + wcol0;
      for_each_state([&](int r, int col, float& x0, float& x1) {
        if (r < p.K) *reinterpret_cast<float2*>(dst + static_cast<std::int64_t>(r) * p.V + col) = make_float2(x0, x1);
      });
    }
    // The next chunk's S0 operand: this chunk's S0 products finished before the second barrier,
    // and every warp's share of the state update, which read Vnew_d lo in S0 lo's place, is done
    // once the warpgroup is past this barrier.
    warpgroup_sync(group);
    write_state_operand();
    GDN_PHASE(16);
    wg::wait_all();
    wg::fence_operand(O);
    if constexpr (dephase) {
      // This warpgroup is done with the chunk's buffer (P Vnew was its last reader): chunk
      // index + 2 goes into it once the other warpgroup is done too.
      warpgroup_sync(group);
      if (second_release(buf) && chunk_index + 2 < chunks) issue_chunk(chunk_index + 2);
    } else {
      __syncthreads();  // both warpgroups' P Vnew are done (their wgmma read P): the next record's P
      if (more) issue_record_p(next);
    }
    GDN_PHASE(17);
    // O through shared memory, in the Vnew tile (P Vnew, its last reader, is done in every warp
    // of the warpgroup after the barrier), so that the global stores are 16-byte pieces, two
    // threads to a 32-byte sector (4-byte stores of the accumulator pairs stalled on the
    // store queue under ncu). Pass 1 has no O: the barrier at the
    // top of the next chunk orders its S update's reads before the next X epilogue's writes.
    if constexpr (!outputs) continue;
    warpgroup_sync(group);
    {
      const float scale = p.scale;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * wl + g + 8 * half, col = 8 * nt + 2 * t;
          store2(Vn + wg::blocked<NW>(i, col), scale * O[nt][2 * half], scale * O[nt][2 * half + 1]);
        }
    }
    warpgroup_sync(group);
    {
      E* const og = static_cast<E*>(p.o);
      constexpr int pieces = kC * NW / 8;
      const int u = tid & 127;
#pragma unroll
      for (int idx = u; idx < pieces; idx += 128) {
        const int r = NW >= 16 ? (idx >> 1) % kC : idx % kC;
        const int cb = NW >= 16 ? 2 * ((idx >> 1) / kC) + (idx & 1) : idx / kC;
        if (r < c)
          *reinterpret_cast<uint4*>(og + ((start + r) * p.HV + j) * p.V + wcol0 + 8 * cb) =
              *reinterpret_cast<const uint4*>(Vn + wg::blocked<NW>(r, 8 * cb));
      }
    }
    GDN_PHASE(18);
  }

  // Where the state ends (computed here: nothing of it stays live through the chunk loop).
  float* out = nullptr;
  std::int64_t out_stride = p.V;
  if (affine) {
    out = affine_at(unit, transition ? wcol0 : p.K + wcol0);
    out_stride = affine_stride;
  } else if (last_segment && p.has_hT) {
    out = p.hT + dense;
  }
  const int out_columns = transition ? p.K - wcol0 : NW;  // M has K columns
  if (out) {
    for_each_state([&](int r, int col, float& x0, float& x1) {
      if (r < p.K && col < out_columns)
        *reinterpret_cast<float2*>(out + static_cast<std::int64_t>(r) * out_stride + col) = make_float2(x0, x1);
    });
  }
}

}  // namespace gdn::cuda::detail::chunked
