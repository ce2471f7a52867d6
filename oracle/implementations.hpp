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
std::unique_ptr<Implementation> make_reference(Formulation formulation, ReferencePrecision precision,
                                               int chunk_size = 64);

// Planted faults, each a one-line change to the sequential double reference, each one a bug
// that real chunked kernels have had:
//   cu_seqlens_off_by_one  every sequence after the first starts one token late: its first
//                          token is run as the last token of the sequence before it
//   dropped_decay          at every chunk boundary (every 64th token of a sequence) the carried
//                          state is not decayed by that token's exp(g)
//   lost_state_carry       at every chunk boundary the carried state is dropped (reset to 0)
enum class Fault { cu_seqlens_off_by_one, dropped_decay, lost_state_carry };
const char* fault_name(Fault fault);
std::unique_ptr<Implementation> make_faulty_reference(Fault fault);

}  // namespace gdn::oracle
