#pragma once
// The calibrated budget's arithmetic floor (BUDGETS.md, "(a) calibrated", arithmetic floor):
// per output element, the rounding error that a correct implementation in a working precision
// of unit roundoff u can make from its evaluation order alone, judged against the magnitudes
// the computation handles rather than against the result.
//
// Why it exists: the calibrated budget compares a kernel with ONE other implementation in the
// same precision (the emulation). On large outputs both errors are averages over many
// elements and their ratio concentrates near 1; on tiny outputs (K = V = 1, one token, a
// state of one element) each error is a single draw, and two independent roundings of the same
// size differ by any factor: an fp32 kernel whose state sum lands 3.6 u from the exact value,
// where the emulation happened to land 1.2 u away, is not wrong. The H200 fuzz campaign of
// 2026-12-03 failed 0.5% of the recurrent kernels' cases this way (every shrunk failure had
// one to a few output elements, margins 1.0 to 6.4). The floor is what an error analysis
// allows; the emulation term keeps the budget tight wherever it is a good estimate.
//
// Model (probabilistic rounding-error analysis, errors of independent roundings add like a
// random walk): the recurrence runs in double here, with absolute values tracked beside it.
//   * o_t[v] = q^_t . S_t[:, v]: its own dot product errs by about u sqrt(K) sum_k |q^_k S_kv|.
//   * the state column S[:, v] carries the errors of every earlier step that decay has not yet
//     erased: each step rounds O(K) products of magnitude at most H[v] (the largest column
//     norm or update term handled in that memory), the steps' maps have norm <= exp(g), so
//     after the memory M = sum_s prod_{r > s} exp(g_r) (M = L without decay, ~1 / (1 - exp(g))
//     with it, 1 after a reset) the column's error is about u sqrt(K M) H[v].
//   * o gets that state error through q^: |q^| u sqrt(K M) H[v].
// States (hT, intermediate) get u sqrt(K M) H[v] per element (the column's error: an element
// may hold all of it).
#include "core/problem.hpp"

namespace gdn::oracle {

// Per-element floors (absolute, >= 0), shaped like the problem's outputs (o; hT and
// intermediate when the problem has them; for a state cache, slots no sequence names get 0).
// `unit` is the working precision's unit roundoff (2^-24 for fp32 state and accumulation).
// Validates the problem and inputs first (ProblemError).
Outputs<double> arithmetic_floor(const Problem& problem, const Inputs& inputs, double unit);

}  // namespace gdn::oracle
