#pragma once
// Planted kernel faults: the fault-injection campaign's subjects (scripts/fault_campaign.sh,
// reports/faults.md). A build configured with -DGDN_KERNEL_FAULTS=ON compiles every kernel with
// these faults in it, each behind a run-time switch in the kernel parameters; `gdn-testbed
// --plant-fault NAME` and `cuda_gpu_tests --plant-fault NAME` switch one on for the whole
// process. The campaign then runs what users run (conformance, fuzz, the GPU suite, the
// sanitizers) and records which of them catch each fault. In every other build GDN_PLANTED is
// the constant false and the kernels compile to the same code as without this header.
//
// Each fault is a small change a kernel author could make, at a real site of the kernel:
// boundaries, barriers, padding, state carry, rounding, indexing.
#include <string>
#include <vector>

namespace gdn::cuda {

enum class PlantedFault : int {
  none = 0,
  // recurrent_kernel.cuh (cuda.recurrent_prefill, cuda.decode)
  recurrent_last_row_unwritten,   // boundary: the last token of each sequence stores no o row
  decode_padding_uses_slot0,      // padding: state_indices = -1 reads and writes cache slot 0
  recurrent_intermediate_shifted, // boundary: token t's per-token state lands in row t - 1
  recurrent_overrun_last_sequence,// memory: the last sequence runs one token past T
  recurrent_l2norm_eps_outside,   // rounding: 1 / (sqrt(sum) + eps) in place of 1 / sqrt(sum + eps)
  // chunked_kernel.cuh, chunked_wgmma.cuh (cuda.chunked_prefill and its modes)
  chunked_prepass_barrier_removed,// barrier: the prepass's phase-0 barrier (gates, norms) is gone
  chunked_partial_chunk_dropped,  // boundary: the partial last chunk of each sequence is skipped
  chunked_last_token_gate_lost,   // boundary: the 64th token of every full chunk gets g = beta = 0
  chunked_gva_head_map,           // indexing: value head j reads q/k head j % H, not j / group
  chunked_split_carry_lost,       // state carry: the sequence split's fix-up drops M_s S(s)
  chunked_state_lo_dropped,       // rounding: the hi + lo split of state-path operands loses lo
  chunked_l2norm_eps_outside,     // rounding: r = 1 / (sqrt(sum) + eps)
};

struct PlantedFaultInfo {
  PlantedFault fault;
  const char* name;
  const char* kind;         // boundary, barrier, padding, state carry, rounding, indexing, memory
  const char* kernels;      // which registered implementations run the faulty code
  const char* description;
};

// Every fault (none excluded), in enum order.
const std::vector<PlantedFaultInfo>& planted_fault_list();
// True in a build configured with -DGDN_KERNEL_FAULTS=ON.
bool kernel_faults_built();
// Switches a fault on for every later launch of this process (none: off). Throws
// std::invalid_argument in a build without the faults, or for an unknown name.
void plant_fault(PlantedFault fault);
void plant_fault(const std::string& name);
PlantedFault planted_fault();

}  // namespace gdn::cuda

// Inside a kernel: whether `name` is the planted fault, read from the kernel's parameters.
#if GDN_KERNEL_FAULTS
#define GDN_PLANTED(params, name) ((params).planted_fault == static_cast<int>(::gdn::cuda::PlantedFault::name))
#else
#define GDN_PLANTED(params, name) false
#endif
