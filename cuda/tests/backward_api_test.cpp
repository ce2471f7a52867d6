// Host-side argument checks of the CUDA backward (cuda/api/backward.hpp): they run before any
// CUDA call, so these tests run (and must pass) on machines without a GPU. The pointers are
// fake, aligned addresses: a check that let one through would reach the launch and fail
// differently.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "cuda/api/backward.hpp"

using namespace gdn;
using namespace gdn::cuda;

namespace {

template <class T = void>
T* fake(int slot) {
  return reinterpret_cast<T*>(std::uintptr_t(1) << 40 | std::uintptr_t(slot) << 28);
}

Problem small_problem() {
  Problem p = Problem::packed({3, 0, 70}, 2, 4, 32, 48);
  p.has_h0 = true;
  p.has_hT = true;
  return p;
}

BackwardTensors tensors_for(const Problem& p, BackwardAlgorithm algorithm = BackwardAlgorithm::sequential) {
  BackwardTensors t;
  t.forward.q = fake(1);
  t.forward.k = fake(2);
  t.forward.v = fake(3);
  if (p.gate_mode == GateMode::direct) {
    t.forward.g = fake(4);
    t.forward.beta = fake(5);
    t.dg = fake(20);
    t.dbeta = fake(21);
  } else {
    t.forward.a = fake(4);
    t.forward.b = fake(5);
    t.forward.A_log = fake<const float>(11);
    t.forward.dt_bias = fake<const float>(12);
    t.da = fake(20);
    t.db = fake(21);
    t.dA_log = fake<float>(22);
    t.ddt_bias = fake<float>(23);
  }
  if (p.has_h0) {
    t.forward.h0 = fake<const float>(6);
    t.dh0 = fake<float>(24);
  }
  t.forward.cu_seqlens = fake(9);
  t.dO = fake(13);
  if (p.has_hT) t.dhT = fake<const float>(14);
  t.dq = fake(15);
  t.dk = fake(16);
  t.dv = fake(17);
  t.workspace = fake(30);
  t.workspace_bytes = backward_workspace_bytes(p, algorithm);
  return t;
}

template <class F>
void require_error(F check, const std::string& argument, const std::string& fragment) {
  try {
    check();
    FAIL("expected ProblemError for '" << argument << "'");
  } catch (const ProblemError& e) {
    INFO(e.what());
    CHECK(e.argument() == argument);
    CHECK(e.rule().find(fragment) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("a well-formed backward passes the host checks") {
  const Problem p = small_problem();
  CHECK_NOTHROW(validate_backward(p, tensors_for(p)));
  BackwardTensors t = tensors_for(p);
  t.dhT = nullptr;  // dhT is optional: zero
  CHECK_NOTHROW(validate_backward(p, t));
  Problem fused = small_problem();
  fused.gate_mode = GateMode::fused;
  CHECK_NOTHROW(validate_backward(fused, tensors_for(fused)));
}

TEST_CASE("the workspace holds the partial sums of every V tile and a state every 64 tokens") {
  const Problem p = small_problem();  // T = 73, HV = 4, K = 32, V = 48: 3 tiles, 1 checkpoint
  const std::int64_t floats = 2 * p.T * p.H + 2 * p.T * p.HV + 2 * 3 * p.T * p.HV * p.K + 2 * 3 * p.T * p.HV +
                              1 * p.HV * p.K * p.V;
  CHECK(backward_workspace_bytes(p) == static_cast<std::size_t>(floats) * 4);
  BackwardTensors t = tensors_for(p);
  t.workspace_bytes -= 4;
  require_error([&] { validate_backward(p, t); }, "workspace_bytes", "at least");
}

TEST_CASE("the chunked backward's workspace holds each chunk's intermediates for at most T / 64 + N chunks") {
  const Problem p = small_problem();  // lengths 3, 0, 70: 1 + 0 + 2 chunks; bound 73 / 64 + 3 = 4
  const std::int64_t chunks = 4, C = 64;
  const std::int64_t table_floats = ((chunks * 8 + chunks * 4 + (p.N() + 1) * 4 + 15) / 16) * 4;
  const std::int64_t per_slot = 5 * C + 2 * C * C + C * p.K + 3 * C * p.V + 2 * p.K * p.V;
  const std::int64_t floats = table_floats + 2 * p.T * p.H + 2 * p.T * p.HV + 2 * p.T * p.HV * p.K +
                              2 * p.T * p.HV + chunks * p.HV * per_slot;
  CHECK(backward_workspace_bytes(p, BackwardAlgorithm::chunked) == static_cast<std::size_t>(floats) * 4);
  BackwardTensors t = tensors_for(p, BackwardAlgorithm::chunked);
  CHECK_NOTHROW(validate_backward(p, t, BackwardAlgorithm::chunked));
  // The sequential backward's workspace is not the chunked one's.
  t.workspace_bytes = backward_workspace_bytes(p);
  REQUIRE(t.workspace_bytes < backward_workspace_bytes(p, BackwardAlgorithm::chunked));
  require_error([&] { validate_backward(p, t, BackwardAlgorithm::chunked); }, "workspace_bytes", "at least");
}

TEST_CASE("the chunked backward takes K <= 128, the sequential one K <= 256") {
  Problem p = small_problem();
  p.K = 129;
  CHECK_NOTHROW(validate_backward(p, tensors_for(p)));
  require_error([&] { validate_backward(p, tensors_for(p, BackwardAlgorithm::chunked), BackwardAlgorithm::chunked); },
                "K", "<= 128");
  p.K = 128;
  CHECK_NOTHROW(validate_backward(p, tensors_for(p, BackwardAlgorithm::chunked), BackwardAlgorithm::chunked));
}

TEST_CASE("the backward rejects what it does not cover, naming the option") {
  Problem p = small_problem();
  p.state_slots = 4;
  require_error([&] { validate_backward(p, tensors_for(p)); }, "state_slots", "dense states");
  p = small_problem();
  p.store_intermediate_states = true;
  require_error([&] { validate_backward(p, tensors_for(p)); }, "store_intermediate_states", "per-token");
  p = small_problem();
  p.K = 257;
  require_error([&] { validate_backward(p, tensors_for(p)); }, "K", "<= 256");
  p = small_problem();
  p.input_dtype = DType::f64;
  p.gate_dtype = DType::f64;
  require_error([&] { validate_backward(p, tensors_for(p)); }, "input_dtype", "f64");
}

TEST_CASE("missing, superfluous and overlapping backward buffers are rejected") {
  const Problem p = small_problem();
  BackwardTensors t = tensors_for(p);
  t.dO = nullptr;
  require_error([&] { validate_backward(p, t); }, "dO", "required");
  t = tensors_for(p);
  t.dq = nullptr;
  require_error([&] { validate_backward(p, t); }, "dq", "required");
  t = tensors_for(p);
  t.da = fake(40);  // a fused-gate gradient with direct gates
  require_error([&] { validate_backward(p, t); }, "da", "must be null");
  t = tensors_for(p);
  t.forward.o = fake(41);
  require_error([&] { validate_backward(p, t); }, "o", "must be null");
  t = tensors_for(p);
  t.dk = t.dq;
  require_error([&] { validate_backward(p, t); }, "dq", "overlap");
  Problem no_hT = small_problem();
  no_hT.has_hT = false;
  t = tensors_for(no_hT);
  t.dhT = fake<const float>(14);
  require_error([&] { validate_backward(no_hT, t); }, "dhT", "has_hT = false");
  Problem no_h0 = small_problem();
  no_h0.has_h0 = false;
  t = tensors_for(no_h0);
  t.dh0 = fake<float>(24);
  require_error([&] { validate_backward(no_h0, t); }, "dh0", "must be null");
}
