#pragma once
// The backward in the chunked (WY) form of §4, the formulation chunked training kernels
// implement (docs/backward.md, "The chunked backward"): the forward's chunk intermediates
// (gamma, A, T = (I + A)^-1, W, U, Vnew and the state S0 at every chunk start) recomputed by
// the chunked forward reference, then per chunk in reverse the adjoint of
//   Vnew = U - W S0,  [W | U] = T [diag(beta a) K^ | diag(beta) V],  A = beta_i E_ij k^_i.k^_j,
//   O = diag(a) Q S0 + (Mask . Q K^^T . E) Vnew,  S_end = a_c S0 + K^^T diag(b) Vnew
// (a_i = exp(gamma_i), b_i = exp(gamma_c - gamma_i), E_ij = exp(gamma_i - gamma_j), all zero
// across a hard reset), the triangular solve's adjoint dR = T^T d[W | U], dA = -(dR [W | U]^T)
// strictly lower, and dS propagated from each chunk's end to its start. It is a second,
// independent route to the gradients of sequential_backward: they agree to about 1e-12 in
// double (normwise, relative to the term magnitudes). Any C >= 1; the same chain rules for the
// l2norm, scale, GVA and fused gates.
#include <vector>

#include "reference/backward.hpp"
#include "reference/chunked.hpp"

namespace gdn::reference {

// One chunk of one (sequence, value head), with the forward's record and the backward's
// intermediates.
template <class Scalar>
struct ChunkBackwardRecord {
  ChunkRecord<Scalar> forward;  // gamma, A, T, W, U, Vnew, S0, S_end (reference::chunked's trace)
  Matrix<Scalar> dS_end;        // [K, V] gradient w.r.t. the state at the chunk's end
  Matrix<Scalar> dS0;           // [K, V] gradient w.r.t. the state at its start (the previous chunk's dS_end)
  Matrix<Scalar> dVnew;         // [c, V]
  Matrix<Scalar> dW;            // [c, K]
  Matrix<Scalar> dU;            // [c, V]
  Matrix<Scalar> dA;            // [c, c] strictly lower
  Vector<Scalar> dgamma;        // [c] gradient w.r.t. the in-chunk cumulative log decay
};

// Records in order of (sequence, value head, chunk), like ChunkTrace.
template <class Scalar>
struct ChunkBackwardTrace {
  std::vector<ChunkBackwardRecord<Scalar>> records;
};

// Validates (validate_backward), then computes the gradients in the chunked form. With trace
// non-null every chunk's intermediates are recorded (memory grows with T: for tests).
template <class Scalar>
Gradients<Scalar> chunked_backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward,
                                   int chunk_size, ChunkBackwardTrace<Scalar>* trace = nullptr);

// How a tensor-core kernel would form the products of the chunked backward's adjoint (the
// 18 matrix products of the chunk step: K K^T, Q K^T, K dS, Vnew dS^T, Q S0, dO S0^T, Q^T dO,
// dO Vnew^T, P^T dO, dQK K, dQK^T Q, dVnew S0^T, W^T dVnew, T^T dW, T^T dU, dX W^T, dY U^T,
// (dGk + dGk^T) K): fp32 (as written, = chunked_backward<float>), or each fp32 operand split into
// terms of the tensor cores' type, the partial products summed in fp32: tf32 (rounded once to
// TF32, round to nearest with ties away as cvt.rna), tf32x3 (hi + lo, three products, the
// "3xTF32" of CUTLASS), bf16 and f16 (rounded once to nearest even: the operand stored in the
// input dtype, as fla's and FlashQLA's backwards store theirs), bf16x2 (hi + lo in bf16, three
// products, 16 bits), bf16x3 (three bf16 terms, six products). Every operand is rounded, the
// l2-normalised q and k included (what a kernel that stores them in the input dtype computes).
// A model, not an emulation of a kernel's bits: the sums run in Eigen's order, and the forward
// it recomputes (S0, T, W, U, Vnew, by reference::chunked<float>) keeps fp32 products (its
// results are rounded where they enter the adjoint's products). What it is for: deciding on
// the CPU which tensor-core precision keeps the gradient budgets before a kernel is written for
// it (experimental/backward_products_study), and, as bf16 / f16, the gradient budget's
// operand baseline (oracle::emulate_backward_operands): the design of kernels that feed their
// products with operands in the input dtype.
enum class BackwardProducts { fp32, tf32, tf32x3, bf16, f16, bf16x2, bf16x3 };
const char* backward_products_name(BackwardProducts products);
Gradients<float> chunked_backward_products(const Problem& problem, const Inputs& inputs,
                                           const BackwardInputs& backward, int chunk_size, BackwardProducts products);

extern template Gradients<float> chunked_backward<float>(const Problem&, const Inputs&, const BackwardInputs&, int,
                                                         ChunkBackwardTrace<float>*);
extern template Gradients<double> chunked_backward<double>(const Problem&, const Inputs&, const BackwardInputs&, int,
                                                           ChunkBackwardTrace<double>*);
extern template Gradients<long double> chunked_backward<long double>(const Problem&, const Inputs&,
                                                                     const BackwardInputs&, int,
                                                                     ChunkBackwardTrace<long double>*);

}  // namespace gdn::reference
