#pragma once
// The one codec between values and the bytes of the element types (little-endian IEEE binary64,
// binary32, bfloat16, binary16), used wherever tensors leave the host's doubles: case files,
// device buffers, benchmarks. Encoding rounds to nearest even through binary32 (the value is
// first rounded to binary32, then to the 16-bit type); callers that need the value to be exactly
// representable check that before encoding (oracle/case_file.cpp does).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.hpp"
#include "core/host_tensor.hpp"

namespace gdn {

// One element: writes dtype_size(dtype) bytes at dst / reads them from src.
void encode_element(DType dtype, double value, std::uint8_t* dst);
double decode_element(DType dtype, const std::uint8_t* src);

// A whole tensor, row-major.
std::vector<std::uint8_t> encode_tensor(const HostTensor<double>& tensor, DType dtype);
// `size` must be numel(shape) * dtype_size(dtype); throws std::invalid_argument otherwise.
HostTensor<double> decode_tensor(const std::uint8_t* bytes, std::size_t size, DType dtype, const Shape& shape);

}  // namespace gdn
