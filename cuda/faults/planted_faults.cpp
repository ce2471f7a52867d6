#include "cuda/faults/planted_faults.hpp"

#include <stdexcept>

namespace gdn::cuda {

namespace {
PlantedFault g_planted = PlantedFault::none;
}

const std::vector<PlantedFaultInfo>& planted_fault_list() {
  static const std::vector<PlantedFaultInfo> list = {
      {PlantedFault::recurrent_last_row_unwritten, "recurrent_last_row_unwritten", "boundary",
       "cuda.recurrent_prefill, cuda.decode", "the last token of each sequence stores no o row"},
      {PlantedFault::decode_padding_uses_slot0, "decode_padding_uses_slot0", "padding",
       "cuda.recurrent_prefill, cuda.decode",
       "a padding row (state_indices = -1) reads and writes cache slot 0 instead of nothing"},
      {PlantedFault::recurrent_intermediate_shifted, "recurrent_intermediate_shifted", "boundary",
       "cuda.recurrent_prefill, cuda.decode", "token t's per-token state is stored in row t - 1"},
      {PlantedFault::recurrent_overrun_last_sequence, "recurrent_overrun_last_sequence", "memory",
       "cuda.recurrent_prefill", "the last sequence of a pack runs one token past T (reads and writes)"},
      {PlantedFault::recurrent_l2norm_eps_outside, "recurrent_l2norm_eps_outside", "rounding",
       "cuda.recurrent_prefill, cuda.decode", "l2norm as 1 / (sqrt(sum x^2) + 1e-6): wrong on small-norm rows only"},
      {PlantedFault::chunked_prepass_barrier_removed, "chunked_prepass_barrier_removed", "barrier",
       "cuda.chunked_prefill*", "the prepass's barrier after the gate scan and the norms is removed (a race)"},
      {PlantedFault::chunked_partial_chunk_dropped, "chunked_partial_chunk_dropped", "boundary",
       "cuda.chunked_prefill*", "the partial last chunk of each sequence is skipped by the forward"},
      {PlantedFault::chunked_last_token_gate_lost, "chunked_last_token_gate_lost", "boundary",
       "cuda.chunked_prefill*", "the 64th token of every full chunk gets g = 0 and beta = 0 in the prepass"},
      {PlantedFault::chunked_gva_head_map, "chunked_gva_head_map", "indexing", "cuda.chunked_prefill*",
       "the prepass maps value head j to q/k head j % H instead of j / group"},
      {PlantedFault::chunked_split_carry_lost, "chunked_split_carry_lost", "state carry",
       "cuda.chunked_prefill.split1", "the sequence split's fix-up drops M_s S(s): segments lose the carried state"},
      {PlantedFault::chunked_state_lo_dropped, "chunked_state_lo_dropped", "rounding",
       "cuda.chunked_prefill (bf16, fp16)", "the hi + lo split of the state-path operands stores lo = 0"},
      {PlantedFault::chunked_l2norm_eps_outside, "chunked_l2norm_eps_outside", "rounding", "cuda.chunked_prefill*",
       "the prepass's norms as 1 / (sqrt(sum x^2) + 1e-6): wrong on small-norm rows only"},
  };
  return list;
}

bool kernel_faults_built() {
#if GDN_KERNEL_FAULTS
  return true;
#else
  return false;
#endif
}

void plant_fault(PlantedFault fault) {
  if (fault != PlantedFault::none && !kernel_faults_built())
    throw std::invalid_argument(
        "--plant-fault: this build has no planted faults (configure a separate build with -DGDN_KERNEL_FAULTS=ON)");
  g_planted = fault;
}

void plant_fault(const std::string& name) {
  if (name == "none") return plant_fault(PlantedFault::none);
  std::string known;
  for (const PlantedFaultInfo& f : planted_fault_list()) {
    if (name == f.name) return plant_fault(f.fault);
    known += (known.empty() ? "" : ", ") + std::string(f.name);
  }
  throw std::invalid_argument("--plant-fault: unknown fault '" + name + "' (known: " + known + ")");
}

PlantedFault planted_fault() { return g_planted; }

}  // namespace gdn::cuda
