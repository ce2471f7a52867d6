// Host side of the CUDA backward (backward.hpp): the checks before any launch, the workspace's
// layout, the parameters of the kernels (cuda/backward/backward_kernel.cu).
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/api/backward.hpp"
#include "cuda/api/check.hpp"
#include "cuda/backward/backward_params.hpp"

namespace gdn::cuda {

namespace {

using detail::element_type;
using detail::fail;
using detail::str;

using detail::Buffer;

int tiles_of(const Problem& p) { return (p.V + detail::kBackwardTileColumns - 1) / detail::kBackwardTileColumns; }

constexpr std::int64_t kChunk = detail::kChunkedBackwardChunk;

// An upper bound of the chunked backward's chunks: sum over sequences of ceil(len / C).
std::int64_t max_chunks_of(const Problem& p) { return p.T / kChunk + p.N(); }

// The workspace's parts, in floats, in this order (the chunked backward's int tables first,
// padded to 16 bytes).
struct WorkspaceLayout {
  std::int64_t table_floats;  // chunk_begin (int64), chunk_length, sequence_chunk (int32)
  std::int64_t norms, gates, parts_qk, parts_gate, totals, checkpoints;
  std::int64_t chunk_slots;   // chunks x HV
  std::int64_t scalars, cc, ck, cv, kv;  // per chunk slot
  std::int64_t floats() const {
    return table_floats + 2 * norms + 2 * gates + 2 * parts_qk + 2 * parts_gate + 2 * totals + checkpoints +
           chunk_slots * (scalars + 2 * cc + ck + 3 * cv + 2 * kv);
  }
};

WorkspaceLayout layout_of(const Problem& p, BackwardAlgorithm algorithm) {
  WorkspaceLayout w{};
  const bool chunked = algorithm == BackwardAlgorithm::chunked;
  const std::int64_t tiles = chunked ? 1 : tiles_of(p);
  w.norms = p.T * p.H;
  w.gates = p.T * p.HV;
  w.parts_qk = tiles * p.T * p.HV * p.K;
  w.parts_gate = tiles * p.T * p.HV;
  w.totals = p.gate_mode == GateMode::fused ? p.T * p.HV : 0;
  if (!chunked) {
    w.checkpoints = (p.T / detail::kBackwardSegment) * p.HV * p.K * p.V;
    return w;
  }
  const std::int64_t chunks = max_chunks_of(p);
  const std::int64_t table_bytes = chunks * 8 + chunks * 4 + (p.N() + 1) * 4;
  w.table_floats = ((table_bytes + 15) / 16) * 4;
  w.chunk_slots = chunks * p.HV;
  w.scalars = detail::kChunkedBackwardScalars * kChunk;
  w.cc = kChunk * kChunk;
  w.ck = kChunk * p.K;
  w.cv = kChunk * p.V;
  w.kv = static_cast<std::int64_t>(p.K) * p.V;
  return w;
}

std::vector<Buffer> buffers_of(const Problem& p, const BackwardTensors& b, BackwardAlgorithm algorithm) {
  const DeviceTensors& f = b.forward;
  const std::int64_t in = static_cast<std::int64_t>(dtype_size(p.input_dtype));
  const std::int64_t gate = static_cast<std::int64_t>(dtype_size(p.gate_dtype));
  const std::int64_t qk = p.T * p.H * p.K * in;
  const std::int64_t vv = p.T * p.HV * p.V * in;
  const std::int64_t gates = p.T * p.HV * gate;
  const std::int64_t state = shape_numel(p.state_shape()) * 4;
  const bool direct = p.gate_mode == GateMode::direct;
  const std::int64_t unused = -1;
  const std::size_t cu_size = f.cu_seqlens_type == IndexType::i64 ? 8 : 4;
  const std::int64_t workspace = static_cast<std::int64_t>(backward_workspace_bytes(p, algorithm));
  return {
      {"q", f.q, qk, false, 4},
      {"k", f.k, qk, false, 4},
      {"v", f.v, vv, false, 4},
      {"g", f.g, direct ? gates : unused, false, 4},
      {"beta", f.beta, direct ? gates : unused, false, 4},
      {"a", f.a, direct ? unused : gates, false, 4},
      {"b", f.b, direct ? unused : gates, false, 4},
      {"A_log", f.A_log, direct ? unused : p.HV * 4, false, 4},
      {"dt_bias", f.dt_bias, direct ? unused : p.HV * 4, false, 4},
      {"h0", f.h0, p.has_h0 ? state : unused, false, 4},
      {"cu_seqlens", f.cu_seqlens, (p.N() + 1) * std::int64_t(cu_size), false, cu_size},
      {"dO", b.dO, vv, false, 4},
      // dhT is optional: a null pointer reads as zero (checked for null-with-no-hT below).
      {"dhT", b.dhT, (p.has_hT && b.dhT != nullptr) ? state : unused, false, 4},
      {"dq", b.dq, qk, true, 4},
      {"dk", b.dk, qk, true, 4},
      {"dv", b.dv, vv, true, 4},
      {"dg", b.dg, direct ? gates : unused, true, 4},
      {"dbeta", b.dbeta, direct ? gates : unused, true, 4},
      {"da", b.da, direct ? unused : gates, true, 4},
      {"db", b.db, direct ? unused : gates, true, 4},
      {"dA_log", b.dA_log, direct ? unused : p.HV * 4, true, 4},
      {"ddt_bias", b.ddt_bias, direct ? unused : p.HV * 4, true, 4},
      {"dh0", b.dh0, p.has_h0 ? state : unused, true, 4},
      {"workspace", b.workspace, workspace, true, 16},
  };
}

}  // namespace

std::size_t backward_workspace_bytes(const Problem& problem, BackwardAlgorithm algorithm) {
  return static_cast<std::size_t>(layout_of(problem, algorithm).floats()) * sizeof(float);
}

void validate_backward(const Problem& p, const BackwardTensors& b, BackwardAlgorithm algorithm) {
  const bool chunked = algorithm == BackwardAlgorithm::chunked;
  p.validate();
  if (p.input_dtype == DType::f64) fail("input_dtype", "must be f32, bf16 or f16 for the CUDA kernels, got f64");
  if (const auto rule = detail::unsupported_storage(p); !rule.first.empty()) fail(rule.first, rule.second);
  if (p.K > detail::kBackwardMaxThreads) fail("K", "must be <= 256 for the CUDA backward, got " + str(p.K));
  if (chunked && p.K > detail::kChunkedBackwardMaxK)
    fail("K", "must be <= 128 for the chunked backward (a chunk's q and k rows live in shared memory), got " +
                  str(p.K));
  if (p.V > 256) fail("V", "must be <= 256 for the CUDA backward, got " + str(p.V));
  if (p.uses_state_cache())
    fail("state_slots", "the backward covers dense states only (§6); a state cache is an inference option, got "
                        "state_slots = " + str(p.state_slots));
  if (p.store_intermediate_states)
    fail("store_intermediate_states", "the backward does not differentiate per-token states (an inference option, §6)");
  const std::int64_t widest = p.H > p.HV ? p.H : p.HV;
  if (p.T * widest * 32 >= (std::int64_t(1) << 31))
    fail("cu_seqlens", "T x max(H, HV) x 32 must be < 2^31 for the backward's grids, got T = " + str(p.T));
  if (static_cast<std::int64_t>(p.N()) * tiles_of(p) >= (std::int64_t(1) << 31))
    fail("cu_seqlens", "N x ceil(V / 16) must be < 2^31 for the backward's grid");
  if (p.HV > 65535) fail("HV", "must be <= 65535 for the backward's grids, got " + str(p.HV));
  const DeviceTensors& f = b.forward;
  if (f.o != nullptr) fail("o", "must be null: the backward writes no forward output");
  if (f.hT != nullptr) fail("hT", "must be null: the backward writes no forward output");
  if (f.state_cache != nullptr || f.state_indices != nullptr || f.host_state_indices != nullptr)
    fail("state_cache", "must be null: the backward covers dense states only");
  if (f.intermediate != nullptr) fail("intermediate", "must be null: the backward writes no forward output");
  if (f.status != nullptr) fail("status", "must be null: the backward has no device status word");
  if (b.dhT != nullptr && !p.has_hT) fail("dhT", "given but the problem has no final state output (has_hT = false)");
  if (b.workspace_bytes < backward_workspace_bytes(p, algorithm))
    fail("workspace_bytes", "must be at least backward_workspace_bytes(problem) = " +
                                str(static_cast<std::int64_t>(backward_workspace_bytes(p, algorithm))) + ", got " +
                                str(static_cast<std::int64_t>(b.workspace_bytes)));

  detail::check_buffers(p, buffers_of(p, b, algorithm), [](const Buffer&, const Buffer&) { return false; });
}

namespace {

void run_backward(const Problem& p, const BackwardTensors& b, cudaStream_t stream, BackwardAlgorithm algorithm) {
  validate_backward(p, b, algorithm);
  detail::check_device_memory(buffers_of(p, b, algorithm), stream);
  const bool chunked = algorithm == BackwardAlgorithm::chunked;

  const DeviceTensors& f = b.forward;
  detail::BackwardParams q{};
  q.q = f.q;
  q.k = f.k;
  q.v = f.v;
  q.g = f.g;
  q.beta = f.beta;
  q.a = f.a;
  q.b = f.b;
  q.A_log = f.A_log;
  q.dt_bias = f.dt_bias;
  q.h0 = f.h0;
  q.cu_seqlens = f.cu_seqlens;
  q.cu_seqlens_64 = f.cu_seqlens_type == IndexType::i64 ? 1 : 0;
  q.dO = b.dO;
  q.dhT = b.dhT;
  q.dq = b.dq;
  q.dk = b.dk;
  q.dv = b.dv;
  q.dg = b.dg;
  q.dbeta = b.dbeta;
  q.da = b.da;
  q.db = b.db;
  q.dA_log = b.dA_log;
  q.dt_bias_grad = b.ddt_bias;
  q.dh0 = b.dh0;
  const WorkspaceLayout w = layout_of(p, algorithm);
  float* cursor = static_cast<float*>(b.workspace);
  if (chunked) {
    const std::int64_t chunks = max_chunks_of(p);
    unsigned char* bytes = static_cast<unsigned char*>(b.workspace);
    q.chunk_begin = reinterpret_cast<long long*>(bytes);
    q.chunk_length = reinterpret_cast<int*>(bytes + chunks * 8);
    q.sequence_chunk = reinterpret_cast<int*>(bytes + chunks * 12);
    q.max_chunks = static_cast<int>(chunks);
    cursor += w.table_floats;
  }
  auto take = [&](std::int64_t floats) {
    float* part = floats > 0 ? cursor : nullptr;
    cursor += floats;
    return part;
  };
  q.inv_norm_q = take(w.norms);
  q.inv_norm_k = take(w.norms);
  q.gate_g = take(w.gates);
  q.gate_beta = take(w.gates);
  q.part_dq = take(w.parts_qk);
  q.part_dk = take(w.parts_qk);
  q.part_dbeta = take(w.parts_gate);
  q.part_dg = take(w.parts_gate);
  q.total_dg = take(w.totals);
  q.total_da = take(w.totals);
  q.checkpoints = take(w.checkpoints);
  q.chunk_scalars = take(w.chunk_slots * w.scalars);
  q.chunk_T = take(w.chunk_slots * w.cc);
  q.chunk_P = take(w.chunk_slots * w.cc);
  q.chunk_W = take(w.chunk_slots * w.ck);
  q.chunk_U = take(w.chunk_slots * w.cv);
  q.chunk_Vnew = take(w.chunk_slots * w.cv);
  q.chunk_dVnew = take(w.chunk_slots * w.cv);
  q.chunk_S0 = take(w.chunk_slots * w.kv);
  q.chunk_dS = take(w.chunk_slots * w.kv);
  q.T = p.T;
  q.N = p.N();
  q.H = p.H;
  q.HV = p.HV;
  q.K = p.K;
  q.V = p.V;
  q.group = p.group_size();
  q.tiles = chunked ? 1 : tiles_of(p);
  q.threads = 32 * ((p.K + 31) / 32);
  q.scale = static_cast<float>(p.effective_scale());
  q.l2norm = p.use_qk_l2norm ? 1 : 0;
  q.fused_gates = p.gate_mode == GateMode::fused ? 1 : 0;
  q.negative_eigenvalues = p.allow_negative_eigenvalues ? 1 : 0;
  q.v_major = p.state_layout == StateLayout::v_major ? 1 : 0;
  q.input_type = static_cast<int>(element_type(p.input_dtype));
  q.gate_type = static_cast<int>(element_type(p.gate_dtype));
  if (chunked) detail::launch_chunked_backward_kernels(q, stream);
  else detail::launch_backward_kernels(q, stream);
}

}  // namespace

void recurrent_backward(const Problem& p, const BackwardTensors& b, cudaStream_t stream) {
  run_backward(p, b, stream, BackwardAlgorithm::sequential);
}

void chunked_backward(const Problem& p, const BackwardTensors& b, cudaStream_t stream) {
  run_backward(p, b, stream, BackwardAlgorithm::chunked);
}

}  // namespace gdn::cuda
