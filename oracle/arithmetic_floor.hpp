#pragma once
// The calibrated budget's arithmetic floor (docs/budgets.md, "(a) calibrated", arithmetic floor):
// per output element, the rounding error that a correct implementation in a working precision
// of unit roundoff u can make from its evaluation order alone, judged against the magnitudes
// the computation handles rather than against the result.
//
// Why it exists: the calibrated budget compares a kernel with ONE other implementation in the
// same precision (the emulation). On large outputs both errors are averages over many
// elements and their ratio concentrates near 1; on tiny outputs (K = V = 1, one token, a
// state of one element) each error is a single draw, and two independent roundings of the same
// size differ by any factor: an fp32 kernel whose state sum lands 3.6 u from the exact value,
// where the emulation happened to land 1.2 u away, is not wrong. Without this floor, GPU fuzz
// campaigns fail correct kernels this way, always on outputs of one to a few elements. The
// floor is what an error analysis allows; the emulation term keeps the budget tight wherever
// it is a good estimate.
//
// Model (probabilistic rounding-error analysis: independent roundings add in energy, like a
// random walk), from a double pass of the recurrence that tracks, per state element S_kv, the
// expected energy E_kv of its accumulated rounding error:
//   E_kv <- alpha^2 (1 - beta (2 - beta) |k|^2 / K) E_kv + u^2 [ (alpha S_kv)^2
//           + beta^2 (K sum_k' (S_k'v k_k')^2 + (1 + K) delta_v^2) k_k^2 + S_new,kv^2 ]
// (earlier errors decay and shrink along k, averaged over directions; this step rounds the
// decay, whose exp(g) inherits g's own roundings, the K-term dot product S^T k written back
// along k, the delta v - S^T k with the l2norm of k and beta's rounding, and the sum
// S + k beta delta; a K-term sum errs by about u sqrt(K) times the 2-norm of its terms:
// relative to the terms, not to the result, which may cancel). An underflowing gate
// (alpha = 0) erases everything before it. The decay's own error, u / 2 relative (+ 2 |g| u
// for fused gates, whose g is itself computed), is one draw per (token, head) shared by the
// whole state: a relative perturbation of S, tracked apart as a relative energy
// R <- share (R + (that error)^2), share = |alpha S_prev|^2 / |S_new|^2 capped at 1 (the decayed
// part's share of the new state), since it does not average out over elements; it gives
// sqrt(R) |S_kv| and sqrt(R) |o|.
// The token's other per-head scalars are shared draws too: the l2norm factors (rq scales o_t;
// rk scales the write) and a fused beta (scales the write): R also takes the write's share of
// the new state times their energy, and o's shared part adds rq's (docs/budgets.md).
//   * states (hT, intermediate): sqrt(E_kv), shared sqrt(R) |S_kv|;
//   * o_t[v] = q^_t . S_t[:, v]: u sqrt(K) |(q^_k S_kv)_k|_2 (its own dot product)
//     + sqrt(sum_k q^_k^2 E_kv) (the state's errors read through q^); shared sqrt(R) |o|.
//
// The chunked form (formulation chunked, chunk size C) forms some of these sums differently: in
// a chunk starting at token s, o_i = e^(gamma_i) q^_i S0 + sum_{j=s..i} P_ij Vnew_j with
// P_ij = e^(gamma_i - gamma_j) q^_i . k^_j, and Vnew_j (= beta_j delta_j) comes from the
// triangular system (I + A) Vnew = X with A_ij = beta_i e^(gamma_i - gamma_j) k^_i . k^_j. P_ij
// and A_ij are K-term dot products computed ONCE per (token pair, head) and applied to every
// column v: their rounding errors (u sqrt(K) |q^_i * k^_j|_2 e^(gamma_i - gamma_j), and
// beta_i u sqrt(K) |k^_i * k^_j|_2 e^(gamma_i - gamma_j)) are draws shared by the whole row
// o_i[:], not independent per element as the same terms are in the recurrence. They go to the
// shared part of o, in energy:
//   o_i[v]:    sum_{j=s..i} dP_ij^2 Vnew_j[v]^2 + sum_{l=s..i} P_il^2 a_l[v],
//   a_l[v] = sum_{j=s..l-1} dA_lj^2 Vnew_j[v]^2   (the error of Vnew_l the A_lj draws make).
// A one-token chunk has A = 0 and P = q^ . k^: one dot product whose error scales all of o_t
// (docs/budgets.md, "The chunked form's shared dot products").
#include "core/implementation.hpp"
#include "core/problem.hpp"

namespace gdn::oracle {

// Per-element floors (absolute, >= 0), shaped like the problem's outputs (o; hT and
// intermediate when the problem has them; for a state cache, slots no sequence names get 0).
// `independent`: errors of separate roundings per element, which average out over elements;
// `shared`: the decays' own error, one draw per (token, head) common to the whole state of
// the head, and (chunked form) the intra-chunk dot products' errors common to a row of o,
// which do not. Independent draws of the shared part: one per (token, head) for o
// and intermediate states (shared_tokens x HV), one per (sequence, head) for hT (shared_groups).
struct ArithmeticFloor {
  Outputs<double> independent, shared;
  std::int64_t shared_groups = 0;  // (sequence, head) pairs that ran tokens
  std::int64_t shared_tokens = 0;  // tokens of named sequences, summed over heads
  // The largest magnitude the modelled computation handles: the decayed state alpha S, the
  // updated state, S^T k, the delta, the write k beta delta, o (+inf when any of them, or any
  // floor, is not finite). The model describes an fp32 computation that stays finite; where
  // this exceeds fp32's largest finite value, that computation overflows and the floor
  // describes nothing (applies() is false).
  double largest = 0;
  bool applies() const;
};
// `unit` is the working precision's unit roundoff (2^-24 for fp32 state and accumulation).
// formulation chunked with chunk_size >= 1 adds the chunked form's shared dot products (above);
// sequential, or a chunk size < 1, models the recurrence alone. Validates the problem and
// inputs first (ProblemError).
ArithmeticFloor arithmetic_floor(const Problem& problem, const Inputs& inputs, double unit,
                                 Formulation formulation = Formulation::sequential, int chunk_size = 0);

}  // namespace gdn::oracle
