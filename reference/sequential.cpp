#include "reference/sequential.hpp"

#include <cmath>

#include "reference/prepare.hpp"
#include "reference/state_io.hpp"

namespace gdn::reference {

template <class Scalar>
Outputs<Scalar> sequential(const Problem& problem, const Inputs& inputs) {
  validate(problem, inputs);
  Outputs<Scalar> out = allocate_outputs<Scalar>(problem, inputs);
  const int HV = problem.HV, K = problem.K, V = problem.V;

  Matrix<Scalar> S(K, V);
  Vector<Scalar> u(V), q(K), k(K);
  for (int n = 0; n < problem.N(); ++n) {
    const std::int64_t row = state_row(problem, inputs, n);
    if (row < 0) continue;  // padding sequence: outputs stay zero, nothing is read or written
    for (int j = 0; j < HV; ++j) {
      const int h = j / problem.group_size();
      initial_state(problem, inputs, row, j, S);
      for (std::int64_t t = problem.seq_begin(n); t < problem.seq_begin(n) + problem.seq_len(n); ++t) {
        using std::exp;
        load_qk(problem, inputs, t, h, q.data(), k.data());
        const Vector<Scalar> v =
            Eigen::Map<const Vector<double>>(inputs.v.data() + (t * HV + j) * V, V).template cast<Scalar>();
        Scalar g, beta;
        load_gates(problem, inputs, t, j, &g, &beta);
        S *= exp(g);                                         // 1. decay first
        u.noalias() = beta * (v - S.transpose() * k);        // 2. delta against decayed state
        S.noalias() += k * u.transpose();                    // 3. rank-one write
        Eigen::Map<Vector<Scalar>>(out.o.data() + (t * HV + j) * V, V).noalias() =
            S.transpose() * q;                               // 4. read after the write
        if (problem.store_intermediate_states)
          store_state(problem, S, t, j, out.intermediate.data());
      }
      if (problem.has_hT) store_state(problem, S, row, j, out.hT.data());
    }
  }
  return out;
}

template Outputs<float> sequential<float>(const Problem&, const Inputs&);
template Outputs<double> sequential<double>(const Problem&, const Inputs&);
template Outputs<long double> sequential<long double>(const Problem&, const Inputs&);

}  // namespace gdn::reference
