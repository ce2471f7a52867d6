// Host side of the CUDA kernels: every check of api.hpp, then one launch (two with a status
// word). Compiled by the host compiler; the kernels live in the .cu files.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda/api/api.hpp"
#include "cuda/api/check.hpp"
#include "cuda/faults/planted_faults.hpp"
#include "cuda/recurrent/recurrent_params.hpp"

namespace gdn::cuda {

namespace {

using detail::element_type;
using detail::fail;
using detail::unsupported_storage;
using detail::str;
using detail::ElementType;
using detail::RecurrentParams;

constexpr int kMaxHeadDim = 256;

using detail::Buffer;

// The buffers a problem uses, with their sizes; unused ones carry bytes = -1.
std::vector<Buffer> buffers_of(const Problem& p, const DeviceTensors& t, bool decode) {
  const std::int64_t in = static_cast<std::int64_t>(dtype_size(p.input_dtype));
  const std::int64_t gate = static_cast<std::int64_t>(dtype_size(p.gate_dtype));
  const std::int64_t qk = p.T * p.H * p.K * in;
  const std::int64_t vv = p.T * p.HV * p.V * in;
  const std::int64_t gates = p.T * p.HV * gate;
  const std::int64_t state = shape_numel(p.state_shape()) * 4;
  const bool direct = p.gate_mode == GateMode::direct;
  const bool cache = p.uses_state_cache();
  const std::int64_t unused = -1;
  const std::size_t cu_size = t.cu_seqlens_type == IndexType::i64 ? 8 : 4;
  return {
      {"q", t.q, qk, false, 16},
      {"k", t.k, qk, false, 16},
      {"v", t.v, vv, false, 16},
      {"g", t.g, direct ? gates : unused, false, 16},
      {"beta", t.beta, direct ? gates : unused, false, 16},
      {"a", t.a, direct ? unused : gates, false, 16},
      {"b", t.b, direct ? unused : gates, false, 16},
      {"A_log", t.A_log, direct ? unused : p.HV * 4, false, 16},
      {"dt_bias", t.dt_bias, direct ? unused : p.HV * 4, false, 16},
      {"h0", t.h0, (p.has_h0 && !cache) ? state : unused, false, 16},
      {"hT", t.hT, (p.has_hT && !cache) ? state : unused, true, 16},
      {"state_cache", t.state_cache, cache ? state : unused, cache && p.has_hT, 16},
      {"state_indices", t.state_indices, cache ? p.N() * 4 : unused, false, 4},
      {"cu_seqlens", t.cu_seqlens, decode ? unused : (p.N() + 1) * std::int64_t(cu_size), false, cu_size},
      {"o", t.o, vv, true, 16},
      {"intermediate", t.intermediate,
       p.store_intermediate_states ? shape_numel(p.intermediate_shape()) * 4 : unused, true, 16},
      {"status", t.status, t.status ? 4 : unused, true, 4},
  };
}

void validate_common(const Problem& p, const DeviceTensors& t, bool decode) {
  p.validate();
  if (p.input_dtype == DType::f64)
    fail("input_dtype", "must be f32, bf16 or f16 for the CUDA kernels, got f64");
  if (const auto rule = unsupported_storage(p); !rule.first.empty()) fail(rule.first, rule.second);
  if (p.K > kMaxHeadDim) fail("K", "must be <= 256 for the CUDA kernels, got " + str(p.K));
  if (p.V > kMaxHeadDim) fail("V", "must be <= 256 for the CUDA kernels, got " + str(p.V));
  if (p.N() > (1 << 30)) fail("cu_seqlens", "must describe at most 2^30 sequences");
  if (decode) {
    if (!p.uses_state_cache())
      fail("state_slots", "decode needs a state cache (state_slots > 0), got 0");
    const std::int64_t ts = p.seq_len(0);
    if (ts < 1) fail("cu_seqlens", "decode needs Ts >= 1 tokens per request, got " + str(ts));
    for (int n = 0; n < p.N(); ++n)
      if (p.seq_len(n) != ts)
        fail("cu_seqlens", "decode needs a fixed-length batch [0, Ts, 2 Ts, ...]; request " + str(n) +
                               " has " + str(p.seq_len(n)) + " tokens, request 0 has " + str(ts));
  }
  if (t.host_state_indices != nullptr && !p.uses_state_cache())
    fail("host_state_indices", "given but the problem has no state cache (state_slots = 0)");

  // Outputs overlap nothing else (dense in-place h0 == hT excepted).
  detail::check_buffers(
      p, buffers_of(p, t, decode),
      [](const Buffer& w, const Buffer& r) {
        return std::string(w.name) == "hT" && std::string(r.name) == "h0" && w.pointer == r.pointer;
      },
      " (outputs alias nothing but h0 == hT)");

  if (t.host_state_indices != nullptr) {
    std::vector<int> seen(static_cast<std::size_t>(p.state_slots), -1);
    for (int n = 0; n < p.N(); ++n) {
      const std::int32_t slot = t.host_state_indices[n];
      if (slot == -1) continue;
      if (slot < 0 || slot >= p.state_slots)
        fail("state_indices", "must be -1 (padding) or in [0, state_slots = " + str(p.state_slots) +
                                  "), got state_indices[" + str(n) + "] = " + str(slot));
      if (p.has_hT && seen[static_cast<std::size_t>(slot)] >= 0)
        fail("state_indices", "must not name one slot twice when the state is written back; slot " +
                                  str(slot) + " is used by sequences " + str(seen[static_cast<std::size_t>(slot)]) +
                                  " and " + str(n));
      seen[static_cast<std::size_t>(slot)] = n;
    }
  }
}

// The default tile depends on K alone, never on the batch (batch invariance), and is the same
// for prefill and decode (decode == prefill bit for bit): 4 column lanes at K <= 128, else 2.
// Measured (reports/), 4 lanes beat fla on every prefill shape of the benchmark, while 2 lanes
// win only for one long sequence and 8 lanes only for many short ones, each losing badly on
// the other end; the streamed decode kernel holds a state in at most 8 V tiles (2 lanes need
// 16).
int column_lanes_for(const Problem& p, const LaunchOptions& options, bool decode) {
  if (options.column_lanes == 0) return default_column_lanes(p, decode);
  if (options.column_lanes != 2 && options.column_lanes != 4 && options.column_lanes != 8)
    fail("column_lanes", "must be 0 (default), 2, 4 or 8, got " + str(options.column_lanes));
  return options.column_lanes;
}

int rows_per_lane_for(const Problem& p, int column_lanes) {
  const int row_lanes = 32 / column_lanes;
  const int needed = (p.K + row_lanes - 1) / row_lanes;
  int rows = 4;
  while (rows < needed) rows *= 2;
  return rows;
}

// Where the streamed decode kernel applies (api.hpp, decode_uses_stream_kernel).
bool stream_kernel_applies(const Problem& p, const LaunchOptions& options, int column_lanes) {
  if (options.general_decode) return false;
  if (!options.streamed_decode && std::int64_t(p.N()) * p.HV <= detail::kGeneralDecodeMaxItems) return false;
  const std::int64_t state_elements = std::int64_t(p.K) * p.V;
  const int num_tiles = (p.V + 4 * column_lanes - 1) / (4 * column_lanes);
  return p.uses_state_cache() && state_elements % 4 == 0 && state_elements * 4 <= detail::kStreamMaxStateBytes &&
         num_tiles <= detail::kStreamMaxTiles && rows_per_lane_for(p, column_lanes) <= 16;
}

// The streamed kernel's wide tile (decode_stream_kernel.cuh, launch_stream_wide;
// LaunchOptions::wide_stream_tile): the default (4, 16) tile's bits with 32 columns per warp,
// so that a K-major state goes back in whole 128-byte lines (the (4, 16) warp holds half of
// each line). It needs a K-major state, K in (64, 128] and V <= 128 (4 consumer warps at most),
// K and V multiples of 4, and one token per request.
bool wide_stream_applies(const Problem& p, const LaunchOptions& options, int column_lanes, int rows_per_lane) {
  return options.wide_stream_tile && column_lanes == 4 && rows_per_lane == 16 &&
         p.state_layout == StateLayout::k_major && p.K % 4 == 0 && p.V % 4 == 0 && p.V <= 128 && p.N() > 0 &&
         p.seq_len(0) == 1;
}

// The general kernel's narrow tile (LaunchOptions::narrow_tile; recurrent_kernel.cuh, Tile's CPL):
// only the fixed-size K = V = 128 instance of the default (4, 16) tile has it. Automatic, prefill
// only: launches of at most kNarrowMaxItems default-tile warps, or packs whose longest sequence
// holds at least a third of the tokens (T <= 3 max_len). Why: the narrow tile shortens one
// warp's serial chain but costs about 1.4x the instructions, so it wins where one chain bounds
// the time (one long sequence, or a varlen pack that one sequence dominates) and loses where
// many warps share the SMs (several long sequences, decode); measured in the recurrent
// benchmark's narrow rows (reports/). The tile changes no bit, so a choice that depends on the
// batch keeps batch invariance.
bool narrow_tile_applies(const Problem& p, const LaunchOptions& options, int column_lanes, int rows_per_lane,
                         bool decode) {
  using Narrow = LaunchOptions::NarrowTile;
  if (options.narrow_tile == Narrow::off || options.runtime_size_kernels) return false;
  if (p.K != 128 || p.V != 128 || column_lanes != 4 || rows_per_lane != 16) return false;
  if (options.narrow_tile == Narrow::on) return true;
  if (decode) return false;
  const std::int64_t standard_warps = std::int64_t(p.N()) * p.HV * ((p.V + 4 * column_lanes - 1) / (4 * column_lanes));
  if (standard_warps <= detail::kNarrowMaxItems) return true;
  std::int64_t max_len = 0;
  for (int n = 0; n < p.N(); ++n) max_len = std::max(max_len, p.seq_len(n));
  return max_len > 0 && p.T <= 3 * max_len;
}

// Where one-token decode launches run decode_token_kernel (recurrent_kernel.cuh; api.hpp,
// decode_uses_token_kernel): the fixed-size K = V = 128 standard default tile of the general
// kernel, one token per request, no intermediate states, at most kDecodeTokenMaxWarps warps.
// The caller has already ruled out the streamed kernel.
bool token_kernel_applies(const Problem& p, const LaunchOptions& options, int column_lanes, int rows_per_lane,
                          bool decode) {
  if (!decode || !options.token_decode_kernel) return false;
  if (options.runtime_size_kernels || narrow_tile_applies(p, options, column_lanes, rows_per_lane, decode)) return false;
  if (p.K != 128 || p.V != 128 || column_lanes != 4 || rows_per_lane != 16) return false;
  if (p.N() == 0 || p.seq_len(0) != 1 || p.store_intermediate_states) return false;
  const std::int64_t warps = std::int64_t(p.N()) * p.HV * ((p.V + 4 * column_lanes - 1) / (4 * column_lanes));
  return warps <= detail::kDecodeTokenMaxWarps;
}

// Stages: as many as the shared-memory budget holds (at most kStreamMaxStages), at least 2.
detail::StreamParams stream_params_for(const Problem& p) {
  detail::StreamParams sp{};
  const std::int64_t state_bytes = std::int64_t(p.K) * p.V * 4;
  const std::int64_t stride_bytes = (state_bytes + 127) / 128 * 128;
  sp.state_bytes = static_cast<unsigned>(state_bytes);
  sp.stage_floats = static_cast<int>(stride_bytes / 4);
  sp.stages = static_cast<int>(std::clamp<std::int64_t>(detail::kStreamSmemBudget / stride_bytes, 2,
                                                         detail::kStreamMaxStages));
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sp.multiprocessors, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(multiprocessors)");
  return sp;
}

void check_device_pointers(const Problem& p, const DeviceTensors& t, bool decode, cudaStream_t stream) {
  detail::check_device_memory(buffers_of(p, t, decode), stream);
}

void launch(const Problem& p, const DeviceTensors& t, cudaStream_t stream, const LaunchOptions& options,
            bool decode) {
  validate_common(p, t, decode);
  const int column_lanes = column_lanes_for(p, options, decode);
  const int rows_per_lane = rows_per_lane_for(p, column_lanes);
  if (column_lanes == 8 && rows_per_lane > 32)
    fail("column_lanes", "8 column lanes support K <= 128, got K = " + str(p.K));
  check_device_pointers(p, t, decode, stream);

  RecurrentParams r{};
  r.q = t.q;
  r.k = t.k;
  r.v = t.v;
  r.g = t.g;
  r.beta = t.beta;
  r.a = t.a;
  r.b = t.b;
  r.A_log = t.A_log;
  r.dt_bias = t.dt_bias;
  r.h0 = t.h0;
  r.hT = t.hT;
  r.state_cache = t.state_cache;
  r.state_indices = t.state_indices;
  r.status = t.status;
  r.cu_seqlens = decode ? nullptr : t.cu_seqlens;
  r.cu_seqlens_64 = t.cu_seqlens_type == IndexType::i64;
  r.tokens_per_sequence = decode ? p.seq_len(0) : 0;
  r.o = t.o;
  r.intermediate = t.intermediate;
  r.N = p.N();
  r.H = p.H;
  r.HV = p.HV;
  r.K = p.K;
  r.V = p.V;
  r.group = p.group_size();
  r.hv_divisor = detail::FastDivisor::of(static_cast<unsigned>(p.HV));
  r.scale = static_cast<float>(p.effective_scale());
  r.state_slots = p.state_slots;
  r.has_h0 = p.has_h0;
  r.has_hT = p.has_hT;
  r.use_cache = p.uses_state_cache();
  r.v_major = p.state_layout == StateLayout::v_major;
  r.l2norm = p.use_qk_l2norm;
  r.fused_gates = p.gate_mode == GateMode::fused;
  r.negative_eigenvalues = p.allow_negative_eigenvalues;
  r.gate_type = static_cast<int>(element_type(p.gate_dtype));
  r.store_intermediate = p.store_intermediate_states;
  r.vector_k = p.K % 4 == 0;
  r.vector_v = p.V % 4 == 0;
  r.runtime_sizes = options.runtime_size_kernels;
  r.num_tiles = (p.V + 4 * column_lanes - 1) / (4 * column_lanes);
  r.items = std::int64_t(p.N()) * p.HV * r.num_tiles;
  r.narrow = narrow_tile_applies(p, options, column_lanes, rows_per_lane, decode) ? 1 : 0;
  r.token_kernel = token_kernel_applies(p, options, column_lanes, rows_per_lane, decode) ? 1 : 0;
#if GDN_KERNEL_FAULTS
  r.planted_fault = static_cast<int>(planted_fault());
#endif
  // The general kernel numbers its warps in 32 bits (recurrent_kernel.cuh); the narrow tile has twice the warps.
  const std::int64_t warps = r.narrow ? 2 * r.items : r.items;
  if (warps > std::int64_t(0x7fffffff))
    fail("cu_seqlens", "N * HV * V tiles must stay below 2^31 warps for one launch, got " + str(warps));

  if (t.status != nullptr) {
    if (p.uses_state_cache()) {
      detail::launch_check_indices(t.state_indices, p.N(), p.state_slots, t.status, stream);
    } else {
      check_cuda(cudaMemsetAsync(t.status, 0, sizeof(int), stream), "cudaMemsetAsync(status)");
    }
    check_cuda(cudaGetLastError(), "check_indices launch");
  }
  if (decode && stream_kernel_applies(p, options, column_lanes)) {
    const bool wide = wide_stream_applies(p, options, column_lanes, rows_per_lane);
    if (wide) r.num_tiles = (p.V + 31) / 32;
    if (!detail::launch_decode_stream(element_type(p.input_dtype), wide ? 8 : column_lanes, wide ? 32 : rows_per_lane,
                                      r, stream_params_for(p), stream))
      fail("K", "no streamed decode kernel instance for column_lanes = " + str(column_lanes) +
                    ", rows per lane " + str(rows_per_lane));
    check_cuda(cudaGetLastError(), "streamed decode kernel launch");
    return;
  }
  if (!detail::launch_recurrent(element_type(p.input_dtype), column_lanes, rows_per_lane, r, stream))
    fail("K", "no kernel instance for column_lanes = " + str(column_lanes) + ", rows per lane " +
                  str(rows_per_lane));
  check_cuda(cudaGetLastError(), "recurrent kernel launch");
}

}  // namespace

void validate_prefill(const Problem& problem, const DeviceTensors& tensors) {
  validate_common(problem, tensors, false);
}
void validate_decode(const Problem& problem, const DeviceTensors& tensors) {
  validate_common(problem, tensors, true);
}

void recurrent_prefill(const Problem& problem, const DeviceTensors& tensors, cudaStream_t stream,
                       const LaunchOptions& options) {
  launch(problem, tensors, stream, options, false);
}

void decode(const Problem& problem, const DeviceTensors& tensors, cudaStream_t stream,
            const LaunchOptions& options) {
  launch(problem, tensors, stream, options, true);
}

// The host-only queries answer false for a column_lanes the launches would reject.
static bool known_column_lanes(const LaunchOptions& options) {
  const int lanes = options.column_lanes;
  return lanes == 0 || lanes == 2 || lanes == 4 || lanes == 8;
}

bool decode_uses_stream_kernel(const Problem& problem, const LaunchOptions& options) {
  if (!known_column_lanes(options)) return false;
  return stream_kernel_applies(problem, options, column_lanes_for(problem, options, /*decode=*/true));
}

bool decode_uses_wide_stream_tile(const Problem& problem, const LaunchOptions& options) {
  if (!decode_uses_stream_kernel(problem, options)) return false;
  const int column_lanes = column_lanes_for(problem, options, /*decode=*/true);
  return wide_stream_applies(problem, options, column_lanes, rows_per_lane_for(problem, column_lanes));
}

bool decode_uses_token_kernel(const Problem& problem, const LaunchOptions& options) {
  if (!known_column_lanes(options) || decode_uses_stream_kernel(problem, options)) return false;
  const int column_lanes = column_lanes_for(problem, options, /*decode=*/true);
  return token_kernel_applies(problem, options, column_lanes, rows_per_lane_for(problem, column_lanes), true);
}

bool uses_narrow_tile(const Problem& problem, const LaunchOptions& options, bool decode) {
  if (!known_column_lanes(options) || (decode && decode_uses_stream_kernel(problem, options))) return false;
  const int column_lanes = column_lanes_for(problem, options, decode);
  return narrow_tile_applies(problem, options, column_lanes, rows_per_lane_for(problem, column_lanes), decode);
}

bool device_available(std::string* why) {
  int count = 0;
  const cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    if (why) *why = code != cudaSuccess ? std::string("no CUDA device: ") + cudaGetErrorString(code)
                                        : std::string("no CUDA device");
    return false;
  }
  return true;
}

std::int64_t state_traffic_bytes(const Problem& problem) {
  const std::int64_t per_state = std::int64_t(problem.HV) * problem.K * problem.V * 4;
  std::int64_t sequences = problem.N();
  const std::int64_t reads = problem.has_h0 ? sequences * per_state : 0;
  const std::int64_t writes = problem.has_hT ? sequences * per_state : 0;
  const std::int64_t intermediate =
      problem.store_intermediate_states ? problem.T * per_state : 0;
  return reads + writes + intermediate;
}

int default_column_lanes(const Problem& problem, bool /*decode*/) {
  return problem.K <= 128 ? 4 : 2;
}

}  // namespace gdn::cuda
