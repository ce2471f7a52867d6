#pragma once
// Helpers of the host API's pre-launch checks (launch.cpp, chunked_launch.cpp): a broken rule
// is a ProblemError naming the argument and the rule, thrown before anything is launched.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda/api/api.hpp"
#include "cuda/recurrent/recurrent_params.hpp"

namespace gdn::cuda::detail {

[[noreturn]] inline void fail(const std::string& argument, const std::string& rule) {
  throw ProblemError(argument, rule);
}

inline std::string str(std::int64_t x) { return std::to_string(x); }

// The kernels' element type of a dtype the checks have accepted (f64 never reaches a kernel).
inline ElementType element_type(DType dtype) {
  switch (dtype) {
    case DType::bf16: return ElementType::bf16;
    case DType::f16: return ElementType::f16;
    default: return ElementType::f32;
  }
}

// The storage conventions the kernels do not implement: {argument, rule}, or empty. They keep
// every state in fp32 and take log-space g (docs/semantics.md §3, §7).
inline std::pair<std::string, std::string> unsupported_storage(const Problem& p) {
  if (p.state_dtype != DType::f32)
    return {"state_dtype", std::string("must be f32 for the CUDA kernels (they store fp32 states), got ") +
                               dtype_name(p.state_dtype)};
  if (p.linear_gates()) return {"gate_space", "must be log for the CUDA kernels (they take g, not alpha = exp(g))"};
  return {};
}

// One buffer a launch touches: its argument name, address, bytes (-1: the problem does not use
// it, so it must be null), whether the launch writes it, the alignment its accesses need.
struct Buffer {
  const char* name;
  const void* pointer;
  std::int64_t bytes;
  bool written;
  std::size_t alignment;
};

// The rules every launch checks on its buffers: each one the problem uses given (unless it has
// zero bytes) and aligned, each one it does not use null, and no written buffer overlapping any
// other, except the pairs `may_alias(written, other)` allows. `overlap_note` ends the overlap
// rule's text.
template <class MayAlias>
void check_buffers(const Problem& p, const std::vector<Buffer>& buffers, MayAlias may_alias,
                   const std::string& overlap_note = "") {
  for (const Buffer& b : buffers) {
    if (b.bytes < 0) {
      if (b.pointer != nullptr) fail(b.name, "must be null: this problem does not use it (" + p.describe() + ")");
      continue;
    }
    if (b.bytes > 0 && b.pointer == nullptr)
      fail(b.name, "is required by this problem but is null (" + str(b.bytes) + " bytes)");
    if (b.pointer != nullptr && reinterpret_cast<std::uintptr_t>(b.pointer) % b.alignment != 0)
      fail(b.name, "must be " + str(std::int64_t(b.alignment)) + "-byte aligned (the kernels' accesses need it)");
  }
  for (std::size_t x = 0; x < buffers.size(); ++x) {
    const Buffer& w = buffers[x];
    if (!w.written || w.bytes <= 0 || w.pointer == nullptr) continue;
    for (std::size_t y = 0; y < buffers.size(); ++y) {
      const Buffer& r = buffers[y];
      if (x == y || r.bytes <= 0 || r.pointer == nullptr || may_alias(w, r)) continue;
      const auto wb = reinterpret_cast<std::uintptr_t>(w.pointer), rb = reinterpret_cast<std::uintptr_t>(r.pointer);
      if (wb < rb + std::uintptr_t(r.bytes) && rb < wb + std::uintptr_t(w.bytes))
        fail(w.name, std::string("must not overlap '") + r.name + "'" + overlap_note);
    }
  }
}

// Every given buffer is device (or managed) memory: cudaPointerGetAttributes, skipped while
// the stream is being captured into a graph (where only stream work may happen).
inline void check_device_memory(const std::vector<Buffer>& buffers, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return;
  for (const Buffer& b : buffers) {
    if (b.bytes <= 0 || b.pointer == nullptr) continue;
    cudaPointerAttributes attributes{};
    const cudaError_t code = cudaPointerGetAttributes(&attributes, b.pointer);
    if (code != cudaSuccess) {
      (void)cudaGetLastError();  // clear it: the error is reported as an argument error
      fail(b.name, std::string("must be device memory (cudaPointerGetAttributes: ") + cudaGetErrorString(code) + ")");
    }
    if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
      fail(b.name, "must be device (or managed) memory, got a host or unregistered pointer");
  }
}

}  // namespace gdn::cuda::detail
