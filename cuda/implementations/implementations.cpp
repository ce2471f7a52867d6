#include "cuda/implementations/implementations.hpp"

#include <cstring>
#include <stdexcept>
#include <vector>

#include "cuda/api/check.hpp"
#include "cuda/api/backward.hpp"
#include "cuda/implementations/guarded_buffer.hpp"

namespace gdn::cuda {


std::string KernelAdapter::name() const {
  return entry_ == Entry::decode ? "cuda.decode" : "cuda.recurrent_prefill";
}

bool KernelAdapter::supports(const Problem& problem, std::string* why) const {
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (problem.input_dtype == DType::f64) return no("input dtype f64 has no CUDA kernel");
  if (const auto rule = detail::unsupported_storage(problem); !rule.first.empty())
    return no(rule.first + ": " + rule.second);
  if (problem.K > 256 || problem.V > 256) return no("K and V must be <= 256");
  if (entry_ == Entry::decode) {
    if (!problem.uses_state_cache()) return no("decode needs a state cache");
    const std::int64_t ts = problem.seq_len(0);
    if (ts < 1) return no("decode needs Ts >= 1");
    for (int n = 0; n < problem.N(); ++n)
      if (problem.seq_len(n) != ts) return no("decode needs a fixed-length batch");
  }
  return true;
}

Outputs<double> KernelAdapter::run(const Problem& problem, const Inputs& inputs) {
  validate(problem, inputs);
  std::vector<GuardedBuffer> buffers;
  buffers.reserve(20);  // stable addresses: references into the vector are held below
  DeviceTensors t;
  const DType in = problem.input_dtype;
  add_token_inputs(buffers, problem, inputs, t);
  const Shape state_shape = problem.state_shape();
  const std::size_t state_bytes = static_cast<std::size_t>(shape_numel(state_shape)) * 4;
  GuardedBuffer* cache = nullptr;
  GuardedBuffer* dense_hT = nullptr;
  std::vector<unsigned char> cache_before;
  if (problem.uses_state_cache()) {
    cache = &add_input(buffers, "state_cache", inputs.h0, DType::f32);
    t.state_cache = static_cast<float*>(cache->data());
    if (!problem.has_hT) cache_before = encode_tensor(inputs.h0, DType::f32);
    std::vector<std::int32_t> indices = inputs.state_indices;
    buffers.emplace_back("state_indices", indices.size() * 4);
    buffers.back().upload(indices.data());
    t.state_indices = static_cast<const std::int32_t*>(buffers.back().data());
    t.host_state_indices = inputs.state_indices.data();
  } else {
    if (problem.has_h0) t.h0 = static_cast<const float*>(add_input(buffers, "h0", inputs.h0, DType::f32).data());
    if (problem.has_hT) {
      buffers.emplace_back("hT", state_bytes);
      buffers.back().fill(0xFF);
      dense_hT = &buffers.back();
      t.hT = static_cast<float*>(dense_hT->data());
    }
  }
  if (entry_ == Entry::recurrent_prefill) add_cu_seqlens(buffers, problem, cu_seqlens_type_, t);
  const Shape o_shape = problem.v_shape();
  buffers.emplace_back("o", static_cast<std::size_t>(shape_numel(o_shape)) * dtype_size(in));
  buffers.back().fill(0xFF);  // NaN in every dtype: an unwritten element fails
  GuardedBuffer& o = buffers.back();
  t.o = o.data();
  GuardedBuffer* intermediate = nullptr;
  if (problem.store_intermediate_states) {
    buffers.emplace_back("intermediate", static_cast<std::size_t>(shape_numel(problem.intermediate_shape())) * 4);
    buffers.back().fill(0xFF);
    intermediate = &buffers.back();
    t.intermediate = static_cast<float*>(intermediate->data());
  }
  GuardedBuffer* status = nullptr;
  if (problem.uses_state_cache()) {
    buffers.emplace_back("status", 4);
    buffers.back().fill(0x7F);  // the check kernel must overwrite it
    status = &buffers.back();
    t.status = static_cast<int*>(status->data());
  }

  if (entry_ == Entry::decode) gdn::cuda::decode(problem, t, nullptr, options_);
  else recurrent_prefill(problem, t, nullptr, options_);
  check_cuda(cudaDeviceSynchronize(), "kernel execution");

  for (const GuardedBuffer& b : buffers) b.check_canaries();
  if (status != nullptr) {
    const std::vector<unsigned char> s = status->download();
    int word;
    std::memcpy(&word, s.data(), 4);
    if (word != kStatusOk)
      throw std::runtime_error("gdn::cuda: status word " + std::to_string(word) + " for validated state indices");
  }

  Outputs<double> out;
  out.o = o.download_tensor(in, o_shape);
  if (problem.has_hT) {
    out.hT = (cache ? cache : dense_hT)->download_tensor(DType::f32, state_shape);
  } else if (cache != nullptr && cache->download() != cache_before) {
    throw std::runtime_error("gdn::cuda: the state cache changed although has_hT is false");
  }
  if (intermediate) out.intermediate = intermediate->download_tensor(DType::f32, problem.intermediate_shape());
  return out;
}

bool device_backward_supports(const Problem& problem, BackwardAlgorithm algorithm, std::string* why) {
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (problem.input_dtype == DType::f64) return no("input dtype f64 has no CUDA kernel");
  if (const auto rule = detail::unsupported_storage(problem); !rule.first.empty())
    return no(rule.first + ": " + rule.second);
  if (problem.K > 256 || problem.V > 256) return no("K and V must be <= 256");
  if (algorithm == BackwardAlgorithm::chunked && problem.K > 128)
    return no("K must be <= 128 for the chunked backward");
  if (problem.uses_state_cache()) return no("the backward covers dense states only (no state cache)");
  if (problem.store_intermediate_states) return no("the backward does not differentiate per-token states");
  return true;
}

bool KernelAdapter::supports_backward(const Problem& problem, std::string* why) const {
  if (!has_backward()) {
    if (why) *why = name() + " has no backward";
    return false;
  }
  return device_backward_supports(problem, BackwardAlgorithm::sequential, why);
}

Gradients<double> KernelAdapter::backward(const Problem& problem, const Inputs& inputs,
                                          const BackwardInputs& cotangents) {
  if (!has_backward()) throw std::logic_error(name() + " has no backward");
  return run_device_backward(problem, inputs, cotangents, cu_seqlens_type_, BackwardAlgorithm::sequential);
}

Gradients<double> run_device_backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& cotangents,
                                      IndexType cu_seqlens_type, BackwardAlgorithm algorithm) {
  validate(problem, inputs);
  std::vector<GuardedBuffer> buffers;
  buffers.reserve(32);  // stable addresses: references into the vector are held below
  BackwardTensors t;
  const DType in = problem.input_dtype, gate = problem.gate_dtype;
  add_token_inputs(buffers, problem, inputs, t.forward);
  if (problem.has_h0)
    t.forward.h0 = static_cast<const float*>(add_input(buffers, "h0", inputs.h0, DType::f32).data());
  add_cu_seqlens(buffers, problem, cu_seqlens_type, t.forward);
  t.dO = add_input(buffers, "dO", cotangents.dO, in).data();
  if (cotangents.dhT.defined() && problem.has_hT)
    t.dhT = static_cast<const float*>(add_input(buffers, "dhT", cotangents.dhT, DType::f32).data());

  // Every gradient starts as NaN (0xFF bytes): an element the kernel does not write fails.
  struct Output {
    const char* name;
    Shape shape;
    DType dtype;
    GuardedBuffer* buffer;
  };
  std::vector<Output> outputs;
  auto output = [&](const char* name, const Shape& shape, DType dtype) -> void* {
    GuardedBuffer& b = add_output(buffers, name, static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype));
    outputs.push_back({name, shape, dtype, &b});
    return b.data();
  };
  t.dq = output("dq", problem.q_shape(), in);
  t.dk = output("dk", problem.q_shape(), in);
  t.dv = output("dv", problem.v_shape(), in);
  if (problem.gate_mode == GateMode::direct) {
    t.dg = output("dg", problem.gate_shape(), gate);
    t.dbeta = output("dbeta", problem.gate_shape(), gate);
  } else {
    t.da = output("da", problem.gate_shape(), gate);
    t.db = output("db", problem.gate_shape(), gate);
    t.dA_log = static_cast<float*>(output("dA_log", problem.head_param_shape(), DType::f32));
    t.ddt_bias = static_cast<float*>(output("ddt_bias", problem.head_param_shape(), DType::f32));
  }
  if (problem.has_h0) t.dh0 = static_cast<float*>(output("dh0", problem.state_shape(), DType::f32));
  t.workspace_bytes = backward_workspace_bytes(problem, algorithm);
  // The workspace too starts as NaN: a part the kernels read before writing poisons a gradient.
  t.workspace = add_output(buffers, "workspace", t.workspace_bytes).data();

  if (algorithm == BackwardAlgorithm::chunked) chunked_backward(problem, t, nullptr);
  else recurrent_backward(problem, t, nullptr);
  check_cuda(cudaDeviceSynchronize(), "backward kernel execution");
  for (const GuardedBuffer& b : buffers) b.check_canaries();

  Gradients<double> g;
  for (const Output& o : outputs) {
    HostTensor<double> x = o.buffer->download_tensor(o.dtype, o.shape);
    g.for_each([&](const char* name, HostTensor<double>& target) {
      if (std::string(name) == o.name) target = std::move(x);
    });
  }
  return g;
}

}  // namespace gdn::cuda
