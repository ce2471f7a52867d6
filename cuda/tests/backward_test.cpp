// The CUDA backward's GPU suite (cuda/api/backward.hpp, docs/cuda_backward.md), tallied with the
// forward's under the kernel "cuda.recurrent_prefill.backward":
//   backward_conformance  random cases of the backward's share of the recurrent prefill's space
//                         (fuzz::backward_space), cotangents from each case's seed
//                         (fuzz::make_backward_inputs), every gradient judged by the oracle's
//                         calibrated gradient budget (oracle/backward_budget.hpp) against the
//                         sequential backward's fp32 emulation;
//   backward_determinism  the same inputs again give the same bits, every gradient;
//   backward_repack_bits  the pack reversed gives every sequence the same bits (dq, dk, dv, the
//                         gate gradients of its tokens and its dh0; dA_log and ddt_bias are sums
//                         over the whole batch by definition and are left out).
// A failure prints the case (enough to rebuild it) and the verdict's checks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/implementations/implementations.hpp"
#include "cuda/tests/testbed.hpp"
#include "fuzz/backward_properties.hpp"
#include "fuzz/sample.hpp"
#include "oracle/backward_budget.hpp"
#include "oracle/reproducibility.hpp"

using namespace gdn;
using namespace gdn::cuda;
using namespace gdn::cuda::testbed;

namespace {

const char* const kKernel = "cuda.recurrent_prefill.backward";

// A case of the backward's space with its cotangents.
struct BackwardCase {
  KernelCase c;
  BackwardInputs cotangents;
};

BackwardCase random_backward_case(std::mt19937_64& rng) {
  BackwardCase b;
  const std::uint64_t seed = rng();
  b.c = fuzz::draw_case(seed, fuzz::backward_space(fuzz::CaseSpace::recurrent_prefill()));
  b.cotangents = fuzz::make_backward_inputs(b.c.problem, seed ^ 0x9e3779b97f4a7c15ull);
  return b;
}

std::string describe(const BackwardCase& b) {
  return testbed::describe(b.c) + (b.cotangents.dhT.defined() ? " with dhT" : " without dhT");
}

// Every gradient bit for bit; "" or the first tensor that differs.
std::string gradient_bits_diff(const Gradients<double>& a, const Gradients<double>& b) {
  std::string diff;
  std::vector<const HostTensor<double>*> second;
  b.for_each([&](const char*, const HostTensor<double>& t) { second.push_back(&t); });
  std::size_t i = 0;
  a.for_each([&](const char* name, const HostTensor<double>& t) {
    if (diff.empty() && !oracle::bits_equal(t, *second[i])) diff = std::string(name) + " differs";
    ++i;
  });
  return diff;
}

// The rows [begin, begin + count) of a [T, ...] tensor, as raw values.
std::vector<double> rows(const HostTensor<double>& t, std::int64_t begin, std::int64_t count) {
  if (!t.defined() || t.numel() == 0) return {};
  const std::int64_t width = t.numel() / t.shape()[0];
  return std::vector<double>(t.data() + begin * width, t.data() + (begin + count) * width);
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) return false;
  return true;
}

// The cotangents of (p, cotangents) reordered like oracle::select_sequences reorders the inputs.
BackwardInputs select_cotangents(const Problem& p, const BackwardInputs& cotangents, const std::vector<int>& order) {
  BackwardInputs out;
  std::int64_t T = 0;
  for (int n : order) T += p.seq_len(n);
  out.dO = HostTensor<double>({T, p.HV, p.V});
  std::int64_t at = 0;
  const std::int64_t row = static_cast<std::int64_t>(p.HV) * p.V;
  for (int n : order) {
    const std::vector<double> r = rows(cotangents.dO, p.seq_begin(n), p.seq_len(n));
    std::copy(r.begin(), r.end(), out.dO.data() + at * row);
    at += p.seq_len(n);
  }
  if (cotangents.dhT.defined()) {
    out.dhT = HostTensor<double>(cotangents.dhT.shape());
    const std::int64_t state = cotangents.dhT.numel() / p.N();
    for (std::size_t m = 0; m < order.size(); ++m)
      std::copy(cotangents.dhT.data() + order[m] * state, cotangents.dhT.data() + (order[m] + 1) * state,
                out.dhT.data() + static_cast<std::int64_t>(m) * state);
  }
  return out;
}

// Every sequence's gradients in the reversed pack equal its gradients in the original one.
std::string reversed_pack_diff(RecurrentPrefillKernel& kernel, const BackwardCase& b, const Gradients<double>& packed) {
  const Problem& p = b.c.problem;
  if (p.N() < 2) return "";
  std::vector<int> order;
  for (int n = p.N() - 1; n >= 0; --n) order.push_back(n);
  Problem q;
  Inputs qin;
  oracle::select_sequences(p, b.c.inputs(), order, &q, &qin);
  const BackwardInputs qcot = select_cotangents(p, b.cotangents, order);
  const Gradients<double> other = kernel.backward(q, qin, qcot);
  for (std::size_t m = 0; m < order.size(); ++m) {
    const int n = order[m];
    std::string diff;
    auto compare = [&](const char* name, const HostTensor<double>& x, const HostTensor<double>& y) {
      if (!diff.empty() || !x.defined()) return;
      if (!same_bits(rows(x, p.seq_begin(n), p.seq_len(n)), rows(y, q.seq_begin(static_cast<int>(m)), q.seq_len(static_cast<int>(m)))))
        diff = std::string(name) + " of sequence " + std::to_string(n) + " differs in the reversed pack";
    };
    compare("dq", packed.dq, other.dq);
    compare("dk", packed.dk, other.dk);
    compare("dv", packed.dv, other.dv);
    compare("dg", packed.dg, other.dg);
    compare("dbeta", packed.dbeta, other.dbeta);
    compare("da", packed.da, other.da);
    compare("db", packed.db, other.db);
    if (diff.empty() && packed.dh0.defined() &&
        !same_bits(rows(packed.dh0, n, 1), rows(other.dh0, static_cast<int>(m), 1)))
      diff = "dh0 of sequence " + std::to_string(n) + " differs in the reversed pack";
    if (!diff.empty()) return diff;
  }
  return "";
}

template <class Check>
void each_case(const char* property, int cases, Check check) {
  std::mt19937_64 rng(property_seed(kKernel, property));
  int failures = 0, ran = 0;
  for (int i = 0; i < cases; ++i) {
    const BackwardCase b = random_backward_case(rng);
    RecurrentPrefillKernel kernel;
    if (!kernel.supports_backward(b.c.problem, nullptr)) {
      Tally::instance().add(kKernel, property, false, false);
      continue;
    }
    double margin = 0;
    std::string failure;
    try {
      failure = check(b, kernel, &margin);
    } catch (const std::exception& e) {
      failure = std::string("threw: ") + e.what();
    }
    ++ran;
    Tally::instance().add(kKernel, property, true, !failure.empty(), margin);
    if (!failure.empty() && ++failures <= 8)
      FAIL_CHECK(property << ": " << failure << "\n  case " << i << ": " << describe(b));
  }
  INFO(kKernel << " " << property << ": " << failures << " of " << ran << " cases failed");
  CHECK(ran > 0);
  CHECK(failures == 0);
}

}  // namespace

// (The test main exits 77, reported as skipped, before any test when there is no device.)
TEST_CASE("backward conformance - cuda.recurrent_prefill.backward", "[gpu][backward][conformance]") {
  each_case("backward_conformance", case_count(), [](const BackwardCase& b, RecurrentPrefillKernel& kernel, double* margin) {
    oracle::BackwardContext context(describe(b), b.c.problem, b.c.inputs(), b.cotangents);
    const oracle::BackwardRun run = [&](const Problem& p, const Inputs& in, const BackwardInputs& cot) {
      return kernel.backward(p, in, cot);
    };
    const oracle::Verdict v =
        oracle::evaluate_backward(kKernel, Formulation::sequential, 64, run, context, oracle::BudgetOptions{});
    if (v.status != oracle::Status::error) *margin = v.worst_margin();
    return v.failed() ? v.details() : std::string();
  });
}

TEST_CASE("backward determinism and batch invariance - cuda.recurrent_prefill.backward", "[gpu][backward][bitwise]") {
  const int cases = std::max(4, case_count() / 5);
  each_case("backward_determinism", cases, [](const BackwardCase& b, RecurrentPrefillKernel& kernel, double*) {
    const Inputs in = b.c.inputs();
    const Gradients<double> first = kernel.backward(b.c.problem, in, b.cotangents);
    const Gradients<double> second = kernel.backward(b.c.problem, in, b.cotangents);
    return gradient_bits_diff(first, second);
  });
  each_case("backward_repack_bits", cases, [](const BackwardCase& b, RecurrentPrefillKernel& kernel, double*) {
    const Gradients<double> packed = kernel.backward(b.c.problem, b.c.inputs(), b.cotangents);
    return reversed_pack_diff(kernel, b, packed);
  });
}
