#include "reference/emulate.hpp"

#include "reference/chunked.hpp"
#include "reference/precision.hpp"
#include "reference/sequential.hpp"

namespace gdn::reference {

Outputs<double> emulate(const Problem& problem, const Inputs& inputs, Formulation formulation,
                        int chunk_size) {
  const Outputs<float> fp32 = formulation == Formulation::sequential
                                  ? sequential<float>(problem, inputs)
                                  : chunked<float>(problem, inputs, chunk_size);
  Outputs<double> out = fp32.cast<double>();
  round_in_place(problem.input_dtype, out.o);
  round_stored_states(problem, out);
  return out;
}

}  // namespace gdn::reference
