#include "oracle/limits.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gdn::oracle {

namespace {

constexpr std::uint64_t kSaturated = std::numeric_limits<std::uint64_t>::max();

// Saturating arithmetic: a header may describe sizes whose products overflow 64 bits; such an
// estimate must come out as "too large", never wrap to something small.
std::uint64_t mul(std::uint64_t a, std::uint64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > kSaturated / b ? kSaturated : a * b;
}
std::uint64_t add(std::uint64_t a, std::uint64_t b) { return a > kSaturated - b ? kSaturated : a + b; }
std::uint64_t extent(std::int64_t x) { return x > 0 ? static_cast<std::uint64_t>(x) : 0; }

// Bytes per element of each copy, in doubles (8 bytes): the inputs are held twice (the case as
// read and the judge's copy of it); the outputs five times (the outputs read, the double
// reference, the emulation, and two transient passes beside them: a long double or float
// result before its conversion to double, the arithmetic floor's extra recurrence).
constexpr std::uint64_t kInputBytes = 2 * 8;
constexpr std::uint64_t kOutputBytes = 5 * 8;

}  // namespace

CaseCost estimate_cost(const Problem& p, Formulation formulation, int chunk_size, std::uint64_t file_bytes,
                       bool backward) {
  const std::uint64_t T = extent(p.T), H = extent(p.H), HV = extent(p.HV), K = extent(p.K), V = extent(p.V);
  const std::uint64_t sequences = extent(p.N());
  const std::uint64_t states = p.uses_state_cache() ? extent(p.state_slots) : sequences;
  const std::uint64_t head_state = mul(K, V);
  const std::uint64_t state_elements = mul(mul(states, HV), head_state);

  std::uint64_t inputs = add(mul(mul(T, H), 2 * K), mul(mul(T, HV), V));  // q, k, v
  inputs = add(inputs, add(mul(mul(T, HV), 2), mul(HV, 2)));              // gates, A_log, dt_bias
  if (p.has_h0 || p.uses_state_cache()) inputs = add(inputs, state_elements);
  // The references produce o, and hT / intermediate when asked, whether or not the file holds
  // outputs; the running state of one sequence (all its heads) is held besides.
  std::uint64_t outputs = mul(mul(T, HV), V);
  if (p.has_hT) outputs = add(outputs, state_elements);
  if (p.store_intermediate_states) outputs = add(outputs, mul(mul(T, HV), head_state));
  outputs = add(outputs, mul(HV, head_state));

  // Work: every token updates its heads' K x V states, every state is read or written once.
  std::uint64_t work = mul(add(T, states), mul(HV, head_state));
  std::uint64_t chunk_bytes = 0;
  if (formulation == Formulation::chunked && !p.store_intermediate_states) {
    std::uint64_t longest = 0;
    for (int n = 0; n < p.N(); ++n) longest = std::max(longest, extent(p.seq_len(n)));
    const std::uint64_t c = std::min(extent(chunk_size), longest);
    // Per chunk and head: the c x c products against K and V columns, and the chunk's
    // c x c, c x K and c x V matrices (a few of each, in double).
    work = add(work, mul(mul(mul(T, HV), c), add(K, V)));
    chunk_bytes = mul(8 * 8, add(mul(c, c), mul(c, add(K, V))));
  }

  std::uint64_t backward_bytes = 0;
  if (backward) {
    // The backward's inputs: dO (and dhT) beside the forward's, held like them.
    std::uint64_t cotangents = mul(mul(T, HV), V);
    if (p.has_hT) cotangents = add(cotangents, state_elements);
    inputs = add(inputs, cotangents);
    // The gradients mirror the inputs: held as outputs are (read, exact, term magnitudes,
    // emulation, a transient pass). One sequence's checkpoints every ceil(sqrt(L)) tokens and the
    // states of one block between them: 2 (sqrt(L) + 2) K V per head.
    std::uint64_t longest = 0;
    for (int n = 0; n < p.N(); ++n) longest = std::max(longest, extent(p.seq_len(n)));
    const std::uint64_t root = static_cast<std::uint64_t>(std::ceil(std::sqrt(static_cast<double>(longest)))) + 1;
    const std::uint64_t checkpoints = mul(mul(2 * (root + 2), HV), head_state);
    backward_bytes = add(mul(inputs, kOutputBytes), mul(checkpoints, 8));
    // Work, of one backward reference run as the forward counts one forward run: the states
    // recomputed from the checkpoints and the adjoint sweep's two contractions per token, three
    // passes over the states.
    work = add(work, mul(3, mul(add(T, states), mul(HV, head_state))));
    if (formulation == Formulation::chunked) {
      // The chunked emulation records the forward of every chunk (its start state and its c x c,
      // c x K, c x V matrices) and walks them back: the chunk products four times over.
      const std::uint64_t c = std::min(extent(chunk_size), std::max<std::uint64_t>(longest, 1));
      work = add(work, mul(4, mul(mul(mul(T, HV), c), add(K, V))));
      const std::uint64_t chunk_starts = add(T / std::max<std::uint64_t>(c, 1), sequences);
      const std::uint64_t trace = add(mul(mul(chunk_starts, HV), head_state),
                                      mul(mul(T, HV), add(4 * c, add(K, 2 * V))));
      backward_bytes = add(backward_bytes, mul(trace, 8));
    }
  }

  CaseCost cost;
  cost.work = work;
  cost.bytes = add(add(add(mul(file_bytes, 2), mul(inputs, kInputBytes)), add(mul(outputs, kOutputBytes), chunk_bytes)),
                   backward_bytes);
  return cost;
}

std::string exceeded_limit(const CaseCost& cost, const CaseLimits& limits) {
  auto amount = [](std::uint64_t x) { return x == kSaturated ? std::string("more than 2^64") : std::to_string(x); };
  if (cost.bytes > limits.max_bytes)
    return "judging it needs about " + amount(cost.bytes) + " bytes of memory (estimated from gdn.problem), over the limit of " +
           std::to_string(limits.max_bytes) +
           " bytes; raise the limit if this is meant (CaseLimits::max_bytes; gdn-testbed --max-case-bytes)";
  if (cost.work > limits.max_work)
    return "one reference run on it needs about " + amount(cost.work) +
           " state-element updates (estimated from gdn.problem), over the limit of " + std::to_string(limits.max_work) +
           "; raise the limit if this is meant (CaseLimits::max_work; gdn-testbed --max-case-work)";
  return "";
}

}  // namespace gdn::oracle
