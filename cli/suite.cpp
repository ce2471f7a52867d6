#include "cli/suite.hpp"

#include <functional>

#include "fuzz/backward_properties.hpp"
#include "fuzz/sample.hpp"
#include "oracle/backward_budget.hpp"
#include "oracle/implementations.hpp"
#include "oracle/reproducibility.hpp"

#if GDN_HAVE_GOLDEN
#include "reference/golden.hpp"
#endif

namespace gdn::cli {

namespace {

struct Spec {
  std::string name;
  Problem problem;
  fuzz::InputOptions options;
  // State cache: the slot of each sequence (-1: padding), in place of make_inputs' random ones,
  // so that padding rows, shared and out-of-order slots sit where the case says.
  std::vector<std::int32_t> slots = {};
};

GeneratedCase make(const Spec& s, std::uint64_t seed) {
  GeneratedCase c;
  c.name = "conformance/" + s.name;
  c.problem = s.problem;
  c.inputs = fuzz::make_inputs(s.problem, s.options, seed);
  c.generator = {{"source", "gdn-testbed conformance_cases"}, {"seed", std::to_string(seed)},
                 {"input_options", to_json(s.options)}};
  if (!s.slots.empty()) {
    c.inputs.state_indices = s.slots;
    c.generator["state_indices"] = s.slots;
  }
  validate(c.problem, c.inputs);  // a malformed built-in case is a bug here, not a verdict
  return c;
}

Problem with(Problem p, const std::function<void(Problem&)>& edit) {
  edit(p);
  return p;
}

// A decode batch: N sequences of ts tokens against a cache of `slots.size()`-or-more slots.
Problem decode_batch(int N, std::int64_t ts, int H, int HV, int K, int V, std::int64_t slot_count, DType dtype,
                     const std::function<void(Problem&)>& edit) {
  Problem p = Problem::fixed_length(N, ts, H, HV, K, V);
  p.state_slots = slot_count;
  p.input_dtype = dtype;
  edit(p);
  return p;
}

// Packs that put every special length of a chunk of C = 64 and of C = 37 (the chunked
// references' second size): 0, 1, C - 1, C, C + 1 at the start, in the middle and at the end of
// a pack. Each length starts one pack and ends another of each of the two sets, which differ in
// shape, dtype, gates and states, so every (length, position) is in at least two cases.
void add_packs(std::vector<Spec>& specs) {
  const std::vector<std::int64_t> special{0, 1, 63, 64, 65, 36, 37, 38};
  const std::size_t count = special.size();
  for (int set = 0; set < 2; ++set)
    for (std::size_t i = 0; i < count; ++i) {
      std::vector<std::int64_t> lengths{special[i]};
      for (std::size_t m = 0; m < count; ++m) lengths.push_back(special[(i + 1 + m) % count]);
      lengths.push_back(special[(i + (set == 0 ? 3 : 5)) % count]);
      Spec s;
      s.name = "pack-" + std::string(set == 0 ? "a" : "b") + "-start" + std::to_string(lengths.front()) + "-end" +
               std::to_string(lengths.back()) + (set == 0 ? "-bf16" : "-f16");
      s.problem = set == 0 ? Problem::packed(lengths, 1, 2, 16, 16) : Problem::packed(lengths, 1, 1, 32, 16);
      s.problem.input_dtype = set == 0 ? DType::bf16 : DType::f16;
      if (set == 0) s.problem.has_h0 = true;
      s.problem.has_hT = true;
      if (set == 1) s.problem.gate_mode = GateMode::fused;
      s.options.regime = i % 2 == 0 ? fuzz::GateRegime::mild : fuzz::GateRegime::strong;
      specs.push_back(std::move(s));
    }
}

}  // namespace

std::vector<GeneratedCase> conformance_cases() {
  using fuzz::GateRegime;
  fuzz::InputOptions mild, strong, underflow, no_decay, beta2, cache, small;
  strong.regime = GateRegime::strong;
  underflow.regime = GateRegime::underflow;
  no_decay.regime = GateRegime::no_decay;
  beta2.beta_max = 2.0;
  cache.padding_fraction = 0.4;
  small.small_norms = true;
  std::vector<Spec> specs = {
      {"varlen-boundaries-f32", with(Problem::packed({0, 1, 63, 64, 65, 130}, 2, 2, 32, 32), [](Problem& p) {
         p.has_h0 = p.has_hT = true;
       }), mild},
      {"gva-l2norm-bf16", with(Problem::packed({100, 37}, 2, 6, 64, 48), [](Problem& p) {
         p.input_dtype = DType::bf16;
         p.use_qk_l2norm = true;
         p.has_hT = true;
       }), mild},
      {"strong-decay-f16", with(Problem::packed({200}, 1, 2, 64, 64), [](Problem& p) {
         p.input_dtype = DType::f16;
         p.has_h0 = p.has_hT = true;
       }), strong},
      {"underflow-reset-f32", with(Problem::packed({150, 10}, 1, 1, 16, 16), [](Problem& p) {
         p.has_h0 = p.has_hT = true;
       }), underflow},
      {"beta-to-2-bf16", with(Problem::packed({129}, 1, 1, 32, 32), [](Problem& p) {
         p.input_dtype = DType::bf16;
         p.has_hT = true;
       }), beta2},
      {"fused-gates-negeig-bf16", with(Problem::packed({90, 3}, 1, 2, 32, 16), [](Problem& p) {
         p.input_dtype = DType::bf16;
         p.gate_mode = GateMode::fused;
         p.allow_negative_eigenvalues = true;
         p.use_qk_l2norm = true;
         p.has_hT = true;
       }), mild},
      {"v-major-odd-sizes-f32", with(Problem::packed({70, 70}, 1, 1, 17, 33), [](Problem& p) {
         p.state_layout = StateLayout::v_major;
         p.has_h0 = p.has_hT = true;
       }), mild},
      {"state-cache-padding-bf16", with(Problem::packed({1, 1, 5, 2, 1}, 1, 2, 32, 32), [](Problem& p) {
         p.input_dtype = DType::bf16;
         p.state_slots = 7;
         p.has_h0 = p.has_hT = true;
       }), cache},
      {"decode-intermediate-states-f32", with(Problem::packed({4, 4, 4}, 2, 4, 16, 16), [](Problem& p) {
         p.state_slots = 4;
         p.has_h0 = p.has_hT = true;
         p.store_intermediate_states = true;
       }), mild},
      {"tiny-heads-gva", with(Problem::packed({65, 2}, 1, 3, 1, 3), [](Problem& p) {
         p.has_h0 = p.has_hT = true;
       }), mild},
      {"no-decay-long-f32", with(Problem::packed({512}, 1, 1, 64, 64), [](Problem& p) { p.has_hT = true; }), no_decay},
      {"large-heads-bf16", with(Problem::packed({192}, 2, 2, 128, 128), [](Problem& p) {
         p.input_dtype = DType::bf16;
         p.use_qk_l2norm = true;
         p.has_h0 = p.has_hT = true;
       }), mild},
      {"scale-gate-dtype-bf16", with(Problem::packed({50, 14}, 1, 1, 24, 40), [](Problem& p) {
         p.input_dtype = DType::bf16;
         p.gate_dtype = DType::bf16;
         p.scale = 0.7;
         p.has_hT = true;
       }), mild},
      {"empty-sequences-only", with(Problem::packed({0, 0}, 1, 1, 8, 8), [](Problem& p) {
         p.has_h0 = p.has_hT = true;
       }), mild},
      // Small-norm q and k under l2norm (InputOptions::small_norms): rows of norm 1e-5 to 1e-2
      // and exactly zero, where the epsilon inside the square root decides the result.
      {"small-norm-l2norm-f32", with(Problem::packed({70, 0, 33}, 2, 4, 32, 16), [](Problem& p) {
         p.use_qk_l2norm = true;
         p.has_h0 = p.has_hT = true;
       }), small},
      {"small-norm-l2norm-bf16", with(Problem::packed({100, 29}, 1, 2, 64, 64), [](Problem& p) {
         p.input_dtype = DType::bf16;
         p.use_qk_l2norm = true;
         p.has_hT = true;
       }), small},
      {"small-norm-l2norm-decode-f32", decode_batch(4, 2, 1, 2, 16, 32, 5, DType::f32, [](Problem& p) {
         p.use_qk_l2norm = true;
         p.has_h0 = p.has_hT = true;
         p.store_intermediate_states = true;
       }), small, {3, 0, -1, 4}},
      // Fused gates, per-token states and dense prefill beyond the cases above.
      {"fused-gates-strong-f16", with(Problem::packed({64, 130}, 2, 2, 64, 64), [](Problem& p) {
         p.input_dtype = DType::f16;
         p.gate_mode = GateMode::fused;
         p.has_h0 = p.has_hT = true;
       }), strong},
      {"prefill-intermediate-states-bf16", with(Problem::packed({65, 0, 3}, 1, 2, 16, 32), [](Problem& p) {
         p.input_dtype = DType::bf16;
         p.has_h0 = p.has_hT = true;
         p.store_intermediate_states = true;
       }), mild},
      // Decode batches (fixed length, a state cache): padding rows at the start, in the middle
      // and at the end, slots out of order, shared slots (read-only: has_h0 without has_hT),
      // per-token states, fused gates, both layouts, Ts = 1, C - 1, C, C + 1 (C = 64).
      {"decode-ts1-padding-ends-bf16", decode_batch(6, 1, 2, 4, 32, 32, 8, DType::bf16, [](Problem& p) {
         p.has_h0 = p.has_hT = true;
         p.store_intermediate_states = true;
       }), mild, {-1, 5, 0, 7, 2, -1}},
      {"decode-ts1-padding-middle-fused-v-major-f32", decode_batch(5, 1, 1, 2, 16, 48, 6, DType::f32, [](Problem& p) {
         p.has_h0 = p.has_hT = true;
         p.gate_mode = GateMode::fused;
         p.state_layout = StateLayout::v_major;
       }), mild, {3, -1, 1, -1, 0}},
      {"decode-ts64-v-major-states-f16", decode_batch(3, 64, 1, 2, 16, 16, 4, DType::f16, [](Problem& p) {
         p.has_h0 = p.has_hT = true;
         p.gate_mode = GateMode::fused;
         p.state_layout = StateLayout::v_major;
         p.store_intermediate_states = true;
       }), mild, {2, -1, 0}},
      {"decode-ts64-k-major-bf16", decode_batch(3, 64, 1, 1, 32, 32, 3, DType::bf16, [](Problem& p) {
         p.has_h0 = p.has_hT = true;
       }), strong, {1, 0, 2}},
      {"decode-ts63-padding-start-no-h0-bf16", decode_batch(3, 63, 1, 1, 32, 16, 3, DType::bf16, [](Problem& p) {
         p.has_hT = true;
       }), mild, {-1, 2, 1}},
      {"decode-ts63-states-f16", decode_batch(4, 63, 1, 2, 16, 16, 4, DType::f16, [](Problem& p) {
         p.has_h0 = p.has_hT = true;
         p.store_intermediate_states = true;
       }), underflow, {0, 3, 1, 2}},
      {"decode-ts65-padding-end-v-major-f32", decode_batch(4, 65, 1, 2, 16, 32, 5, DType::f32, [](Problem& p) {
         p.has_h0 = p.has_hT = true;
         p.state_layout = StateLayout::v_major;
         p.gate_mode = GateMode::fused;
       }), mild, {4, 1, 3, -1}},
      {"decode-ts65-padding-middle-bf16", decode_batch(3, 65, 1, 1, 16, 16, 3, DType::bf16, [](Problem& p) {
         p.has_h0 = p.has_hT = true;
         p.gate_mode = GateMode::fused;
         p.allow_negative_eigenvalues = true;
       }), mild, {2, -1, 0}},
      {"decode-shared-slots-read-only-f32", decode_batch(4, 2, 1, 2, 16, 16, 3, DType::f32, [](Problem& p) {
         p.has_h0 = true;
       }), mild, {1, 1, -1, 0}},
      {"decode-shared-slots-read-only-v-major-bf16", decode_batch(5, 1, 2, 2, 32, 16, 2, DType::bf16, [](Problem& p) {
         p.has_h0 = true;
         p.state_layout = StateLayout::v_major;
       }), mild, {0, 1, 0, 0, 1}},
  };
  add_packs(specs);
  // After the packs, so that the cases before keep their seeds. Sequences whose last 8 tokens
  // have zero keys after strong decays: in the 9- and 20-token sequences the rows that make the
  // final state are decayed to about 1e-10 within their chunk, below fp16's range, where the
  // chunked kernel's fp16 state-update operand flushed them and hT came out 0
  // (cuda/chunked/chunked_kernel.cuh, rescale_state_update).
  fuzz::InputOptions zero_tail = strong;
  zero_tail.zero_key_tail = 8;
  specs.push_back({"zero-key-tail-strong-f16", with(Problem::packed({70, 9, 20}, 1, 2, 32, 32), [](Problem& p) {
                     p.input_dtype = DType::f16;
                     p.has_h0 = p.has_hT = true;
                   }), zero_tail});
  std::vector<GeneratedCase> cases;
  std::uint64_t seed = 1000;
  for (const Spec& s : specs) cases.push_back(make(s, seed++));
  return cases;
}

std::vector<oracle::Verdict> conformance_verdicts(const std::vector<const oracle::RegistryEntry*>& entries,
                                                  const std::optional<oracle::BudgetOptions>& budget) {
  std::vector<oracle::Verdict> verdicts;
  std::vector<std::unique_ptr<Implementation>> impls;
  for (const oracle::RegistryEntry* e : entries) impls.push_back(e->make());
  for (const GeneratedCase& c : conformance_cases()) {
    // The long double recurrence is the oracle here: the double references are under test too.
    oracle::CaseContext context(c.name, c.problem, c.inputs, oracle::CaseContext::Oracle::f80);
    for (std::size_t i = 0; i < entries.size(); ++i) {
      Outputs<double> actual;
      oracle::Verdict v = oracle::evaluate(*impls[i], context, budget ? *budget : entries[i]->default_budget, &actual);
      // Kernels: once more on the same inputs and once on the reversed pack, bit for bit, so
      // that a race shows in CI even when its values stay within the budget.
      if (entries[i]->check_reproducibility)
        oracle::add_reproducibility_checks(v, *impls[i], c.problem, c.inputs, actual);
      verdicts.push_back(std::move(v));
    }
  }
  return verdicts;
}

std::vector<BackwardCase> backward_conformance_cases(std::size_t* out_of_scope) {
  std::vector<BackwardCase> out;
  std::size_t left_out = 0;
  for (GeneratedCase& c : conformance_cases()) {
    if (!oracle::backward_in_scope(c.problem)) {
      ++left_out;
      continue;
    }
    BackwardCase b;
    b.seed = std::stoull(c.generator.at("seed").get<std::string>());
    b.cotangents = fuzz::make_backward_inputs(c.problem, b.seed);
    b.generated = std::move(c);
    out.push_back(std::move(b));
  }
  if (out_of_scope) *out_of_scope = left_out;
  return out;
}

std::vector<oracle::Verdict> backward_conformance_verdicts(const std::vector<const oracle::RegistryEntry*>& entries,
                                                           const std::optional<oracle::BudgetOptions>& budget) {
  std::vector<oracle::Verdict> verdicts;
  std::vector<std::unique_ptr<Implementation>> impls;
  std::vector<oracle::BudgetOptions> budgets;
  for (const oracle::RegistryEntry* e : entries) {
    impls.push_back(e->make());
    budgets.push_back(budget ? *budget : oracle::backward_budget_of(*e));
  }
  for (const BackwardCase& b : backward_conformance_cases()) {
    const GeneratedCase& c = b.generated;
    // The long double adjoint is the oracle, as the long double recurrence is the forward's.
    oracle::BackwardContext context(c.name + "/backward", c.problem, c.inputs, b.cotangents,
                                    oracle::BackwardContext::Oracle::f80);
    for (std::size_t i = 0; i < entries.size(); ++i) {
      Gradients<double> actual;
      oracle::Verdict v = oracle::evaluate_backward(*impls[i], context, budgets[i], &actual);
      // Kernels: the backward once more and on the reversed pack, bit for bit.
      if (entries[i]->check_reproducibility)
        oracle::add_backward_reproducibility_checks(v, *impls[i], c.problem, c.inputs, b.cotangents, actual);
      verdicts.push_back(std::move(v));
    }
  }
  return verdicts;
}

std::vector<oracle::Verdict> golden_verdicts(bool* available, std::string* why) {
  std::vector<oracle::Verdict> out;
#if GDN_HAVE_GOLDEN
  *available = true;
  std::string origin;
  const std::vector<reference::GoldenCase> goldens = reference::load_all_golden(&origin);
  if (goldens.empty()) {
    *available = false;
    *why = "no golden cases (" + origin + ")";
  }
  const auto subjects = {std::make_pair(Formulation::sequential, 64), std::make_pair(Formulation::chunked, 64)};
  for (const reference::GoldenCase& g : goldens) {
    for (auto [formulation, chunk] : subjects) {
      auto impl = oracle::make_reference(formulation, oracle::ReferencePrecision::f64, chunk);
      oracle::Verdict v;
      // One stored problem per peer function: the file (library) and the function tell them apart.
      std::string file = g.file.substr(g.file.find_last_of('/') + 1);
      if (file.size() > 5 && file.compare(file.size() - 5, 5, ".json") == 0) file.resize(file.size() - 5);
      v.case_name = "golden/" + file + "." + (g.formulation == Formulation::chunked ? "chunk" : "recurrent") + "/" + g.name;
      v.problem = g.problem.describe();
      v.implementation = impl->name();
      v.budget = "golden tolerance (reference/golden.hpp)";
      v.message = g.source;
      try {
        const Outputs<double> x = impl->run(g.problem, g.inputs);
        auto check = [&](oracle::OutputTensor tensor, double error, double tolerance) {
          oracle::Check c;
          c.tensor = tensor;
          c.metric = "golden_error";
          c.error = error;
          c.budget = tolerance;
          c.margin = error == 0 ? 0.0 : (tolerance > 0 ? error / tolerance : INFINITY);
          c.pass = c.margin <= 1.0;
          c.basis = "8 u (sqrt(L (K + 8)) + Gamma), normwise per (sequence, head) block";
          v.checks.push_back(c);
        };
        check(oracle::OutputTensor::o, reference::golden_error_o(g, x.o), g.tolerance_o);
        if (g.hT.defined() && g.problem.has_hT) check(oracle::OutputTensor::hT, reference::golden_error_hT(g, x.hT), g.tolerance_hT);
        bool pass = true;
        for (const oracle::Check& c : v.checks) pass = pass && c.pass;
        v.status = pass ? oracle::Status::pass : oracle::Status::fail;
      } catch (const std::exception& e) {
        v.status = oracle::Status::error;
        v.message = e.what();
      }
      out.push_back(std::move(v));
    }
  }
#else
  *available = false;
  *why = "the golden loader (reference/golden.hpp) is not built in";
#endif
  return out;
}

}  // namespace gdn::cli
