// Negative and positive tests of Problem::validate() and gdn::validate(problem, inputs): every
// rule the two functions enforce has a case here that breaks exactly that rule on an otherwise
// valid problem, and asserts both the argument the error names and the words of the rule, so a
// rule that silently stops firing, or fires under the wrong name, fails a test.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "core/problem.hpp"

namespace {

using gdn::DType;
using gdn::GateMode;
using gdn::HostTensor;
using gdn::Inputs;
using gdn::Problem;
using gdn::ProblemError;
using gdn::StateLayout;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Runs f and requires a ProblemError whose argument() is `argument` and whose rule() contains
// `rule_words`; the message (what()) must name both. Any other outcome fails the test.
void require_error(const std::function<void()>& f, const std::string& argument,
                   const std::string& rule_words) {
  INFO("expected ProblemError for '" << argument << "' containing \"" << rule_words << "\"");
  try {
    f();
  } catch (const ProblemError& e) {
    INFO("got: " << e.what());
    CHECK(e.argument() == argument);
    CHECK_THAT(e.rule(), Catch::Matchers::Contains(rule_words));
    CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains("'" + argument + "'"));
    CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains(rule_words));
    return;
  }
  FAIL("no ProblemError was thrown");
}

void require_problem_error(const Problem& p, const std::string& argument, const std::string& rule_words) {
  require_error([&] { p.validate(); }, argument, rule_words);
}

void require_inputs_error(const Problem& p, const Inputs& in, const std::string& argument,
                          const std::string& rule_words) {
  require_error([&] { gdn::validate(p, in); }, argument, rule_words);
}

// A valid problem with two non-empty sequences and one empty one, GVA (H = 2, HV = 4).
Problem base_problem() { return Problem::packed({3, 0, 2}, 2, 4, 5, 3); }

// Zero tensors of exactly the shapes the problem needs: the valid inputs that each negative
// test then breaks in one place.
Inputs valid_inputs(const Problem& p) {
  Inputs in;
  in.q = HostTensor<double>(p.q_shape(), 0.25);
  in.k = HostTensor<double>(p.q_shape(), 0.5);
  in.v = HostTensor<double>(p.v_shape(), 1.0);
  if (p.gate_mode == GateMode::direct) {
    in.g = HostTensor<double>(p.gate_shape(), -0.1);
    in.beta = HostTensor<double>(p.gate_shape(), 0.5);
  } else {
    in.a = HostTensor<double>(p.gate_shape(), 0.3);
    in.b = HostTensor<double>(p.gate_shape(), -0.2);
    in.A_log = HostTensor<double>(p.head_param_shape(), 0.7);
    in.dt_bias = HostTensor<double>(p.head_param_shape(), -1.0);
  }
  if (p.has_h0 || p.uses_state_cache()) in.h0 = HostTensor<double>(p.state_shape(), 0.125);
  if (p.uses_state_cache())
    for (int n = 0; n < p.N(); ++n) in.state_indices.push_back(n % 2 == 0 ? n / 2 : -1);
  return in;
}

Problem cache_problem() {
  Problem p = base_problem();  // N = 3
  p.state_slots = 4;
  p.has_h0 = true;
  p.has_hT = true;
  return p;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Problem::validate()

TEST_CASE("the base problems are valid", "[problem]") {
  REQUIRE_NOTHROW(base_problem().validate());
  REQUIRE_NOTHROW(gdn::validate(base_problem(), valid_inputs(base_problem())));
  REQUIRE_NOTHROW(gdn::validate(cache_problem(), valid_inputs(cache_problem())));
}

TEST_CASE("cu_seqlens rules", "[problem][negative]") {
  SECTION("empty") {
    Problem p = base_problem();
    p.cu_seqlens.clear();
    require_problem_error(p, "cu_seqlens", "N+1 >= 2 boundaries");
  }
  SECTION("a single boundary is no sequence") {
    Problem p = base_problem();
    p.cu_seqlens = {0};
    p.T = 0;
    require_problem_error(p, "cu_seqlens", "N+1 >= 2 boundaries");
  }
  SECTION("not starting at 0") {
    Problem p = base_problem();
    p.cu_seqlens = {1, 3, 5};
    p.T = 5;
    require_problem_error(p, "cu_seqlens", "must start at 0");
  }
  SECTION("decreasing") {
    Problem p = base_problem();
    p.cu_seqlens = {0, 3, 2, 5};
    require_problem_error(p, "cu_seqlens", "non-decreasing");
  }
  SECTION("decreasing below zero") {
    Problem p = base_problem();
    p.cu_seqlens = {0, -1, 5};
    require_problem_error(p, "cu_seqlens", "non-decreasing");
  }
  SECTION("not ending at T") {
    Problem p = base_problem();
    p.T = 6;
    require_problem_error(p, "cu_seqlens", "must end at T");
  }
  SECTION("T larger than cu[N]") {
    Problem p = base_problem();
    p.cu_seqlens.back() = 4;
    require_problem_error(p, "cu_seqlens", "must end at T");
  }
}

TEST_CASE("T range", "[problem][negative]") {
  Problem p = base_problem();
  SECTION("negative") {
    p.cu_seqlens = {0, 0};
    p.T = -1;
    require_problem_error(p, "T", "must be in [0, 2^40]");
  }
  SECTION("absurdly large") {
    p.T = (std::int64_t(1) << 40) + 1;
    p.cu_seqlens = {0, p.T};
    require_problem_error(p, "T", "must be in [0, 2^40]");
  }
}

TEST_CASE("head counts", "[problem][negative]") {
  Problem p = base_problem();
  SECTION("H = 0") {
    p.H = 0;
    require_problem_error(p, "H", "must be in [1, 4096]");
  }
  SECTION("H too large") {
    p.H = 4097;
    p.HV = 4097;
    require_problem_error(p, "H", "must be in [1, 4096]");
  }
  SECTION("HV = 0") {
    p.HV = 0;
    require_problem_error(p, "HV", "must be in [1, 4096]");
  }
  SECTION("HV negative") {
    p.HV = -2;
    require_problem_error(p, "HV", "must be in [1, 4096]");
  }
  SECTION("HV too large") {
    p.H = 1;
    p.HV = 4097;
    require_problem_error(p, "HV", "must be in [1, 4096]");
  }
  SECTION("HV not a multiple of H") {
    p.H = 3;
    p.HV = 4;
    require_problem_error(p, "HV", "multiple of H");
  }
  SECTION("HV smaller than H") {
    p.H = 4;
    p.HV = 2;
    require_problem_error(p, "HV", "multiple of H");
  }
}

TEST_CASE("head sizes", "[problem][negative]") {
  Problem p = base_problem();
  SECTION("K = 0") {
    p.K = 0;
    require_problem_error(p, "K", "must be in [1, 4096]");
  }
  SECTION("K too large") {
    p.K = 4097;
    require_problem_error(p, "K", "must be in [1, 4096]");
  }
  SECTION("V = 0") {
    p.V = 0;
    require_problem_error(p, "V", "must be in [1, 4096]");
  }
  SECTION("V negative") {
    p.V = -7;
    require_problem_error(p, "V", "must be in [1, 4096]");
  }
  SECTION("V too large") {
    p.V = 4097;
    require_problem_error(p, "V", "must be in [1, 4096]");
  }
}

TEST_CASE("scale must be finite", "[problem][negative]") {
  for (double bad : {kNaN, kInf, -kInf}) {
    Problem p = base_problem();
    p.scale = bad;
    require_problem_error(p, "scale", "must be finite");
  }
  Problem p = base_problem();
  p.scale = 0.0;  // finite, even zero, is allowed: o = 0
  REQUIRE_NOTHROW(p.validate());
  REQUIRE(p.effective_scale() == 0.0);
}

TEST_CASE("state_slots rules", "[problem][negative]") {
  Problem p = base_problem();
  SECTION("negative") {
    p.state_slots = -1;
    p.has_h0 = true;
    require_problem_error(p, "state_slots", "must be >= 0");
  }
  SECTION("a cache that is neither read nor written") {
    p.state_slots = 2;
    require_problem_error(p, "state_slots", "needs has_h0 or has_hT");
  }
  SECTION("a cache that is only read or only written is valid") {
    p.state_slots = 2;
    p.has_h0 = true;
    REQUIRE_NOTHROW(p.validate());
    p.has_h0 = false;
    p.has_hT = true;
    REQUIRE_NOTHROW(p.validate());
  }
}

TEST_CASE("gate_dtype is f32 or the input dtype", "[problem][negative]") {
  Problem p = base_problem();
  p.input_dtype = DType::bf16;
  p.gate_dtype = DType::f16;
  require_problem_error(p, "gate_dtype", "must be f32 or the input dtype (bf16)");
  p.gate_dtype = DType::f64;
  require_problem_error(p, "gate_dtype", "must be f32 or the input dtype (bf16)");
  p.gate_dtype = DType::bf16;
  REQUIRE_NOTHROW(p.validate());
  p.gate_dtype = DType::f32;
  REQUIRE_NOTHROW(p.validate());
  p.input_dtype = DType::f32;
  p.gate_dtype = DType::bf16;
  require_problem_error(p, "gate_dtype", "must be f32 or the input dtype (f32)");
}

TEST_CASE("allow_negative_eigenvalues needs fused gates", "[problem][negative]") {
  Problem p = base_problem();
  p.allow_negative_eigenvalues = true;
  require_problem_error(p, "allow_negative_eigenvalues", "applies to fused gates only");
  p.gate_mode = GateMode::fused;
  REQUIRE_NOTHROW(p.validate());
}

TEST_CASE("fixed_length and packed reject bad sizes", "[problem][negative]") {
  require_error([] { Problem::fixed_length(0, 4, 1, 1, 4, 4); }, "batch", "must be >= 1");
  require_error([] { Problem::fixed_length(-3, 4, 1, 1, 4, 4); }, "batch", "must be >= 1");
  require_error([] { Problem::fixed_length(2, -1, 1, 1, 4, 4); }, "tokens_per_sequence", "must be >= 0");
  require_error([] { Problem::packed({2, -1, 3}, 1, 1, 4, 4); }, "lengths", "must be >= 0");
}

// ---------------------------------------------------------------------------------------------
// gdn::validate(problem, inputs)

TEST_CASE("validate(problem, inputs) checks the problem first", "[inputs][negative]") {
  Problem p = base_problem();
  const Inputs in = valid_inputs(p);
  p.HV = 3;  // inputs were shaped for HV = 4, but the problem rule must be the one reported
  require_inputs_error(p, in, "HV", "multiple of H");
}

TEST_CASE("every required tensor must be present", "[inputs][negative]") {
  SECTION("direct gates") {
    const Problem p = base_problem();
    for (const char* name : {"q", "k", "v", "g", "beta"}) {
      Inputs in = valid_inputs(p);
      if (std::string(name) == "q") in.q = {};
      if (std::string(name) == "k") in.k = {};
      if (std::string(name) == "v") in.v = {};
      if (std::string(name) == "g") in.g = {};
      if (std::string(name) == "beta") in.beta = {};
      require_inputs_error(p, in, name, "is required by this problem but was not given");
    }
  }
  SECTION("fused gates") {
    Problem p = base_problem();
    p.gate_mode = GateMode::fused;
    for (const char* name : {"a", "b", "A_log", "dt_bias"}) {
      Inputs in = valid_inputs(p);
      if (std::string(name) == "a") in.a = {};
      if (std::string(name) == "b") in.b = {};
      if (std::string(name) == "A_log") in.A_log = {};
      if (std::string(name) == "dt_bias") in.dt_bias = {};
      require_inputs_error(p, in, name, "is required by this problem but was not given");
    }
  }
  SECTION("h0 when the problem reads an initial state") {
    Problem p = base_problem();
    p.has_h0 = true;
    Inputs in = valid_inputs(p);
    in.h0 = {};
    require_inputs_error(p, in, "h0", "is required by this problem but was not given (expected shape [3, 4, 5, 3])");
  }
  SECTION("h0 holds the cache even when only hT is asked for") {
    Problem p = cache_problem();
    p.has_h0 = false;
    Inputs in = valid_inputs(p);
    in.h0 = {};
    require_inputs_error(p, in, "h0", "is required by this problem but was not given (expected shape [4, 4, 5, 3])");
  }
}

TEST_CASE("every tensor must have its shape", "[inputs][negative]") {
  SECTION("q, k, v, g, beta") {
    const Problem p = base_problem();  // T = 5, H = 2, HV = 4, K = 5, V = 3
    {
      Inputs in = valid_inputs(p);
      in.q = HostTensor<double>({5, 2, 4});
      require_inputs_error(p, in, "q", "must have shape [5, 2, 5], got [5, 2, 4]");
    }
    {
      Inputs in = valid_inputs(p);
      in.k = HostTensor<double>({5, 4, 5});  // keys shaped like value heads (GVA confusion)
      require_inputs_error(p, in, "k", "must have shape [5, 2, 5], got [5, 4, 5]");
    }
    {
      Inputs in = valid_inputs(p);
      in.k = HostTensor<double>({10, 5});  // right size, wrong rank
      require_inputs_error(p, in, "k", "must have shape [5, 2, 5], got [10, 5]");
    }
    {
      Inputs in = valid_inputs(p);
      in.v = HostTensor<double>({5, 2, 3});  // value tensor with H instead of HV heads
      require_inputs_error(p, in, "v", "must have shape [5, 4, 3], got [5, 2, 3]");
    }
    {
      Inputs in = valid_inputs(p);
      in.g = HostTensor<double>({5, 2});
      require_inputs_error(p, in, "g", "must have shape [5, 4], got [5, 2]");
    }
    {
      Inputs in = valid_inputs(p);
      in.beta = HostTensor<double>({4, 4});
      require_inputs_error(p, in, "beta", "must have shape [5, 4], got [4, 4]");
    }
  }
  SECTION("fused gate tensors") {
    Problem p = base_problem();
    p.gate_mode = GateMode::fused;
    {
      Inputs in = valid_inputs(p);
      in.a = HostTensor<double>({5, 4, 1});
      require_inputs_error(p, in, "a", "must have shape [5, 4], got [5, 4, 1]");
    }
    {
      Inputs in = valid_inputs(p);
      in.b = HostTensor<double>({6, 4});
      require_inputs_error(p, in, "b", "must have shape [5, 4], got [6, 4]");
    }
    {
      Inputs in = valid_inputs(p);
      in.A_log = HostTensor<double>({2});  // one per query/key head instead of per value head
      require_inputs_error(p, in, "A_log", "must have shape [4], got [2]");
    }
    {
      Inputs in = valid_inputs(p);
      in.dt_bias = HostTensor<double>({1, 4});
      require_inputs_error(p, in, "dt_bias", "must have shape [4], got [1, 4]");
    }
  }
  SECTION("h0: dense, V-major, and a cache") {
    Problem p = base_problem();
    p.has_h0 = true;
    {
      Inputs in = valid_inputs(p);
      in.h0 = HostTensor<double>({3, 4, 3, 5});  // V-major data for a K-major problem
      require_inputs_error(p, in, "h0", "must have shape [3, 4, 5, 3], got [3, 4, 3, 5]");
    }
    p.state_layout = StateLayout::v_major;
    {
      Inputs in = valid_inputs(p);
      REQUIRE(in.h0.shape() == gdn::Shape{3, 4, 3, 5});
      REQUIRE_NOTHROW(gdn::validate(p, in));
      in.h0 = HostTensor<double>({3, 4, 5, 3});
      require_inputs_error(p, in, "h0", "must have shape [3, 4, 3, 5], got [3, 4, 5, 3]");
    }
    const Problem c = cache_problem();
    {
      Inputs in = valid_inputs(c);
      in.h0 = HostTensor<double>({3, 4, 5, 3});  // one state per sequence instead of per slot
      require_inputs_error(c, in, "h0", "must have shape [4, 4, 5, 3], got [3, 4, 5, 3]");
    }
  }
}

TEST_CASE("gate values", "[inputs][negative]") {
  SECTION("g must not be NaN or +inf") {
    const Problem p = base_problem();
    for (double bad : {kNaN, kInf}) {
      Inputs in = valid_inputs(p);
      in.g[7] = bad;
      require_inputs_error(p, in, "g", "must not be NaN or +inf; element 7");
    }
  }
  SECTION("g = -inf is a legal hard reset") {
    const Problem p = base_problem();
    Inputs in = valid_inputs(p);
    in.g[3] = -kInf;
    REQUIRE_NOTHROW(gdn::validate(p, in));
  }
  SECTION("A_log and dt_bias must be finite") {
    Problem p = base_problem();
    p.gate_mode = GateMode::fused;
    for (double bad : {kNaN, kInf, -kInf}) {
      Inputs in = valid_inputs(p);
      in.A_log[2] = bad;
      require_inputs_error(p, in, "A_log", "must be finite; element 2");
      in = valid_inputs(p);
      in.dt_bias[3] = bad;
      require_inputs_error(p, in, "dt_bias", "must be finite; element 3");
    }
  }
}

TEST_CASE("state_indices rules", "[inputs][negative]") {
  const Problem p = cache_problem();  // N = 3, slots = 4, indices {0, -1, 1}
  SECTION("wrong count") {
    Inputs in = valid_inputs(p);
    in.state_indices.pop_back();
    require_inputs_error(p, in, "state_indices", "one slot per sequence (N = 3), got 2");
    in.state_indices = {0, 1, 2, 3};
    require_inputs_error(p, in, "state_indices", "one slot per sequence (N = 3), got 4");
    in.state_indices.clear();
    require_inputs_error(p, in, "state_indices", "one slot per sequence (N = 3), got 0");
  }
  SECTION("out of range") {
    for (std::int32_t bad : {4, 100, -2, std::numeric_limits<std::int32_t>::min()}) {
      Inputs in = valid_inputs(p);
      in.state_indices[2] = bad;
      require_inputs_error(p, in, "state_indices",
                           "must be -1 (padding) or in [0, state_slots = 4), got state_indices[2] = " +
                               std::to_string(bad));
    }
  }
  SECTION("duplicate slot with write-back") {
    Inputs in = valid_inputs(p);
    in.state_indices = {2, 0, 2};
    require_inputs_error(p, in, "state_indices", "must not name one slot twice when the state is written back; slot 2");
  }
  SECTION("duplicate slot without write-back is a read, and legal") {
    Problem read_only = p;
    read_only.has_hT = false;
    Inputs in = valid_inputs(read_only);
    in.state_indices = {2, 2, 2};
    REQUIRE_NOTHROW(gdn::validate(read_only, in));
  }
  SECTION("padding rows may repeat") {
    Inputs in = valid_inputs(p);
    in.state_indices = {-1, -1, -1};
    REQUIRE_NOTHROW(gdn::validate(p, in));
  }
  SECTION("given without a cache") {
    const Problem dense = base_problem();
    Inputs in = valid_inputs(dense);
    in.state_indices = {0, 1, 2};
    require_inputs_error(dense, in, "state_indices", "given but the problem has no state cache");
  }
}

// ---------------------------------------------------------------------------------------------
// Positive cases: what is legal must stay legal.

TEST_CASE("zero-length sequences are legal", "[problem]") {
  const Problem p = Problem::packed({0, 0, 4, 0}, 1, 1, 3, 2);
  REQUIRE(p.cu_seqlens == std::vector<std::int64_t>{0, 0, 0, 4, 4});
  REQUIRE(p.N() == 4);
  REQUIRE(p.T == 4);
  REQUIRE(p.seq_len(0) == 0);
  REQUIRE(p.seq_len(2) == 4);
  REQUIRE(p.seq_begin(3) == 4);
  REQUIRE_NOTHROW(gdn::validate(p, valid_inputs(p)));

  // A batch of nothing but empty sequences: T = 0, zero-row tensors are defined and valid.
  Problem empty = Problem::packed({0, 0}, 2, 2, 4, 4);
  empty.has_h0 = empty.has_hT = true;
  const Inputs in = valid_inputs(empty);
  REQUIRE(in.q.defined());
  REQUIRE(in.q.numel() == 0);
  REQUIRE_NOTHROW(gdn::validate(empty, in));
}

TEST_CASE("padding rows (index -1) in the state cache are legal", "[problem]") {
  Problem p = cache_problem();
  p.state_slots = 1;  // fewer slots than sequences is fine when the others are padding
  Inputs in = valid_inputs(p);
  in.h0 = HostTensor<double>(p.state_shape());
  in.state_indices = {-1, 0, -1};
  REQUIRE_NOTHROW(gdn::validate(p, in));
  REQUIRE(p.state_shape() == gdn::Shape{1, 4, 5, 3});
}

TEST_CASE("fixed_length is the packed case with equal lengths", "[problem]") {
  const Problem p = Problem::fixed_length(3, 5, 2, 6, 7, 9);
  REQUIRE(p.cu_seqlens == std::vector<std::int64_t>{0, 5, 10, 15});
  REQUIRE(p.T == 15);
  REQUIRE(p.N() == 3);
  REQUIRE(p.H == 2);
  REQUIRE(p.HV == 6);
  REQUIRE(p.group_size() == 3);
  REQUIRE(p.K == 7);
  REQUIRE(p.V == 9);
  REQUIRE_NOTHROW(p.validate());
  REQUIRE(p.q_shape() == gdn::Shape{15, 2, 7});
  REQUIRE(p.v_shape() == gdn::Shape{15, 6, 9});
  REQUIRE(p.state_shape() == gdn::Shape{3, 6, 7, 9});

  const Problem zero = Problem::fixed_length(2, 0, 1, 1, 1, 1);
  REQUIRE(zero.cu_seqlens == std::vector<std::int64_t>{0, 0, 0});
  REQUIRE_NOTHROW(zero.validate());
}

TEST_CASE("derived quantities", "[problem]") {
  Problem p = Problem::packed({2}, 1, 1, 16, 8);
  REQUIRE(p.effective_scale() == 0.25);
  p.scale = 0.5;
  REQUIRE(p.effective_scale() == 0.5);
  p.state_layout = StateLayout::v_major;
  REQUIRE(p.state_shape() == gdn::Shape{1, 1, 8, 16});
  REQUIRE(p.intermediate_shape() == gdn::Shape{2, 1, 8, 16});
  p.state_slots = 5;
  p.has_hT = true;
  REQUIRE(p.state_shape() == gdn::Shape{5, 1, 8, 16});
  const std::string text = p.describe();
  CHECK_THAT(text, Catch::Matchers::Contains("K=16"));
  CHECK_THAT(text, Catch::Matchers::Contains("v_major"));
  CHECK_THAT(text, Catch::Matchers::Contains("slots=5"));
}

TEST_CASE("bounds are inclusive", "[problem]") {
  Problem p = Problem::packed({1}, 4096, 4096, 4096, 1);
  REQUIRE_NOTHROW(p.validate());
  p = Problem::packed({1}, 1, 1, 1, 4096);
  REQUIRE_NOTHROW(p.validate());
  p.cu_seqlens = {0, std::int64_t(1) << 40};
  p.T = std::int64_t(1) << 40;
  REQUIRE_NOTHROW(p.validate());
}

TEST_CASE("dtype names round-trip", "[dtype]") {
  for (DType d : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    DType parsed = DType::f64;
    REQUIRE(gdn::parse_dtype(gdn::dtype_name(d), &parsed));
    REQUIRE(parsed == d);
  }
  DType out;
  REQUIRE_FALSE(gdn::parse_dtype("int8", &out));
}

TEST_CASE("state_dtype: f32, bf16 or f16", "[problem][state_dtype]") {
  Problem p = base_problem();
  for (DType ok : {DType::f32, DType::bf16, DType::f16}) {
    p.state_dtype = ok;
    CHECK_NOTHROW(p.validate());
  }
  p.state_dtype = DType::f64;
  require_problem_error(p, "state_dtype", "must be f32, bf16 or f16");
  p.state_dtype = DType::bf16;
  CHECK_THAT(p.describe(), Catch::Matchers::Contains("state=bf16"));
}

TEST_CASE("gate_space linear: direct gates only, alpha in [0, inf)", "[problem][gate_space]") {
  Problem p = base_problem();
  p.gate_space = gdn::GateSpace::linear;
  CHECK_NOTHROW(p.validate());
  CHECK(p.linear_gates());
  CHECK(std::string(p.decay_name()) == "alpha");
  CHECK_THAT(p.describe(), Catch::Matchers::Contains("alpha"));
  Inputs in = valid_inputs(p);
  in.g = HostTensor<double>(p.gate_shape(), 1.0);  // alpha = 1: no decay
  CHECK_NOTHROW(gdn::validate(p, in));
  in.g[0] = 0.0;  // the hard reset
  CHECK_NOTHROW(gdn::validate(p, in));
  in.g[1] = 1.5;  // growth, as a positive finite g is accepted
  CHECK_NOTHROW(gdn::validate(p, in));
  for (double bad : {-0.25, kNaN, kInf, -kInf}) {
    Inputs broken = in;
    broken.g[2] = bad;
    require_inputs_error(p, broken, "alpha", "must be finite and >= 0");
  }
  Inputs missing = in;
  missing.g = HostTensor<double>();
  require_inputs_error(p, missing, "alpha", "is required");

  Problem fused = base_problem();
  fused.gate_mode = GateMode::fused;
  fused.gate_space = gdn::GateSpace::linear;
  require_problem_error(fused, "gate_space", "direct gates only");
  // Log space is the default and keeps g's rules: -inf legal, +inf not.
  Problem log = base_problem();
  CHECK(std::string(log.decay_name()) == "g");
  Inputs g = valid_inputs(log);
  g.g[0] = -kInf;
  CHECK_NOTHROW(gdn::validate(log, g));
  g.g[0] = kInf;
  require_inputs_error(log, g, "g", "must not be NaN or +inf");
}
