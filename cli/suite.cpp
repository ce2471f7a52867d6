#include "cli/suite.hpp"

#include "fuzz/sample.hpp"
#include "oracle/implementations.hpp"

#if GDN_HAVE_GOLDEN
#include "reference/golden.hpp"
#endif

namespace gdn::cli {

namespace {

struct Spec {
  const char* name;
  Problem problem;
  fuzz::InputOptions options;
};

GeneratedCase make(const Spec& s, std::uint64_t seed) {
  GeneratedCase c;
  c.name = std::string("conformance/") + s.name;
  c.problem = s.problem;
  c.inputs = fuzz::make_inputs(s.problem, s.options, seed);
  c.generator = {{"source", "gdn-testbed conformance_cases"}, {"seed", std::to_string(seed)},
                 {"input_options", to_json(s.options)}};
  return c;
}

Problem with(Problem p, const std::function<void(Problem&)>& edit) {
  edit(p);
  return p;
}

}  // namespace

std::vector<GeneratedCase> conformance_cases() {
  using fuzz::GateRegime;
  fuzz::InputOptions mild, strong, underflow, no_decay, beta2, cache;
  strong.regime = GateRegime::strong;
  underflow.regime = GateRegime::underflow;
  no_decay.regime = GateRegime::no_decay;
  beta2.beta_max = 2.0;
  cache.padding_fraction = 0.4;
  const std::vector<Spec> specs = {
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
  };
  std::vector<GeneratedCase> cases;
  std::uint64_t seed = 1000;
  for (const Spec& s : specs) cases.push_back(make(s, seed++));
  return cases;
}

std::vector<oracle::Verdict> golden_verdicts(bool* available, std::string* why) {
  std::vector<oracle::Verdict> out;
#if GDN_HAVE_GOLDEN
  *available = true;
  std::vector<reference::GoldenCase> goldens;
  for (const std::string& file : reference::golden_files())
    for (reference::GoldenCase& g : reference::load_golden(file)) goldens.push_back(std::move(g));
  if (goldens.empty()) {
    *available = false;
    *why = "no golden files in " + reference::golden_data_dir();
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
