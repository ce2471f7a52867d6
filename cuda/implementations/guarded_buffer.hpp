#pragma once
// Device buffers of the implementation adapters: every tensor a kernel reads or writes lives in
// its own allocation with a canary zone on each side, so a write outside the tensor is caught
// (check_canaries) instead of silently corrupting a neighbour; outputs start as 0xFF bytes, NaN
// in every float dtype, so an element the kernel never wrote fails the oracle. Values cross in
// the tensor's dtype through the one codec (core/dtype_codec.hpp). Plain C++ (no nvcc).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype_codec.hpp"
#include "core/problem.hpp"
#include "cuda/api/api.hpp"
#include "cuda/api/device_buffer.hpp"

namespace gdn::cuda {

class GuardedBuffer {
 public:
  // Canary zone on each side; 256 keeps the payload's 256-byte alignment.
  static constexpr std::size_t kGuard = 256;
  static constexpr unsigned char kCanary = 0xA5;

  GuardedBuffer(std::string name, std::size_t bytes)
      : name_(std::move(name)), bytes_(bytes), storage_(bytes + 2 * kGuard) {
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
  std::vector<std::uint8_t> download() {
    std::vector<std::uint8_t> host(bytes_);
    if (bytes_ > 0) check_cuda(cudaMemcpy(host.data(), data(), bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return host;
  }
  // The payload decoded from `dtype` into a tensor of `shape`.
  HostTensor<double> download_tensor(DType dtype, const Shape& shape) {
    const std::vector<std::uint8_t> bytes = download();
    return decode_tensor(bytes.data(), bytes.size(), dtype, shape);
  }
  void check_canaries() const {
    const std::vector<unsigned char> all = storage_.download();
    for (std::size_t i = 0; i < kGuard; ++i)
      if (all[i] != kCanary || all[kGuard + bytes_ + i] != kCanary)
        throw std::runtime_error("gdn::cuda: canary around '" + name_ +
                                 "' overwritten: the kernel wrote outside the buffer");
  }

 private:
  std::string name_;
  std::size_t bytes_;
  DeviceBuffer<unsigned char> storage_;
};

// Appends a buffer holding `t` encoded in `dtype`. `all` must not reallocate while references
// into it are held: reserve first.
inline GuardedBuffer& add_input(std::vector<GuardedBuffer>& all, const char* name, const HostTensor<double>& t,
                                DType dtype) {
  const std::vector<std::uint8_t> bytes = encode_tensor(t, dtype);
  all.emplace_back(name, bytes.size());
  all.back().upload(bytes.data());
  return all.back();
}

// Appends an output buffer of `bytes`, filled with NaN (0xFF bytes).
inline GuardedBuffer& add_output(std::vector<GuardedBuffer>& all, const char* name, std::size_t bytes) {
  all.emplace_back(name, bytes);
  all.back().fill(0xFF);
  return all.back();
}

// Uploads the per-token inputs every kernel reads (q, k, v in the input dtype; g and beta, or
// the fused gates' a, b in the gate dtype with A_log and dt_bias in fp32) and points `t` at them.
inline void add_token_inputs(std::vector<GuardedBuffer>& all, const Problem& problem, const Inputs& inputs,
                             DeviceTensors& t) {
  const DType in = problem.input_dtype, gate = problem.gate_dtype;
  t.q = add_input(all, "q", inputs.q, in).data();
  t.k = add_input(all, "k", inputs.k, in).data();
  t.v = add_input(all, "v", inputs.v, in).data();
  if (problem.gate_mode == GateMode::direct) {
    t.g = add_input(all, "g", inputs.g, gate).data();
    t.beta = add_input(all, "beta", inputs.beta, gate).data();
  } else {
    t.a = add_input(all, "a", inputs.a, gate).data();
    t.b = add_input(all, "b", inputs.b, gate).data();
    t.A_log = static_cast<const float*>(add_input(all, "A_log", inputs.A_log, DType::f32).data());
    t.dt_bias = static_cast<const float*>(add_input(all, "dt_bias", inputs.dt_bias, DType::f32).data());
  }
}

// Uploads cu_seqlens in the index type the launch is asked to read (int64 as given, or int32)
// and points `t` at it.
inline void add_cu_seqlens(std::vector<GuardedBuffer>& all, const Problem& problem, IndexType type,
                           DeviceTensors& t) {
  if (type == IndexType::i64) {
    all.emplace_back("cu_seqlens", problem.cu_seqlens.size() * 8);
    all.back().upload(problem.cu_seqlens.data());
  } else {
    std::vector<std::int32_t> cu(problem.cu_seqlens.begin(), problem.cu_seqlens.end());
    all.emplace_back("cu_seqlens", cu.size() * 4);
    all.back().upload(cu.data());
  }
  t.cu_seqlens = all.back().data();
  t.cu_seqlens_type = type;
}

}  // namespace gdn::cuda
