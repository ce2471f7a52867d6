#pragma once
// The chunked (WY) form (§4) for any chunk size C >= 1, chunks restarting at every sequence.
// It is a second oracle and the step-by-step model of the GPU chunk kernels, so it can record
// every intermediate of every chunk.
#include <vector>

#include "core/problem.hpp"
#include "reference/state_io.hpp"

namespace gdn::reference {

template <class Scalar>
struct ChunkRecord {
  int sequence = 0, head = 0, chunk = 0;
  std::int64_t begin = 0;  // first token (packed index)
  int length = 0;          // c <= C
  // [c] cumulative log decay inside the chunk; it restarts at 0 at a reset token (one whose
  // exp(g) is exactly 0 in Scalar), where every decay factor spanning the token is 0.
  Vector<Scalar> gamma;
  Matrix<Scalar> A;        // [c, c] strictly lower
  Matrix<Scalar> T;        // [c, c] (I + A)^-1, unit lower triangular
  Matrix<Scalar> W;        // [c, K]
  Matrix<Scalar> U;        // [c, V]
  Matrix<Scalar> Vnew;     // [c, V]
  Matrix<Scalar> S0;       // [K, V] state at the chunk's start
  Matrix<Scalar> S_end;    // [K, V] state at its end
};

// Records in order of (sequence, value head, chunk). Padding sequences have none.
template <class Scalar>
struct ChunkTrace {
  std::vector<ChunkRecord<Scalar>> records;
};

// Validates, then runs the chunked form. With trace non-null, every chunk's intermediates are
// recorded (memory grows with T: for tests, not for long runs). The intermediate-state option
// is served at chunk granularity only inside a chunk's algebra, so it is rejected here: the
// sequential reference is the one that defines per-token states.
template <class Scalar>
Outputs<Scalar> chunked(const Problem& problem, const Inputs& inputs, int chunk_size,
                        ChunkTrace<Scalar>* trace = nullptr);

extern template Outputs<float> chunked<float>(const Problem&, const Inputs&, int, ChunkTrace<float>*);
extern template Outputs<double> chunked<double>(const Problem&, const Inputs&, int, ChunkTrace<double>*);
extern template Outputs<long double> chunked<long double>(const Problem&, const Inputs&, int,
                                                          ChunkTrace<long double>*);

}  // namespace gdn::reference
