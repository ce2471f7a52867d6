#pragma once
// Reading and writing one (sequence, value head) state through the problem's state options:
// dense [N, HV, ...] or a slot of a cache, K-major or V-major. The references hold the state
// as a K x V matrix (S[k][v]) whatever the layout in memory.
#include <Eigen/Core>

#include "core/problem.hpp"

namespace gdn::reference {

template <class Scalar>
using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Scalar>
using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;

// Row of the state tensor that sequence n uses, or -1 for a padding sequence.
inline std::int64_t state_row(const Problem& problem, const Inputs& inputs, int n) {
  if (!problem.uses_state_cache()) return n;
  return inputs.state_indices[static_cast<std::size_t>(n)];
}

template <class Scalar, class T>
void load_state(const Problem& problem, const T* states, std::int64_t row, int head,
                Matrix<Scalar>& S) {
  const std::int64_t base = (row * problem.HV + head) * std::int64_t(problem.K) * problem.V;
  for (int kk = 0; kk < problem.K; ++kk)
    for (int vv = 0; vv < problem.V; ++vv) {
      const std::int64_t offset = problem.state_layout == StateLayout::k_major
                                      ? std::int64_t(kk) * problem.V + vv
                                      : std::int64_t(vv) * problem.K + kk;
      S(kk, vv) = static_cast<Scalar>(states[base + offset]);
    }
}

template <class Scalar, class T>
void store_state(const Problem& problem, const Matrix<Scalar>& S, std::int64_t row, int head,
                 T* states) {
  const std::int64_t base = (row * problem.HV + head) * std::int64_t(problem.K) * problem.V;
  for (int kk = 0; kk < problem.K; ++kk)
    for (int vv = 0; vv < problem.V; ++vv) {
      const std::int64_t offset = problem.state_layout == StateLayout::k_major
                                      ? std::int64_t(kk) * problem.V + vv
                                      : std::int64_t(vv) * problem.K + kk;
      states[base + offset] = static_cast<T>(S(kk, vv));
    }
}

// Allocates the outputs the problem asks for; with a state cache hT starts as a copy of the
// cache, so slots that no sequence names come out unchanged.
template <class Scalar>
Outputs<Scalar> allocate_outputs(const Problem& problem, const Inputs& inputs) {
  Outputs<Scalar> out;
  out.o = HostTensor<Scalar>(problem.v_shape());
  if (problem.has_hT) {
    out.hT = problem.uses_state_cache() ? inputs.h0.template cast<Scalar>()
                                        : HostTensor<Scalar>(problem.state_shape());
  }
  if (problem.store_intermediate_states) out.intermediate = HostTensor<Scalar>(problem.intermediate_shape());
  return out;
}

// Initial state of (n, head): h0's, or zero when the problem has none.
template <class Scalar>
void initial_state(const Problem& problem, const Inputs& inputs, std::int64_t row, int head,
                   Matrix<Scalar>& S) {
  S.setZero(problem.K, problem.V);
  if (problem.has_h0) load_state<Scalar>(problem, inputs.h0.data(), row, head, S);
}

}  // namespace gdn::reference
