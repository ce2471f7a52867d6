#include "fuzz/backward_properties.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include <rapidcheck.h>

#include "oracle/budget.hpp"
#include "reference/backward_chunked.hpp"
#include "reference/precision.hpp"
#include "reference/prepare.hpp"
#include "reference/sequential.hpp"

namespace gdn::fuzz {

using reference::BackwardInputs;
using reference::Gradients;

BackwardImplementation sequential_backward_reference() {
  return {"reference.sequential_backward.f64", Formulation::sequential, 64,
          [](const Problem& p, const Inputs& in, const BackwardInputs& b) {
            return reference::sequential_backward<double>(p, in, b);
          }};
}

BackwardImplementation chunked_backward_reference(int chunk_size) {
  return {"reference.chunked_backward.f64.c" + std::to_string(chunk_size), Formulation::chunked, chunk_size,
          [chunk_size](const Problem& p, const Inputs& in, const BackwardInputs& b) {
            return reference::chunked_backward<double>(p, in, b, chunk_size);
          }};
}

CaseSpace backward_space(CaseSpace space) {
  space.state_cache = false;
  space.intermediate_states = false;
  space.state_dtypes = {DType::f32};
  space.gate_spaces = {GateSpace::log};
  return space;
}

BackwardInputs make_backward_inputs(const Problem& problem, std::uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0xBAC4D0A2D5EEDull);
  std::normal_distribution<double> normal(0.0, 1.0);
  BackwardInputs b;
  b.dO = HostTensor<double>(problem.v_shape());
  for (std::int64_t i = 0; i < b.dO.numel(); ++i) b.dO[i] = reference::round_to(problem.input_dtype, normal(rng));
  if (problem.has_hT && std::uniform_int_distribution<int>(0, 3)(rng) != 0) {
    b.dhT = HostTensor<double>(problem.state_shape());
    for (std::int64_t i = 0; i < b.dhT.numel(); ++i) b.dhT[i] = reference::round_to(DType::f32, normal(rng));
  }
  return b;
}

double GradientScale::of(const std::string& t) const {
  if (t == "dq") return dq;
  if (t == "dk") return dk;
  if (t == "dv") return dv;
  if (t == "dg") return dg;
  if (t == "dbeta") return dbeta;
  if (t == "da") return da;
  if (t == "db") return db;
  if (t == "dA_log") return dA_log;
  if (t == "ddt_bias") return ddt_bias;
  if (t == "dh0") return dh0;
  return 0;
}

GradientScale gradient_scale(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward) {
  Gradients<double> m;
  reference::sequential_backward<double>(problem, inputs, backward, &m);
  GradientScale s;
  s.dq = oracle::max_abs(m.dq);
  s.dk = oracle::max_abs(m.dk);
  s.dv = oracle::max_abs(m.dv);
  s.dg = oracle::max_abs(m.dg);
  s.dbeta = oracle::max_abs(m.dbeta);
  s.da = oracle::max_abs(m.da);
  s.db = oracle::max_abs(m.db);
  s.dA_log = oracle::max_abs(m.dA_log);
  s.ddt_bias = oracle::max_abs(m.ddt_bias);
  s.dh0 = oracle::max_abs(m.dh0);
  return s;
}

double gradient_difference(const Gradients<double>& x, const Gradients<double>& y, const GradientScale& scale,
                           std::string* worst_tensor) {
  std::vector<const HostTensor<double>*> ys;
  y.for_each([&](const char*, const HostTensor<double>& t) { ys.push_back(&t); });
  double worst = 0;
  std::size_t i = 0;
  x.for_each([&](const char* name, const HostTensor<double>& t) {
    const HostTensor<double>& other = *ys[i++];
    double r = 0;
    if (t.defined() != other.defined()) {
      r = std::numeric_limits<double>::infinity();
    } else if (t.defined()) {
      const double d = oracle::difference(t, other).max_abs;
      r = d == 0 ? 0 : d / scale.of(name);
    }
    if (!(r <= worst)) {
      worst = r;
      if (worst_tensor) *worst_tensor = name;
    }
  });
  return worst;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One problem with its data and cotangents.
struct Run {
  Problem p;
  Inputs in;
  BackwardInputs b;
};

Run make_run(const Case& c) {
  Run r{c.problem, c.inputs(), {}};
  r.b = make_backward_inputs(r.p, c.seed);
  return r;
}

// Rows [r0, r1) of the first axis.
HostTensor<double> rows(const HostTensor<double>& x, std::int64_t r0, std::int64_t r1) {
  if (!x.defined()) return {};
  Shape shape = x.shape();
  const std::int64_t width = shape[0] > 0 ? x.numel() / shape[0] : 0;
  shape[0] = r1 - r0;
  HostTensor<double> out(shape);
  std::copy(x.data() + r0 * width, x.data() + r1 * width, out.data());
  return out;
}

// Tokens [t0, t1) of r as a one-sequence run, with initial state h0 (one state row, or none)
// and, when has_hT, the cotangent dhT (one state row, or none = zero).
Run take(const Run& r, std::int64_t t0, std::int64_t t1, const HostTensor<double>* h0, bool has_hT,
         const HostTensor<double>* dhT) {
  Run out;
  out.p = r.p;
  out.p.cu_seqlens = {0, t1 - t0};
  out.p.T = t1 - t0;
  out.p.has_h0 = h0 != nullptr;
  out.p.has_hT = has_hT;
  out.in.q = rows(r.in.q, t0, t1);
  out.in.k = rows(r.in.k, t0, t1);
  out.in.v = rows(r.in.v, t0, t1);
  out.in.g = rows(r.in.g, t0, t1);
  out.in.beta = rows(r.in.beta, t0, t1);
  out.in.a = rows(r.in.a, t0, t1);
  out.in.b = rows(r.in.b, t0, t1);
  out.in.A_log = r.in.A_log;
  out.in.dt_bias = r.in.dt_bias;
  if (h0) out.in.h0 = *h0;
  out.b.dO = rows(r.b.dO, t0, t1);
  if (has_hT && dhT) out.b.dhT = *dhT;
  return out;
}

// Collects the checks of one evaluation (like properties.cpp's report).
class Checks {
 public:
  void compare(const std::string& what, const HostTensor<double>& expected, const HostTensor<double>& actual,
               double allowed) {
    ++count_;
    const oracle::Difference d = oracle::difference(expected, actual);
    const double margin = d.max_abs == 0 ? 0 : allowed > 0 ? d.max_abs / allowed : kInf;
    worst_ = std::max(worst_, margin);
    if (!(d.max_abs <= allowed)) {
      failed_ = true;
      failures_ << "  " << what << ": max error " << d.max_abs << " > allowed " << allowed;
      if (expected.shape() != actual.shape())
        failures_ << " (shape " << shape_string(actual.shape()) << ", expected " << shape_string(expected.shape()) << ")";
      else
        failures_ << " at " << index_string(expected.shape(), d.worst) << ": got " << d.actual_at_worst
                  << ", expected " << d.expected_at_worst;
      failures_ << "\n";
    }
  }
  PropertyResult result(const std::string& header) const {
    PropertyResult r;
    r.status = failed_ ? PropertyStatus::fail : PropertyStatus::pass;
    r.worst_margin = worst_;
    r.checks = count_;
    if (failed_) r.message = header + "\n" + failures_.str();
    return r;
  }

 private:
  std::ostringstream failures_;
  bool failed_ = false;
  double worst_ = 0;
  int count_ = 0;
};

// The budget of one run of impl on r: rel x M per tensor.
struct Budget {
  double relative = 0;
  GradientScale scale;
  double of(const std::string& tensor) const { return relative * scale.of(tensor); }
};

Budget budget_of(const BackwardImplementation& impl, const Run& r) {
  Budget b;
  b.relative = oracle::analytic_relative_bound(r.p, r.in, impl.formulation, impl.chunk_size, false);
  b.scale = gradient_scale(r.p, r.in, r.b);
  return b;
}

std::string header(const char* name, const BackwardImplementation& impl, const Case& c) {
  std::ostringstream s;
  s << name << " failed for " << impl.name << " on " << c;
  return s.str();
}

// Per-token tensors and their first-axis width in tokens, by name.
bool per_token(const std::string& name) {
  return name == "dq" || name == "dk" || name == "dv" || name == "dg" || name == "dbeta" || name == "da" ||
         name == "db";
}

// Concatenates the per-token tensors of parts along the token axis, and adds their dA_log,
// ddt_bias; dh0 is the first part's.
Gradients<double> concatenate(const std::vector<Gradients<double>>& parts) {
  Gradients<double> out = parts.front();
  std::vector<HostTensor<double>*> targets;
  out.for_each([&](const char*, HostTensor<double>& t) { targets.push_back(&t); });
  for (std::size_t k = 1; k < parts.size(); ++k) {
    std::size_t i = 0;
    parts[k].for_each([&](const char* name, const HostTensor<double>& t) {
      HostTensor<double>& target = *targets[i++];
      if (!t.defined()) return;
      if (per_token(name)) {
        Shape shape = target.shape();
        shape[0] += t.shape()[0];
        HostTensor<double> joined(shape);
        std::copy(target.data(), target.data() + target.numel(), joined.data());
        std::copy(t.data(), t.data() + t.numel(), joined.data() + target.numel());
        target = std::move(joined);
      } else if (std::string(name) != "dh0") {
        for (std::int64_t e = 0; e < t.numel(); ++e) target[e] += t[e];
      }
    });
  }
  return out;
}

// Every defined tensor of expected against actual, allowed budget.of(name) x factor.
void compare_all(Checks& checks, const std::string& prefix, const Gradients<double>& expected,
                 const Gradients<double>& actual, const Budget& budget, double factor,
                 bool skip_dh0 = false) {
  std::vector<const HostTensor<double>*> as;
  actual.for_each([&](const char*, const HostTensor<double>& t) { as.push_back(&t); });
  std::size_t i = 0;
  expected.for_each([&](const char* name, const HostTensor<double>& t) {
    const HostTensor<double>& a = *as[i++];
    if (!t.defined() && !a.defined()) return;
    if (skip_dh0 && std::string(name) == "dh0") return;
    checks.compare(prefix + name, t, a, factor * budget.of(name));
  });
}

}  // namespace

PropertyResult backward_matches_sequential(const BackwardImplementation& impl, const Case& c) {
  const Run r = make_run(c);
  const Gradients<double> expected = reference::sequential_backward<double>(r.p, r.in, r.b);
  const Gradients<double> actual = impl.run(r.p, r.in, r.b);
  const Budget mine = budget_of(impl, r);
  Budget both = mine;
  both.relative += oracle::analytic_relative_bound(r.p, r.in, Formulation::sequential, 64, false);
  Checks checks;
  compare_all(checks, "", expected, actual, both, 1.0);
  return checks.result(header("backward_matches_sequential", impl, c));
}

PropertyResult backward_state_carry(const BackwardImplementation& impl, const Case& c) {
  const Run whole_case = make_run(c);
  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 101);
  const int n = std::uniform_int_distribution<int>(0, whole_case.p.N() - 1)(rng);
  const std::int64_t t0 = whole_case.p.seq_begin(n), t1 = t0 + whole_case.p.seq_len(n);
  const std::int64_t split = std::uniform_int_distribution<std::int64_t>(t0, t1)(rng);
  const HostTensor<double> h0 = rows(whole_case.in.h0, n, n + 1), dhT = rows(whole_case.b.dhT, n, n + 1);
  const Run whole = take(whole_case, t0, t1, whole_case.p.has_h0 ? &h0 : nullptr, whole_case.p.has_hT,
                         whole_case.b.dhT.defined() ? &dhT : nullptr);
  // Forward: the first part's final state starts the second part.
  Run first = take(whole, 0, split - t0, whole.p.has_h0 ? &h0 : nullptr, true, nullptr);
  const Outputs<double> carried = reference::sequential<double>(first.p, first.in);
  const Run second = take(whole, split - t0, t1 - t0, &carried.hT, whole.p.has_hT,
                          whole.b.dhT.defined() ? &dhT : nullptr);
  // Backward: the second part's dh0 is the first part's dhT.
  const Gradients<double> g2 = impl.run(second.p, second.in, second.b);
  first.b.dhT = g2.dh0;
  Gradients<double> g1 = impl.run(first.p, first.in, first.b);
  const Gradients<double> joined = concatenate({g1, g2});
  const Gradients<double> expected = impl.run(whole.p, whole.in, whole.b);
  // Three runs; the carried state is the double forward's (its error is within the
  // forward's analytic bound, one more run's worth).
  Budget budget = budget_of(impl, whole);
  budget.relative *= 4;
  Checks checks;
  compare_all(checks, "", expected, joined, budget, 1.0, /*skip_dh0=*/!whole.p.has_h0);
  return checks.result(header("backward_state_carry", impl, c) + " (sequence " + std::to_string(n) +
                       " split at token " + std::to_string(split - t0) + ")");
}

PropertyResult backward_packing_independence(const BackwardImplementation& impl, const Case& c) {
  const Run r = make_run(c);
  const Gradients<double> packed = impl.run(r.p, r.in, r.b);
  const Budget budget = budget_of(impl, r);
  Checks checks;
  Gradients<double> sums;  // dA_log, ddt_bias added over the sequences alone
  for (int n = 0; n < r.p.N(); ++n) {
    const std::int64_t t0 = r.p.seq_begin(n), t1 = t0 + r.p.seq_len(n);
    const HostTensor<double> h0 = rows(r.in.h0, n, n + 1), dhT = rows(r.b.dhT, n, n + 1);
    const Run alone = take(r, t0, t1, r.p.has_h0 ? &h0 : nullptr, r.p.has_hT, r.b.dhT.defined() ? &dhT : nullptr);
    const Gradients<double> g = impl.run(alone.p, alone.in, alone.b);
    const std::string at = "sequence " + std::to_string(n) + ": ";
    std::vector<const HostTensor<double>*> whole;
    packed.for_each([&](const char*, const HostTensor<double>& t) { whole.push_back(&t); });
    std::size_t i = 0;
    g.for_each([&](const char* name, const HostTensor<double>& t) {
      const HostTensor<double>& w = *whole[i++];
      if (!t.defined()) return;
      if (per_token(name)) checks.compare(at + name, rows(w, t0, t1), t, 0.0);
      else if (std::string(name) == "dh0") checks.compare(at + name, rows(w, n, n + 1), t, 0.0);
    });
    if (g.dA_log.defined()) {
      if (n == 0) {
        sums.dA_log = g.dA_log;
        sums.ddt_bias = g.ddt_bias;
      } else {
        for (std::int64_t e = 0; e < g.dA_log.numel(); ++e) {
          sums.dA_log[e] += g.dA_log[e];
          sums.ddt_bias[e] += g.ddt_bias[e];
        }
      }
    }
  }
  if (packed.dA_log.defined()) {
    // Sums over all tokens, in another order: each alone run and the packed run within budget.
    const double factor = r.p.N() + 1;
    checks.compare("dA_log (sum over sequences)", packed.dA_log, sums.dA_log, factor * budget.of("dA_log"));
    checks.compare("ddt_bias (sum over sequences)", packed.ddt_bias, sums.ddt_bias, factor * budget.of("ddt_bias"));
  }
  return checks.result(header("backward_packing_independence", impl, c));
}

PropertyResult backward_linear_in_cotangents(const BackwardImplementation& impl, const Case& c) {
  Run r = make_run(c);
  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 103);
  const double weights[] = {1, -1, 2, -2, 4, -4};
  const double x = weights[std::uniform_int_distribution<int>(0, 5)(rng)];
  const double y = weights[std::uniform_int_distribution<int>(0, 5)(rng)];
  const BackwardInputs b1 = r.b, b2 = make_backward_inputs(r.p, c.seed + 1);
  BackwardInputs mixed;
  mixed.dO = b1.dO;
  for (std::int64_t i = 0; i < mixed.dO.numel(); ++i) mixed.dO[i] = x * b1.dO[i] + y * b2.dO[i];
  if (b1.dhT.defined() || b2.dhT.defined()) {
    mixed.dhT = HostTensor<double>(r.p.state_shape());
    for (std::int64_t i = 0; i < mixed.dhT.numel(); ++i)
      mixed.dhT[i] = (b1.dhT.defined() ? x * b1.dhT[i] : 0.0) + (b2.dhT.defined() ? y * b2.dhT[i] : 0.0);
  }
  const Gradients<double> g1 = impl.run(r.p, r.in, b1), g2 = impl.run(r.p, r.in, b2);
  const Gradients<double> g = impl.run(r.p, r.in, mixed);
  Gradients<double> combined = g1;
  std::vector<const HostTensor<double>*> second;
  g2.for_each([&](const char*, const HostTensor<double>& t) { second.push_back(&t); });
  std::size_t i = 0;
  combined.for_each([&](const char*, HostTensor<double>& t) {
    const HostTensor<double>& s = *second[i++];
    for (std::int64_t e = 0; e < t.numel(); ++e) t[e] = x * t[e] + y * s[e];
  });
  // Each run within its budget: |x| M1 + |y| M2 + M(mixed), relative bound shared.
  Budget b = budget_of(impl, r);
  r.b = b2;
  const Budget bb = budget_of(impl, r);
  r.b = mixed;
  const Budget bm = budget_of(impl, r);
  Checks checks;
  std::vector<const HostTensor<double>*> mixed_run;
  g.for_each([&](const char*, const HostTensor<double>& t) { mixed_run.push_back(&t); });
  i = 0;
  combined.for_each([&](const char* name, const HostTensor<double>& t) {
    const HostTensor<double>& m = *mixed_run[i++];
    if (!t.defined()) return;
    const double allowed =
        std::abs(x) * b.of(name) + std::abs(y) * bb.of(name) + bm.of(name);
    checks.compare(name, t, m, allowed);
  });
  std::ostringstream what;
  what << " (x = " << x << ", y = " << y << ")";
  return checks.result(header("backward_linear_in_cotangents", impl, c) + what.str());
}

PropertyResult backward_gva_equals_repeated_heads(const BackwardImplementation& impl, const Case& c0) {
  Case c = c0;
  if (c.problem.group_size() == 1) {
    c.problem.HV = 2 * c.problem.H;
  }
  const Run r = make_run(c);
  const Problem& p = r.p;
  const int group = p.group_size();
  Run rep = r;
  rep.p.H = p.HV;
  rep.in.q = HostTensor<double>(rep.p.q_shape());
  rep.in.k = HostTensor<double>(rep.p.q_shape());
  for (std::int64_t t = 0; t < p.T; ++t)
    for (int j = 0; j < p.HV; ++j)
      for (int i = 0; i < p.K; ++i) {
        rep.in.q[(t * p.HV + j) * p.K + i] = r.in.q[(t * p.H + j / group) * p.K + i];
        rep.in.k[(t * p.HV + j) * p.K + i] = r.in.k[(t * p.H + j / group) * p.K + i];
      }
  const Gradients<double> gva = impl.run(r.p, r.in, r.b);
  Gradients<double> summed = impl.run(rep.p, rep.in, rep.b);
  for (HostTensor<double>* t : {&summed.dq, &summed.dk}) {
    HostTensor<double> s(p.q_shape());
    for (std::int64_t tok = 0; tok < p.T; ++tok)
      for (int j = 0; j < p.HV; ++j)
        for (int i = 0; i < p.K; ++i) s[(tok * p.H + j / group) * p.K + i] += (*t)[(tok * p.HV + j) * p.K + i];
    *t = std::move(s);
  }
  Budget budget = budget_of(impl, r);
  budget.relative *= 2;
  Checks checks;
  compare_all(checks, "", gva, summed, budget, 1.0);
  return checks.result(header("backward_gva_equals_repeated_heads", impl, c));
}

PropertyResult backward_pure_decay(const BackwardImplementation& impl, const Case& c0) {
  Case c = c0;
  Problem& p = c.problem;
  p.use_qk_l2norm = false;
  p.gate_mode = GateMode::direct;
  p.allow_negative_eigenvalues = false;
  Run r = make_run(c);
  std::fill(r.in.beta.data(), r.in.beta.data() + r.in.beta.numel(), 0.0);
  const Gradients<double> g = impl.run(r.p, r.in, r.b);
  // The closed form, per (sequence, value head), in long double.
  using L = long double;
  const int HV = p.HV, K = p.K, V = p.V, group = p.group_size();
  const L scale = static_cast<L>(p.effective_scale());
  Gradients<double> e;
  e.dq = HostTensor<double>(p.q_shape());
  e.dk = HostTensor<double>(p.q_shape());
  e.dv = HostTensor<double>(p.v_shape());
  e.dg = HostTensor<double>(p.gate_shape());
  e.dbeta = HostTensor<double>(p.gate_shape());
  if (p.has_h0) e.dh0 = HostTensor<double>(p.state_shape());
  std::vector<L> dq(static_cast<std::size_t>(p.T * p.H * K), 0.0L);
  auto state_at = [&](const HostTensor<double>& x, int n, int j, int kk, int vv) -> L {
    if (!x.defined()) return 0;
    const std::int64_t base = (std::int64_t(n) * HV + j) * K * V;
    return x[base + (p.state_layout == StateLayout::k_major ? std::int64_t(kk) * V + vv : std::int64_t(vv) * K + kk)];
  };
  auto state_index = [&](int n, int j, int kk, int vv) {
    const std::int64_t base = (std::int64_t(n) * HV + j) * K * V;
    return base + (p.state_layout == StateLayout::k_major ? std::int64_t(kk) * V + vv : std::int64_t(vv) * K + kk);
  };
  for (int n = 0; n < p.N(); ++n)
    for (int j = 0; j < HV; ++j) {
      const int h = j / group;
      const std::int64_t t0 = p.seq_begin(n), len = p.seq_len(n);
      std::vector<L> G(static_cast<std::size_t>(len));
      L acc = 0;
      for (std::int64_t s = 0; s < len; ++s) G[static_cast<std::size_t>(s)] = acc += r.in.g[(t0 + s) * HV + j];
      const L GL = len > 0 ? G.back() : 0.0L;
      // dS after token t (K x V), built from the end: dS_t = qs_t dO_t^T + e^{g_{t+1}} dS_{t+1}.
      std::vector<L> dS(static_cast<std::size_t>(K * V));
      for (int kk = 0; kk < K; ++kk)
        for (int vv = 0; vv < V; ++vv) dS[static_cast<std::size_t>(kk * V + vv)] = state_at(r.b.dhT, n, j, kk, vv);
      L dg_tail = 0;  // sum_{s > t} e^{G_s} qs_s^T S0 dO_s + e^{G_L} <dhT, S0>
      {
        L x = 0;
        for (int kk = 0; kk < K; ++kk)
          for (int vv = 0; vv < V; ++vv) x += state_at(r.b.dhT, n, j, kk, vv) * state_at(r.in.h0, n, j, kk, vv);
        dg_tail = std::exp(GL) * x;
      }
      for (std::int64_t s = len - 1; s >= 0; --s) {
        const std::int64_t t = t0 + s;
        const L eG = std::exp(G[static_cast<std::size_t>(s)]);
        L read = 0;  // qs_t^T S0 dO_t
        for (int kk = 0; kk < K; ++kk) {
          L s0do = 0;
          for (int vv = 0; vv < V; ++vv) s0do += state_at(r.in.h0, n, j, kk, vv) * static_cast<L>(r.b.dO[(t * HV + j) * V + vv]);
          dq[static_cast<std::size_t>((t * p.H + h) * K + kk)] += scale * eG * s0do;
          read += scale * static_cast<L>(r.in.q[(t * p.H + h) * K + kk]) * s0do;
        }
        for (int kk = 0; kk < K; ++kk)
          for (int vv = 0; vv < V; ++vv)
            dS[static_cast<std::size_t>(kk * V + vv)] +=
                scale * static_cast<L>(r.in.q[(t * p.H + h) * K + kk]) * static_cast<L>(r.b.dO[(t * HV + j) * V + vv]);
        dg_tail += eG * read;
        e.dg[t * HV + j] = static_cast<double>(dg_tail);
        L dbeta = 0;
        for (int vv = 0; vv < V; ++vv) {
          L du = 0, pk = 0;
          for (int kk = 0; kk < K; ++kk) {
            const L k = r.in.k[(t * p.H + h) * K + kk];
            du += dS[static_cast<std::size_t>(kk * V + vv)] * k;
            pk += eG * state_at(r.in.h0, n, j, kk, vv) * k;
          }
          dbeta += du * (static_cast<L>(r.in.v[(t * HV + j) * V + vv]) - pk);
        }
        e.dbeta[t * HV + j] = static_cast<double>(dbeta);
        const L alpha = std::exp(static_cast<L>(r.in.g[t * HV + j]));
        for (L& x : dS) x *= alpha;
      }
      if (p.has_h0)
        for (int kk = 0; kk < K; ++kk)
          for (int vv = 0; vv < V; ++vv) e.dh0[state_index(n, j, kk, vv)] = static_cast<double>(dS[static_cast<std::size_t>(kk * V + vv)]);
    }
  for (std::size_t i = 0; i < dq.size(); ++i) e.dq[static_cast<std::int64_t>(i)] = static_cast<double>(dq[i]);
  Budget budget = budget_of(impl, r);
  Checks checks;
  compare_all(checks, "", e, g, budget, 1.0);
  // dk and dv are exactly zero: every term they add is multiplied by u = 0 or beta = 0.
  checks.compare("dk (exactly 0)", e.dk, g.dk, 0.0);
  checks.compare("dv (exactly 0)", e.dv, g.dv, 0.0);
  return checks.result(header("backward_pure_decay", impl, c));
}

PropertyResult backward_reset(const BackwardImplementation& impl, const Case& c) {
  Run r = make_run(c);
  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 107);
  std::vector<int> nonempty;
  for (int n = 0; n < r.p.N(); ++n)
    if (r.p.seq_len(n) > 0) nonempty.push_back(n);
  if (nonempty.empty()) return {};
  const int n = nonempty[std::uniform_int_distribution<std::size_t>(0, nonempty.size() - 1)(rng)];
  const std::int64_t t0 = r.p.seq_begin(n), t1 = t0 + r.p.seq_len(n);
  const std::int64_t reset = std::uniform_int_distribution<std::int64_t>(t0, t1 - 1)(rng);
  // Reset every value head at that token, so that the prefix and suffix runs are exact
  // counterparts (a reset in one head only leaves the others coupled across it).
  for (int j = 0; j < r.p.HV; ++j) {
    if (r.p.gate_mode == GateMode::direct) r.in.g[reset * r.p.HV + j] = -std::numeric_limits<double>::infinity();
    else r.in.a[reset * r.p.HV + j] = 1e4;
  }
  const Gradients<double> g = impl.run(r.p, r.in, r.b);
  Checks checks;
  {
    const HostTensor<double> at_reset = rows(r.p.gate_mode == GateMode::direct ? g.dg : g.da, reset, reset + 1);
    checks.compare(r.p.gate_mode == GateMode::direct ? "dg at the reset token (exactly 0)"
                                                     : "da at the reset token (exactly 0)",
                   HostTensor<double>(at_reset.shape()), at_reset, 0.0);
  }
  // Prefix alone (its dhT zero) and suffix alone from a zero state.
  const HostTensor<double> h0 = rows(r.in.h0, n, n + 1), dhT = rows(r.b.dhT, n, n + 1);
  const Run prefix = take(r, t0, reset, r.p.has_h0 ? &h0 : nullptr, false, nullptr);
  const Run suffix = take(r, reset, t1, nullptr, r.p.has_hT, r.b.dhT.defined() ? &dhT : nullptr);
  Gradients<double> gp = impl.run(prefix.p, prefix.in, prefix.b);
  const Gradients<double> gs = impl.run(suffix.p, suffix.in, suffix.b);
  const Gradients<double> joined = concatenate({gp, gs});
  const Budget budget = budget_of(impl, r);
  std::vector<const HostTensor<double>*> js;
  joined.for_each([&](const char*, const HostTensor<double>& t) { js.push_back(&t); });
  std::size_t i = 0;
  g.for_each([&](const char* name, const HostTensor<double>& t) {
    const HostTensor<double>& j = *js[i++];
    if (!t.defined()) return;
    const std::string s = name;
    if (per_token(s)) checks.compare(s + " (sequence " + std::to_string(n) + ")", rows(t, t0, t1), j, 3 * budget.of(s));
    else if (s == "dh0") checks.compare("dh0 (sequence " + std::to_string(n) + ")", rows(t, n, n + 1), j, 3 * budget.of(s));
  });
  std::ostringstream what;
  what << " (reset at token " << reset - t0 << " of sequence " << n << ")";
  return checks.result(header("backward_reset", impl, c) + what.str());
}

const std::vector<BackwardProperty>& all_backward_properties() {
  static const std::vector<BackwardProperty> properties{
      {"backward_matches_sequential", backward_matches_sequential},
      {"backward_state_carry", backward_state_carry},
      {"backward_packing_independence", backward_packing_independence},
      {"backward_linear_in_cotangents", backward_linear_in_cotangents},
      {"backward_gva_equals_repeated_heads", backward_gva_equals_repeated_heads},
      {"backward_pure_decay", backward_pure_decay},
      {"backward_reset", backward_reset},
  };
  return properties;
}

}  // namespace gdn::fuzz
