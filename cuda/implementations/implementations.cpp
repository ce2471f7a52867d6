#include "cuda/implementations/implementations.hpp"

#include <cstring>
#include <stdexcept>
#include <vector>

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

}  // namespace gdn::cuda
