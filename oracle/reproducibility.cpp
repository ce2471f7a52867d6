#include "oracle/reproducibility.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "oracle/backward_budget.hpp"

namespace gdn::oracle {

namespace {

void set_lengths(Problem& p, const std::vector<std::int64_t>& lengths) {
  const Problem shape = Problem::packed(lengths, p.H, p.HV, p.K, p.V);
  p.cu_seqlens = shape.cu_seqlens;
  p.T = shape.T;
}

// Copies rows [begin, begin + count) of a tensor whose first axis is tokens (or sequences).
void append_rows(const HostTensor<double>& from, std::int64_t begin, std::int64_t count, std::vector<double>& to) {
  const std::int64_t row = from.numel() / std::max<std::int64_t>(from.dim(0), 1);
  to.insert(to.end(), from.data() + begin * row, from.data() + (begin + count) * row);
}

HostTensor<double> with_rows(const HostTensor<double>& like, std::int64_t rows, const std::vector<double>& data) {
  Shape shape = like.shape();
  shape[0] = rows;
  HostTensor<double> t(shape);
  std::copy(data.begin(), data.end(), t.data());
  return t;
}

std::string compare_rows(const char* name, const HostTensor<double>& a, std::int64_t a_begin,
                         const HostTensor<double>& b, std::int64_t b_begin, std::int64_t count) {
  if (count == 0) return "";
  if (!a.defined() || !b.defined()) return a.defined() == b.defined() ? "" : std::string(name) + ": one run lacks it";
  const std::int64_t row = a.numel() / std::max<std::int64_t>(a.dim(0), 1);
  const std::int64_t row_b = b.numel() / std::max<std::int64_t>(b.dim(0), 1);
  if (row != row_b) return std::string(name) + ": row sizes differ";
  for (std::int64_t i = 0; i < count * row; ++i) {
    const double x = a[a_begin * row + i], y = b[b_begin * row + i];
    if (std::memcmp(&x, &y, sizeof(double)) != 0) {
      std::ostringstream s;
      s << name << ": element " << i << " of the sequence's rows differs: " << x << " vs " << y;
      return s.str();
    }
  }
  return "";
}

// The first element where two tensors differ in bits, as "o[token 3, ...]: x vs y".
std::string first_difference(const Problem& problem, const Inputs& inputs, OutputTensor tensor,
                             const HostTensor<double>& a, const HostTensor<double>& b) {
  if (a.defined() != b.defined()) return std::string(output_tensor_name(tensor)) + ": one run lacks it";
  if (!a.defined()) return "";
  if (a.shape() != b.shape()) return std::string(output_tensor_name(tensor)) + ": shapes differ";
  std::int64_t differing = 0, first = -1;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a[i], y = b[i];
    if (std::memcmp(&x, &y, sizeof(double)) != 0) {
      if (first < 0) first = i;
      ++differing;
    }
  }
  if (first < 0) return "";
  std::ostringstream s;
  s << output_tensor_name(tensor) << ": " << differing << " of " << a.numel() << " elements differ, first at "
    << locate(problem, &inputs, tensor, first).describe() << ": " << a[first] << " vs " << b[first];
  return s.str();
}

Check bit_check(OutputTensor tensor, const char* metric, const std::string& violation, const std::string& rule) {
  Check c;
  c.tensor = tensor;
  c.metric = metric;
  c.budget = 0;
  c.error = violation.empty() ? 0.0 : 1.0;
  c.margin = violation.empty() ? 0.0 : INFINITY;
  c.pass = violation.empty();
  c.basis = violation.empty() ? rule : rule + ": " + violation;
  return c;
}

}  // namespace

void select_sequences(const Problem& problem, const Inputs& inputs, const std::vector<int>& order,
                      Problem* out_problem, Inputs* out_inputs) {
  Problem p = problem;
  std::vector<std::int64_t> lengths;
  for (int n : order) lengths.push_back(problem.seq_len(n));
  set_lengths(p, lengths);
  Inputs in;
  auto tokens = [&](const HostTensor<double>& t) {
    if (!t.defined()) return HostTensor<double>();
    std::vector<double> data;
    for (int n : order) append_rows(t, problem.seq_begin(n), problem.seq_len(n), data);
    return with_rows(t, p.T, data);
  };
  in.q = tokens(inputs.q);
  in.k = tokens(inputs.k);
  in.v = tokens(inputs.v);
  in.g = tokens(inputs.g);
  in.beta = tokens(inputs.beta);
  in.a = tokens(inputs.a);
  in.b = tokens(inputs.b);
  in.A_log = inputs.A_log;
  in.dt_bias = inputs.dt_bias;
  if (problem.uses_state_cache()) {
    in.h0 = inputs.h0;
    for (int n : order) in.state_indices.push_back(inputs.state_indices[static_cast<std::size_t>(n)]);
  } else if (inputs.h0.defined()) {
    std::vector<double> data;
    for (int n : order) append_rows(inputs.h0, n, 1, data);
    in.h0 = with_rows(inputs.h0, std::int64_t(order.size()), data);
  }
  *out_problem = p;
  *out_inputs = in;
}

std::string compare_sequence_bits(const Problem& p, const Inputs& in, const Outputs<double>& out, int n,
                                  const Problem& q, const Inputs& qin, const Outputs<double>& other, int m) {
  if (p.seq_len(n) != q.seq_len(m)) return "sequence lengths differ";
  std::string d = compare_rows("o", out.o, p.seq_begin(n), other.o, q.seq_begin(m), p.seq_len(n));
  if (!d.empty()) return d;
  if (p.store_intermediate_states) {
    d = compare_rows("intermediate", out.intermediate, p.seq_begin(n), other.intermediate, q.seq_begin(m), p.seq_len(n));
    if (!d.empty()) return d;
  }
  if (p.has_hT) {
    std::int64_t rn = n, rm = m;
    if (p.uses_state_cache()) {
      rn = in.state_indices[static_cast<std::size_t>(n)];
      rm = qin.state_indices[static_cast<std::size_t>(m)];
      if (rn < 0 || rm < 0) return rn == rm ? "" : "padding differs";
    }
    d = compare_rows("hT", out.hT, rn, other.hT, rm, 1);
  }
  return d;
}

std::string check_exact_rules(const Problem& problem, const Inputs& inputs, const Outputs<double>& out) {
  if (!problem.uses_state_cache()) return "";
  std::vector<bool> named(static_cast<std::size_t>(problem.state_slots), false);
  const std::int64_t o_row = std::int64_t(problem.HV) * problem.V;
  const std::int64_t s_row = std::int64_t(problem.HV) * problem.K * problem.V;
  for (int n = 0; n < problem.N(); ++n) {
    const std::int32_t slot = inputs.state_indices[static_cast<std::size_t>(n)];
    if (slot >= 0) {
      named[static_cast<std::size_t>(slot)] = true;
      continue;
    }
    for (std::int64_t t = problem.seq_begin(n); t < problem.seq_begin(n) + problem.seq_len(n); ++t) {
      for (std::int64_t i = 0; i < o_row; ++i)
        if (out.o[t * o_row + i] != 0.0 || std::signbit(out.o[t * o_row + i]))
          return "padding sequence " + std::to_string(n) + ": o is not exactly +0 at token " + std::to_string(t);
      if (problem.store_intermediate_states)
        for (std::int64_t i = 0; i < s_row; ++i)
          if (out.intermediate[t * s_row + i] != 0.0)
            return "padding sequence " + std::to_string(n) + ": intermediate is not zero at token " + std::to_string(t);
    }
  }
  if (problem.has_hT) {
    for (std::int64_t slot = 0; slot < problem.state_slots; ++slot) {
      if (named[static_cast<std::size_t>(slot)]) continue;
      for (std::int64_t i = 0; i < s_row; ++i) {
        const double x = out.hT[slot * s_row + i], y = inputs.h0[slot * s_row + i];
        if (std::memcmp(&x, &y, sizeof(double)) != 0)
          return "cache slot " + std::to_string(slot) + " is named by no sequence but changed (element " +
                 std::to_string(i) + ")";
      }
    }
  }
  return "";
}

bool bits_equal(const HostTensor<double>& a, const HostTensor<double>& b) {
  if (a.shape() != b.shape()) return false;
  if (a.numel() == 0) return true;
  return std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(double)) == 0;
}

bool outputs_bits_equal(const Outputs<double>& a, const Outputs<double>& b) {
  return bits_equal(a.o, b.o) && bits_equal(a.hT, b.hT) && bits_equal(a.intermediate, b.intermediate);
}

std::string reversed_pack_diff(Implementation& implementation, const Problem& problem, const Inputs& inputs,
                               const Outputs<double>& packed) {
  if (problem.N() < 2) return "";
  std::vector<int> reversed(static_cast<std::size_t>(problem.N()));
  for (int n = 0; n < problem.N(); ++n) reversed[static_cast<std::size_t>(n)] = problem.N() - 1 - n;
  Problem rp;
  Inputs ri;
  select_sequences(problem, inputs, reversed, &rp, &ri);
  const Outputs<double> rev = implementation.run(rp, ri);
  for (int n = 0; n < problem.N(); ++n) {
    const std::string diff = compare_sequence_bits(problem, inputs, packed, n, rp, ri, rev, problem.N() - 1 - n);
    if (!diff.empty()) return "sequence " + std::to_string(n) + " (position " + std::to_string(problem.N() - 1 - n) +
                              " in the reversed pack): " + diff;
  }
  return "";
}

std::vector<Check> reproducibility_checks(Implementation& implementation, const Problem& problem,
                                          const Inputs& inputs, const Outputs<double>& first) {
  std::vector<Check> checks;
  const std::string repeat_rule = "bitwise: a second run on the same inputs gives the same bits (determinism)";
  try {
    const Outputs<double> again = implementation.run(problem, inputs);
    std::string diff = first_difference(problem, inputs, OutputTensor::o, first.o, again.o);
    OutputTensor where = OutputTensor::o;
    if (diff.empty()) diff = first_difference(problem, inputs, where = OutputTensor::hT, first.hT, again.hT);
    if (diff.empty())
      diff = first_difference(problem, inputs, where = OutputTensor::intermediate, first.intermediate, again.intermediate);
    checks.push_back(bit_check(diff.empty() ? OutputTensor::o : where, "repeat_bits", diff, repeat_rule));
  } catch (const std::exception& e) {
    checks.push_back(bit_check(OutputTensor::o, "repeat_bits", std::string("the second run threw: ") + e.what(), repeat_rule));
  }
  if (problem.N() >= 2) {
    const std::string rule = "bitwise: each sequence's bits do not depend on its place in the pack (batch invariance)";
    try {
      checks.push_back(bit_check(OutputTensor::o, "repack_bits", reversed_pack_diff(implementation, problem, inputs, first), rule));
    } catch (const std::exception& e) {
      checks.push_back(bit_check(OutputTensor::o, "repack_bits", std::string("the reversed pack threw: ") + e.what(), rule));
    }
  }
  if (problem.uses_state_cache())
    checks.push_back(bit_check(OutputTensor::o, "exact_rules", check_exact_rules(problem, inputs, first),
                               "exact: padding rows output +0, slots no sequence names come back unchanged"));
  return checks;
}

namespace {

// The bits in which two doubles differ.
int differing_bits(double x, double y) {
  std::uint64_t a, b;
  std::memcpy(&a, &x, sizeof a);
  std::memcpy(&b, &y, sizeof b);
  return __builtin_popcountll(a ^ b);
}

// Adds the checks' violations to a verdict (shared by outputs and gradients).
void add_checks(Verdict& verdict, std::vector<Check> checks) {
  if (verdict.status != Status::pass && verdict.status != Status::fail) return;
  bool violated = false;
  for (Check& c : checks) {
    violated = violated || !c.pass;
    verdict.checks.push_back(std::move(c));
  }
  if (!violated) return;
  if (verdict.status == Status::pass) verdict.status = Status::fail;
  if (!verdict.message.empty()) verdict.message += "; ";
  verdict.message +=
      "not reproducible bit for bit (a race, uninitialised memory or a batch-dependent reduction): "
      "run it under compute-sanitizer --tool racecheck and --tool initcheck";
}

// Cotangents reordered as select_sequences reorders the inputs: dO by token rows, dhT by
// sequence rows (the backward covers dense states only).
BackwardInputs select_cotangents(const Problem& problem, const BackwardInputs& b, const std::vector<int>& order,
                                 std::int64_t T) {
  BackwardInputs out;
  std::vector<double> data;
  for (int n : order) append_rows(b.dO, problem.seq_begin(n), problem.seq_len(n), data);
  out.dO = with_rows(b.dO, T, data);
  if (b.dhT.defined()) {
    data.clear();
    for (int n : order) append_rows(b.dhT, n, 1, data);
    out.dhT = with_rows(b.dhT, std::int64_t(order.size()), data);
  }
  return out;
}

}  // namespace

std::vector<Check> backward_reproducibility_checks(Implementation& implementation, const Problem& problem,
                                                   const Inputs& inputs, const BackwardInputs& cotangents,
                                                   const Gradients<double>& first) {
  std::vector<Check> checks;
  const std::string repeat_rule = "bitwise: a second backward on the same inputs gives the same bits (determinism)";
  const std::vector<OutputTensor> tensors = gradient_tensors(problem);
  try {
    const Gradients<double> again = implementation.backward(problem, inputs, cotangents);
    for (OutputTensor t : tensors) {
      const HostTensor<double>& a = gradient_of(first, t);
      const HostTensor<double>& b = gradient_of(again, t);
      if (a.shape() != b.shape()) {
        checks.push_back(make_check(t, "repeat_bits", INFINITY, 0.0, repeat_rule,
                                    std::string(output_tensor_name(t)) + ": the two runs' shapes differ (" +
                                        shape_string(a.shape()) + " vs " + shape_string(b.shape()) + ")"));
        continue;
      }
      double bits = 0;
      std::int64_t elements = 0, at = -1;
      for (std::int64_t i = 0; i < a.numel(); ++i) {
        const int d = differing_bits(a[i], b[i]);
        if (d == 0) continue;
        bits += d;
        ++elements;
        if (at < 0) at = i;
      }
      std::string basis = repeat_rule;
      if (elements > 0) {
        std::ostringstream s;
        s << ": " << bits << " bits in " << elements << " of " << a.numel() << " elements of " << output_tensor_name(t)
          << " differ, first at " << locate(problem, &inputs, t, at).describe() << ": " << a[at] << " vs " << b[at];
        basis += s.str();
      }
      checks.push_back(make_check(t, "repeat_bits", bits, 0.0, basis));
    }
  } catch (const std::exception& e) {
    checks.push_back(bit_check(tensors.front(), "repeat_bits", std::string("the second backward threw: ") + e.what(),
                               repeat_rule));
  }
  if (problem.N() >= 2) {
    const std::string rule =
        "bitwise: each sequence's gradients do not depend on its place in the pack (batch invariance; dA_log, "
        "ddt_bias left out)";
    try {
      std::vector<int> reversed(static_cast<std::size_t>(problem.N()));
      for (int n = 0; n < problem.N(); ++n) reversed[static_cast<std::size_t>(n)] = problem.N() - 1 - n;
      Problem rp;
      Inputs ri;
      select_sequences(problem, inputs, reversed, &rp, &ri);
      const BackwardInputs rb = select_cotangents(problem, cotangents, reversed, rp.T);
      const Gradients<double> rev = implementation.backward(rp, ri, rb);
      std::string diff;
      for (OutputTensor t : tensors)
        if (diff.empty() && gradient_of(rev, t).shape() != output_shape(rp, t))
          diff = std::string(output_tensor_name(t)) + " of the reversed pack has shape " +
                 shape_string(gradient_of(rev, t).shape()) + ", expected " + shape_string(output_shape(rp, t));
      for (int n = 0; n < problem.N() && diff.empty(); ++n) {
        const int m = problem.N() - 1 - n;
        for (OutputTensor t : tensors) {
          if (t == OutputTensor::dA_log || t == OutputTensor::ddt_bias) continue;
          const char* name = output_tensor_name(t);
          diff = t == OutputTensor::dh0
                     ? compare_rows(name, gradient_of(first, t), n, gradient_of(rev, t), m, 1)
                     : compare_rows(name, gradient_of(first, t), problem.seq_begin(n), gradient_of(rev, t),
                                    rp.seq_begin(m), problem.seq_len(n));
          if (!diff.empty()) {
            diff = "sequence " + std::to_string(n) + " (position " + std::to_string(m) + " in the reversed pack): " + diff;
            break;
          }
        }
      }
      checks.push_back(bit_check(tensors.front(), "repack_bits", diff, rule));
    } catch (const std::exception& e) {
      checks.push_back(bit_check(tensors.front(), "repack_bits", std::string("the reversed pack threw: ") + e.what(), rule));
    }
  }
  return checks;
}

void add_backward_reproducibility_checks(Verdict& verdict, Implementation& implementation, const Problem& problem,
                                         const Inputs& inputs, const BackwardInputs& cotangents,
                                         const Gradients<double>& first) {
  if (verdict.status != Status::pass && verdict.status != Status::fail) return;
  add_checks(verdict, backward_reproducibility_checks(implementation, problem, inputs, cotangents, first));
}

void add_reproducibility_checks(Verdict& verdict, Implementation& implementation, const Problem& problem,
                                const Inputs& inputs, const Outputs<double>& first) {
  if (verdict.status != Status::pass && verdict.status != Status::fail) return;
  add_checks(verdict, reproducibility_checks(implementation, problem, inputs, first));
}

}  // namespace gdn::oracle
