#pragma once
// Host API of the CUDA backward (docs/semantics.md §6, docs/cuda_backward.md): the gradients
// of L = <dO, o> + <dhT, hT> with respect to every input of the forward, for dense states.
// Plain C++ (g++-compiled callers include this).
//
// The kernel is the sequential adjoint of §6 in fp32 (inputs in their dtypes, every
// accumulation fp32, the forward's states recomputed from checkpoints), bitwise deterministic
// and batch invariant: no atomics, every sum in one fixed order. Gradients are stored in the
// dtype of what they differentiate: dq, dk, dv in the input dtype; dg, dbeta, da, db in the gate
// dtype; dA_log, ddt_bias and dh0 in fp32.
//
// Rules, checked on the host before anything is enqueued (ProblemError naming the argument):
//  - everything Problem::validate() and the forward (validate_prefill) require of the forward's
//    inputs: dtypes f32, bf16 or f16, K and V <= 256, every used tensor given, unused ones null;
//  - dense states only (no state cache, no per-token states), as the reference's backward;
//  - dO [T, HV, V] in the input dtype is required; dhT (the state shape, fp32) only with has_hT;
//  - every gradient the problem has is given, the others null (dg, dbeta with direct gates;
//    da, db, dA_log, ddt_bias with fused gates; dh0 with has_h0); outputs overlap nothing;
//  - the workspace holds at least backward_workspace_bytes(problem) bytes, 16-byte aligned,
//    and overlaps nothing else;
//  - T * max(H, HV) * 32 < 2^31 (grid sizes).
// Pointers are checked to be device memory (skipped during stream capture, as the forward).
#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/problem.hpp"
#include "cuda/api/api.hpp"

namespace gdn::cuda {

struct BackwardTensors {
  // The forward's inputs, as recurrent_prefill takes them (o, hT, the state cache and
  // intermediate states must be null; h0 dense when has_h0).
  DeviceTensors forward;
  const void* dO = nullptr;    // [T, HV, V] input dtype, required
  const float* dhT = nullptr;  // dense state shape, fp32: optional with has_hT (null = zero)
  // Gradients.
  void* dq = nullptr;          // [T, H, K] input dtype
  void* dk = nullptr;          // [T, H, K] input dtype
  void* dv = nullptr;          // [T, HV, V] input dtype
  void* dg = nullptr;          // [T, HV] gate dtype (direct gates)
  void* dbeta = nullptr;       // [T, HV] gate dtype (direct gates)
  void* da = nullptr;          // [T, HV] gate dtype (fused gates)
  void* db = nullptr;          // [T, HV] gate dtype (fused gates)
  float* dA_log = nullptr;     // [HV] fp32 (fused gates)
  float* ddt_bias = nullptr;   // [HV] fp32 (fused gates)
  float* dh0 = nullptr;        // dense state shape, fp32 (has_h0)
  void* workspace = nullptr;   // backward_workspace_bytes(problem) bytes
  std::size_t workspace_bytes = 0;
};

// The two backwards. Both compute the same gradients in fp32, bitwise deterministic and batch
// invariant; they differ in the order of the arithmetic (so in their calibrated baselines) and
// in speed (docs/cuda_backward.md):
//  - sequential: the reverse sweep of §6, token by token (the recurrent prefill's backward);
//  - chunked: the adjoint of the WY form of §4 in chunks of 64 tokens (the chunked prefill's
//    backward; oracle baseline: the chunked backward's fp32 emulation, chunk size 64). K <= 128.
//    Its matrix products run on the tensor cores in 3xTF32: fp32's accuracy, not its bits.
enum class BackwardAlgorithm { sequential, chunked };

// Bytes of device workspace the backward needs. Sequential: per (token, value head) and V tile
// of 16 columns the tile's share of dq, dk (K floats each) and of dg, dbeta; the states at every
// 64th token (at most T / 64 x HV x K x V floats); per-token norms and gates. Chunked: the value
// heads' shares of dq, dk, dg, dbeta; per chunk and value head the chunk's intermediates (T, P,
// W, U, Vnew, dVnew, the state at its start and the gradient at its end: about
// 2 C^2 + C (K + 3 V) + 2 K V floats) for at most T / 64 + N chunks; norms, gates. Host-only.
std::size_t backward_workspace_bytes(const Problem& problem,
                                     BackwardAlgorithm algorithm = BackwardAlgorithm::sequential);

// The host-side checks alone (no CUDA call).
void validate_backward(const Problem& problem, const BackwardTensors& tensors,
                       BackwardAlgorithm algorithm = BackwardAlgorithm::sequential);

// Runs the sequential backward on `stream`. Every gradient the problem has is written in full.
void recurrent_backward(const Problem& problem, const BackwardTensors& tensors, cudaStream_t stream);

// Runs the chunked backward on `stream` (the same rules, and K <= 128).
void chunked_backward(const Problem& problem, const BackwardTensors& tensors, cudaStream_t stream);

}  // namespace gdn::cuda
