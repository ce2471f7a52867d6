#pragma once
// The decode-specialised ("streamed") path (§5): a persistent kernel that keeps the state
// cache's bytes in flight.
//
// Why: the general kernel (recurrent_kernel.cuh) gives each warp one (request, head, V tile),
// loads its slice of the state into registers, computes, stores and exits. A warp waits for its
// own state loads and the SM holds only ~12 such warps (162 registers each), so too few bytes
// are in flight to reach the copy bandwidth (well short of it at large batches).
//
// Here one block per SM (or more for small states) runs over the items (request n, value head
// j) item = blockIdx.x, blockIdx.x + gridDim.x, ... One producer warp streams each item's
// whole [K, V] fp32 state (one contiguous K*V*4-byte block in both layouts) from its cache slot
// into a ring of STAGES shared-memory buffers with Hopper bulk async copies
// (cp.async.bulk ... mbarrier::complete_tx::bytes), several items ahead of the math. The
// consumer warps, one per V tile, copy their slice of the staged state into registers, release
// the buffer at once (so the next load starts while they compute), run the general kernel's own
// Tile code on it (same lane mapping, same reduction order: the same bits as the general
// kernel, so decode == prefill bitwise at the same tile still holds), and write the updated state back to the
// slot with vector stores straight from registers (posted writes: nothing to wait for; evict-first
// .cs at the default tile, see StreamWriteBack).
// The first token of the block's next item is prefetched into registers during the current
// one. No atomics, no inter-block communication: deterministic and batch invariant.
#include <map>
#include <mutex>
#include <tuple>

#include "cuda/ptx/bulk_copy.cuh"
#include "cuda/recurrent/recurrent_kernel.cuh"

namespace gdn::cuda::detail {

// A consumer's take of stage s: wait for its bytes, copy this warp's slice into registers (or
// zeros where nothing was loaded: padding, out-of-range slot, no h0), then release the stage
// at once, so the next load starts while the warp computes. The arrive orders the warp's
// shared-memory reads before the producer's next bulk copy into the buffer.
template <class TileT, int RPL>
__device__ __forceinline__ void take_stage(const TileT& tl, const float* stage, bool loaded, std::uint64_t* full,
                                           std::uint64_t* empty, unsigned parity, int lane, float (&st)[RPL][4]) {
  ptx::bulk::wait(full, parity);
  if (loaded) {
    tl.load_state(stage, st);
  } else {
#pragma unroll
    for (int r = 0; r < RPL; ++r) st[r][0] = st[r][1] = st[r][2] = st[r][3] = 0.f;
  }
  __syncwarp();
  if (lane == 0) ptx::bulk::arrive(empty);
}

// SPLIT = 2 (the wide tile, see Tile): (COL_LANES, RPL) computes the bits of (COL_LANES / 2,
// RPL / 2) with 32 columns per warp; MAX_THREADS bounds the block (one producer warp plus the
// consumers), which sets the register cap: the SM's four register files hold 3 warps each at 9
// warps (168 registers), 2 at 5 (255), and the wide tile's 128-float state needs the latter.
// Runtime K and V only: the (4, 16) instance with V = 128 fixed at compile time (Tile's VF; K
// fixed too spilled at the 168-register cap) was measured slower at 256 and 1024 requests.
template <class In, int COL_LANES, int RPL, bool ALIGNED, int WRITE_BACK, int SPLIT = 1,
          int MAX_THREADS = kStreamMaxThreads>
__global__ void __launch_bounds__(MAX_THREADS, 1)
    decode_stream_kernel(const __grid_constant__ RecurrentParams p, const __grid_constant__ StreamParams sp) {
  // The wide tile defers the token's masks and gates (registers allow it there); see Tile.
  using TileT = Tile<In, COL_LANES, RPL, ALIGNED, /*EAGER=*/SPLIT == 1, SPLIT>;
  static_assert(RPL <= 16 || MAX_THREADS <= 5 * 32,
                "32 rows per lane spill at 9 warps (see launch_stream_for_type)");
  extern __shared__ __align__(128) unsigned char smem[];
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem);
  std::uint64_t* empty = full + kStreamMaxStages;
  float* stages = reinterpret_cast<float*>(smem + kStreamHeaderBytes);

  // Every thread reads the same word (written by an earlier kernel in the stream): the whole
  // block leaves together, before any barrier exists.
  if (p.status != nullptr && *p.status != 0) return;

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int consumers = p.num_tiles;
  const int num_stages = sp.stages;
  const std::int64_t items = std::int64_t(p.N) * p.HV;
  const std::int64_t state_elems = std::int64_t(p.K) * p.V;
  const std::int64_t ts = p.tokens_per_sequence;
  // This block's items: first, first + step, ... below last. (Contiguous runs per block instead
  // were measured slower.)
  const std::int64_t first = blockIdx.x;
  const std::int64_t last = items;
  const int step = int(gridDim.x);

  if (threadIdx.x == 0) {
    for (int s = 0; s < num_stages; ++s) {
      ptx::bulk::barrier_init(&full[s], 1);           // the producer's arrive (+ the copy's bytes)
      ptx::bulk::barrier_init(&empty[s], consumers);  // one arrive per consumer warp
    }
    ptx::bulk::fence_barrier_init();
  }
  __syncthreads();

  if (warp == consumers) {
    // Producer warp. Slot indices are read 32 items at a time (one per lane), so the loop
    // waits for an index load once per 32 items, not once per item.
    int slots = -1;
    int i = 0;
    for (std::int64_t item = first; item < last; item += step, ++i) {
      if ((i & 31) == 0) {
        const std::int64_t mine = item + std::int64_t(lane) * step;
        slots = mine < last ? p.state_indices[mine / p.HV] : -1;
      }
      const int slot = __shfl_sync(0xffffffffu, slots, i & 31);
      if (lane == 0) {
        const int s = i % num_stages;
        if (i >= num_stages) ptx::bulk::wait(&empty[s], unsigned((i / num_stages) - 1) & 1u);
        // Padding (-1) and out-of-range slots read nothing (the latter are errors reported by
        // the status pre-pass or the host check; never touch memory through them).
        if (p.has_h0 && slot >= 0 && slot < p.state_slots) {
          const int j = int(item % p.HV);
          ptx::bulk::arrive_expect_tx(&full[s], sp.state_bytes);
          float* dst = stages + std::int64_t(s) * sp.stage_floats;
          const float* src = p.state_cache + (std::int64_t(slot) * p.HV + j) * state_elems;
          ptx::bulk::bulk_load(dst, src, sp.state_bytes, &full[s]);
        } else {
          ptx::bulk::arrive(&full[s]);
        }
      }
      __syncwarp();
    }
    return;
  }

  // Consumer warp `warp` owns V tile `warp` of every item. Each consumer reads the slot index
  // itself (prefetched with the token, one item ahead): the producer and the consumers share
  // nothing but the staged states and the barriers.
  const int tile = warp;
  if constexpr (SPLIT == 2) {
    // The wide tile, one token per request (the host routes Ts == 1 here): nothing is carried
    // from item to item. The token and the slot index are loaded before the stage wait, so
    // their latency overlaps it, and they are the only registers live beside the state (a
    // token prefetched one item ahead, as below, spilled 650 bytes at 255 registers).
    // (Prefetching the next item's token into L2 instead was measured slower.)
    int i = 0;
    for (std::int64_t item = first; item < last; item += step, ++i) {
      const int j = int(item % p.HV);
      const std::int64_t n = item / p.HV;
      const TileT tl(p, lane, tile, j);
      Token<In, RPL> x;
      tl.load_token(n, x);
      const std::int64_t row = p.state_indices[n];
      const bool in_range = row >= 0 && row < p.state_slots;
      const int s = i % num_stages;
      float st[RPL][4];
      take_stage(tl, stages + std::int64_t(s) * sp.stage_floats, in_range && p.has_h0, &full[s], &empty[s],
                 unsigned(i / num_stages) & 1u, lane, st);
      if (row == -1) {
        const float zeros[4] = {0.f, 0.f, 0.f, 0.f};
        tl.store_o(n, zeros);
        if (p.store_intermediate) tl.store_state(tl.intermediate_at(n), st);  // st is zero here
      } else if (in_range) {
        float o[4];
        tl.step(x, st, o);
        tl.store_o(n, o);
        if (p.store_intermediate) tl.store_state(tl.intermediate_at(n), st);
        float* const slot_state = p.state_cache + (row * p.HV + j) * state_elems;
        if (p.has_hT) tl.template store_state<WRITE_BACK != kWriteBackDirect>(slot_state, st);
      }
    }
    return;
  }
  Token<In, RPL> cur;
  int cur_slot = -1;
  if (first < last) {
    const std::int64_t item = first;
    const TileT first(p, lane, tile, int(item % p.HV));
    first.load_token((item / p.HV) * ts, cur);
    cur_slot = p.state_indices[item / p.HV];
  }
  int i = 0;
  for (std::int64_t item = first; item < last; item += step, ++i) {
    const int j = int(item % p.HV);
    const int n = int(item / p.HV);
    const TileT tl(p, lane, tile, j);
    const std::int64_t bos = std::int64_t(n) * ts, eos = bos + ts;
    const int s = i % num_stages;
    const std::int64_t row = cur_slot;
    const bool in_range = row >= 0 && row < p.state_slots;
    float st[RPL][4];
    take_stage(tl, stages + std::int64_t(s) * sp.stage_floats, in_range && p.has_h0, &full[s], &empty[s],
               unsigned(i / num_stages) & 1u, lane, st);

    Token<In, RPL> upcoming;
    int upcoming_slot = -1;
    const std::int64_t next_item = item + step;
    if (next_item < last) {
      const TileT nt(p, lane, tile, int(next_item % p.HV));
      nt.load_token((next_item / p.HV) * ts, upcoming);
      upcoming_slot = p.state_indices[next_item / p.HV];
    }

    if (row == -1) {
      // Padding (§5): read and write nothing in the cache; output rows are zeros.
      const float zeros[4] = {0.f, 0.f, 0.f, 0.f};
      for (std::int64_t t = bos; t < eos; ++t) {
        tl.store_o(t, zeros);
        if (p.store_intermediate) tl.store_state(tl.intermediate_at(t), st);  // st is zero here
      }
    } else if (in_range) {
      // The general kernel's token loop, unchanged (same bits).
      for (std::int64_t t = bos; t < eos; ++t) {
        Token<In, RPL> next;
        const bool has_next = t + 1 < eos;
        if (has_next) tl.load_token(t + 1, next);
        float o[4];
        tl.step(cur, st, o);
        tl.store_o(t, o);
        if (p.store_intermediate) tl.store_state(tl.intermediate_at(t), st);
        if (has_next) cur = next;
      }
      float* const slot_state = p.state_cache + (row * p.HV + j) * state_elems;
      // The .cs (evict-first) hint: the updated state is not read again in this launch
      // (measured: a little more of the copy bandwidth).
      if (p.has_hT) tl.template store_state<WRITE_BACK != kWriteBackDirect>(slot_state, st);
    }

    if (next_item < last) {
      cur = upcoming;
      cur_slot = upcoming_slot;
    }
  }
}

// Launches one instance on a persistent grid: as many blocks as fit on the device at once
// (at most one per item). Shared memory: header + stages * stage_floats * 4 bytes.
template <auto Kernel>
void launch_stream_kernel(const RecurrentParams& params, const StreamParams& sp, cudaStream_t stream) {
  const int threads = (params.num_tiles + 1) * 32;
  const std::size_t smem = kStreamHeaderBytes + std::size_t(sp.stages) * sp.stage_floats * sizeof(float);
  const std::int64_t items = std::int64_t(params.N) * params.HV;
  // Blocks per SM for this (threads, smem), asked once per device and kept: the occupancy
  // query is not free and batch-1 decode is latency bound.
  static std::mutex mutex;
  static std::map<std::tuple<int, int, std::size_t>, int> resident_per_sm;
  int device = 0;
  (void)cudaGetDevice(&device);
  int per_sm = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    auto [at, inserted] = resident_per_sm.try_emplace({device, threads, smem}, 1);
    if (inserted) {
      // Once per device and shape: allow the largest request the stage ring can make.
      (void)cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(kStreamHeaderBytes + kStreamSmemBudget));
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&at->second, Kernel, threads, smem) != cudaSuccess ||
          at->second < 1)
        at->second = 1;
    }
    per_sm = at->second;
  }
  const std::int64_t resident = std::int64_t(per_sm) * sp.multiprocessors;
  const unsigned blocks = static_cast<unsigned>(items < resident ? items : resident);
  Kernel<<<dim3(blocks), dim3(threads), smem, stream>>>(params, sp);
}

template <class In, int COL_LANES, int RPL, int WRITE_BACK>
void launch_stream_mode(const RecurrentParams& params, const StreamParams& sp, cudaStream_t stream) {
  if (params.vector_k && params.vector_v)
    launch_stream_kernel<decode_stream_kernel<In, COL_LANES, RPL, true, WRITE_BACK>>(params, sp, stream);
  else
    launch_stream_kernel<decode_stream_kernel<In, COL_LANES, RPL, false, WRITE_BACK>>(params, sp, stream);
}

// The write-back mode is a template parameter (as a runtime switch it spilled at the
// 168-register cap). Streaming (.cs) stores at the default decode tile at K = 128 (4 column
// lanes, 16 rows per lane), where they were measured; the other tiles store plainly.
template <class In, int COL_LANES, int RPL>
void launch_stream_instance(const RecurrentParams& params, const StreamParams& sp, cudaStream_t stream) {
  constexpr int kWriteBack = COL_LANES == 4 && RPL == 16 ? kWriteBackStreaming : kWriteBackDirect;
  launch_stream_mode<In, COL_LANES, RPL, kWriteBack>(params, sp, stream);
}

// The wide tile (8 column lanes, 32 rows per lane, SPLIT = 2): the bits of the default (4, 16)
// tile, K-major, K in (64, 128], V <= 128 (at most 4 consumer warps: 5 warps per block), K and V
// multiples of 4 (launch.cpp, wide_stream_applies).
template <class In>
void launch_stream_wide(const RecurrentParams& params, const StreamParams& sp, cudaStream_t stream) {
  launch_stream_kernel<decode_stream_kernel<In, 8, 32, true, kWriteBackStreaming, 2, 5 * 32>>(params, sp, stream);
}

// The general kernel's (COL_LANES, RPL) set up to 16 rows per lane: at 32 the state alone is
// 128 registers and, at the 168 registers that 9 warps per SM partition leave, it spills
// (launch.cpp routes those to the general kernel).
template <class In>
bool launch_stream_for_type(int column_lanes, int rows_per_lane, const RecurrentParams& params,
                            const StreamParams& sp, cudaStream_t stream) {
#define GDN_CASE(CL, RPL)                                      \
  if (column_lanes == CL && rows_per_lane == RPL) {            \
    launch_stream_instance<In, CL, RPL>(params, sp, stream);   \
    return true;                                               \
  }
  // (8, 32) is only the wide tile: the bits of (4, 16).
  if (column_lanes == 8 && rows_per_lane == 32) {
    launch_stream_wide<In>(params, sp, stream);
    return true;
  }
  GDN_CASE(2, 4) GDN_CASE(2, 8) GDN_CASE(2, 16)
  GDN_CASE(4, 4) GDN_CASE(4, 8) GDN_CASE(4, 16)
  GDN_CASE(8, 4) GDN_CASE(8, 8) GDN_CASE(8, 16)
#undef GDN_CASE
  return false;
}

}  // namespace gdn::cuda::detail
