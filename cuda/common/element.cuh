#pragma once
// Device conversions of the input element types to fp32, shared by the kernel families. Exact
// (every bf16 and fp16 value is an fp32 value); overloads, so that a kernel templated on the
// element type converts without a switch on the dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace gdn::cuda::detail {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

}  // namespace gdn::cuda::detail
