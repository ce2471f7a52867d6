#pragma once
// The references wrapped as Implementations, and copies of the sequential reference with
// planted faults: the fuzzer's own test subjects (a fuzzer that cannot find a known bug proves
// nothing when it finds none).
#include <memory>

#include "core/implementation.hpp"

namespace gdn::oracle {

enum class ReferencePrecision { f64, f80, emulated };

// reference::sequential / reference::chunked in double or long double, or reference::emulate
// (fp32 compute, o rounded to the input dtype). Name: reference.<sequential|chunked>.<f64|f80>
// (".c<C>" appended for a chunk size other than 64), reference.emulate.<sequential|chunked>.
// Each has the backward of its formulation in its precision (docs/backward.md):
// reference::sequential_backward / chunked_backward (at its chunk size) in double or long
// double, or oracle::emulate_backward (fp32, every gradient rounded to its storage dtype);
// problems outside the backward's scope (oracle::backward_in_scope) are unsupported.
std::unique_ptr<Implementation> make_reference(Formulation formulation, ReferencePrecision precision,
                                               int chunk_size = 64);

// Planted faults, each a one-line change to the sequential double reference, each one a bug
// that real chunked kernels have had:
//   cu_seqlens_off_by_one  every sequence after the first starts one token late: its first
//                          token is run as the last token of the sequence before it
//   dropped_decay          at every chunk boundary (every 64th token of a sequence) the carried
//                          state is not decayed by that token's exp(g)
//   lost_state_carry       at every chunk boundary the carried state is dropped (reset to 0)
// and three that only the newer conformance cases and checks see:
//   l2norm_eps_outside_sqrt  l2norm divides by sqrt(sum x^2) + 1e-6 instead of
//                          sqrt(sum x^2 + 1e-6): invisible on N(0, 1) rows, wrong on small ones
//   states_before_write    the per-token state of token t is stored before its rank-one write
//   state_loses_bits       the state keeps 11 significant bits after every token: an fp32 path
//                          whose error grew about 8000-fold, within every fixed threshold
// and one that no budget sees, only a bitwise comparison of two runs:
//   run_to_run_bits        every second run flips the last bit of o's last element: a race's
//                          signature (the values stay within any budget, the bits change)
// and one that fails only some of the time, as a race that corrupts results does:
//   intermittent           every second run returns o's last row negated
enum class Fault {
  cu_seqlens_off_by_one,
  dropped_decay,
  lost_state_carry,
  l2norm_eps_outside_sqrt,
  states_before_write,
  state_loses_bits,
  run_to_run_bits,
  intermittent
};
const char* fault_name(Fault fault);
std::unique_ptr<Implementation> make_faulty_reference(Fault fault);

// Planted faults in the backward: the sequential double reference (forward and backward) with
// one change to its gradients, each a bug gradient kernels have had. The forward is correct, so
// only a backward verdict sees them (conformance --backward, fuzz --backward):
//   dg_sign         the decay's gradient has the wrong sign: dg (direct gates) or da (fused
//                   gates) negated
//   dk_last_token   dk of the last token of every sequence is dropped (0): the reverse sweep
//                   starts one token early
// Name: fault.backward_<name>; formulation sequential for forward and backward.
enum class BackwardFault { dg_sign, dk_last_token };
const char* backward_fault_name(BackwardFault fault);
std::unique_ptr<Implementation> make_faulty_backward(BackwardFault fault);

}  // namespace gdn::oracle
