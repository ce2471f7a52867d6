// The property suite's own tests: (1) an independent, naive implementation of §2 (plain loops,
// no Eigen, written from the spec) passes every property; (2) copies of it with planted faults,
// each a bug real kernels have had, are caught: a property that cannot fail proves nothing.
// The fault x property table is printed, so what each property detects is on record.
#include <catch2/catch.hpp>

#include <cmath>
#include <iomanip>
#include <iostream>
#include <map>
#include <random>

#include "fuzz/catch_properties.hpp"
#include "fuzz/generators.hpp"
#include "fuzz/properties.hpp"

namespace {

using namespace gdn;
using fuzz::Case;
using fuzz::CaseSpace;

// The double references' budget, which the naive double implementation is held to too.
oracle::BudgetOptions analytic() {
  oracle::BudgetOptions budget;
  budget.model = oracle::BudgetModel::analytic;
  return budget;
}

enum class Fault {
  none,
  decay_after_write,      // S = e^g (S + k u^T) with u against the undecayed state
  read_before_write,      // o_t = S_{t-1}^T q: the output misses token t
  gva_modulo,             // value head j reads key head j % H instead of j / (HV / H)
  l2norm_without_eps,     // x / |x| instead of x / sqrt(|x|^2 + 1e-6)
  ignores_h0,             // starts every sequence from zero
  beta_squared,           // writes with beta^2
  drops_state_every_64,   // a chunked kernel that loses the carried state at chunk boundaries
  sequence_starts_late,   // cu_seqlens off by one: each later sequence's first token is run last in the one before
  padding_writes_output,  // -1 rows output ones instead of zeros
  touches_unnamed_slots,  // zeroes cache slots nobody names
  v_major_read_as_k_major, // state layout ignored on read
  states_before_write     // the per-token state of token t stored before its rank-one write
};

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::none: return "none";
    case Fault::decay_after_write: return "decay_after_write";
    case Fault::read_before_write: return "read_before_write";
    case Fault::gva_modulo: return "gva_modulo";
    case Fault::l2norm_without_eps: return "l2norm_without_eps";
    case Fault::ignores_h0: return "ignores_h0";
    case Fault::beta_squared: return "beta_squared";
    case Fault::drops_state_every_64: return "drops_state_every_64";
    case Fault::sequence_starts_late: return "sequence_starts_late";
    case Fault::padding_writes_output: return "padding_writes_output";
    case Fault::touches_unnamed_slots: return "touches_unnamed_slots";
    case Fault::v_major_read_as_k_major: return "v_major_read_as_k_major";
    case Fault::states_before_write: return "states_before_write";
  }
  return "?";
}

// §2 and §3 as loops over plain vectors, in double. Independent of reference/.
class Naive : public Implementation {
 public:
  explicit Naive(Fault fault) : fault_(fault) {}
  std::string name() const override { return std::string("naive.") + fault_name(fault_); }
  Formulation formulation() const override { return Formulation::sequential; }

  Outputs<double> run(const Problem& p, const Inputs& in) override {
    validate(p, in);
    const int H = p.H, HV = p.HV, K = p.K, V = p.V, G = p.group_size();
    const std::int64_t KV = std::int64_t(K) * V;
    Outputs<double> out;
    out.o = HostTensor<double>(p.v_shape());
    if (p.has_hT) out.hT = p.uses_state_cache() ? in.h0 : HostTensor<double>(p.state_shape());
    if (p.store_intermediate_states) out.intermediate = HostTensor<double>(p.intermediate_shape());
    auto offset = [&](int kk, int vv, bool v_major) {
      return v_major ? std::int64_t(vv) * K + kk : std::int64_t(kk) * V + vv;
    };
    const bool v_major = p.state_layout == StateLayout::v_major;
    const double scale = p.effective_scale();
    const double eps = fault_ == Fault::l2norm_without_eps ? 0.0 : 1e-6;
    std::vector<double> S(static_cast<std::size_t>(KV)), q(static_cast<std::size_t>(K)), k(q), Sk(static_cast<std::size_t>(V));
    for (int n = 0; n < p.N(); ++n) {
      const std::int64_t row = p.uses_state_cache() ? in.state_indices[static_cast<std::size_t>(n)] : n;
      std::int64_t begin = p.seq_begin(n), end = begin + p.seq_len(n);
      if (fault_ == Fault::sequence_starts_late) {
        if (n > 0 && begin < end) ++begin;
        if (n + 1 < p.N() && p.seq_len(n + 1) > 0) ++end;
      }
      if (row < 0) {
        if (fault_ == Fault::padding_writes_output)
          for (std::int64_t i = p.seq_begin(n) * HV * V; i < (p.seq_begin(n) + p.seq_len(n)) * HV * V; ++i) out.o[i] = 1;
        continue;
      }
      for (int j = 0; j < HV; ++j) {
        const int h = fault_ == Fault::gva_modulo ? j % H : j / G;
        const double* h0 = p.has_h0 ? in.h0.data() + (row * HV + j) * KV : nullptr;
        for (int kk = 0; kk < K; ++kk)
          for (int vv = 0; vv < V; ++vv)
            S[static_cast<std::size_t>(kk * V + vv)] =
                h0 && fault_ != Fault::ignores_h0
                    ? h0[offset(kk, vv, v_major && fault_ != Fault::v_major_read_as_k_major)]
                    : 0.0;
        for (std::int64_t t = begin; t < end; ++t) {
          if (fault_ == Fault::drops_state_every_64 && t > begin && (t - begin) % 64 == 0)
            std::fill(S.begin(), S.end(), 0.0);
          double qq = 0, kk2 = 0;
          for (int i = 0; i < K; ++i) {
            q[static_cast<std::size_t>(i)] = in.q[(t * H + h) * K + i];
            k[static_cast<std::size_t>(i)] = in.k[(t * H + h) * K + i];
            qq += q[static_cast<std::size_t>(i)] * q[static_cast<std::size_t>(i)];
            kk2 += k[static_cast<std::size_t>(i)] * k[static_cast<std::size_t>(i)];
          }
          if (p.use_qk_l2norm)
            for (int i = 0; i < K; ++i) {
              q[static_cast<std::size_t>(i)] /= std::sqrt(qq + eps);
              k[static_cast<std::size_t>(i)] /= std::sqrt(kk2 + eps);
            }
          double g, beta;
          const std::int64_t gi = t * HV + j;
          if (p.gate_mode == GateMode::direct) {
            g = in.g[gi];
            beta = in.beta[gi];
          } else {
            const double x = in.a[gi] + in.dt_bias[j];
            g = -std::exp(in.A_log[j]) * (x > 20 ? x : std::log1p(std::exp(x)));
            beta = (p.allow_negative_eigenvalues ? 2.0 : 1.0) / (1.0 + std::exp(-in.b[gi]));
          }
          if (fault_ == Fault::beta_squared) beta *= beta;
          const double decay = std::exp(g);
          double* o = out.o.data() + gi * V;
          auto read = [&]() {
            for (int vv = 0; vv < V; ++vv) {
              double sum = 0;
              for (int i = 0; i < K; ++i) sum += S[static_cast<std::size_t>(i * V + vv)] * q[static_cast<std::size_t>(i)];
              o[vv] = scale * sum;
            }
          };
          if (fault_ != Fault::decay_after_write)
            for (double& s : S) s *= decay;
          if (fault_ == Fault::read_before_write) read();
          for (int vv = 0; vv < V; ++vv) {
            double sum = 0;
            for (int i = 0; i < K; ++i) sum += S[static_cast<std::size_t>(i * V + vv)] * k[static_cast<std::size_t>(i)];
            Sk[static_cast<std::size_t>(vv)] = beta * (in.v[gi * V + vv] - sum);
          }
          if (fault_ == Fault::states_before_write && p.store_intermediate_states)
            for (int kk = 0; kk < K; ++kk)
              for (int vv = 0; vv < V; ++vv)
                out.intermediate[(t * HV + j) * KV + offset(kk, vv, v_major)] = S[static_cast<std::size_t>(kk * V + vv)];
          for (int i = 0; i < K; ++i)
            for (int vv = 0; vv < V; ++vv)
              S[static_cast<std::size_t>(i * V + vv)] += k[static_cast<std::size_t>(i)] * Sk[static_cast<std::size_t>(vv)];
          if (fault_ == Fault::decay_after_write)
            for (double& s : S) s *= decay;
          if (fault_ != Fault::read_before_write) read();
          if (p.store_intermediate_states && fault_ != Fault::states_before_write)
            for (int kk = 0; kk < K; ++kk)
              for (int vv = 0; vv < V; ++vv)
                out.intermediate[(t * HV + j) * KV + offset(kk, vv, v_major)] = S[static_cast<std::size_t>(kk * V + vv)];
        }
        if (p.has_hT)
          for (int kk = 0; kk < K; ++kk)
            for (int vv = 0; vv < V; ++vv)
              out.hT[(row * HV + j) * KV + offset(kk, vv, v_major)] = S[static_cast<std::size_t>(kk * V + vv)];
      }
    }
    if (fault_ == Fault::touches_unnamed_slots && p.has_hT && p.uses_state_cache()) {
      std::vector<bool> named(static_cast<std::size_t>(p.state_slots), false);
      for (std::int32_t s : in.state_indices)
        if (s >= 0) named[static_cast<std::size_t>(s)] = true;
      for (std::int64_t s = 0; s < p.state_slots; ++s)
        if (!named[static_cast<std::size_t>(s)])
          std::fill(out.hT.data() + s * HV * KV, out.hT.data() + (s + 1) * HV * KV, 0.0);
    }
    return out;
  }

 private:
  Fault fault_;
};

}  // namespace

TEST_CASE("an independent naive implementation passes every property", "[properties][naive]") {
  Naive impl(Fault::none);
  CaseSpace space;
  space.intermediate_states = true;
  space.max_work = 1e6;  // plain loops: slower than Eigen on the large cases
  const oracle::BudgetOptions budget = analytic();
  for (const fuzz::Property& property : fuzz::all_properties())
    fuzz::rc_section(impl.name() + ": " + property.name, [&]() {
      const Case c = *fuzz::gen_case(space);
      fuzz::rc_require(property.check(impl, c, budget));
    }, 200);
}

// Each planted fault must fail at least one property within a fixed set of cases (drawn at
// sizes 0..100 from a fixed seed, no shrinking: this is about power, not diagnosis), and the
// table shows which properties saw it. The relational properties (everything but the two
// oracle comparisons) must catch every fault that changes a relation: they are what a kernel
// is tested by when no oracle agrees with it to the last bit.
TEST_CASE("the property suite catches planted faults", "[properties][faults]") {
  const std::vector<Fault> faults{Fault::decay_after_write,    Fault::read_before_write,  Fault::gva_modulo,
                                  Fault::l2norm_without_eps,   Fault::ignores_h0,         Fault::beta_squared,
                                  Fault::drops_state_every_64, Fault::sequence_starts_late, Fault::padding_writes_output,
                                  Fault::touches_unnamed_slots, Fault::v_major_read_as_k_major,
                                  Fault::states_before_write};
  CaseSpace space;
  space.max_work = 3e5;
  const auto generator = fuzz::gen_case(space);
  const oracle::BudgetOptions budget = analytic();
  const int cases = 40;
  std::cout << "faults caught (cases out of " << cases << ") per property:\n" << std::setw(26) << "";
  for (const auto& property : fuzz::all_properties()) std::cout << " " << property.name.substr(0, 8);
  std::cout << "\n";
  for (Fault fault : faults) {
    Naive impl(fault);
    std::mt19937_64 rng(2024);
    std::map<std::string, int> caught;
    int total = 0, relational = 0;
    for (int i = 0; i < cases; ++i) {
      const Case c = generator(rc::Random(rng()), static_cast<int>(i * 100 / cases)).value();
      for (const auto& property : fuzz::all_properties()) {
        const fuzz::PropertyResult r = property.check(impl, c, budget);
        if (r.status == fuzz::PropertyStatus::fail) {
          ++caught[property.name];
          ++total;
          if (property.name != "matches_sequential" && property.name != "matches_long_double") ++relational;
        }
      }
    }
    std::cout << std::setw(26) << fault_name(fault);
    for (const auto& property : fuzz::all_properties()) std::cout << std::setw(9) << caught[property.name];
    std::cout << "\n";
    INFO("fault " << fault_name(fault));
    CHECK(total > 0);
    CHECK(caught["matches_sequential"] > 0);
    // Faults that only break agreement with the definition (not a relation) need an oracle.
    const bool relation_blind = fault == Fault::decay_after_write || fault == Fault::read_before_write ||
                                fault == Fault::beta_squared || fault == Fault::l2norm_without_eps;
    if (!relation_blind) CHECK(relational > 0);
    // Per-token states have their own anchor, which needs no oracle (the default space draws
    // them; the property switches them on in every case).
    if (fault == Fault::states_before_write) CHECK(caught["intermediate_states_anchor"] > 0);
  }
}
