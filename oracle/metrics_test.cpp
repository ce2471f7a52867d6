#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "oracle/metrics.hpp"

using namespace gdn;
using namespace gdn::oracle;

namespace {
// Two sequences of two tokens, HV = 2, V = 3: o has 4 * 2 * 3 = 24 elements.
Problem small_problem() {
  Problem p = Problem::packed({2, 2}, 1, 2, 4, 3);
  p.has_hT = true;
  return p;
}
}  // namespace

TEST_CASE("a planted error of known size gives the expected metrics and location", "[oracle][metrics]") {
  const Problem p = small_problem();
  HostTensor<double> ref(p.v_shape(), 1.0);
  HostTensor<double> x = ref;
  // token 2 (first of sequence 1), value head 1, element v = 2
  const std::int64_t flat = (2 * p.HV + 1) * p.V + 2;
  x[flat] = 1.25;
  const TensorMetrics m = compare(p, nullptr, OutputTensor::o, ref, x);
  CHECK(m.count == 24);
  CHECK(m.max_abs_error == 0.25);
  CHECK(m.rms_error == Approx(0.25 / std::sqrt(24.0)).epsilon(1e-12));
  CHECK(m.rms_ref == Approx(1.0));
  CHECK(m.rel_rms == Approx(0.25 / std::sqrt(24.0)).epsilon(1e-12));
  CHECK(m.max_rel_error == Approx(0.25));
  CHECK(m.max_ulp == 0.25 / 0x1p-23);  // fp32 spacing at 1.0 is 2^-23
  CHECK(m.mismatches == 1);
  CHECK(m.nan_count == 0);
  CHECK(m.worst.flat == flat);
  CHECK(m.worst.sequence == 1);
  CHECK(m.worst.token == 2);
  CHECK(m.worst.position == 0);
  CHECK(m.worst.head == 1);
  CHECK(m.worst.v == 2);
  CHECK(m.worst_ref == 1.0);
  CHECK(m.worst_value == 1.25);
}

TEST_CASE("the relative-error floor keeps near-zero references from dominating", "[oracle][metrics]") {
  const Problem p = small_problem();
  HostTensor<double> ref(p.v_shape(), 1.0);
  ref[0] = 1e-9;
  HostTensor<double> x = ref;
  x[0] = 2e-9;  // relative error 1 against |ref|, tiny against the floor 1e-3 * rms(ref)
  const TensorMetrics m = compare(p, nullptr, OutputTensor::o, ref, x);
  CHECK(m.rel_floor == Approx(1e-3 * m.rms_ref));
  CHECK(m.max_rel_error == Approx(1e-9 / m.rel_floor));
  CHECK(m.max_rel_error < 1e-5);
}

TEST_CASE("NaN and Inf in the output are counted and fail every metric", "[oracle][metrics]") {
  const Problem p = small_problem();
  HostTensor<double> ref(p.v_shape(), 0.5);
  HostTensor<double> x = ref;
  x[7] = std::numeric_limits<double>::quiet_NaN();
  x[9] = INFINITY;
  const TensorMetrics m = compare(p, nullptr, OutputTensor::o, ref, x);
  CHECK(m.nan_count == 1);
  CHECK(m.inf_count == 1);
  CHECK(m.nonfinite_mismatches == 2);
  CHECK(std::isinf(m.max_abs_error));
  CHECK(std::isinf(m.rel_rms));
  CHECK(m.worst.flat == 7);
}

TEST_CASE("NaN where the reference is NaN is a match", "[oracle][metrics]") {
  const Problem p = small_problem();
  HostTensor<double> ref(p.v_shape(), 0.5);
  ref[3] = std::numeric_limits<double>::quiet_NaN();
  HostTensor<double> x = ref;
  const TensorMetrics m = compare(p, nullptr, OutputTensor::o, ref, x);
  CHECK(m.ref_nan_count == 1);
  CHECK(m.nonfinite_mismatches == 0);
  CHECK(m.max_abs_error == 0);
  CHECK(m.mismatches == 0);
}

TEST_CASE("state locations decode through layout and the state cache", "[oracle][metrics]") {
  Problem p = Problem::packed({3, 0, 2}, 1, 2, 4, 3);
  p.has_hT = true;
  p.has_h0 = true;
  SECTION("dense K-major") {
    // row 2, head 1, k = 3, v = 1
    const std::int64_t flat = ((2 * 2 + 1) * 4 + 3) * 3 + 1;
    const Location l = locate(p, nullptr, OutputTensor::hT, flat);
    CHECK(l.sequence == 2);
    CHECK(l.head == 1);
    CHECK(l.k == 3);
    CHECK(l.v == 1);
    CHECK(l.token == -1);
  }
  SECTION("V-major") {
    p.state_layout = StateLayout::v_major;
    // row 0, head 0, element at [v = 2][k = 1]
    const Location l = locate(p, nullptr, OutputTensor::hT, 2 * 4 + 1);
    CHECK(l.v == 2);
    CHECK(l.k == 1);
  }
  SECTION("state cache slot maps back to the sequence that names it") {
    p.state_slots = 5;
    Inputs in;
    in.state_indices = {4, -1, 1};
    const std::int64_t per_row = 2 * 4 * 3;
    CHECK(locate(p, &in, OutputTensor::hT, 1 * per_row).sequence == 2);
    CHECK(locate(p, &in, OutputTensor::hT, 4 * per_row).sequence == 0);
    const Location unused = locate(p, &in, OutputTensor::hT, 3 * per_row);
    CHECK(unused.sequence == -1);
    CHECK(unused.state_row == 3);
  }
  SECTION("o after a zero-length sequence") {
    // token 3 is the first of sequence 2 (sequence 1 is empty)
    const Location l = locate(p, nullptr, OutputTensor::o, 3 * 2 * 3);
    CHECK(l.sequence == 2);
    CHECK(l.position == 0);
  }
}

TEST_CASE("fp32 ULP distance", "[oracle][metrics]") {
  CHECK(ulp_distance_f32(1.0f, 1.0f) == 0);
  CHECK(ulp_distance_f32(1.0f, std::nextafter(1.0f, 2.0f)) == 1);
  CHECK(ulp_distance_f32(0.0f, -0.0f) == 0);
  const float tiny = std::numeric_limits<float>::denorm_min();
  CHECK(ulp_distance_f32(tiny, -tiny) == 2);
  CHECK(ulp_distance_f32(1.0f, 2.0f) == double(1 << 23));
  CHECK(std::isinf(ulp_distance_f32(1.0f, std::nanf(""))));
}

TEST_CASE("ulp_of gives the spacing of each dtype", "[oracle][metrics]") {
  CHECK(ulp_of(DType::f32, 1.0) == 0x1p-23);
  CHECK(ulp_of(DType::bf16, 1.0) == 0x1p-7);
  CHECK(ulp_of(DType::f16, 1.0) == 0x1p-10);
  CHECK(ulp_of(DType::bf16, 3.0) == 0x1p-6);
  CHECK(ulp_of(DType::f16, 1e-7) == 0x1p-24);  // subnormal spacing
  CHECK(ulp_of(DType::f64, 1.0) == 0x1p-52);
}

TEST_CASE("shape mismatch is an error naming the tensor", "[oracle][metrics]") {
  const Problem p = small_problem();
  HostTensor<double> ref(p.v_shape()), x(Shape{1, 2});
  CHECK_THROWS_WITH(compare(p, nullptr, OutputTensor::o, ref, x), Catch::Contains("'o'"));
}

TEST_CASE("finite values above 1e154 give finite rms metrics, not inf or inf / inf", "[oracle][metrics][nonfinite]") {
  // Their squares overflow double: the sums are taken again, scaled by the largest term.
  const Problem p = small_problem();
  HostTensor<double> ref(p.v_shape(), 1e200);
  HostTensor<double> x = ref;
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] *= 1 + 1e-3;
  const TensorMetrics m = compare(p, nullptr, OutputTensor::o, ref, x);
  CHECK(m.nonfinite_mismatches == 0);
  CHECK(m.rms_ref == Approx(1e200).epsilon(1e-12));
  CHECK(m.rms_error == Approx(1e197).epsilon(1e-9));
  CHECK(m.rel_rms == Approx(1e-3).epsilon(1e-9));
  // Mixed magnitudes: one huge element among ones.
  HostTensor<double> mixed(p.v_shape(), 1.0);
  mixed[5] = 1e300;
  HostTensor<double> y = mixed;
  y[5] = 1.5e300;
  const TensorMetrics n = compare(p, nullptr, OutputTensor::o, mixed, y);
  CHECK(n.rms_ref == Approx(1e300 / std::sqrt(24.0)).epsilon(1e-12));
  CHECK(n.rel_rms == Approx(0.5).epsilon(1e-12));
  // An error that itself exceeds the largest double stays inf.
  HostTensor<double> far = mixed;
  far[5] = -1.7e308;
  mixed[5] = 1.7e308;
  CHECK(std::isinf(compare(p, nullptr, OutputTensor::o, mixed, far).rms_error));
}
