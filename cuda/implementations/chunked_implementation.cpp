#include "cuda/implementations/chunked_implementation.hpp"
#include "cuda/implementations/implementations.hpp"

#include <cstring>
#include <stdexcept>
#include <vector>

#include "cuda/implementations/guarded_buffer.hpp"

namespace gdn::cuda {

namespace {

std::vector<float> as_floats(const std::vector<unsigned char>& bytes) {
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

}  // namespace

std::string ChunkedPrefillKernel::name() const {
  std::string n = "cuda.chunked_prefill";
  if (options_.value_tile != 0) n += ".bv" + std::to_string(options_.value_tile);
  if (options_.split_chunks > 0) n += ".split" + std::to_string(options_.split_chunks);
  if (options_.split_chunks == kChunkedSplitAuto) n += ".split_auto";
  // kChunkedSplitByHeads is the default (no suffix, as before it was); an explicit 0 is named.
  if (options_.split_chunks == 0) n += ".unsplit";
  if (options_.rounding == ChunkedRounding::single) n += ".single";
  if (options_.schedule == ChunkedSchedule::two_pass) n += ".two_pass";
  if (options_.schedule == ChunkedSchedule::fused) n += ".fused";
  if (cu_seqlens_type_ == IndexType::i64) n += ".cu64";
  return n;
}

bool ChunkedPrefillKernel::has_backward() const {
  const ChunkedOptions defaults{};
  return options_.value_tile == defaults.value_tile && options_.split_chunks == defaults.split_chunks &&
         options_.rounding == defaults.rounding && options_.schedule == defaults.schedule &&
         options_.long_value_tile == defaults.long_value_tile &&
         options_.long_above_chunks == defaults.long_above_chunks;
}

bool ChunkedPrefillKernel::supports_backward(const Problem& problem, std::string* why) const {
  if (!has_backward()) {
    if (why) *why = name() + " has no backward (the chunked backward is on cuda.chunked_prefill)";
    return false;
  }
  return device_backward_supports(problem, BackwardAlgorithm::chunked, why);
}

Gradients<double> ChunkedPrefillKernel::backward(const Problem& problem, const Inputs& inputs,
                                                 const BackwardInputs& cotangents) {
  if (!has_backward()) throw std::logic_error(name() + " has no backward");
  return run_device_backward(problem, inputs, cotangents, cu_seqlens_type_, BackwardAlgorithm::chunked);
}

bool ChunkedPrefillKernel::supports(const Problem& problem, std::string* why) const {
  if (!chunked_prefill_supports(problem, why)) return false;
  // chunked_blocks_per_sm is 0 where the dtype and K have no instance of the tile (fp32 above
  // 32, fp16 at 128 for K > 64).
  if (options_.value_tile != 0 &&
      (problem.V % options_.value_tile != 0 || chunked_blocks_per_sm(problem, options_.value_tile) == 0)) {
    if (why)
      *why = "value tile " + std::to_string(options_.value_tile) + " does not fit V = " + std::to_string(problem.V) +
             " or has no instance for this dtype and K";
    return false;
  }
  if (options_.split_chunks > 0 && problem.input_dtype == DType::f32) {
    if (why) *why = "the sequence split runs on the bf16/fp16 kernel only";
    return false;
  }
  if (options_.rounding == ChunkedRounding::single && problem.input_dtype == DType::f32) {
    if (why) *why = "single rounding is for bf16/fp16 inputs (the fp32 kernel has no tensor-core operands)";
    return false;
  }
  if (options_.long_value_tile > 0 &&
      (problem.input_dtype == DType::f32 || problem.V % options_.long_value_tile != 0 ||
       chunked_blocks_per_sm(problem, options_.long_value_tile) == 0)) {
    if (why) *why = "two V tiles need bf16/fp16 and a long value tile that fits V";
    return false;
  }
  if (options_.schedule == ChunkedSchedule::fused && options_.split_chunks != kChunkedSplitAuto) {
    // The plan's tile does not depend on the SM count where value_tile is given; otherwise the
    // launch may still refuse it (ProblemError "schedule").
    if (!chunked_plan(problem, options_, 132).fused) {
      if (why) *why = "the fused schedule runs bf16 with K > 64 at value tile 128, unsplit, without two V tiles";
      return false;
    }
  }
  if (options_.long_value_tile > 0 && chunked_fixed_split(problem, options_.split_chunks) != 0) {
    if (why) *why = "two V tiles need an unsplit launch (split_chunks resolves to a split for this problem)";
    return false;
  }
  return true;
}

Outputs<double> ChunkedPrefillKernel::run(const Problem& problem, const Inputs& inputs) {
  return run_impl(problem, inputs, nullptr);
}

Outputs<double> ChunkedPrefillKernel::run_traced(const Problem& problem, const Inputs& inputs, KernelTrace* trace) {
  return run_impl(problem, inputs, trace);
}

Outputs<double> ChunkedPrefillKernel::run_impl(const Problem& problem, const Inputs& inputs, KernelTrace* trace) {
  validate(problem, inputs);
  std::vector<GuardedBuffer> buffers;
  buffers.reserve(24);  // stable addresses: references into the vector are held below
  DeviceTensors t;
  const DType in = problem.input_dtype;
  add_token_inputs(buffers, problem, inputs, t);
  const Shape state_shape = problem.state_shape();
  const std::size_t state_bytes = static_cast<std::size_t>(shape_numel(state_shape)) * 4;
  if (problem.has_h0) t.h0 = static_cast<const float*>(add_input(buffers, "h0", inputs.h0, DType::f32).data());
  GuardedBuffer* hT = nullptr;
  if (problem.has_hT) {
    hT = &add_output(buffers, "hT", state_bytes);
    t.hT = static_cast<float*>(hT->data());
  }
  add_cu_seqlens(buffers, problem, cu_seqlens_type_, t);
  const Shape o_shape = problem.v_shape();
  GuardedBuffer& o = add_output(buffers, "o", static_cast<std::size_t>(shape_numel(o_shape)) * dtype_size(in));
  t.o = o.data();

  ChunkedOptions options = options_;
  ChunkedDebug debug;
  std::vector<std::int64_t> offsets;
  GuardedBuffer *dA = nullptr, *dT = nullptr, *dVnew = nullptr, *dS0 = nullptr, *dS_end = nullptr;
  if (trace) {
    const std::int64_t chunks = chunked_chunk_offsets(problem, &offsets);
    const std::size_t C = kChunkSize, HV = problem.HV, K = problem.K, V = problem.V;
    const std::size_t n = static_cast<std::size_t>(chunks);
    buffers.emplace_back("chunk_offsets", offsets.size() * 8);
    buffers.back().upload(offsets.data());
    debug.chunk_offsets = static_cast<const std::int64_t*>(buffers.back().data());
    debug.total_chunks = chunks;
    dA = &add_output(buffers, "debug.A", n * HV * C * C * 4);
    dT = &add_output(buffers, "debug.T", n * HV * C * C * 4);
    dVnew = &add_output(buffers, "debug.Vnew", n * HV * C * V * 4);
    dS0 = &add_output(buffers, "debug.S0", n * HV * K * V * 4);
    dS_end = &add_output(buffers, "debug.S_end", n * HV * K * V * 4);
    debug.A = static_cast<float*>(dA->data());
    debug.T = static_cast<float*>(dT->data());
    debug.Vnew = static_cast<float*>(dVnew->data());
    debug.S0 = static_cast<float*>(dS0->data());
    debug.S_end = static_cast<float*>(dS_end->data());
    options.debug = &debug;
  } else {
    options.debug = nullptr;
  }

  chunked_prefill(problem, t, nullptr, options);
  check_cuda(cudaDeviceSynchronize(), "chunked kernel execution");
  for (const GuardedBuffer& b : buffers) b.check_canaries();

  Outputs<double> out;
  out.o = o.download_tensor(in, o_shape);
  if (hT) out.hT = hT->download_tensor(DType::f32, state_shape);

  if (trace) {
    const std::vector<float> A = as_floats(dA->download()), T = as_floats(dT->download());
    const std::vector<float> Vn = as_floats(dVnew->download());
    const std::vector<float> S0 = as_floats(dS0->download()), Se = as_floats(dS_end->download());
    const int C = kChunkSize, HV = problem.HV, K = problem.K, V = problem.V;
    trace->records.clear();
    for (int n = 0; n < problem.N(); ++n) {
      for (int j = 0; j < HV; ++j) {
        int chunk = 0;
        for (std::int64_t start = problem.seq_begin(n); start < problem.seq_begin(n) + problem.seq_len(n);
             start += C, ++chunk) {
          const int c = static_cast<int>(std::min<std::int64_t>(C, problem.seq_begin(n) + problem.seq_len(n) - start));
          const std::size_t id = static_cast<std::size_t>(offsets[static_cast<std::size_t>(n)] + chunk) * HV + j;
          reference::ChunkRecord<double> r;
          r.sequence = n;
          r.head = j;
          r.chunk = chunk;
          r.begin = start;
          r.length = c;
          r.A.resize(c, c);
          r.T.resize(c, c);
          r.Vnew.resize(c, V);
          r.S0.resize(K, V);
          r.S_end.resize(K, V);
          for (int i = 0; i < c; ++i)
            for (int q = 0; q < c; ++q) {
              r.A(i, q) = A[id * C * C + std::size_t(i) * C + q];
              r.T(i, q) = T[id * C * C + std::size_t(i) * C + q];
            }
          for (int i = 0; i < c; ++i)
            for (int v = 0; v < V; ++v) r.Vnew(i, v) = Vn[id * C * V + std::size_t(i) * V + v];
          for (int k = 0; k < K; ++k)
            for (int v = 0; v < V; ++v) {
              r.S0(k, v) = S0[id * K * V + std::size_t(k) * V + v];
              r.S_end(k, v) = Se[id * K * V + std::size_t(k) * V + v];
            }
          trace->records.push_back(std::move(r));
        }
      }
    }
  }
  return out;
}

oracle::BudgetOptions chunked_budget(ChunkedRounding rounding) {
  oracle::BudgetOptions options;  // calibrated: factor 2, floor 1 u, arithmetic floor
  options.state_unit_input = true;
  if (rounding == ChunkedRounding::single) options.baseline = oracle::BudgetBaseline::operands_single;
  return options;
}

}  // namespace gdn::cuda
