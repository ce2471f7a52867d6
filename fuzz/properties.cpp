#include "fuzz/properties.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>

#include <rapidcheck.h>

#include "reference/precision.hpp"
#include "reference/prepare.hpp"
#include "reference/sequential.hpp"

namespace gdn::fuzz {

using oracle::Allowance;
using oracle::difference;
using oracle::Difference;

// ---------------------------------------------------------------------------------------------
// Building blocks

void l2normalize_rows(HostTensor<double>& x, int row_length) {
  for (std::int64_t r = 0; r * row_length < x.numel(); ++r) {
    double* row = x.data() + r * row_length;
    long double sum = 0;
    for (int i = 0; i < row_length; ++i) sum += static_cast<long double>(row[i]) * row[i];
    const long double inv = 1.0L / std::sqrt(sum + 1e-6L);
    for (int i = 0; i < row_length; ++i) row[i] = static_cast<double>(row[i] * inv);
  }
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Unsupported {
  std::string why;
};


// Collects the checks of one property evaluation.
class Report {
 public:
  // |actual - expected| <= allowed elementwise max; allowed = 0 demands equality (== on
  // doubles: bit for bit up to the sign of zero, NaN equal to NaN).
  void compare(const std::string& what, const HostTensor<double>& expected, const HostTensor<double>& actual,
               double allowed) {
    ++checks_;
    const Difference d = difference(expected, actual);
    const double margin = d.max_abs == 0 ? 0 : allowed > 0 ? d.max_abs / allowed : kInf;
    worst_ = std::max(worst_, margin);
    if (!(d.max_abs <= allowed)) {
      failed_ = true;
      failures_ << "  " << what << ": max error " << d.max_abs << " > allowed " << allowed;
      if (expected.shape() != actual.shape())
        failures_ << " (shape " << shape_string(actual.shape()) << ", expected " << shape_string(expected.shape())
                  << ")";
      else
        failures_ << " at " << index_string(expected.shape(), d.worst) << " of " << shape_string(expected.shape())
                  << ": got " << d.actual_at_worst << ", expected " << d.expected_at_worst;
      failures_ << "\n";
    }
  }
  void note(const std::string& text) { notes_ << "  " << text << "\n"; }
  PropertyResult result(const std::string& header) const {
    PropertyResult r;
    r.status = failed_ ? PropertyStatus::fail : PropertyStatus::pass;
    r.worst_margin = worst_;
    r.checks = checks_;
    if (failed_) r.message = header + "\n" + failures_.str() + notes_.str();
    return r;
  }

 private:
  std::ostringstream failures_, notes_;
  bool failed_ = false;
  double worst_ = 0;
  int checks_ = 0;
};

// What every property needs: the implementation, a reproducible random stream derived from
// the case's seed (a different one per property), and runs that refuse unsupported problems.
class Context {
 public:
  Context(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget, std::uint64_t salt)
      : impl(impl), c(c), budget(budget), rng(c.seed * 0x9E3779B97F4A7C15ull + salt) {}

  Outputs<double> run(const Problem& problem, const Inputs& inputs) {
    std::string why;
    if (!impl.supports(problem, &why)) throw Unsupported{why.empty() ? problem.describe() : why};
    return impl.run(problem, inputs);
  }
  bool supports(const Problem& problem) {
    std::string why;
    return impl.supports(problem, &why);
  }
  // The oracle's max-abs budget of a run whose exact outputs are `exact`.
  Allowance budget_of(const Problem& problem, const Inputs& inputs, const Outputs<double>& exact) {
    return oracle::max_abs_allowance(budget, problem, inputs, exact, impl.formulation(), impl.chunk_size());
  }
  // The run's budget when its exact outputs are not at hand. A calibrated budget measures the
  // baseline's error against the double reference; otherwise only max|exact| is needed and the
  // run's own output stands in for the exact value (they agree to the budget itself).
  Allowance allow(const Problem& problem, const Inputs& inputs, const Outputs<double>& out) {
    if (budget.model == oracle::BudgetModel::calibrated)
      return budget_of(problem, inputs, reference::sequential<double>(problem, inputs));
    return budget_of(problem, inputs, out);
  }
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  }
  bool coin(double p = 0.5) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

  Implementation& impl;
  const Case& c;
  const oracle::BudgetOptions& budget;
  std::mt19937_64 rng;
  Report report;
};

template <class Body>
PropertyResult evaluate(const char* name, std::uint64_t salt, Implementation& impl, const Case& c,
                        const oracle::BudgetOptions& budget, Body body) {
  Context context(impl, c, budget, salt);
  try {
    body(context);
  } catch (const Unsupported& u) {
    PropertyResult r;
    r.status = PropertyStatus::unsupported;
    r.message = std::string(name) + ": " + impl.name() + " does not support " + u.why;
    return r;
  }
  std::ostringstream header;
  header << name << " failed for " << impl.name() << " on " << c << " (budget " << budget.describe()
         << ")";
  return context.report.result(header.str());
}

// ----- sequences as pieces ---------------------------------------------------------------------

std::int64_t state_block_size(const Problem& p) { return std::int64_t(p.HV) * p.K * p.V; }

Shape state_block_shape(const Problem& p) {
  return p.state_layout == StateLayout::k_major ? Shape{p.HV, p.K, p.V} : Shape{p.HV, p.V, p.K};
}

std::int64_t state_row_of(const Problem& p, const Inputs& in, int n) {
  return p.uses_state_cache() ? in.state_indices[static_cast<std::size_t>(n)] : n;
}

// One sequence's data: the rows of every per-token tensor, and its initial state.
struct Piece {
  std::int64_t length = 0;
  std::vector<double> q, k, v, g, beta, a, b;
  std::vector<double> h0;  // one state block in the problem's layout; empty: zero
  bool padding = false;
};

Piece extract(const Problem& p, const Inputs& in, int n) {
  Piece piece;
  piece.length = p.seq_len(n);
  const std::int64_t t0 = p.seq_begin(n);
  auto rows = [&](const HostTensor<double>& x, std::int64_t width, std::vector<double>& out) {
    if (!x.defined()) return;
    out.assign(x.data() + t0 * width, x.data() + (t0 + piece.length) * width);
  };
  rows(in.q, std::int64_t(p.H) * p.K, piece.q);
  rows(in.k, std::int64_t(p.H) * p.K, piece.k);
  rows(in.v, std::int64_t(p.HV) * p.V, piece.v);
  rows(in.g, p.HV, piece.g);
  rows(in.beta, p.HV, piece.beta);
  rows(in.a, p.HV, piece.a);
  rows(in.b, p.HV, piece.b);
  const std::int64_t row = state_row_of(p, in, n);
  if (row < 0) {
    piece.padding = true;
  } else if (p.has_h0) {
    const std::int64_t block = state_block_size(p);
    piece.h0.assign(in.h0.data() + row * block, in.h0.data() + (row + 1) * block);
  }
  return piece;
}

Piece slice(const Piece& whole, const Problem& p, std::int64_t begin, std::int64_t end) {
  Piece part;
  part.length = end - begin;
  auto cut = [&](const std::vector<double>& x, std::int64_t width, std::vector<double>& out) {
    if (x.empty()) return;
    out.assign(x.begin() + begin * width, x.begin() + end * width);
  };
  cut(whole.q, std::int64_t(p.H) * p.K, part.q);
  cut(whole.k, std::int64_t(p.H) * p.K, part.k);
  cut(whole.v, std::int64_t(p.HV) * p.V, part.v);
  cut(whole.g, p.HV, part.g);
  cut(whole.beta, p.HV, part.beta);
  cut(whole.a, p.HV, part.a);
  cut(whole.b, p.HV, part.b);
  return part;
}

struct Packed {
  Problem problem;
  Inputs inputs;
  std::vector<std::int64_t> rows;  // state row of each piece (-1: padding)
};

constexpr double kCanary = 0.75;  // cache slots nobody names: must come back unchanged

// A problem shaped like `like` (heads, sizes, flags, dtypes, gates, layout) holding the pieces
// as its sequences, with has_h0 and has_hT on. Dense states when slots is empty; otherwise a
// cache of slot_count slots where piece i uses slots[i] (-1: padding) and the other slots hold
// kCanary. Per-head gate parameters come from like_inputs.
Packed assemble(const Problem& like, const Inputs& like_inputs, const std::vector<Piece>& pieces,
                const std::vector<std::int32_t>& slots = {}, std::int64_t slot_count = 0) {
  std::vector<std::int64_t> lengths;
  for (const Piece& piece : pieces) lengths.push_back(piece.length);
  Packed out;
  Problem& p = out.problem;
  p = like;
  const Problem shape = Problem::packed(lengths, like.H, like.HV, like.K, like.V);
  p.cu_seqlens = shape.cu_seqlens;
  p.T = shape.T;
  p.has_h0 = true;
  p.has_hT = true;
  p.state_slots = slots.empty() ? 0 : slot_count;
  Inputs& in = out.inputs;
  auto concat = [&](HostTensor<double>& dst, Shape dst_shape, std::vector<double> Piece::*member) {
    dst = HostTensor<double>(std::move(dst_shape));
    std::int64_t offset = 0;
    for (const Piece& piece : pieces) {
      const std::vector<double>& src = piece.*member;
      std::copy(src.begin(), src.end(), dst.data() + offset);
      offset += static_cast<std::int64_t>(src.size());
    }
  };
  concat(in.q, p.q_shape(), &Piece::q);
  concat(in.k, p.q_shape(), &Piece::k);
  concat(in.v, p.v_shape(), &Piece::v);
  if (p.gate_mode == GateMode::direct) {
    concat(in.g, p.gate_shape(), &Piece::g);
    concat(in.beta, p.gate_shape(), &Piece::beta);
  } else {
    concat(in.a, p.gate_shape(), &Piece::a);
    concat(in.b, p.gate_shape(), &Piece::b);
    in.A_log = like_inputs.A_log;
    in.dt_bias = like_inputs.dt_bias;
  }
  const std::int64_t block = state_block_size(p);
  in.h0 = HostTensor<double>(p.state_shape(), slots.empty() ? 0.0 : kCanary);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const std::int64_t row = slots.empty() ? std::int64_t(i) : slots[i];
    out.rows.push_back(row);
    if (row < 0) continue;
    double* dst = in.h0.data() + row * block;
    if (pieces[i].h0.empty()) std::fill(dst, dst + block, 0.0);
    else std::copy(pieces[i].h0.begin(), pieces[i].h0.end(), dst);
  }
  if (!slots.empty()) in.state_indices = slots;
  return out;
}

HostTensor<double> o_rows(const Problem& p, const HostTensor<double>& o, int n) {
  HostTensor<double> rows({p.seq_len(n), p.HV, p.V});
  const std::int64_t width = std::int64_t(p.HV) * p.V;
  std::copy(o.data() + p.seq_begin(n) * width, o.data() + (p.seq_begin(n) + p.seq_len(n)) * width, rows.data());
  return rows;
}

HostTensor<double> intermediate_rows(const Problem& p, const HostTensor<double>& states, int n,
                                     std::int64_t from = 0) {
  Shape shape = state_block_shape(p);
  shape.insert(shape.begin(), p.seq_len(n) - from);
  HostTensor<double> rows(shape);
  const std::int64_t block = state_block_size(p);
  const std::int64_t t0 = p.seq_begin(n) + from;
  std::copy(states.data() + t0 * block, states.data() + (p.seq_begin(n) + p.seq_len(n)) * block, rows.data());
  return rows;
}

HostTensor<double> state_block(const Problem& p, const HostTensor<double>& states, std::int64_t row) {
  HostTensor<double> block(state_block_shape(p));
  const std::int64_t size = state_block_size(p);
  std::copy(states.data() + row * size, states.data() + (row + 1) * size, block.data());
  return block;
}

HostTensor<double> from_vector(Shape shape, const std::vector<double>& values) {
  HostTensor<double> t(std::move(shape));
  if (!values.empty()) std::copy(values.begin(), values.end(), t.data());
  return t;
}

// Sequences that read and write a state (not padding), non-empty ones first if any.
std::vector<int> live_sequences(const Problem& p, const Inputs& in, bool nonempty) {
  std::vector<int> out;
  for (int n = 0; n < p.N(); ++n)
    if (state_row_of(p, in, n) >= 0 && (!nonempty || p.seq_len(n) > 0)) out.push_back(n);
  return out;
}

// Largest |scale * q^_t|_1 over the problem's tokens: how much a state error can grow into o.
double query_gain(const Problem& p, const Inputs& in) {
  double gain = 0;
  const double scale = std::fabs(p.effective_scale());
  for (std::int64_t r = 0; r < p.T * p.H; ++r) {
    const double* row = in.q.data() + r * p.K;
    double sum = 0, sq = 0;
    for (int i = 0; i < p.K; ++i) {
      sum += std::fabs(row[i]);
      sq += row[i] * row[i];
    }
    if (p.use_qk_l2norm) sum /= std::sqrt(sq + 1e-6);
    gain = std::max(gain, scale * sum);
  }
  return gain;
}

// The case with l2norm switched off and the keys it had normalised beforehand (rounded to the
// input dtype), so the recurrence stays contractive; queries keep their raw values.
Inputs without_l2norm(Problem& p, Inputs in) {
  if (p.use_qk_l2norm) {
    p.use_qk_l2norm = false;
    l2normalize_rows(in.k, p.K);
    reference::round_in_place(p.input_dtype, in.k);
  }
  return in;
}

// Complementary random masks: x1 = mask . x, x2 = (1 - mask) . x, and x3 = a x1 + b x2
// elementwise (each element is a x or b x: exact for a, b powers of two).
struct Split {
  HostTensor<double> first, second, combined;
};
Split split(const HostTensor<double>& x, double a, double b, std::mt19937_64& rng) {
  Split s{x, x, x};
  std::bernoulli_distribution mask(0.5);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    if (mask(rng)) {
      s.second[i] = 0;
      s.combined[i] = a * x[i];
    } else {
      s.first[i] = 0;
      s.combined[i] = b * x[i];
    }
  }
  return s;
}

double power_of_two_coefficient(Context& ctx) {
  const double magnitude = std::ldexp(1.0, static_cast<int>(ctx.uniform(0, 2)));
  return ctx.coin() ? magnitude : -magnitude;
}

// a x + b y elementwise, plus the rounding of that sum in double (one u per element).
struct Combination {
  HostTensor<double> value;
  double rounding = 0;
};
Combination combine(double a, const HostTensor<double>& x, double b, const HostTensor<double>& y) {
  Combination c{HostTensor<double>(x.shape()), 0};
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    c.value[i] = a * x[i] + b * y[i];
    c.rounding = std::max(c.rounding, 0x1p-53 * (std::fabs(a * x[i]) + std::fabs(b * y[i])));
  }
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// (a) and (j): against an oracle

namespace {
template <class Oracle>
void against_oracle(Context& ctx, Oracle oracle) {
  const Problem& p = ctx.c.problem;
  const Inputs in = ctx.c.inputs();
  const Outputs<double> out = ctx.run(p, in);
  const Outputs<double> exact = oracle(p, in);
  const Allowance a = ctx.budget_of(p, in, exact);
  ctx.report.compare("o", exact.o, out.o, a.o);
  if (p.has_hT) ctx.report.compare("hT", exact.hT, out.hT, a.hT);
  if (p.store_intermediate_states) ctx.report.compare("intermediate", exact.intermediate, out.intermediate, a.intermediate);
}
}  // namespace

PropertyResult matches_sequential(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget) {
  return evaluate("matches_sequential", 1, impl, c, budget, [](Context& ctx) {
    against_oracle(ctx, [](const Problem& p, const Inputs& in) { return reference::sequential<double>(p, in); });
  });
}

PropertyResult matches_long_double(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget) {
  return evaluate("matches_long_double", 10, impl, c, budget, [](Context& ctx) {
    against_oracle(ctx, [](const Problem& p, const Inputs& in) {
      return reference::sequential<long double>(p, in).cast<double>();
    });
  });
}

// ---------------------------------------------------------------------------------------------
// (b) state carry

PropertyResult state_carry(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget) {
  return evaluate("state_carry", 2, impl, c, budget, [](Context& ctx) {
    const Problem& p = ctx.c.problem;
    const Inputs in = ctx.c.inputs();
    std::vector<int> candidates = live_sequences(p, in, true);
    if (candidates.empty()) candidates = live_sequences(p, in, false);
    if (candidates.empty()) return;  // every sequence is padding: nothing carries a state
    const int n = candidates[static_cast<std::size_t>(ctx.uniform(0, std::int64_t(candidates.size()) - 1))];
    const Piece whole = extract(p, in, n);
    const std::int64_t L = whole.length;

    const Packed alone = assemble(p, in, {whole});
    const Outputs<double> full = ctx.run(alone.problem, alone.inputs);
    Allowance allowed = ctx.allow(alone.problem, alone.inputs, full);

    std::vector<std::int64_t> cuts{0, L};
    const int splits = static_cast<int>(ctx.uniform(1, 4));
    for (int s = 0; s < splits; ++s) cuts.push_back(ctx.uniform(0, L));
    std::sort(cuts.begin(), cuts.end());

    const Problem& q = alone.problem;
    HostTensor<double> o_parts({L, q.HV, q.V});
    HostTensor<double> states_parts;
    if (q.store_intermediate_states) states_parts = intermediate_rows(q, full.intermediate, 0);
    std::vector<double> state = whole.h0;
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
      Piece part = slice(whole, q, cuts[i], cuts[i + 1]);
      part.h0 = state;
      const Packed packed = assemble(q, in, {part});
      const Outputs<double> out = ctx.run(packed.problem, packed.inputs);
      allowed += ctx.allow(packed.problem, packed.inputs, out);
      const std::int64_t width = std::int64_t(q.HV) * q.V;
      std::copy(out.o.data(), out.o.data() + part.length * width, o_parts.data() + cuts[i] * width);
      if (q.store_intermediate_states) {
        const std::int64_t block = state_block_size(q);
        std::copy(out.intermediate.data(), out.intermediate.data() + part.length * block,
                  states_parts.data() + cuts[i] * block);
      }
      state = out.hT.storage();  // the implementation's own final state, unchanged
    }
    // A state error grows into o by at most |scale q^|_1 and, through the non-expansive
    // recurrence, into a later state by at most sqrt(K) in max-abs terms.
    const double gain = query_gain(q, alone.inputs);
    const double state_growth = 1 + std::sqrt(double(q.K));
    ctx.report.compare("o (whole vs split at " + std::to_string(splits) + " points)", o_rows(q, full.o, 0), o_parts,
                       allowed.o + gain * state_growth * allowed.hT);
    ctx.report.compare("hT (whole vs carried)", state_block(q, full.hT, 0),
                       from_vector(state_block_shape(q), state), state_growth * allowed.hT);
    if (q.store_intermediate_states)
      ctx.report.compare("intermediate (whole vs carried)", intermediate_rows(q, full.intermediate, 0), states_parts,
                         state_growth * (allowed.hT + allowed.intermediate));
  });
}

// ---------------------------------------------------------------------------------------------
// (c) packing independence

PropertyResult packing_independence(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget) {
  return evaluate("packing_independence", 3, impl, c, budget, [](Context& ctx) {
    const Problem& p = ctx.c.problem;
    const Inputs in = ctx.c.inputs();
    const std::vector<int> candidates = live_sequences(p, in, false);
    if (candidates.empty()) return;
    const int n = candidates[static_cast<std::size_t>(ctx.uniform(0, std::int64_t(candidates.size()) - 1))];
    const Piece target = extract(p, in, n);

    // Random neighbours, no longer than the target or a chunk, from another seed.
    const std::int64_t C = std::max(ctx.impl.chunk_size(), 1);
    const std::int64_t limit = std::max<std::int64_t>(target.length, 2);
    const int count = static_cast<int>(ctx.uniform(1, 3));
    std::vector<std::int64_t> lengths;
    for (int i = 0; i < count; ++i) {
      const std::int64_t special[] = {0, 1, C - 1, C, C + 1};
      std::int64_t l = ctx.coin() ? special[ctx.uniform(0, 4)] : ctx.uniform(0, limit);
      lengths.push_back(std::clamp<std::int64_t>(l, 0, limit));
    }
    Problem np = Problem::packed(lengths, p.H, p.HV, p.K, p.V);
    np.use_qk_l2norm = p.use_qk_l2norm;
    np.has_h0 = true;
    np.input_dtype = p.input_dtype;
    np.gate_dtype = p.gate_dtype;
    np.gate_mode = p.gate_mode;
    np.allow_negative_eigenvalues = p.allow_negative_eigenvalues;
    np.state_layout = p.state_layout;
    const Inputs neighbour_inputs = make_inputs(np, ctx.c.options, ctx.rng());
    std::vector<Piece> pieces;
    for (int i = 0; i < count; ++i) pieces.push_back(extract(np, neighbour_inputs, i));
    const std::size_t position = static_cast<std::size_t>(ctx.uniform(0, count));
    pieces.insert(pieces.begin() + static_cast<std::ptrdiff_t>(position), target);

    Packed alone, packed;
    if (p.uses_state_cache()) {
      const std::int64_t slot_count = std::int64_t(pieces.size()) + ctx.uniform(0, 2);
      std::vector<std::int32_t> order(static_cast<std::size_t>(slot_count));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), ctx.rng);
      std::vector<std::int32_t> slots(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(pieces.size()));
      for (std::size_t i = 0; i < pieces.size(); ++i)
        if (i != position && ctx.coin(0.3)) slots[i] = -1;
      packed = assemble(p, in, pieces, slots, slot_count);
      alone = assemble(p, in, {target}, {0}, 1);
    } else {
      packed = assemble(p, in, pieces);
      alone = assemble(p, in, {target});
    }
    const Outputs<double> out_alone = ctx.run(alone.problem, alone.inputs);
    const Outputs<double> out_packed = ctx.run(packed.problem, packed.inputs);
    const Allowance allowed{};  // batch invariance: bit for bit
    const Problem& a = alone.problem;
    const Problem& b = packed.problem;
    const int m = static_cast<int>(position);
    ctx.report.compare("o of the sequence alone vs packed at " + std::to_string(position), o_rows(a, out_alone.o, 0),
                       o_rows(b, out_packed.o, m), allowed.o);
    ctx.report.compare("final state alone vs packed", state_block(a, out_alone.hT, alone.rows[0]),
                       state_block(b, out_packed.hT, packed.rows[position]), allowed.hT);
    if (a.store_intermediate_states)
      ctx.report.compare("intermediate alone vs packed", intermediate_rows(a, out_alone.intermediate, 0),
                         intermediate_rows(b, out_packed.intermediate, m), allowed.intermediate);
    // Padding rows output zeros; slots nobody names are not touched.
    for (std::size_t i = 0; i < pieces.size(); ++i)
      if (packed.rows[i] < 0) {
        const HostTensor<double> rows = o_rows(b, out_packed.o, static_cast<int>(i));
        ctx.report.compare("o of padding sequence " + std::to_string(i) + " (must be 0)",
                           HostTensor<double>(rows.shape()), rows, 0.0);
      }
    if (b.uses_state_cache()) {
      std::vector<bool> named(static_cast<std::size_t>(b.state_slots), false);
      for (std::int64_t row : packed.rows)
        if (row >= 0) named[static_cast<std::size_t>(row)] = true;
      for (std::int64_t s = 0; s < b.state_slots; ++s)
        if (!named[static_cast<std::size_t>(s)])
          ctx.report.compare("cache slot " + std::to_string(s) + " nobody names (must be unchanged)",
                             state_block(b, packed.inputs.h0, s), state_block(b, out_packed.hT, s), 0.0);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// (d) GVA

PropertyResult gva_equals_repeated_heads(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget) {
  return evaluate("gva_equals_repeated_heads", 4, impl, c, budget, [](Context& ctx) {
    Problem gva = ctx.c.problem;
    Inputs in;
    if (gva.group_size() == 1) {
      gva.HV = 2 * gva.H;
      in = make_inputs(gva, ctx.c.options, ctx.c.seed);
    } else {
      in = ctx.c.inputs();
    }
    Problem mha = gva;
    mha.H = gva.HV;
    Inputs repeated = in;
    repeated.q = HostTensor<double>(mha.q_shape());
    repeated.k = HostTensor<double>(mha.q_shape());
    for (std::int64_t t = 0; t < gva.T; ++t)
      for (int j = 0; j < gva.HV; ++j) {
        const int h = j / gva.group_size();
        for (int i = 0; i < gva.K; ++i) {
          repeated.q[(t * mha.H + j) * gva.K + i] = in.q[(t * gva.H + h) * gva.K + i];
          repeated.k[(t * mha.H + j) * gva.K + i] = in.k[(t * gva.H + h) * gva.K + i];
        }
      }
    const Outputs<double> out_gva = ctx.run(gva, in);
    const Outputs<double> out_mha = ctx.run(mha, repeated);
    Allowance allowed = ctx.allow(gva, in, out_gva);
    allowed += ctx.allow(mha, repeated, out_mha);
    ctx.report.compare("o (GVA vs repeated heads)", out_mha.o, out_gva.o, allowed.o);
    if (gva.has_hT) ctx.report.compare("hT (GVA vs repeated heads)", out_mha.hT, out_gva.hT, allowed.hT);
    if (gva.store_intermediate_states)
      ctx.report.compare("intermediate (GVA vs repeated heads)", out_mha.intermediate, out_gva.intermediate,
                         allowed.intermediate);
  });
}

// ---------------------------------------------------------------------------------------------
// (e) l2norm

PropertyResult l2norm_equals_prenormalized(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget) {
  return evaluate("l2norm_equals_prenormalized", 5, impl, c, budget, [](Context& ctx) {
    Problem on = ctx.c.problem;
    on.use_qk_l2norm = true;
    const Inputs in_on = make_inputs(on, ctx.c.options, ctx.c.seed);

    Problem off = on;
    off.use_qk_l2norm = false;
    Inputs in_off = in_on;
    l2normalize_rows(in_off.q, on.K);
    l2normalize_rows(in_off.k, on.K);
    Problem off_f64 = off;
    off_f64.input_dtype = DType::f64;
    if (off_f64.gate_dtype != DType::f32) off_f64.gate_dtype = DType::f32;  // gates are f32-representable
    double rounding_o = 0, rounding_hT = 0, rounding_intermediate = 0;
    if (ctx.supports(off_f64)) {
      off = off_f64;
    } else {
      // The implementation takes only its storage dtypes: round the normalised inputs and
      // add what that rounding changes in the exact operator on this input.
      Inputs rounded = in_off;
      reference::round_in_place(off.input_dtype, rounded.q);
      reference::round_in_place(off.input_dtype, rounded.k);
      const Outputs<double> exact_unrounded = reference::sequential<double>(off_f64, in_off);
      const Outputs<double> exact_rounded = reference::sequential<double>(off, rounded);
      rounding_o = difference(exact_unrounded.o, exact_rounded.o).max_abs;
      rounding_hT = difference(exact_unrounded.hT, exact_rounded.hT).max_abs;
      rounding_intermediate = difference(exact_unrounded.intermediate, exact_rounded.intermediate).max_abs;
      in_off = rounded;
    }
    const Outputs<double> out_on = ctx.run(on, in_on);
    const Outputs<double> out_off = ctx.run(off, in_off);
    Allowance allowed = ctx.allow(on, in_on, out_on);
    allowed += ctx.allow(off, in_off, out_off);
    ctx.report.compare("o (l2norm flag vs pre-normalised)", out_off.o, out_on.o, allowed.o + rounding_o);
    if (on.has_hT)
      ctx.report.compare("hT (l2norm flag vs pre-normalised)", out_off.hT, out_on.hT, allowed.hT + rounding_hT);
    if (on.store_intermediate_states)
      ctx.report.compare("intermediate (l2norm flag vs pre-normalised)", out_off.intermediate, out_on.intermediate,
                         allowed.intermediate + rounding_intermediate);
  });
}

// ---------------------------------------------------------------------------------------------
// (f) linearity

PropertyResult linear_in_q(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget) {
  return evaluate("linear_in_q", 6, impl, c, budget, [](Context& ctx) {
    Problem p = ctx.c.problem;
    const Inputs base = without_l2norm(p, ctx.c.inputs());
    const double a = power_of_two_coefficient(ctx), b = power_of_two_coefficient(ctx);
    const Split q = split(base.q, a, b, ctx.rng);
    Inputs in1 = base, in2 = base, in3 = base;
    in1.q = q.first;
    in2.q = q.second;
    in3.q = q.combined;
    const Outputs<double> r1 = ctx.run(p, in1), r2 = ctx.run(p, in2), r3 = ctx.run(p, in3);
    const Allowance a1 = ctx.allow(p, in1, r1), a2 = ctx.allow(p, in2, r2), a3 = ctx.allow(p, in3, r3);
    const Combination expected = combine(a, r1.o, b, r2.o);
    std::ostringstream what;
    what << "o(" << a << " q1 + " << b << " q2) vs " << a << " o(q1) + " << b << " o(q2)";
    ctx.report.compare(what.str(), expected.value, r3.o,
                       a3.o + std::fabs(a) * a1.o + std::fabs(b) * a2.o + expected.rounding);
    if (p.has_hT) {
      ctx.report.compare("hT(q1) vs hT(a q1 + b q2) (independent of q)", r1.hT, r3.hT, a1.hT + a3.hT);
      ctx.report.compare("hT(q2) vs hT(a q1 + b q2) (independent of q)", r2.hT, r3.hT, a2.hT + a3.hT);
    }
  });
}

PropertyResult linear_in_v_and_h0(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget) {
  return evaluate("linear_in_v_and_h0", 7, impl, c, budget, [](Context& ctx) {
    Problem p = ctx.c.problem;
    p.has_h0 = true;
    p.has_hT = true;
    const Inputs base = make_inputs(p, ctx.c.options, ctx.c.seed);
    const double a = power_of_two_coefficient(ctx), b = power_of_two_coefficient(ctx);
    const Split v = split(base.v, a, b, ctx.rng);
    const Split h0 = split(base.h0, a, b, ctx.rng);
    Inputs in1 = base, in2 = base, in3 = base;
    in1.v = v.first;
    in1.h0 = h0.first;
    in2.v = v.second;
    in2.h0 = h0.second;
    in3.v = v.combined;
    in3.h0 = h0.combined;
    const Outputs<double> r1 = ctx.run(p, in1), r2 = ctx.run(p, in2), r3 = ctx.run(p, in3);
    const Allowance a1 = ctx.allow(p, in1, r1), a2 = ctx.allow(p, in2, r2), a3 = ctx.allow(p, in3, r3);
    std::ostringstream coefficients;
    coefficients << "(a, b) = (" << a << ", " << b << ")";
    const Combination o = combine(a, r1.o, b, r2.o);
    ctx.report.compare("o(a v1 + b v2, a h01 + b h02) vs a o1 + b o2, " + coefficients.str(), o.value, r3.o,
                       a3.o + std::fabs(a) * a1.o + std::fabs(b) * a2.o + o.rounding);
    const Combination hT = combine(a, r1.hT, b, r2.hT);
    ctx.report.compare("hT(a v1 + b v2, a h01 + b h02) vs a hT1 + b hT2, " + coefficients.str(), hT.value, r3.hT,
                       a3.hT + std::fabs(a) * a1.hT + std::fabs(b) * a2.hT + hT.rounding);
    if (p.store_intermediate_states) {
      const Combination s = combine(a, r1.intermediate, b, r2.intermediate);
      ctx.report.compare("intermediate states, " + coefficients.str(), s.value, r3.intermediate,
                         a3.intermediate + std::fabs(a) * a1.intermediate + std::fabs(b) * a2.intermediate +
                             s.rounding);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// (g) beta = 0

PropertyResult pure_decay(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget) {
  return evaluate("pure_decay", 8, impl, c, budget, [](Context& ctx) {
    Problem p = ctx.c.problem;
    p.gate_mode = GateMode::direct;
    p.allow_negative_eigenvalues = false;
    p.has_h0 = true;
    p.has_hT = true;
    Inputs in = make_inputs(p, ctx.c.options, ctx.c.seed);
    for (std::int64_t i = 0; i < in.beta.numel(); ++i) in.beta[i] = 0.0;

    // The closed form in long double: S_t = exp(G_t) S_0, o_t = S_t^T (scale q^_t).
    Outputs<double> expected;
    expected.o = HostTensor<double>(p.v_shape());
    expected.hT = in.h0;  // slots nobody names stay as they are
    if (p.store_intermediate_states) expected.intermediate = HostTensor<double>(p.intermediate_shape());
    const bool k_major = p.state_layout == StateLayout::k_major;
    std::vector<long double> qhat(static_cast<std::size_t>(p.K));
    for (int n = 0; n < p.N(); ++n) {
      const std::int64_t row = state_row_of(p, in, n);
      if (row < 0) continue;
      for (int j = 0; j < p.HV; ++j) {
        const int h = j / p.group_size();
        const double* S0 = in.h0.data() + (row * p.HV + j) * std::int64_t(p.K) * p.V;
        auto s0 = [&](int kk, int vv) -> long double {
          return k_major ? S0[std::int64_t(kk) * p.V + vv] : S0[std::int64_t(vv) * p.K + kk];
        };
        long double G = 0;
        for (std::int64_t t = p.seq_begin(n); t < p.seq_begin(n) + p.seq_len(n); ++t) {
          G += in.g[t * p.HV + j];
          const long double decay = std::exp(G);
          long double norm = 0;
          for (int i = 0; i < p.K; ++i) {
            qhat[static_cast<std::size_t>(i)] = in.q[(t * p.H + h) * p.K + i];
            norm += qhat[static_cast<std::size_t>(i)] * qhat[static_cast<std::size_t>(i)];
          }
          const long double factor =
              static_cast<long double>(p.effective_scale()) / (p.use_qk_l2norm ? std::sqrt(norm + 1e-6L) : 1.0L);
          for (int vv = 0; vv < p.V; ++vv) {
            long double sum = 0;
            for (int i = 0; i < p.K; ++i) sum += s0(i, vv) * qhat[static_cast<std::size_t>(i)];
            expected.o[(t * p.HV + j) * p.V + vv] = static_cast<double>(decay * factor * sum);
          }
          if (p.store_intermediate_states) {
            double* dst = expected.intermediate.data() + (t * p.HV + j) * std::int64_t(p.K) * p.V;
            for (std::int64_t e = 0; e < std::int64_t(p.K) * p.V; ++e) dst[e] = static_cast<double>(decay * S0[e]);
          }
        }
        double* dst = expected.hT.data() + (row * p.HV + j) * std::int64_t(p.K) * p.V;
        const long double decay = std::exp(G);
        for (std::int64_t e = 0; e < std::int64_t(p.K) * p.V; ++e) dst[e] = static_cast<double>(decay * S0[e]);
      }
    }
    const Outputs<double> out = ctx.run(p, in);
    const Allowance a = ctx.budget_of(p, in, expected);
    ctx.report.compare("o (beta = 0: exp(sum g) S0^T scale q^)", expected.o, out.o, a.o);
    ctx.report.compare("hT (beta = 0: exp(sum g) S0)", expected.hT, out.hT, a.hT);
    if (p.store_intermediate_states)
      ctx.report.compare("intermediate (beta = 0)", expected.intermediate, out.intermediate, a.intermediate);
  });
}

// ---------------------------------------------------------------------------------------------
// (h) underflowing gate resets

PropertyResult underflow_resets(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget) {
  return evaluate("underflow_resets", 9, impl, c, budget, [](Context& ctx) {
    const Problem& p = ctx.c.problem;
    Inputs first = ctx.c.inputs();
    const std::vector<int> candidates = live_sequences(p, first, true);
    if (candidates.empty()) return;
    const int n = candidates[static_cast<std::size_t>(ctx.uniform(0, std::int64_t(candidates.size()) - 1))];
    const std::int64_t begin = p.seq_begin(n), L = p.seq_len(n);
    const std::int64_t reset = ctx.uniform(0, L - 1);  // position in the sequence
    const std::int64_t t_reset = begin + reset;
    for (int j = 0; j < p.HV; ++j) {
      if (p.gate_mode == GateMode::direct) first.g[t_reset * p.HV + j] = reference::round_to(p.gate_dtype, -1e4);
      else first.a[t_reset * p.HV + j] = reference::round_to(p.gate_dtype, 1e4);  // softplus(a) = a
    }
    // Second input: everything before the reset token (and h0) replaced, the gates g (or a) kept.
    Inputs second = first;
    const Inputs other = make_inputs(p, ctx.c.options, ctx.rng());
    auto replace_rows = [&](HostTensor<double>& dst, const HostTensor<double>& src, std::int64_t width) {
      if (!dst.defined()) return;
      std::copy(src.data() + begin * width, src.data() + t_reset * width, dst.data() + begin * width);
    };
    replace_rows(second.q, other.q, std::int64_t(p.H) * p.K);
    replace_rows(second.k, other.k, std::int64_t(p.H) * p.K);
    replace_rows(second.v, other.v, std::int64_t(p.HV) * p.V);
    replace_rows(second.beta, other.beta, p.HV);
    replace_rows(second.b, other.b, p.HV);
    const std::int64_t row = state_row_of(p, first, n);
    if (p.has_h0) {
      const std::int64_t block = state_block_size(p);
      std::copy(other.h0.data() + row * block, other.h0.data() + (row + 1) * block, second.h0.data() + row * block);
    }
    const Outputs<double> r1 = ctx.run(p, first), r2 = ctx.run(p, second);
    const Allowance allowed{};  // identical data from the reset on: bit for bit
    const HostTensor<double> o1 = o_rows(p, r1.o, n), o2 = o_rows(p, r2.o, n);
    const std::int64_t width = std::int64_t(p.HV) * p.V;
    HostTensor<double> after1({L - reset, p.HV, p.V}), after2({L - reset, p.HV, p.V});
    std::copy(o1.data() + reset * width, o1.data() + L * width, after1.data());
    std::copy(o2.data() + reset * width, o2.data() + L * width, after2.data());
    ctx.report.compare("o from the reset token (position " + std::to_string(reset) + " of sequence " +
                           std::to_string(n) + ") on, with earlier tokens and h0 replaced",
                       after1, after2, allowed.o);
    if (p.has_hT)
      ctx.report.compare("final state with earlier tokens and h0 replaced", state_block(p, r1.hT, row),
                         state_block(p, r2.hT, row), allowed.hT);
    if (p.store_intermediate_states)
      ctx.report.compare("intermediate states from the reset token on", intermediate_rows(p, r1.intermediate, n, reset),
                         intermediate_rows(p, r2.intermediate, n, reset), allowed.intermediate);
  });
}

// ---------------------------------------------------------------------------------------------
// (i) exact store and retrieve

PropertyResult exact_store_and_retrieve(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget) {
  return evaluate("exact_store_and_retrieve", 11, impl, c, budget, [](Context& ctx) {
    Problem p = ctx.c.problem;
    p.use_qk_l2norm = false;  // l2norm(e_i) = e_i / sqrt(1 + 1e-6) is not a unit vector
    p.scale = 1.0;
    p.gate_mode = GateMode::direct;
    p.allow_negative_eigenvalues = false;
    p.has_hT = true;
    // Values on the grid k / 16, |k| <= 64: every sum and difference the recurrence or the
    // chunked form makes of them is exact in fp32 (and bf16 holds the values themselves).
    auto dyadic = [&]() { return static_cast<double>(ctx.uniform(-64, 64)) / 16.0; };
    Inputs in;
    in.q = HostTensor<double>(p.q_shape());
    in.k = HostTensor<double>(p.q_shape());
    std::vector<int> key_of(static_cast<std::size_t>(p.T * p.H));
    for (std::int64_t r = 0; r < p.T * p.H; ++r) {
      const int i = static_cast<int>(ctx.uniform(0, p.K - 1));  // repeats on purpose: overwrites
      key_of[static_cast<std::size_t>(r)] = i;
      in.q[r * p.K + i] = 1.0;
      in.k[r * p.K + i] = 1.0;
    }
    in.v = HostTensor<double>(p.v_shape());
    for (std::int64_t i = 0; i < in.v.numel(); ++i) in.v[i] = dyadic();
    in.g = HostTensor<double>(p.gate_shape(), 0.0);
    in.beta = HostTensor<double>(p.gate_shape(), 1.0);
    if (p.has_h0 || p.uses_state_cache()) {
      in.h0 = HostTensor<double>(p.state_shape());
      for (std::int64_t i = 0; i < in.h0.numel(); ++i) in.h0[i] = dyadic();
    }
    if (p.uses_state_cache()) in.state_indices = make_inputs(ctx.c.problem, ctx.c.options, ctx.c.seed).state_indices;

    Outputs<double> expected;
    expected.o = HostTensor<double>(p.v_shape());
    expected.hT = p.uses_state_cache() ? in.h0 : HostTensor<double>(p.state_shape());
    if (p.store_intermediate_states) expected.intermediate = HostTensor<double>(p.intermediate_shape());
    const bool k_major = p.state_layout == StateLayout::k_major;
    const std::int64_t KV = std::int64_t(p.K) * p.V;
    std::vector<double> S(static_cast<std::size_t>(KV));
    auto at = [&](int kk, int vv) -> double& {
      return S[static_cast<std::size_t>(k_major ? std::int64_t(kk) * p.V + vv : std::int64_t(vv) * p.K + kk)];
    };
    for (int n = 0; n < p.N(); ++n) {
      const std::int64_t row = state_row_of(p, in, n);
      if (row < 0) continue;
      for (int j = 0; j < p.HV; ++j) {
        const int h = j / p.group_size();
        if (p.has_h0) std::copy(in.h0.data() + (row * p.HV + j) * KV, in.h0.data() + (row * p.HV + j + 1) * KV, S.begin());
        else std::fill(S.begin(), S.end(), 0.0);
        for (std::int64_t t = p.seq_begin(n); t < p.seq_begin(n) + p.seq_len(n); ++t) {
          const int key = key_of[static_cast<std::size_t>(t * p.H + h)];
          for (int vv = 0; vv < p.V; ++vv) {
            at(key, vv) = in.v[(t * p.HV + j) * p.V + vv];
            expected.o[(t * p.HV + j) * p.V + vv] = at(key, vv);
          }
          if (p.store_intermediate_states)
            std::copy(S.begin(), S.end(), expected.intermediate.data() + (t * p.HV + j) * KV);
        }
        std::copy(S.begin(), S.end(), expected.hT.data() + (row * p.HV + j) * KV);
      }
    }
    const Outputs<double> out = ctx.run(p, in);
    const Allowance a{};  // every intermediate is exact in fp32 and wider
    ctx.report.compare("o (must equal v: stored and read back through a unit key)", expected.o, out.o, a.o);
    ctx.report.compare("hT (h0 with written rows replaced by their last value)", expected.hT, out.hT, a.hT);
    if (p.store_intermediate_states)
      ctx.report.compare("intermediate states", expected.intermediate, out.intermediate, a.intermediate);
  });
}

// ---------------------------------------------------------------------------------------------
// (k) per-token states against the implementation's own final states

PropertyResult intermediate_states_anchor(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget) {
  return evaluate("intermediate_states_anchor", 12, impl, c, budget, [](Context& ctx) {
    Problem p = ctx.c.problem;
    p.store_intermediate_states = true;
    p.has_hT = true;
    if (!ctx.supports(p)) {
      // Only the per-token states are refused (a chunked implementation): nothing to anchor.
      if (ctx.supports(ctx.c.problem)) return;
      throw Unsupported{p.describe()};
    }
    const Inputs in = ctx.c.inputs();
    const Outputs<double> whole = ctx.run(p, in);
    const Allowance a = ctx.allow(p, in, whole);
    const std::int64_t block = state_block_size(p);
    auto state_after = [&](std::int64_t t) {  // the per-token state of packed token t
      HostTensor<double> state(state_block_shape(p));
      std::copy(whole.intermediate.data() + t * block, whole.intermediate.data() + (t + 1) * block, state.data());
      return state;
    };
    for (int n = 0; n < p.N(); ++n) {
      const std::int64_t row = state_row_of(p, in, n), L = p.seq_len(n);
      if (L == 0) continue;
      if (row < 0) {
        const HostTensor<double> rows = intermediate_rows(p, whole.intermediate, n);
        ctx.report.compare("per-token states of padding sequence " + std::to_string(n) + " (must be 0)",
                           HostTensor<double>(rows.shape()), rows, 0.0);
        continue;
      }
      ctx.report.compare("last per-token state of sequence " + std::to_string(n) + " vs its hT",
                         state_block(p, whole.hT, row), state_after(p.seq_begin(n) + L - 1), a.hT + a.intermediate);
    }
    const std::vector<int> candidates = live_sequences(p, in, true);
    if (candidates.empty()) return;
    const int n = candidates[static_cast<std::size_t>(ctx.uniform(0, std::int64_t(candidates.size()) - 1))];
    const Piece piece = extract(p, in, n);
    std::vector<std::int64_t> ends{piece.length};  // prefix lengths: the whole sequence and 0 to 2 more
    const int more = static_cast<int>(ctx.uniform(0, 2));
    for (int i = 0; i < more; ++i) ends.push_back(ctx.uniform(1, piece.length));
    for (std::int64_t end : ends) {
      Piece prefix = slice(piece, p, 0, end);
      prefix.h0 = piece.h0;
      Packed alone = assemble(p, in, {prefix});
      alone.problem.store_intermediate_states = false;
      const Outputs<double> out = ctx.run(alone.problem, alone.inputs);
      const Allowance b = ctx.allow(alone.problem, alone.inputs, out);
      ctx.report.compare("per-token state after token " + std::to_string(end - 1) + " of sequence " +
                             std::to_string(n) + " vs hT of that prefix run alone",
                         state_block(alone.problem, out.hT, 0), state_after(p.seq_begin(n) + end - 1),
                         a.intermediate + b.hT);
    }
  });
}

// ---------------------------------------------------------------------------------------------

const std::vector<Property>& all_properties() {
  static const std::vector<Property> properties{
      {"matches_sequential", "o, hT equal the double sequential reference", matches_sequential},
      {"state_carry", "splitting a sequence and carrying hT -> h0 changes nothing", state_carry},
      {"packing_independence", "a sequence's outputs do not depend on its neighbours or position",
       packing_independence},
      {"gva_equals_repeated_heads", "GVA equals MHA with q, k repeated", gva_equals_repeated_heads},
      {"l2norm_equals_prenormalized", "the l2norm flag equals normalising q, k beforehand",
       l2norm_equals_prenormalized},
      {"linear_in_q", "o is linear in q, hT independent of q", linear_in_q},
      {"linear_in_v_and_h0", "(o, hT) is jointly linear in (v, h0)", linear_in_v_and_h0},
      {"pure_decay", "beta = 0: S_t = exp(sum g) S0, o = S^T scale q^", pure_decay},
      {"underflow_resets", "after g = -1e4 nothing earlier matters", underflow_resets},
      {"exact_store_and_retrieve", "unit key, g = 0, beta = 1: o = v exactly", exact_store_and_retrieve},
      {"matches_long_double", "o, hT equal the long double sequential reference", matches_long_double},
      {"intermediate_states_anchor", "the state after token t equals hT of the prefix ending at t",
       intermediate_states_anchor},
  };
  return properties;
}

const Property& find_property(const std::string& name) {
  for (const Property& p : all_properties())
    if (p.name == name) return p;
  throw std::invalid_argument("no property named '" + name + "'");
}

void rc_require(const PropertyResult& result) {
  if (result.status == PropertyStatus::unsupported) RC_DISCARD(result.message);
  if (result.status == PropertyStatus::fail) RC_FAIL(result.message);
}

}  // namespace gdn::fuzz
