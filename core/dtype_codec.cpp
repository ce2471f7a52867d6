#include "core/dtype_codec.hpp"

#include <Eigen/Core>
#include <cstring>
#include <stdexcept>
#include <string>

namespace gdn {

void encode_element(DType dtype, double value, std::uint8_t* dst) {
  switch (dtype) {
    case DType::f64: std::memcpy(dst, &value, 8); return;
    case DType::f32: {
      const float f = static_cast<float>(value);
      std::memcpy(dst, &f, 4);
      return;
    }
    case DType::bf16: {
      const auto bits = Eigen::numext::bit_cast<std::uint16_t>(Eigen::bfloat16(static_cast<float>(value)));
      std::memcpy(dst, &bits, 2);
      return;
    }
    case DType::f16: {
      const auto bits = Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(static_cast<float>(value)));
      std::memcpy(dst, &bits, 2);
      return;
    }
  }
  throw std::invalid_argument("encode_element: unknown dtype");
}

double decode_element(DType dtype, const std::uint8_t* src) {
  switch (dtype) {
    case DType::f64: {
      double d;
      std::memcpy(&d, src, 8);
      return d;
    }
    case DType::f32: {
      float f;
      std::memcpy(&f, src, 4);
      return f;
    }
    case DType::bf16: {
      std::uint16_t bits;
      std::memcpy(&bits, src, 2);
      return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(bits));
    }
    case DType::f16: {
      std::uint16_t bits;
      std::memcpy(&bits, src, 2);
      return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(bits));
    }
  }
  throw std::invalid_argument("decode_element: unknown dtype");
}

std::vector<std::uint8_t> encode_tensor(const HostTensor<double>& tensor, DType dtype) {
  const std::size_t width = dtype_size(dtype);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(tensor.numel()) * width);
  for (std::int64_t i = 0; i < tensor.numel(); ++i)
    encode_element(dtype, tensor[i], bytes.data() + static_cast<std::size_t>(i) * width);
  return bytes;
}

HostTensor<double> decode_tensor(const std::uint8_t* bytes, std::size_t size, DType dtype, const Shape& shape) {
  HostTensor<double> tensor(shape);
  const std::size_t width = dtype_size(dtype);
  if (size != static_cast<std::size_t>(tensor.numel()) * width)
    throw std::invalid_argument("decode_tensor: " + std::to_string(size) + " bytes for " + shape_string(shape) +
                                " of " + dtype_name(dtype));
  for (std::int64_t i = 0; i < tensor.numel(); ++i)
    tensor[i] = decode_element(dtype, bytes + static_cast<std::size_t>(i) * width);
  return tensor;
}

}  // namespace gdn
