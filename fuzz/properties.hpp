#pragma once
// The property suite of §2, written once against gdn::Implementation: the references' tests,
// the fuzzer and the GPU conformance suite all call these functions on their implementation.
// A property takes one generated Case, derives from it (deterministically, from its seed) the
// problems it needs, runs the implementation on them, and returns a verdict with the worst
// error over the error it was allowed. It never throws for a failing implementation; it
// throws only for a malformed case (ProblemError).
//
// Tolerances. Every comparison of an implementation's output with a value it should equal
// allows, per output tensor (o, hT, intermediate states), a max-abs error of
//
//     absolute + scale * (relative + relative_per_sqrt_work * sqrt((L + 1) * (K + V))
//                                  + relative_per_log_decay * Gamma_C)
//              + baseline_factor * max|emulated - exact|
//
// with scale the larger of max|exact| and magnitudes() (rounding errors are relative to the
// magnitudes the computation handles, |S| |q| for o and |S| for states, not to the result:
// o = S^T q can be tiny by cancellation, e.g. one token with a small beta), L the longest
// sequence of that run, Gamma_C = chunk_log_decay() (the largest in-chunk
// cumulative |log decay|; 0 for a sequential formulation) and `emulated` reference::emulate()
// on the same input (the precision-emulating baseline, computed only when baseline_factor > 0).
//   * The double references: relative_per_sqrt_work = 64 u, relative_per_log_decay = 16 u
//     (u = 2^-53), nothing else. Why: with contractive inputs (normalised keys, beta in [0, 2),
//     g <= 0) each step's map is non-expansive, so a rounding error made at one token is never
//     amplified later and the output error is the sum of the per-step errors. A step rounds
//     O(K + V) products and sums of magnitude <= max|S| |q|: u (K + V) relative to the output
//     scale in the worst case, u L (K + V) over L steps; roundings are nearly independent, so
//     the error grows like u sqrt(L (K + V)) (a random walk). The chunked form adds one term:
//     it forms every decay as exp(gamma_i - gamma_j) from running sums gamma, whose rounding
//     is an absolute error of about u |gamma| in the exponent, i.e. a relative error u Gamma_C
//     of the decay factor (worst case 2 C u Gamma_C). Measured over 4000 generated cases
//     (K, V up to 256, C from 1 to 129, L up to 4C+1, strong decay with K = V = 1 included),
//     against the long double recurrence: at most 2.3 u sqrt((L+1)(K+V)) (chunked; 0.7 for the
//     sequential form) and at most 1.5 u Gamma_C where that term dominates; the coefficients
//     64 and 16 leave a margin of 10x to 28x and stay below the worst-case bounds.
//   * A kernel uses calibrated(factor, floor_units, dtype): at most `factor` times the error
//     of the straightforward implementation in its own storage precisions on the very same
//     input, plus a floor of a few units of the output dtype's rounding (relative), the
//     rule FlashAttention's tests use against a same-precision baseline.
// A relation between several runs of the implementation (state carry, packing, linearity,
// ...) holds exactly for the operator; for the implementation it may be off by the sum of
// the runs' allowances, each run's allowance formed as above on that run's own input.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/implementation.hpp"
#include "fuzz/generators.hpp"

namespace gdn::fuzz {

struct Tolerance {
  double absolute = 0.0;
  double relative = 0.0;
  double relative_per_sqrt_work = 0.0;
  // Times chunk_log_decay() for a chunked formulation (0 for a sequential one).
  double relative_per_log_decay = 0.0;
  double baseline_factor = 0.0;

  // The allowance of the double references (see above): u (64 sqrt((L+1)(K+V)) + 16 Gamma_C).
  static Tolerance double_reference();
  // factor x the emulation's error + floor_units x unit roundoff of `dtype` (relative).
  static Tolerance calibrated(double factor, double floor_units, DType dtype);
  // Tighter scale of the same model for a long double (u = 2^-64) computation.
  static Tolerance long_double_reference();
  std::string describe() const;
};

struct Tolerances {
  Tolerance accuracy;  // any run against the exact value on its input
  // Packing independence bit for bit (up to the sign of zero): batch invariance, which the
  // project's kernels must have by construction and the references have too. When false,
  // within the summed allowances.
  bool packing_bitwise = true;
  // After a gate with exp(g) = 0 the state is exactly 0 in every precision; everything after
  // it is computed from identical data, so outputs are identical bit for bit (up to the sign of
  // zero) when the implementation is deterministic. When false, within the allowances.
  bool reset_bitwise = true;
  // The store-and-retrieve case uses data on a coarse dyadic grid, basis keys, g = 0, beta = 1
  // and scale 1: every intermediate of the recurrence and of the chunked form is a small
  // dyadic number, exact in fp32 and wider, so o = v and hT exactly. When false, within the
  // allowances (for an implementation whose arithmetic is not exact on such data).
  bool store_exact = true;

  static Tolerances double_reference();
  // For kernels: calibrated accuracy (factor x baseline + floor), bitwise relations.
  static Tolerances calibrated(double factor, double floor_units, DType output_dtype);
};

enum class PropertyStatus { pass, fail, unsupported };

struct PropertyResult {
  PropertyStatus status = PropertyStatus::pass;
  std::string message;   // failures (every failing check), or why unsupported
  double worst_margin = 0;  // largest error / allowed over all checks (0 when all exact)
  int checks = 0;           // comparisons made
  bool passed() const { return status == PropertyStatus::pass; }
};

using PropertyFunction =
    std::function<PropertyResult(Implementation&, const Case&, const Tolerances&)>;

struct Property {
  std::string name;       // e.g. "state_carry"
  std::string statement;  // one line: what must hold
  PropertyFunction check;
};

// (a) o, hT (and intermediate states) equal reference::sequential<double> within accuracy.
PropertyResult matches_sequential(Implementation& impl, const Case& c, const Tolerances& tol);
// (b) One sequence run whole equals the same sequence split at 1 to 4 random points (zero-length
//     parts included), each part started from the implementation's own final state of the
//     part before (passed back unchanged: fp32 from a kernel, double from a reference).
PropertyResult state_carry(Implementation& impl, const Case& c, const Tolerances& tol);
// (c) One sequence alone equals the same sequence packed at a random position among 1 to 3
//     random neighbours (dense states, or cache slots in random order with padding rows, when
//     the case uses a cache). Padding rows output exact zeros; cache slots nobody names come
//     back unchanged.
PropertyResult packing_independence(Implementation& impl, const Case& c, const Tolerances& tol);
// (d) GVA (HV = group * H) equals MHA with q and k repeated along the head axis (a case with
//     group 1 is widened to group 2 first).
PropertyResult gva_equals_repeated_heads(Implementation& impl, const Case& c, const Tolerances& tol);
// (e) use_qk_l2norm = true equals l2norm off with q, k normalised beforehand as §2 writes it
//     (x / sqrt(sum x^2 + 1e-6), in long double). The normalised inputs are passed in f64 when
//     the implementation supports it; otherwise they are rounded to the input dtype and the
//     effect of that rounding on the exact operator (measured with the double reference) is
//     added to the allowance.
PropertyResult l2norm_equals_prenormalized(Implementation& impl, const Case& c, const Tolerances& tol);
// (f) o is linear in q: o(a q1 + b q2) = a o(q1) + b o(q2), hT does not depend on q. q1, q2 are
//     complementary random masks of q, a, b in {+-1, +-2, +-4}: every input is exactly
//     representable in its dtype. (l2norm is switched off, keys pre-normalised: it is not
//     linear.)
PropertyResult linear_in_q(Implementation& impl, const Case& c, const Tolerances& tol);
// (f) (o, hT) is jointly linear in (v, h0), the same construction on v and h0.
PropertyResult linear_in_v_and_h0(Implementation& impl, const Case& c, const Tolerances& tol);
// (g) beta = 0: S_t = exp(g_1 + ... + g_t) S_0 and o_t = S_t^T (scale q^_t), against that closed
//     form evaluated in long double.
PropertyResult pure_decay(Implementation& impl, const Case& c, const Tolerances& tol);
// (h) A token with g = -1e4 (exp(g) = 0 in every precision; fused gates: a = 1e4) makes every
//     later output and the final state independent of the earlier tokens (q, k, v, beta) and of
//     h0: replacing them changes nothing from that token on.
PropertyResult underflow_resets(Implementation& impl, const Case& c, const Tolerances& tol);
// (i) Keys and queries are unit basis vectors e_i, g = 0, beta = 1, scale = 1, no l2norm: each
//     token stores v in row i of the state and reads it back, so o_t = v_t and hT is h0 with the
//     written rows replaced by their last value, exactly.
PropertyResult exact_store_and_retrieve(Implementation& impl, const Case& c, const Tolerances& tol);
// (j) o, hT equal reference::sequential<long double> within accuracy (certifies the double
//     references; for a kernel it is (a) against a more exact oracle).
PropertyResult matches_long_double(Implementation& impl, const Case& c, const Tolerances& tol);

// All of the above, in this order.
const std::vector<Property>& all_properties();
const Property& find_property(const std::string& name);  // throws std::invalid_argument

// For RapidCheck properties: RC_FAIL with the result's message when it failed, RC_DISCARD when
// the implementation does not support the derived problem.
void rc_require(const PropertyResult& result);

// ----- building blocks, shared with other tests ------------------------------------------

// The max-abs error of `actual` against `expected` (+inf where actual is not finite but
// expected is, or shapes differ) and the flat index of the worst element.
struct Difference {
  double max_abs = 0;
  std::int64_t worst = -1;
  double expected_at_worst = 0, actual_at_worst = 0;
};
Difference difference(const HostTensor<double>& expected, const HostTensor<double>& actual);
double max_abs(const HostTensor<double>& tensor);

// The allowance of one run for each output tensor (see the header comment). `exact` is the
// exact value on that run's input; when baseline_factor is 0 any good approximation of it
// serves (its max|.| is all that is used).
struct Allowance {
  double o = 0, hT = 0, intermediate = 0;
  Allowance& operator+=(const Allowance& other);
};
Allowance allowance(const Tolerance& tolerance, const Implementation& impl, const Problem& problem,
                    const Inputs& inputs, const Outputs<double>& exact);

// Bounds on the magnitudes the recurrence handles, from the inputs alone: for every column s
// of a state (S[:, v]), |s_t|^2 <= exp(2 g_t) |s_{t-1}|^2 + v_t[v]^2 when beta <= 1 (the
// component along k^ becomes a convex combination of the decayed one and v, the rest only
// decays), |s_t| <= exp(g_t) |s_{t-1}| + beta |v_t[v]| otherwise; valid for |k^| <= 1, i.e.
// contractive inputs. o: max over tokens of that bound times |scale q^_t|; hT, intermediate:
// the bound itself.
Allowance magnitudes(const Problem& problem, const Inputs& inputs);

// The largest in-chunk cumulative log decay |g_s + ... + g_i| over every sequence, value head
// and chunk of chunk_size tokens (s: the chunk's start, or the last token with exp(g) = 0 in
// double, where the chunked form restarts its sums). The chunked form takes differences of
// such sums, so their rounding (u per addition, relative to this magnitude) is an absolute
// error in the exponent of every decay factor: a term no sequential computation has.
// long_double: where exp(g) = 0 is judged in long double (exp(-1e4) is not 0 there), for a
// long double chunked computation.
double chunk_log_decay(const Problem& problem, const Inputs& inputs, int chunk_size, bool long_double = false);

// The spec's l2norm in long double, rounded to double.
void l2normalize_rows(HostTensor<double>& x, int row_length);

}  // namespace gdn::fuzz
