#pragma once
// Internal: what the host side (launch.cpp) hands the kernel (recurrent_kernel.cuh). Plain
// pointers and sizes only, passed by value as the kernel's one parameter.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace gdn::cuda::detail {

enum class ElementType : int { f32 = 0, bf16 = 1, f16 = 2 };

// x / divisor for 0 <= x < 2^31 as a multiply-high and a shift (Granlund and Montgomery; the
// form CUTLASS's FastDivmod uses): a division by a runtime value is a dozen dependent
// instructions (a reciprocal on the MUFU pipe among them), and the decode kernel's first load
// (the slot index) waits for n = item / HV.
struct FastDivisor {
  unsigned divisor = 1;
  unsigned multiplier = 0;
  unsigned shift = 0;

  static FastDivisor of(unsigned d) {
    FastDivisor f;
    f.divisor = d;
    if (d > 1) {
      unsigned log2_ceil = 0;
      while ((std::uint64_t(1) << log2_ceil) < d) ++log2_ceil;
      const unsigned p = 31 + log2_ceil;
      f.multiplier = static_cast<unsigned>(((std::uint64_t(1) << p) + d - 1) / d);
      f.shift = p - 32;
    }
    return f;
  }
#if defined(__CUDACC__)
  __host__ __device__
#endif
  unsigned divide(unsigned x) const {
    if (divisor == 1) return x;
#if defined(__CUDA_ARCH__)
    return __umulhi(x, multiplier) >> shift;
#else
    return static_cast<unsigned>((std::uint64_t(x) * multiplier) >> 32) >> shift;
#endif
  }
};

// The layout below is the one the prefill instances were tuned with. ptxas's register choice
// for the token loop is fragile: reordering these fields and resolving g/a, beta/b and
// h0/hT/cache on the host made it keep far fewer registers in the prefill instances, which then
// ran much slower. New fields go at the end.
struct RecurrentParams {
  const void* q;
  const void* k;
  const void* v;
  const void* g;
  const void* beta;
  const void* a;
  const void* b;
  const float* A_log;
  const float* dt_bias;
  const float* h0;          // dense initial states (or null)
  float* hT;                // dense final states (or null)
  float* state_cache;       // cache (or null)
  const std::int32_t* state_indices;
  const int* status;        // when non-null, blocks do nothing unless *status == 0
  const void* cu_seqlens;   // null: fixed length tokens_per_sequence (decode)
  int cu_seqlens_64;
  std::int64_t tokens_per_sequence;
  void* o;
  float* intermediate;

  int N, H, HV, K, V;
  int group;  // HV / H
  float scale;
  std::int64_t state_slots;

  int has_h0, has_hT, use_cache, v_major, l2norm, fused_gates, negative_eigenvalues;
  int gate_type;  // ElementType of g/beta or a/b
  int store_intermediate;
  int vector_k;   // K % 4 == 0: rows along K allow vector accesses
  int vector_v;   // V % 4 == 0
  int runtime_sizes;  // 1: never the fixed-size (K = V = 128) instances (LaunchOptions::runtime_size_kernels)
  int narrow;         // 1: the K = V = 128 default tile runs its narrow instance (LaunchOptions::narrow_tile)

  int num_tiles;       // ceil(V / (4 * column_lanes))
  std::int64_t items;  // N * HV * num_tiles warps
  FastDivisor hv_divisor;     // HV (decode_token_kernel)
  int token_kernel;           // 1: one-token decode launches may run decode_token_kernel
#if GDN_KERNEL_FAULTS
  int planted_fault;          // cuda/faults/planted_faults.hpp (fault-campaign builds only)
#endif
};

constexpr int kWarpsPerBlock = 4;
// Launches of at most this many warps (one or two decode requests at HV = 32, K = V = 128) run
// the fixed-size default instance one warp per block (recurrent_kernel.cuh, launch_instance).
constexpr std::int64_t kSmallLaunchWarps = 512;
// One-token decode launches of at most this many default-tile warps (16 requests at HV = 32)
// run decode_token_kernel (recurrent_kernel.cuh), larger ones the general kernel (same bits):
// measured (graph mode, held), the one-token kernel is faster up to 16 requests at HV = 32 and
// slower from 32.
constexpr std::int64_t kDecodeTokenMaxWarps = 4096;
// LaunchOptions::NarrowTile::automatic: prefill launches of at most this many default-tile warps
// run the narrow tile (recurrent_kernel.cuh, Tile's CPL = 2; same bits), as do packs whose
// longest sequence holds a third of the tokens (launch.cpp, narrow_tile_applies).
constexpr std::int64_t kNarrowMaxItems = 512;
// Decode batches of at most this many (request, value head) items run the general kernel, not
// the streamed one, unless LaunchOptions::streamed_decode (same bits; measured, the general
// kernel is faster up to 64 requests at HV = 32, the streamed one from 256).
constexpr std::int64_t kGeneralDecodeMaxItems = 4096;

// Launches the main kernel for (input type, column_lanes, rows_per_lane); defined in the
// per-dtype .cu files. Returns false when that combination is not instantiated.
bool launch_recurrent(ElementType input, int column_lanes, int rows_per_lane,
                      const RecurrentParams& params, cudaStream_t stream);
// The decode-specialised (streamed) kernel, decode_stream_kernel.cuh: a persistent grid whose
// blocks stream whole [K, V] states through a ring of shared-memory stages with bulk async
// copies. It needs the state (K * V * 4 bytes) to be a multiple of 16 bytes and to fit
// kStreamMaxStateBytes, and at most kStreamMaxTiles V tiles (one consumer warp each, plus the
// producer warp).
constexpr int kStreamMaxStages = 8;
constexpr int kStreamMaxTiles = 8;
constexpr int kStreamMaxThreads = (kStreamMaxTiles + 1) * 32;
constexpr std::int64_t kStreamMaxStateBytes = 64 * 1024;
// Shared memory for the stages (~200 KiB of loads in flight per SM at 3 x 64 KiB), and the
// header in front of them (the full and empty barrier of each stage).
constexpr std::int64_t kStreamSmemBudget = 192 * 1024;
constexpr std::int64_t kStreamHeaderBytes = 512;

struct StreamParams {
  int stages;            // 2 .. kStreamMaxStages
  int stage_floats;      // stride between stages (K * V rounded up to 128 bytes)
  unsigned state_bytes;  // K * V * 4
  int multiprocessors;   // of the launching device
};

// The streamed kernel's write-back of the updated state (same bits either way; a template
// parameter of the kernel): direct: each consumer warp stores its V tile from registers;
// streaming: the same stores with the evict-first (.cs) hint, which the default tile (4 column
// lanes, 16 rows per lane) and the wide tile use, the others storing directly. Measured and
// dropped: staging the state back through its stage buffer for full-line stores or one bulk
// store (both hold the stage until the state has left, and the loads in flight are what the
// kernel lives on), and pairs of warps swapping rows through shared memory to store whole
// 128-byte lines (the pair barriers and the extra shared-memory round trip cost more than the
// lines gain, although the probe, BM_stream_probe, moves the same data faster with whole lines).
enum StreamWriteBack : int { kWriteBackDirect = 0, kWriteBackStreaming = 1 };

bool launch_decode_stream(ElementType input, int column_lanes, int rows_per_lane, const RecurrentParams& params,
                          const StreamParams& stream_params, cudaStream_t stream);

// One-block check of state_indices against [0, state_slots) (-1 allowed) writing *status.
void launch_check_indices(const std::int32_t* indices, int N, std::int64_t slots, int* status,
                          cudaStream_t stream);

}  // namespace gdn::cuda::detail
