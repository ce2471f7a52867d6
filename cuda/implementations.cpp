#include "cuda/implementations.hpp"

#include <Eigen/Core>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cuda/device_buffer.hpp"

namespace gdn::cuda {

namespace {

// Canary zone on each side of every buffer; 256 keeps the payload's 256-byte alignment.
constexpr std::size_t kGuard = 256;
constexpr unsigned char kCanary = 0xA5;

// A device allocation with canaries before and after the payload.
class GuardedBuffer {
 public:
  GuardedBuffer(const char* name, std::size_t bytes)
      : name_(name), bytes_(bytes), storage_(bytes + 2 * kGuard) {
    check_cuda(cudaMemset(storage_.data(), kCanary, storage_.size()), "cudaMemset(canary)");
  }
  void* data() { return storage_.data() + kGuard; }
  std::size_t bytes() const { return bytes_; }
  void upload(const void* host) {
    if (bytes_ > 0) check_cuda(cudaMemcpy(data(), host, bytes_, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  void fill(int byte) {
    if (bytes_ > 0) check_cuda(cudaMemset(data(), byte, bytes_), "cudaMemset");
  }
  std::vector<unsigned char> download() {
    std::vector<unsigned char> host(bytes_);
    if (bytes_ > 0) check_cuda(cudaMemcpy(host.data(), data(), bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return host;
  }
  void check_canaries() const {
    const std::vector<unsigned char> all = storage_.download();
    for (std::size_t i = 0; i < kGuard; ++i)
      if (all[i] != kCanary || all[kGuard + bytes_ + i] != kCanary)
        throw std::runtime_error(std::string("gdn::cuda: canary around '") + name_ +
                                 "' overwritten: the kernel wrote outside the buffer");
  }

 private:
  const char* name_;
  std::size_t bytes_;
  DeviceBuffer<unsigned char> storage_;
};

std::vector<unsigned char> encode(const HostTensor<double>& t, DType dtype) {
  std::vector<unsigned char> out(static_cast<std::size_t>(t.numel()) * dtype_size(dtype));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float x = static_cast<float>(t[i]);
    switch (dtype) {
      case DType::f32: std::memcpy(out.data() + 4 * i, &x, 4); break;
      case DType::bf16: {
        const std::uint16_t bits = Eigen::numext::bit_cast<std::uint16_t>(Eigen::bfloat16(x));
        std::memcpy(out.data() + 2 * i, &bits, 2);
        break;
      }
      case DType::f16: {
        const std::uint16_t bits = Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(x));
        std::memcpy(out.data() + 2 * i, &bits, 2);
        break;
      }
      default: throw std::runtime_error("gdn::cuda: unsupported dtype");
    }
  }
  return out;
}

HostTensor<double> decode_tensor(const std::vector<unsigned char>& bytes, DType dtype, const Shape& shape) {
  HostTensor<double> t(shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    switch (dtype) {
      case DType::f32: {
        float x;
        std::memcpy(&x, bytes.data() + 4 * i, 4);
        t[i] = x;
        break;
      }
      case DType::bf16: {
        std::uint16_t bits;
        std::memcpy(&bits, bytes.data() + 2 * i, 2);
        t[i] = static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(bits));
        break;
      }
      case DType::f16: {
        std::uint16_t bits;
        std::memcpy(&bits, bytes.data() + 2 * i, 2);
        t[i] = static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(bits));
        break;
      }
      default: throw std::runtime_error("gdn::cuda: unsupported dtype");
    }
  }
  return t;
}

// Uploads one input tensor in its dtype into a guarded buffer.
GuardedBuffer& add_input(std::vector<GuardedBuffer>& all, const char* name, const HostTensor<double>& t,
                         DType dtype) {
  const std::vector<unsigned char> bytes = encode(t, dtype);
  all.emplace_back(name, bytes.size());
  all.back().upload(bytes.data());
  return all.back();
}

}  // namespace

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
  const DType in = problem.input_dtype, gate = problem.gate_dtype;
  t.q = add_input(buffers, "q", inputs.q, in).data();
  t.k = add_input(buffers, "k", inputs.k, in).data();
  t.v = add_input(buffers, "v", inputs.v, in).data();
  if (problem.gate_mode == GateMode::direct) {
    t.g = add_input(buffers, "g", inputs.g, gate).data();
    t.beta = add_input(buffers, "beta", inputs.beta, gate).data();
  } else {
    t.a = add_input(buffers, "a", inputs.a, gate).data();
    t.b = add_input(buffers, "b", inputs.b, gate).data();
    t.A_log = static_cast<const float*>(add_input(buffers, "A_log", inputs.A_log, DType::f32).data());
    t.dt_bias = static_cast<const float*>(add_input(buffers, "dt_bias", inputs.dt_bias, DType::f32).data());
  }
  const Shape state_shape = problem.state_shape();
  const std::size_t state_bytes = static_cast<std::size_t>(shape_numel(state_shape)) * 4;
  GuardedBuffer* cache = nullptr;
  GuardedBuffer* dense_hT = nullptr;
  std::vector<unsigned char> cache_before;
  if (problem.uses_state_cache()) {
    cache = &add_input(buffers, "state_cache", inputs.h0, DType::f32);
    t.state_cache = static_cast<float*>(cache->data());
    if (!problem.has_hT) cache_before = encode(inputs.h0, DType::f32);
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
  if (entry_ == Entry::recurrent_prefill) {
    if (cu_seqlens_type_ == IndexType::i64) {
      buffers.emplace_back("cu_seqlens", problem.cu_seqlens.size() * 8);
      buffers.back().upload(problem.cu_seqlens.data());
    } else {
      std::vector<std::int32_t> cu(problem.cu_seqlens.begin(), problem.cu_seqlens.end());
      buffers.emplace_back("cu_seqlens", cu.size() * 4);
      buffers.back().upload(cu.data());
    }
    t.cu_seqlens = buffers.back().data();
    t.cu_seqlens_type = cu_seqlens_type_;
  }
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
  out.o = decode_tensor(o.download(), in, o_shape);
  if (problem.has_hT) {
    out.hT = decode_tensor((cache ? cache : dense_hT)->download(), DType::f32, state_shape);
  } else if (cache != nullptr && cache->download() != cache_before) {
    throw std::runtime_error("gdn::cuda: the state cache changed although has_hT is false");
  }
  if (intermediate) out.intermediate = decode_tensor(intermediate->download(), DType::f32, problem.intermediate_shape());
  return out;
}

}  // namespace gdn::cuda
