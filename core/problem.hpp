#pragma once
// The one description of a gated-delta-rule problem (docs/semantics.md, §1-5, 7).
// References, CUDA kernels, the oracle and the fuzzer all take this type; validate() is the
// single place where a malformed problem is rejected, with an error naming the argument and
// the rule it breaks.
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/host_tensor.hpp"

namespace gdn {

// Thrown for every malformed problem or input set. argument() is the offending argument's
// name as the user knows it ("cu_seqlens", "HV", "q", ...); rule() the rule it breaks.
class ProblemError : public std::invalid_argument {
 public:
  ProblemError(std::string argument, std::string rule)
      : std::invalid_argument("gdn: invalid argument '" + argument + "': " + rule),
        argument_(std::move(argument)),
        rule_(std::move(rule)) {}
  const std::string& argument() const { return argument_; }
  const std::string& rule() const { return rule_; }

 private:
  std::string argument_;
  std::string rule_;
};

// K-major: S[k][v] with rows of length V contiguous ([.., K, V]); V-major: [.., V, K].
enum class StateLayout { k_major, v_major };

inline const char* state_layout_name(StateLayout layout) {
  return layout == StateLayout::k_major ? "k_major" : "v_major";
}

// How g and beta reach the kernel: given directly, or computed from the raw projections of §3.
enum class GateMode { direct, fused };

// What the direct gate tensor holds (§3): the log decay g (log space, the default), or the decay
// factor alpha = exp(g) itself (linear space, FlashInfer's convention). With linear gates the
// tensor Inputs::g holds alpha, named "alpha" wherever a user sees it (errors, case files,
// Python); references take g = log(alpha) in their own scalar.
enum class GateSpace { log, linear };

inline const char* gate_space_name(GateSpace space) { return space == GateSpace::log ? "log" : "linear"; }
inline bool parse_gate_space(const std::string& text, GateSpace* out) {
  if (text == "log") *out = GateSpace::log;
  else if (text == "linear") *out = GateSpace::linear;
  else return false;
  return true;
}

struct Problem {
  // Packed boundaries [N+1]: cu[0] = 0, non-decreasing, cu[N] = T. Held on the host: kernels
  // receive a device copy, but shapes are validated here once.
  std::vector<std::int64_t> cu_seqlens{0, 0};
  std::int64_t T = 0;  // total packed tokens
  int H = 1;           // query/key heads
  int HV = 1;          // value heads, HV % H == 0 (GVA)
  int K = 1;           // key/query head size
  int V = 1;           // value head size
  std::optional<double> scale;  // default 1/sqrt(K)
  bool use_qk_l2norm = false;

  bool has_h0 = false;  // initial state given (else zero)
  bool has_hT = false;  // final state requested
  StateLayout state_layout = StateLayout::k_major;

  // State cache (§5 and the prefill that populates request states): when state_slots > 0 the
  // state tensors are one cache [state_slots, HV, K, V] (layout as above) and sequence n uses
  // slot state_indices[n]; index -1 marks a padding sequence that reads and writes nothing and
  // outputs zeros. When 0, h0/hT are dense per-sequence [N, HV, K, V].
  std::int64_t state_slots = 0;
  // Write the state after every token to an intermediate buffer [T, HV, K, V] (for decode
  // with Ts tokens per request this is [B, Ts, HV, K, V]): speculative decoders roll back to it.
  bool store_intermediate_states = false;

  DType input_dtype = DType::f32;  // q, k, v and o
  DType gate_dtype = DType::f32;   // g, beta (direct) or a, b (fused); f32 or input_dtype
  // Storage dtype of every state (§7): h0 / the state cache, hT and the per-token states; f32,
  // bf16 or f16. Kernels compute in fp32 and round each state they store to this dtype once;
  // h0 holds values exactly representable in it.
  DType state_dtype = DType::f32;

  GateMode gate_mode = GateMode::direct;
  GateSpace gate_space = GateSpace::log;   // direct gates only: g, or alpha = exp(g)
  bool allow_negative_eigenvalues = false;  // fused gates: beta = 2 * sigmoid(b)

  // --- derived -------------------------------------------------------------------------
  int N() const { return static_cast<int>(cu_seqlens.size()) - 1; }
  int group_size() const { return HV / H; }  // value heads per query/key head
  double effective_scale() const;
  std::int64_t seq_begin(int n) const { return cu_seqlens[static_cast<std::size_t>(n)]; }
  std::int64_t seq_len(int n) const {
    return cu_seqlens[static_cast<std::size_t>(n) + 1] - cu_seqlens[static_cast<std::size_t>(n)];
  }
  bool uses_state_cache() const { return state_slots > 0; }
  bool linear_gates() const { return gate_mode == GateMode::direct && gate_space == GateSpace::linear; }
  // The user-facing name of the direct decay tensor: "g", or "alpha" with linear gates.
  const char* decay_name() const { return linear_gates() ? "alpha" : "g"; }

  // Shapes of every tensor, in the layout the problem says.
  Shape q_shape() const { return {T, H, K}; }
  Shape v_shape() const { return {T, HV, V}; }
  Shape gate_shape() const { return {T, HV}; }
  Shape head_param_shape() const { return {HV}; }  // A_log, dt_bias
  Shape state_shape() const;                      // h0 / hT / state cache
  Shape intermediate_shape() const;               // [T, HV, K, V] in the state layout
  std::string describe() const;                   // one line, for logs and verdict tables

  // Throws ProblemError on the first broken rule. Checks structure only (no tensor data).
  void validate() const;

  // Fixed-length batch [B, T0, ...]: the packed case cu = [0, T0, 2*T0, ..., B*T0].
  static Problem fixed_length(int batch, std::int64_t tokens_per_sequence, int H, int HV, int K,
                              int V);
  // Packed batch from sequence lengths.
  static Problem packed(const std::vector<std::int64_t>& lengths, int H, int HV, int K, int V);
};

// The data of one problem. Every value is exactly representable in the dtype the Problem
// names for it (generators round once, at creation), so references, emulations and kernels all
// see the same numbers; tensors that the problem does not use stay undefined.
struct Inputs {
  HostTensor<double> q, k, v;        // [T,H,K], [T,H,K], [T,HV,V]
  // [T,HV] (GateMode::direct). g holds alpha = exp(g) when gate_space is linear: one tensor, so
  // that everything that slices, packs or copies inputs serves both spaces unchanged.
  HostTensor<double> g, beta;
  HostTensor<double> a, b;           // [T,HV]  (GateMode::fused)
  HostTensor<double> A_log, dt_bias; // [HV]    (GateMode::fused)
  HostTensor<double> h0;             // state_shape(), when has_h0 or a state cache is used; values in state_dtype
  std::vector<std::int32_t> state_indices;  // [N], when state_slots > 0
};

// Outputs in the reference's scalar. With a state cache, hT is the whole cache after the
// in-place update (untouched slots equal h0's).
template <class Scalar>
struct Outputs {
  HostTensor<Scalar> o;             // [T, HV, V]
  HostTensor<Scalar> hT;            // state_shape(), when has_hT
  HostTensor<Scalar> intermediate;  // intermediate_shape(), when store_intermediate_states

  template <class U>
  Outputs<U> cast() const {
    return Outputs<U>{o.template cast<U>(), hT.template cast<U>(), intermediate.template cast<U>()};
  }
};

// Validates the problem, then the inputs against it: every needed tensor present with the
// right shape, state indices in range, gates finite where the definition needs them.
void validate(const Problem& problem, const Inputs& inputs);

}  // namespace gdn
