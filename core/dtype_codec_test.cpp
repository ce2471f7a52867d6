#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype_codec.hpp"

namespace {

std::uint16_t bits16(gdn::DType dtype, double x) {
  std::uint8_t b[2];
  gdn::encode_element(dtype, x, b);
  std::uint16_t v;
  std::memcpy(&v, b, 2);
  return v;
}

}  // namespace

TEST_CASE("dtype codec: known bit patterns of bf16 and f16") {
  using gdn::DType;
  CHECK(bits16(DType::bf16, 1.0) == 0x3F80);
  CHECK(bits16(DType::bf16, -2.0) == 0xC000);
  CHECK(bits16(DType::f16, 1.0) == 0x3C00);
  CHECK(bits16(DType::f16, 65504.0) == 0x7BFF);
  CHECK(bits16(DType::f16, 1e6) == 0x7C00);  // overflow rounds to +inf
  // Ties round to even: 1 + 2^-8 lies halfway between bf16's 1 and 1 + 2^-7.
  CHECK(bits16(DType::bf16, 1.0 + 0x1p-8) == 0x3F80);
  CHECK(bits16(DType::bf16, 1.0 + 3 * 0x1p-8) == 0x3F82);
}

TEST_CASE("dtype codec: every type round-trips its representable values and NaN") {
  using gdn::DType;
  for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    gdn::HostTensor<double> t({2, 3});
    const double values[] = {0.0, -0.0, 1.5, -0.25, 0x1p-14, std::numeric_limits<double>::infinity()};
    for (int i = 0; i < 6; ++i) t[i] = values[i];
    const std::vector<std::uint8_t> bytes = gdn::encode_tensor(t, dtype);
    REQUIRE(bytes.size() == 6 * gdn::dtype_size(dtype));
    const gdn::HostTensor<double> back = gdn::decode_tensor(bytes.data(), bytes.size(), dtype, t.shape());
    for (int i = 0; i < 6; ++i) {
      CHECK(back[i] == t[i]);
      CHECK(std::signbit(back[i]) == std::signbit(t[i]));
    }
    std::uint8_t nan_bytes[8];
    gdn::encode_element(dtype, std::nan(""), nan_bytes);
    CHECK(std::isnan(gdn::decode_element(dtype, nan_bytes)));
  }
}

TEST_CASE("dtype codec: a byte count that does not fit the shape is refused") {
  const std::vector<std::uint8_t> bytes(6);
  CHECK_THROWS_AS(gdn::decode_tensor(bytes.data(), bytes.size(), gdn::DType::f32, {2}), std::invalid_argument);
}
