#pragma once
// Host API of the CUDA kernels (docs/semantics.md §1-3, 5, 7). Plain C++:
// g++-compiled tests and tools include this; only the .cu files need nvcc.
//
// Every launch takes the shared gdn::Problem (host-side shapes and options, cu_seqlens on the
// host for validation), a DeviceTensors of device pointers and a stream. All checks below run
// on the host before anything is enqueued and throw gdn::ProblemError naming the argument and
// the rule; CUDA API failures throw gdn::cuda::CudaError.
//
// Rules beyond Problem::validate():
//  - input_dtype is f32, bf16 or f16 (no f64 kernels); gate_dtype is f32 or input_dtype (as
//    validate() says). A_log and dt_bias are always fp32. States (h0, hT, the state cache,
//    intermediate) are always fp32.
//  - K <= 256 and V <= 256 (any size from 1, multiples of 16 or not).
//  - Every tensor the problem uses must be given (non-null) unless it has zero elements;
//    tensors the problem does not use must be null, so a mix-up of options is caught.
//  - Alignment: every float/half/bf16 tensor 16-byte aligned (cudaMalloc gives 256): the kernels
//    use 16-byte (8-byte for 16-bit types) vector accesses on rows whose length is a multiple of
//    4 elements and scalar accesses otherwise. cu_seqlens, state_indices and status need the
//    natural alignment of their element type.
//  - Outputs (o, hT, state_cache when written, intermediate, status) must not overlap each other
//    or any input, with one exception: dense h0 == hT exactly (in place) is allowed.
//  - Pointers must be device-accessible memory (cudaPointerGetAttributes; skipped while the
//    stream is being captured into a graph, where only stream work is allowed to happen).
//
// State indices (state cache, §5): -1 marks a padding sequence: nothing is read from or written
// to the cache for it and its output rows (and intermediate rows) are written as zeros. Any other
// index outside [0, state_slots) is an error. The range needs device data, so it is checked in
// one of two ways, the caller's choice:
//  - host_state_indices (a host copy of the same indices) given: checked on the host before the
//    launch, duplicates too when the state is written back (ProblemError, nothing enqueued);
//  - status given (a device int): a one-block check kernel runs first and writes status
//    (kStatusOk or kStatusBadStateIndex); when it is not kStatusOk the main kernel writes nothing
//    at all. This path is graph-capturable; duplicate slots are not detected on it.
//  With neither, a sequence with an out-of-range index is skipped (nothing written for it, its
//  o rows are left as they were) and no error is reported: give one of the two.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/problem.hpp"

namespace gdn::cuda {

class CudaError : public std::runtime_error {
 public:
  explicit CudaError(const std::string& what) : std::runtime_error(what) {}
};

// Throws CudaError with the call's text and CUDA's message.
inline void check_cuda(cudaError_t code, const char* what) {
  if (code != cudaSuccess)
    throw CudaError(std::string("gdn::cuda: ") + what + ": " + cudaGetErrorName(code) + ": " +
                    cudaGetErrorString(code));
}

enum class IndexType { i32, i64 };

constexpr int kStatusOk = 0;
constexpr int kStatusBadStateIndex = 1;

// Device pointers. Shapes and dtypes are the Problem's (row-major, packed tokens first):
struct DeviceTensors {
  const void* q = nullptr;        // [T, H, K]   input_dtype
  const void* k = nullptr;        // [T, H, K]   input_dtype
  const void* v = nullptr;        // [T, HV, V]  input_dtype
  const void* g = nullptr;        // [T, HV]     gate_dtype (GateMode::direct)
  const void* beta = nullptr;     // [T, HV]     gate_dtype (GateMode::direct)
  const void* a = nullptr;        // [T, HV]     gate_dtype (GateMode::fused)
  const void* b = nullptr;        // [T, HV]     gate_dtype (GateMode::fused)
  const float* A_log = nullptr;   // [HV] fp32   (GateMode::fused)
  const float* dt_bias = nullptr; // [HV] fp32   (GateMode::fused)
  const float* h0 = nullptr;      // dense [N, HV, K, V] (or V-major): has_h0, no state cache
  float* hT = nullptr;            // dense [N, HV, K, V] (or V-major): has_hT, no state cache
  // State cache [state_slots, HV, K, V] (or V-major), when problem.state_slots > 0: read
  // when has_h0, written in place when has_hT.
  float* state_cache = nullptr;
  const std::int32_t* state_indices = nullptr;       // [N] device, with a state cache
  const std::int32_t* host_state_indices = nullptr;  // [N] optional host copy (see above)
  int* status = nullptr;                             // optional device status word (see above)
  // [N+1] device copy of problem.cu_seqlens (the kernel reads boundaries from it; it must hold
  // the same values as the Problem's). Required by recurrent_prefill, ignored by decode.
  const void* cu_seqlens = nullptr;
  IndexType cu_seqlens_type = IndexType::i32;
  void* o = nullptr;              // [T, HV, V] input_dtype
  float* intermediate = nullptr;  // [T, HV, K, V] (or V-major): store_intermediate_states
};

// Tuning override. The default picks the tile from K alone (never from N, T or the batch: a
// sequence's bits do not depend on its neighbours): default_column_lanes(), the same for prefill
// and decode. Prefill and decode launched with the same column_lanes give the same bits (so by
// default decode equals prefill bit for bit). Setting it changes the reduction order (other
// bits, same function).
struct LaunchOptions {
  int column_lanes = 0;  // 0: default; else 2, 4 or 8 lanes across a V tile of 4 * lanes
  // decode only: run the general kernel even where the streamed decode kernel applies (for
  // comparison; both give the same bits).
  bool general_decode = false;
  // decode only: run the streamed kernel wherever it applies, whatever the batch. By default
  // batches of at most 4096 (request, value head) items (128 requests at HV = 32) run the
  // general kernel, which has the lower latency there (same bits).
  bool streamed_decode = false;
  // decode only: where the streamed kernel runs the default tile (4 column lanes, 16 rows per
  // lane) on a K-major state with V <= 128, K and V multiples of 4 and one token per request,
  // run its wide tile instead: 32 columns per warp computing the same sums in the same order
  // (the same bits), states written back in whole 128-byte lines. Off by default: measured, it
  // gains nothing at large batches and loses at one request (reports/).
  bool wide_stream_tile = false;
  // At K = V = 128 with the default tile, the general kernel (prefill, and decode where the
  // streamed kernel does not run) uses an instance compiled for those sizes (addresses and
  // bounds folded at compile time); true runs the runtime-size instance instead. Same bits
  // either way (tested bitwise); for comparison and tests.
  bool runtime_size_kernels = false;
  // decode only: among those fixed-size launches, one token per request, no intermediate states
  // and at most 4096 warps (16 requests at HV = 32) run the one-token kernel (the same tile
  // and bits, scheduled for latency; see decode_uses_token_kernel). false runs the general
  // kernel there, for comparison and tests.
  bool token_decode_kernel = true;
  // The general kernel's narrow tile at K = V = 128 with the default tile: 8 columns per warp
  // instead of 16 (2 per lane instead of 4), twice the warps, each lane with the same rows,
  // sums and butterflies: the same bits (tested bitwise). automatic: prefill launches of at most
  // 512 default-tile warps (N * HV <= 64) or whose longest sequence holds at least a third of the
  // tokens, where one warp's serial chain bounds the time; never decode (measured slower
  // there). Ignored where it does not apply (other sizes or tiles, runtime_size_kernels, the
  // streamed decode kernel).
  enum class NarrowTile { automatic, off, on };
  NarrowTile narrow_tile = NarrowTile::automatic;
};

// Full recurrence over a packed varlen batch (zero-length sequences allowed): one warp per
// (sequence, value head, V tile of 4 * column_lanes columns), the K x tile slice of the state
// in registers, reductions over K by warp shuffles in a fixed order. Deterministic.
void recurrent_prefill(const Problem& problem, const DeviceTensors& tensors, cudaStream_t stream,
                       const LaunchOptions& options = {});

// Decode (§5): a fixed-length batch (cu_seqlens = [0, Ts, 2 Ts, ...], Ts >= 1 tokens per
// request) against a state cache (state_slots > 0) indexed by state_indices, updated in place.
// Capturable in a CUDA graph: no host synchronisation, no allocation; behaviour depends on
// device data only. Where decode_uses_stream_kernel() says so, it runs the streamed decode
// kernel (a persistent grid streaming whole states through shared memory with bulk async
// copies, several per SM in flight); elsewhere the prefill's kernel without cu_seqlens. Both
// run the same per-tile arithmetic in the same order: the same bits as the prefill launched
// with the same column_lanes.
void decode(const Problem& problem, const DeviceTensors& tensors, cudaStream_t stream,
            const LaunchOptions& options = {});

// The tile (column lanes) that column_lanes = 0 picks for prefill (decode = false) or decode:
// today the same for both (4 at K <= 128, else 2); the entry point is an argument so that they
// may differ one day without changing callers (the decode == prefill test uses it).
int default_column_lanes(const Problem& problem, bool decode);

// Whether decode(problem, ..., options) runs the streamed kernel: not forced off by
// options.general_decode, more than 4096 (request, value head) items or options.streamed_decode,
// the state is K * V * 4 <= 64 KiB with K * V a multiple of 4 (one
// 16-byte-aligned bulk copy per state), V fits 8 tiles of 4 * column_lanes columns and a lane
// holds at most 16 rows of K (at the default tile: K <= 128 with V <= 128, or K > 128 with
// V <= 64). Host-only, no CUDA call.
bool decode_uses_stream_kernel(const Problem& problem, const LaunchOptions& options = {});

// Whether decode(problem, ..., options) runs the one-token kernel (LaunchOptions::
// token_decode_kernel): the general kernel's fixed-size K = V = 128 default-tile path, standard
// tile, one token per request, no intermediate states, at most 4096 warps. Host-only.
bool decode_uses_token_kernel(const Problem& problem, const LaunchOptions& options);

// Whether that streamed launch uses its wide tile (options.wide_stream_tile, where it applies:
// the streamed kernel at the default tile, i.e. K in (64, 128], a K-major state, V <= 128, K
// and V multiples of 4, one token per request). Host-only.
bool decode_uses_wide_stream_tile(const Problem& problem, const LaunchOptions& options = {});

// Whether recurrent_prefill (decode = false) or decode runs the general kernel's narrow tile
// (LaunchOptions::narrow_tile). Host-only.
bool uses_narrow_tile(const Problem& problem, const LaunchOptions& options, bool decode);

// The host-side checks alone (no CUDA call): what the launches run first.
void validate_prefill(const Problem& problem, const DeviceTensors& tensors);
void validate_decode(const Problem& problem, const DeviceTensors& tensors);

// Whether a CUDA device is usable here; fills *why when not.
bool device_available(std::string* why = nullptr);

// Bytes of state traffic one launch moves (state read + state written, fp32), for benchmarks.
std::int64_t state_traffic_bytes(const Problem& problem);

}  // namespace gdn::cuda
