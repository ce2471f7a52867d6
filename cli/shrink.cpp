#include "cli/shrink.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "reference/precision.hpp"
#include "reference/prepare.hpp"

namespace gdn::cli {

Selection select_all(const Problem& problem) {
  Selection s;
  for (int n = 0; n < problem.N(); ++n) s.sequences.push_back({n, problem.seq_len(n)});
  for (int h = 0; h < problem.H; ++h) s.query_heads.push_back(h);
  for (int j = 0; j < problem.HV; ++j) s.value_heads.push_back(j);
  s.K = problem.K;
  s.V = problem.V;
  return s;
}

std::int64_t case_size(const ConcreteCase& c) {
  const Inputs& in = c.inputs;
  return in.q.numel() + in.k.numel() + in.v.numel() + in.g.numel() + in.beta.numel() + in.a.numel() +
         in.b.numel() + in.A_log.numel() + in.dt_bias.numel() + in.h0.numel() +
         static_cast<std::int64_t>(in.state_indices.size());
}

namespace {

[[noreturn]] void bad(const std::string& argument, const std::string& rule) { throw ProblemError(argument, rule); }

// Offset of S[k][v] inside one (row, head) block of a state tensor.
std::int64_t state_offset(const Problem& p, int k, int v) {
  return p.state_layout == StateLayout::k_major ? std::int64_t(k) * p.V + v : std::int64_t(v) * p.K + k;
}

}  // namespace

ConcreteCase apply(const ConcreteCase& source, const Selection& sel) {
  const Problem& P = source.problem;
  const Inputs& I = source.inputs;
  const int H = static_cast<int>(sel.query_heads.size()), HV = static_cast<int>(sel.value_heads.size());
  if (H < 1 || HV < H || HV % H != 0) bad("selection.heads", "needs >= 1 query head and a whole group of value heads for each");
  const int group = HV / H, G = P.group_size();
  for (int h : sel.query_heads)
    if (h < 0 || h >= P.H) bad("selection.query_heads", "names a head the problem does not have");
  for (int j = 0; j < HV; ++j) {
    const int original = sel.value_heads[static_cast<std::size_t>(j)];
    if (original < 0 || original >= P.HV || original / G != sel.query_heads[static_cast<std::size_t>(j / group)])
      bad("selection.value_heads", "value head " + std::to_string(j) + " must belong to its query head");
  }
  if (sel.K < 1 || sel.K > P.K) bad("selection.K", "must be in [1, K]");
  if (sel.V < 1 || sel.V > P.V) bad("selection.V", "must be in [1, V]");
  if (sel.sequences.empty()) bad("selection.sequences", "must keep at least one sequence");
  ConcreteCase out;
  Problem& p = out.problem;
  p = P;
  p.H = H;
  p.HV = HV;
  p.K = sel.K;
  p.V = sel.V;
  p.cu_seqlens.assign(1, 0);
  std::vector<std::int64_t> tokens;  // original token of each new token
  std::set<int> seen;
  for (const Selection::Sequence& s : sel.sequences) {
    if (s.index < 0 || s.index >= P.N() || !seen.insert(s.index).second)
      bad("selection.sequences", "must name distinct sequences of the problem");
    if (s.length < 0 || s.length > P.seq_len(s.index)) bad("selection.sequences", "length beyond the sequence");
    for (std::int64_t i = 0; i < s.length; ++i) tokens.push_back(P.seq_begin(s.index) + i);
    p.cu_seqlens.push_back(p.cu_seqlens.back() + s.length);
  }
  p.T = p.cu_seqlens.back();
  auto head = [&](int j) { return sel.value_heads[static_cast<std::size_t>(j)]; };
  auto query_head = [&](int h) { return sel.query_heads[static_cast<std::size_t>(h)]; };

  Inputs& in = out.inputs;
  auto per_token_qk = [&](const HostTensor<double>& src) {
    HostTensor<double> t(p.q_shape());
    for (std::int64_t tt = 0; tt < p.T; ++tt)
      for (int h = 0; h < p.H; ++h)
        for (int k = 0; k < p.K; ++k) t[(tt * p.H + h) * p.K + k] = src[(tokens[tt] * P.H + query_head(h)) * P.K + k];
    return t;
  };
  auto per_token_gate = [&](const HostTensor<double>& src) {
    if (!src.defined()) return HostTensor<double>();
    HostTensor<double> t(p.gate_shape());
    for (std::int64_t tt = 0; tt < p.T; ++tt)
      for (int j = 0; j < p.HV; ++j) t[tt * p.HV + j] = src[tokens[tt] * P.HV + head(j)];
    return t;
  };
  auto per_head = [&](const HostTensor<double>& src) {
    if (!src.defined()) return HostTensor<double>();
    HostTensor<double> t(p.head_param_shape());
    for (int j = 0; j < p.HV; ++j) t[j] = src[head(j)];
    return t;
  };
  in.q = per_token_qk(I.q);
  in.k = per_token_qk(I.k);
  in.v = HostTensor<double>(p.v_shape());
  for (std::int64_t tt = 0; tt < p.T; ++tt)
    for (int j = 0; j < p.HV; ++j)
      for (int v = 0; v < p.V; ++v) in.v[(tt * p.HV + j) * p.V + v] = I.v[(tokens[tt] * P.HV + head(j)) * P.V + v];
  in.g = per_token_gate(I.g);
  in.beta = per_token_gate(I.beta);
  in.a = per_token_gate(I.a);
  in.b = per_token_gate(I.b);
  in.A_log = per_head(I.A_log);
  in.dt_bias = per_head(I.dt_bias);
  if (I.h0.defined()) {
    // A cache keeps every slot (indices stay valid); dense states keep the selected rows.
    std::vector<std::int64_t> rows;
    if (P.uses_state_cache()) {
      for (std::int64_t r = 0; r < P.state_slots; ++r) rows.push_back(r);
    } else {
      for (const Selection::Sequence& s : sel.sequences) rows.push_back(s.index);
    }
    in.h0 = HostTensor<double>(p.state_shape());
    const std::int64_t block = std::int64_t(p.K) * p.V, source_block = std::int64_t(P.K) * P.V;
    for (std::size_t r = 0; r < rows.size(); ++r)
      for (int j = 0; j < p.HV; ++j)
        for (int k = 0; k < p.K; ++k)
          for (int v = 0; v < p.V; ++v)
            in.h0[(std::int64_t(r) * p.HV + j) * block + state_offset(p, k, v)] =
                I.h0[(rows[r] * P.HV + head(j)) * source_block + state_offset(P, k, v)];
  }
  if (P.uses_state_cache())
    for (const Selection::Sequence& s : sel.sequences) in.state_indices.push_back(I.state_indices[static_cast<std::size_t>(s.index)]);
  validate(p, in);
  return out;
}

namespace {

struct Candidate {
  std::string what;
  std::function<ConcreteCase()> make;
};

// Distinct values below `n`, ascending, starting from the smallest: the first one that still
// fails is taken, so a long dimension drops quickly and then approaches its threshold.
std::vector<std::int64_t> smaller_values(std::int64_t n, std::int64_t smallest) {
  std::set<std::int64_t> values;
  for (std::int64_t x : {smallest, n / 8, n / 4, n / 2, (3 * n) / 4, n - 2, n - 1})
    if (x >= smallest && x < n) values.insert(x);
  return {values.begin(), values.end()};
}

// Replaces the gates with direct g, beta computed from the fused ones in double and rounded
// to the gate dtype: a candidate, the failure decides whether it is the same failure.
ConcreteCase unfuse(const ConcreteCase& c) {
  ConcreteCase out = c;
  Problem& p = out.problem;
  out.inputs.g = HostTensor<double>(p.gate_shape());
  out.inputs.beta = HostTensor<double>(p.gate_shape());
  for (std::int64_t t = 0; t < p.T; ++t)
    for (int j = 0; j < p.HV; ++j) {
      double g, beta;
      reference::load_gates(p, c.inputs, t, j, &g, &beta);
      out.inputs.g[t * p.HV + j] = std::min(0.0, reference::round_to(p.gate_dtype, g));
      out.inputs.beta[t * p.HV + j] = reference::round_to(p.gate_dtype, beta);
    }
  out.inputs.a = out.inputs.b = out.inputs.A_log = out.inputs.dt_bias = HostTensor<double>();
  p.gate_mode = GateMode::direct;
  p.allow_negative_eigenvalues = false;
  validate(p, out.inputs);
  return out;
}

ConcreteCase dense_states(const ConcreteCase& c) {
  // Only when every sequence names a slot: padding rows have no dense equivalent.
  ConcreteCase out = c;
  Problem& p = out.problem;
  for (std::int32_t slot : c.inputs.state_indices)
    if (slot < 0) bad("state_indices", "padding rows have no dense equivalent");
  p.state_slots = 0;
  p.has_h0 = true;
  out.inputs.h0 = HostTensor<double>(p.state_shape());
  const std::int64_t block = std::int64_t(p.HV) * p.K * p.V;
  for (int n = 0; n < p.N(); ++n)
    std::copy_n(c.inputs.h0.data() + c.inputs.state_indices[static_cast<std::size_t>(n)] * block, block,
                out.inputs.h0.data() + n * block);
  out.inputs.state_indices.clear();
  validate(p, out.inputs);
  return out;
}

ConcreteCase k_major(const ConcreteCase& c) {
  ConcreteCase out = c;
  Problem& p = out.problem;
  p.state_layout = StateLayout::k_major;
  if (c.inputs.h0.defined()) {
    out.inputs.h0 = HostTensor<double>(p.state_shape());
    const std::int64_t rows = p.state_shape()[0], block = std::int64_t(p.K) * p.V;
    for (std::int64_t r = 0; r < rows * p.HV; ++r)
      for (int k = 0; k < p.K; ++k)
        for (int v = 0; v < p.V; ++v)
          out.inputs.h0[r * block + std::int64_t(k) * p.V + v] = c.inputs.h0[r * block + std::int64_t(v) * p.K + k];
  }
  validate(p, out.inputs);
  return out;
}

std::vector<Candidate> candidates(const ConcreteCase& c) {
  std::vector<Candidate> list;
  const Problem& p = c.problem;
  const Selection all = select_all(p);
  auto with = [&](std::string what, Selection s) {
    list.push_back({std::move(what), [&c, s] { return apply(c, s); }});
  };
  // Sequences: keep one, then drop one.
  if (p.N() > 1) {
    for (int n = 0; n < p.N(); ++n) {
      Selection s = all;
      s.sequences = {all.sequences[static_cast<std::size_t>(n)]};
      with("keep only sequence " + std::to_string(n), s);
    }
    for (int n = 0; n < p.N(); ++n) {
      Selection s = all;
      s.sequences.erase(s.sequences.begin() + n);
      with("drop sequence " + std::to_string(n), s);
    }
  }
  // Shorter sequences.
  for (int n = 0; n < p.N(); ++n)
    for (std::int64_t length : smaller_values(p.seq_len(n), 0)) {
      Selection s = all;
      s.sequences[static_cast<std::size_t>(n)].length = length;
      with("sequence " + std::to_string(n) + " length " + std::to_string(p.seq_len(n)) + " -> " + std::to_string(length), s);
    }
  // Fewer heads: one value head alone (with its query head), the first h query heads, the
  // first g value heads of every group.
  if (p.HV > 1)
    for (int j = 0; j < p.HV; ++j) {
      Selection s = all;
      s.query_heads = {j / p.group_size()};
      s.value_heads = {j};
      with("keep only value head " + std::to_string(j), s);
    }
  for (std::int64_t h : smaller_values(p.H, 1)) {
    Selection s = all;
    s.query_heads.resize(static_cast<std::size_t>(h));
    s.value_heads.resize(static_cast<std::size_t>(h * p.group_size()));
    with("H " + std::to_string(p.H) + " -> " + std::to_string(h), s);
  }
  for (std::int64_t g : smaller_values(p.group_size(), 1)) {
    Selection s = all;
    s.value_heads.clear();
    for (int h = 0; h < p.H; ++h)
      for (int i = 0; i < g; ++i) s.value_heads.push_back(h * p.group_size() + i);
    with("value heads per key head " + std::to_string(p.group_size()) + " -> " + std::to_string(g), s);
  }
  // Smaller head sizes.
  for (std::int64_t k : smaller_values(p.K, 1)) {
    Selection s = all;
    s.K = static_cast<int>(k);
    with("K " + std::to_string(p.K) + " -> " + std::to_string(k), s);
  }
  for (std::int64_t v : smaller_values(p.V, 1)) {
    Selection s = all;
    s.V = static_cast<int>(v);
    with("V " + std::to_string(p.V) + " -> " + std::to_string(v), s);
  }
  // Fewer features.
  auto feature = [&](std::string what, std::function<void(ConcreteCase&)> edit) {
    list.push_back({std::move(what), [&c, edit] {
                      ConcreteCase out = c;
                      edit(out);
                      validate(out.problem, out.inputs);
                      return out;
                    }});
  };
  if (p.uses_state_cache()) list.push_back({"state cache -> dense states", [&c] { return dense_states(c); }});
  if (p.has_hT) feature("no final state", [](ConcreteCase& x) { x.problem.has_hT = false; });
  if (p.has_h0 && !p.uses_state_cache())
    feature("no initial state", [](ConcreteCase& x) {
      x.problem.has_h0 = false;
      x.inputs.h0 = HostTensor<double>();
    });
  if (p.store_intermediate_states) feature("no intermediate states", [](ConcreteCase& x) { x.problem.store_intermediate_states = false; });
  if (p.state_layout == StateLayout::v_major) list.push_back({"V-major -> K-major", [&c] { return k_major(c); }});
  if (p.gate_mode == GateMode::fused) list.push_back({"fused gates -> direct g, beta", [&c] { return unfuse(c); }});
  // Without l2norm the kernel takes q and k as given, so they become what the l2norm made of them
  // (x / sqrt(|x|^2 + 1e-6), §2, rounded to the input dtype): raw keys without it have
  // |k|^2 ~ K and grow the state, leaving the contractive space the case was drawn from for a
  // different failure (an fp16 overflow in place of a rounding one).
  if (p.use_qk_l2norm)
    feature("no l2norm (q, k normalised)", [](ConcreteCase& x) {
      const Problem& q = x.problem;
      for (HostTensor<double>* t : {&x.inputs.q, &x.inputs.k}) {
        for (std::int64_t r = 0; r < q.T * q.H; ++r) reference::l2normalize(t->data() + r * q.K, q.K);
        reference::round_in_place(q.input_dtype, *t);
      }
      x.problem.use_qk_l2norm = false;
    });
  if (p.scale) feature("default scale", [](ConcreteCase& x) { x.problem.scale.reset(); });
  if (p.input_dtype != DType::f32 && p.input_dtype != DType::f64)
    feature("input dtype -> f32", [](ConcreteCase& x) {
      x.problem.input_dtype = DType::f32;  // bf16/f16 values are f32 values: nothing to round
      x.problem.gate_dtype = DType::f32;
    });
  if (p.gate_dtype != DType::f32) feature("gate dtype -> f32", [](ConcreteCase& x) { x.problem.gate_dtype = DType::f32; });
  if (p.has_h0 || p.uses_state_cache()) {
    bool nonzero = false;
    for (std::int64_t i = 0; i < c.inputs.h0.numel() && !nonzero; ++i) nonzero = c.inputs.h0[i] != 0;
    if (nonzero)
      feature("zero initial state values", [](ConcreteCase& x) {
        std::fill(x.inputs.h0.storage().begin(), x.inputs.h0.storage().end(), 0.0);
      });
  }
  return list;
}

}  // namespace

ShrinkResult shrink(const ConcreteCase& failing, const std::function<bool(const ConcreteCase&)>& still_fails,
                    const ShrinkOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  ShrinkResult result;
  result.smallest = failing;
  bool progress = true;
  while (progress) {
    progress = false;
    for (const Candidate& candidate : candidates(result.smallest)) {
      if (result.evaluations >= options.max_evaluations || elapsed() > options.max_seconds ||
          (options.interrupted && options.interrupted())) {
        result.stopped_early = true;
        result.seconds = elapsed();
        return result;
      }
      ConcreteCase next;
      try {
        next = candidate.make();
      } catch (const ProblemError&) {
        continue;  // not a valid case: not a candidate
      }
      ++result.evaluations;
      if (still_fails(next)) {
        result.steps.push_back(candidate.what);
        result.smallest = std::move(next);
        ++result.accepted;
        progress = true;
        break;  // candidates refer to the case they were made from: list them again
      }
    }
  }
  result.seconds = elapsed();
  return result;
}

}  // namespace gdn::cli
