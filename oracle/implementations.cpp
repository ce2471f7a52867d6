#include "oracle/implementations.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "oracle/backward_budget.hpp"
#include "oracle/registry.hpp"
#include "reference/backward.hpp"
#include "reference/backward_chunked.hpp"
#include "reference/chunked.hpp"
#include "reference/emulate.hpp"
#include "reference/operand_model.hpp"
#include "reference/prepare.hpp"
#include "reference/sequential.hpp"
#include "reference/state_io.hpp"

namespace gdn::oracle {

namespace {

class ReferenceImplementation final : public Implementation {
 public:
  ReferenceImplementation(Formulation formulation, ReferencePrecision precision, int chunk_size)
      : formulation_(formulation), precision_(precision), chunk_size_(chunk_size) {
    if (chunk_size < 1) throw std::invalid_argument("make_reference: chunk_size must be >= 1");
  }

  std::string name() const override {
    const bool chunked = formulation_ == Formulation::chunked;
    std::string n = precision_ == ReferencePrecision::emulated
                        ? std::string("reference.emulate.") + (chunked ? "chunked" : "sequential")
                        : std::string("reference.") + (chunked ? "chunked." : "sequential.") +
                              (precision_ == ReferencePrecision::f64 ? "f64" : "f80");
    if (chunked && chunk_size_ != 64) n += ".c" + std::to_string(chunk_size_);
    return n;
  }
  Formulation formulation() const override { return formulation_; }
  int chunk_size() const override { return chunk_size_; }
  bool supports(const Problem& problem, std::string* why) const override {
    if (formulation_ == Formulation::chunked && problem.store_intermediate_states) {
      if (why) *why = "the chunked form has no per-token states (store_intermediate_states)";
      return false;
    }
    return true;
  }
  Outputs<double> run(const Problem& problem, const Inputs& inputs) override {
    const bool chunked = formulation_ == Formulation::chunked;
    switch (precision_) {
      case ReferencePrecision::f64:
        return chunked ? reference::chunked<double>(problem, inputs, chunk_size_)
                       : reference::sequential<double>(problem, inputs);
      case ReferencePrecision::f80:
        return (chunked ? reference::chunked<long double>(problem, inputs, chunk_size_)
                        : reference::sequential<long double>(problem, inputs))
            .cast<double>();
      case ReferencePrecision::emulated:
        return reference::emulate(problem, inputs, formulation_, chunk_size_);
    }
    return {};
  }

  bool has_backward() const override { return true; }
  bool supports_backward(const Problem& problem, std::string* why) const override {
    return backward_in_scope(problem, why);
  }
  Gradients<double> backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& b) override {
    const bool chunked = formulation_ == Formulation::chunked;
    switch (precision_) {
      case ReferencePrecision::f64:
        return chunked ? reference::chunked_backward<double>(problem, inputs, b, chunk_size_)
                       : reference::sequential_backward<double>(problem, inputs, b);
      case ReferencePrecision::f80:
        return (chunked ? reference::chunked_backward<long double>(problem, inputs, b, chunk_size_)
                        : reference::sequential_backward<long double>(problem, inputs, b))
            .cast<double>();
      case ReferencePrecision::emulated:
        return emulate_backward(problem, inputs, b, formulation_, chunk_size_);
    }
    return {};
  }

 private:
  Formulation formulation_;
  ReferencePrecision precision_;
  int chunk_size_;
};

// The sequential double reference with one planted fault in its gradients.
class FaultyBackward final : public Implementation {
 public:
  explicit FaultyBackward(BackwardFault fault) : fault_(fault) {}
  std::string name() const override { return std::string("fault.backward_") + backward_fault_name(fault_); }
  Formulation formulation() const override { return Formulation::sequential; }
  Outputs<double> run(const Problem& problem, const Inputs& inputs) override {
    return reference::sequential<double>(problem, inputs);
  }
  bool has_backward() const override { return true; }
  bool supports_backward(const Problem& problem, std::string* why) const override {
    return backward_in_scope(problem, why);
  }
  Gradients<double> backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& b) override {
    Gradients<double> g = reference::sequential_backward<double>(problem, inputs, b);
    switch (fault_) {
      case BackwardFault::dg_sign: {
        HostTensor<double>& decay = problem.gate_mode == GateMode::direct ? g.dg : g.da;
        for (std::int64_t i = 0; i < decay.numel(); ++i) decay[i] = -decay[i];
        break;
      }
      case BackwardFault::dk_last_token: {
        const std::int64_t row = std::int64_t(problem.H) * problem.K;
        for (int n = 0; n < problem.N(); ++n) {
          if (problem.seq_len(n) == 0) continue;
          const std::int64_t last = problem.seq_begin(n) + problem.seq_len(n) - 1;
          std::fill(g.dk.data() + last * row, g.dk.data() + (last + 1) * row, 0.0);
        }
        break;
      }
    }
    return g;
  }

 private:
  BackwardFault fault_;
};

// reference::emulate_operands: the chunked kernel's operand roundings, split or single.
class OperandModel final : public Implementation {
 public:
  explicit OperandModel(reference::OperandRounding rounding) : rounding_(rounding) {}
  std::string name() const override {
    switch (rounding_) {
      case reference::OperandRounding::split: return "model.chunked.split";
      case reference::OperandRounding::single: return "model.chunked.single";
      case reference::OperandRounding::split_state: return "model.chunked.split_state";
      case reference::OperandRounding::split_state_pv: return "model.chunked.split_state_pv";
      case reference::OperandRounding::s0_once: return "model.chunked.s0_once";
      case reference::OperandRounding::single_qk: return "model.chunked.single_qk";
      case reference::OperandRounding::split_all: return "model.chunked.split_all";
      case reference::OperandRounding::split_all_p_once: return "model.chunked.split_all_p_once";
    }
    return "model.chunked";
  }
  Formulation formulation() const override { return Formulation::chunked; }
  // What the kernel it models supports (cuda/chunked_launch.cpp, unsupported()): the model
  // runs everything, but only these cases say something about the kernel.
  bool supports(const Problem& problem, std::string* why) const override {
    const char* rule = nullptr;
    if (problem.input_dtype == DType::f64)
      rule = "input_dtype: the chunked kernel takes f32, bf16 or f16";
    else if (problem.K % 16 != 0 || problem.K > 128)
      rule = "K: the chunked kernel takes multiples of 16 up to 128";
    else if (problem.V % 16 != 0 || problem.V > 256)
      rule = "V: the chunked kernel takes multiples of 16 up to 256";
    else if (problem.uses_state_cache())
      rule = "state_slots: the chunked kernel reads and writes dense states only";
    else if (problem.state_layout != StateLayout::k_major)
      rule = "state_layout: the chunked kernel takes k_major only";
    else if (problem.store_intermediate_states)
      rule = "store_intermediate_states: the chunked form has no per-token states";
    if (rule && why) *why = rule;
    return rule == nullptr;
  }
  Outputs<double> run(const Problem& problem, const Inputs& inputs) override {
    return reference::emulate_operands(problem, inputs, rounding_);
  }

 private:
  reference::OperandRounding rounding_;
};

// A copy of reference::sequential<double> with one planted fault. Kept deliberately close to
// the original so that the fault is the only difference.
class FaultyReference final : public Implementation {
 public:
  explicit FaultyReference(Fault fault) : fault_(fault) {}
  std::string name() const override { return std::string("fault.") + fault_name(fault_); }
  // Posing as a chunk kernel of chunk size 64: judged against the chunked emulation.
  Formulation formulation() const override { return Formulation::chunked; }
  int chunk_size() const override { return kChunk; }

  Outputs<double> run(const Problem& problem, const Inputs& inputs) override {
    using reference::Matrix;
    using reference::Vector;
    validate(problem, inputs);
    Outputs<double> out = reference::allocate_outputs<double>(problem, inputs);
    const int HV = problem.HV, K = problem.K, V = problem.V, N = problem.N();
    Matrix<double> S(K, V);
    Vector<double> u(V), q(K), k(K);
    for (int n = 0; n < N; ++n) {
      const std::int64_t row = reference::state_row(problem, inputs, n);
      if (row < 0) continue;
      std::int64_t begin = problem.seq_begin(n), end = begin + problem.seq_len(n);
      if (fault_ == Fault::cu_seqlens_off_by_one) {
        if (n > 0) begin = std::min(begin + 1, end);
        if (n + 1 < N && end < problem.T) end += 1;
      }
      for (int j = 0; j < HV; ++j) {
        const int h = j / problem.group_size();
        reference::initial_state(problem, inputs, row, j, S);
        for (std::int64_t t = begin; t < end; ++t) {
          const bool boundary = t > begin && (t - begin) % kChunk == 0;
          reference::load_qk(problem, inputs, t, h, q.data(), k.data());
          if (fault_ == Fault::l2norm_eps_outside_sqrt && problem.use_qk_l2norm) {
            const std::int64_t base = (t * problem.H + h) * K;
            q = Eigen::Map<const Vector<double>>(inputs.q.data() + base, K);
            k = Eigen::Map<const Vector<double>>(inputs.k.data() + base, K);
            q *= problem.effective_scale() / (q.norm() + 1e-6);
            k /= k.norm() + 1e-6;
          }
          const Eigen::Map<const Vector<double>> v(inputs.v.data() + (t * HV + j) * V, V);
          double g, beta;
          reference::load_gates(problem, inputs, t, j, &g, &beta);
          if (fault_ == Fault::lost_state_carry && boundary) S.setZero();
          if (!(fault_ == Fault::dropped_decay && boundary)) S *= std::exp(g);
          u.noalias() = beta * (v - S.transpose() * k);
          if (fault_ == Fault::states_before_write && problem.store_intermediate_states)
            reference::store_state(problem, S, t, j, out.intermediate.data());
          S.noalias() += k * u.transpose();
          if (fault_ == Fault::state_loses_bits)
            for (Eigen::Index i = 0; i < S.size(); ++i) {
              int exponent = 0;
              const double mantissa = std::frexp(S.data()[i], &exponent);
              S.data()[i] = std::ldexp(std::nearbyint(std::ldexp(mantissa, 11)), exponent - 11);
            }
          Eigen::Map<Vector<double>>(out.o.data() + (t * HV + j) * V, V).noalias() = S.transpose() * q;
          if (problem.store_intermediate_states && fault_ != Fault::states_before_write)
            reference::store_state(problem, S, t, j, out.intermediate.data());
        }
        if (problem.has_hT) reference::store_state(problem, S, row, j, out.hT.data());
      }
    }
    const bool odd_run = runs_++ % 2 == 1;
    if (fault_ == Fault::run_to_run_bits && odd_run && out.o.numel() > 0) {
      double& last = out.o.data()[out.o.numel() - 1];
      std::uint64_t bits;
      std::memcpy(&bits, &last, sizeof bits);
      bits ^= 1u;
      std::memcpy(&last, &bits, sizeof bits);
    }
    if (fault_ == Fault::intermittent && odd_run && problem.T > 0) {
      const std::int64_t row = std::int64_t(HV) * V;
      for (std::int64_t i = (problem.T - 1) * row; i < problem.T * row; ++i) out.o.data()[i] = -out.o.data()[i];
    }
    return out;
  }

 private:
  static constexpr int kChunk = 64;
  Fault fault_;
  std::uint64_t runs_ = 0;
};

}  // namespace

std::unique_ptr<Implementation> make_reference(Formulation formulation, ReferencePrecision precision,
                                               int chunk_size) {
  return std::make_unique<ReferenceImplementation>(formulation, precision, chunk_size);
}

const char* fault_name(Fault fault) {
  switch (fault) {
    case Fault::cu_seqlens_off_by_one: return "cu_seqlens_off_by_one";
    case Fault::dropped_decay: return "dropped_decay";
    case Fault::lost_state_carry: return "lost_state_carry";
    case Fault::l2norm_eps_outside_sqrt: return "l2norm_eps_outside_sqrt";
    case Fault::states_before_write: return "states_before_write";
    case Fault::state_loses_bits: return "state_loses_bits";
    case Fault::run_to_run_bits: return "run_to_run_bits";
    case Fault::intermittent: return "intermittent";
  }
  return "?";
}

std::unique_ptr<Implementation> make_faulty_reference(Fault fault) {
  return std::make_unique<FaultyReference>(fault);
}

const char* backward_fault_name(BackwardFault fault) {
  switch (fault) {
    case BackwardFault::dg_sign: return "dg_sign";
    case BackwardFault::dk_last_token: return "dk_last_token";
  }
  return "?";
}

std::unique_ptr<Implementation> make_faulty_backward(BackwardFault fault) {
  return std::make_unique<FaultyBackward>(fault);
}

BudgetOptions backward_budget_of(const RegistryEntry& entry) {
  return entry.backward_budget ? *entry.backward_budget : entry.default_budget;
}

// --- registry ------------------------------------------------------------------------------

void Registry::add(RegistryEntry entry) {
  if (entry.name.empty()) throw std::invalid_argument("Registry::add: empty implementation name");
  if (find(entry.name)) throw std::invalid_argument("Registry::add: '" + entry.name + "' is already registered");
  if (!entry.make) throw std::invalid_argument("Registry::add: '" + entry.name + "' has no factory");
  entries_.push_back(std::move(entry));
}

const RegistryEntry* Registry::find(const std::string& name) const {
  for (const RegistryEntry& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

std::vector<const RegistryEntry*> Registry::select(const std::string& names) const {
  std::vector<const RegistryEntry*> out;
  auto push = [&](const RegistryEntry* e) {
    for (const RegistryEntry* x : out)
      if (x == e) return;
    out.push_back(e);
  };
  std::size_t start = 0;
  while (start <= names.size()) {
    const std::size_t comma = names.find(',', start);
    const std::string item = names.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? names.size() + 1 : comma + 1;
    if (item.empty()) continue;
    if (item == "all") {
      for (const RegistryEntry& e : entries_)
        if (e.in_conformance) push(&e);
    } else if (item.back() == '*') {
      const std::string prefix = item.substr(0, item.size() - 1);
      bool any = false;
      for (const RegistryEntry& e : entries_)
        if (e.name.compare(0, prefix.size(), prefix) == 0) {
          push(&e);
          any = true;
        }
      if (!any) throw std::invalid_argument("no implementation matches '" + item + "'");
    } else {
      const RegistryEntry* e = find(item);
      if (!e) {
        std::string known;
        for (const RegistryEntry& x : entries_) known += (known.empty() ? "" : ", ") + x.name;
        throw std::invalid_argument("unknown implementation '" + item + "' (known: " + known + ")");
      }
      push(e);
    }
  }
  return out;
}

void register_references(Registry& registry) {
  // Double references against the double oracle (or the long double one in conformance):
  // docs/budgets.md, "references", for the 1e-12 threshold.
  BudgetOptions double_budget;
  double_budget.model = BudgetModel::fixed;
  double_budget.fixed_rel_rms = 1e-12;
  double_budget.fixed_abs_rms = 1e-14;
  BudgetOptions emulation_budget;  // the fp32 emulations against other projects' thresholds
  emulation_budget.model = BudgetModel::fixed;
  // Their backward (docs/budgets.md "Gradients"): the exact references under the analytic
  // bound at double's unit roundoff (which the long double ones meet too, and which holds
  // against the double oracle of fuzz as against the long double one of conformance); the fp32
  // emulations calibrated, i.e. against their own emulation (margin 1 / factor: a check of
  // the judge's wiring, not of the emulation).
  BudgetOptions exact_backward_budget;
  exact_backward_budget.model = BudgetModel::analytic;
  const BudgetOptions emulation_backward_budget;

  auto add = [&](Formulation f, ReferencePrecision p, int c, const std::string& description, const BudgetOptions& b) {
    RegistryEntry e;
    e.name = make_reference(f, p, c)->name();
    e.description = description;
    e.make = [f, p, c] { return make_reference(f, p, c); };
    e.default_budget = b;
    e.backward_budget = p == ReferencePrecision::emulated ? emulation_backward_budget : exact_backward_budget;
    registry.add(std::move(e));
  };
  add(Formulation::sequential, ReferencePrecision::f64, 64, "the recurrence (§2) in double: the oracle", double_budget);
  add(Formulation::sequential, ReferencePrecision::f80, 64, "the recurrence in long double: certifies double", double_budget);
  add(Formulation::chunked, ReferencePrecision::f64, 64, "the chunked WY form (§4), C = 64, double", double_budget);
  add(Formulation::chunked, ReferencePrecision::f64, 37, "the chunked WY form, C = 37 (not a power of two), double", double_budget);
  add(Formulation::chunked, ReferencePrecision::f80, 64, "the chunked WY form, C = 64, long double", double_budget);
  add(Formulation::sequential, ReferencePrecision::emulated, 64,
      "precision emulation: recurrence in fp32, o rounded to the input dtype", emulation_budget);
  add(Formulation::chunked, ReferencePrecision::emulated, 64,
      "precision emulation: chunked form in fp32, o rounded to the input dtype", emulation_budget);

  // Models of the chunked kernel's operand roundings (reference/operand_model.hpp), judged as
  // cuda.chunked_prefill is (calibrated, state unit of the input dtype). The kernel's current
  // design (split_all) is in `all`: an fp32 computation of its own (not the emulation that
  // sets its budget) under the calibrated budget, so that an accuracy loss in an fp32 path fails
  // conformance in a build without a GPU, where every other subject is judged by fixed
  // thresholds. The others answer design questions (what single rounding would cost) and stay
  // outside `all`.
  BudgetOptions kernel_budget;
  kernel_budget.state_unit_input = true;
  for (auto rounding : {reference::OperandRounding::split, reference::OperandRounding::single,
                        reference::OperandRounding::split_state, reference::OperandRounding::split_state_pv,
                        reference::OperandRounding::s0_once, reference::OperandRounding::split_all,
                        reference::OperandRounding::split_all_p_once}) {
    RegistryEntry e;
    e.name = OperandModel(rounding).name();
    e.description =
        rounding == reference::OperandRounding::split
            ? "model of the chunked kernel's earlier design: fp32, computed operands split hi + lo in the input dtype"
        : rounding == reference::OperandRounding::single
            ? "model of a single-rounding chunked kernel: fp32, computed operands rounded once"
        : rounding == reference::OperandRounding::split_state
            ? "model of the chunked kernel with Q S0's S0 rounded once (hi + lo on the state path only)"
        : rounding == reference::OperandRounding::split_state_pv
            ? "model of the chunked kernel's previous design: Q S0's S0 rounded once, Vnew split in P Vnew"
        : rounding == reference::OperandRounding::split_all
            ? "model of the chunked kernel's current design: every computed operand split hi + lo (S0 in both S0 products, Vnew and P in P Vnew)"
        : rounding == reference::OperandRounding::split_all_p_once
            ? "model of the chunked kernel's previous design: split_all with bf16's P rounded once in P Vnew"
            : "model of the chunked kernel with S0 rounded once in K S0 and Q S0 and Vnew split in P Vnew";
    e.make = [rounding] { return std::make_unique<OperandModel>(rounding); };
    e.default_budget = kernel_budget;
    e.in_conformance = rounding == reference::OperandRounding::split_all;
    registry.add(std::move(e));
  }

  for (Fault fault : {Fault::cu_seqlens_off_by_one, Fault::dropped_decay, Fault::lost_state_carry,
                      Fault::l2norm_eps_outside_sqrt, Fault::states_before_write, Fault::state_loses_bits,
                      Fault::run_to_run_bits, Fault::intermittent}) {
    RegistryEntry e;
    e.name = std::string("fault.") + fault_name(fault);
    e.description = "planted fault (fuzzer self-test): a copy of the sequential reference with a bug";
    e.make = [fault] { return make_faulty_reference(fault); };
    e.in_conformance = false;
    // Posing as kernels: conformance reruns them, as it reruns the GPU kernels.
    e.check_reproducibility = fault == Fault::run_to_run_bits || fault == Fault::intermittent;
    registry.add(std::move(e));
  }
  for (BackwardFault fault : {BackwardFault::dg_sign, BackwardFault::dk_last_token}) {
    RegistryEntry e;
    e.name = make_faulty_backward(fault)->name();
    e.description = "planted fault (fuzzer self-test): the sequential reference with a bug in its backward";
    e.make = [fault] { return make_faulty_backward(fault); };
    e.in_conformance = false;  // posing as a kernel: calibrated, forward and backward
    registry.add(std::move(e));
  }
}

}  // namespace gdn::oracle
