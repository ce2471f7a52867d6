#pragma once
// Warp-level matrix instructions (sm_80 and later): ldmatrix / stmatrix between shared memory and
// the fragment registers, and the mma.sync m16n8k16 tensor-core product with fp32 accumulators.
// Contract (PTX ISA): all 32 lanes of the warp execute each one together (.sync.aligned); for
// ldmatrix / stmatrix each lane supplies the shared address of one 16-byte row of the 8 x 8
// matrices (lanes 0-7 the first matrix, 8-15 the second, ...; x2 uses lanes 0-15), 16-byte
// aligned, and .trans transposes each 8 x 8 matrix on the way. Fragment layouts are the ISA's
// m16n8k16 ones: a lane holds (row g, columns 2t, 2t + 1) and (row g + 8, same columns) of a
// 16 x 8 accumulator block, g = lane / 4, t = lane % 4.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/ptx/sync.cuh"

namespace gdn::cuda::ptx {

// Loads four (x4) or two (x2) 8 x 8 matrices of 16-bit elements, one 32-bit register per
// matrix per lane; _t: transposed.
__device__ __forceinline__ void ldsm_x4(std::uint32_t (&r)[4], const void* p) {
  const unsigned a = smem_address(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(std::uint32_t (&r)[4], const void* p) {
  const unsigned a = smem_address(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ void ldsm_x2(std::uint32_t (&r)[2], const void* p) {
  const unsigned a = smem_address(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a) : "memory");
}
__device__ __forceinline__ void ldsm_x2_t(std::uint32_t (&r)[2], const void* p) {
  const unsigned a = smem_address(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(a)
               : "memory");
}

// D[16 x 8] += A[16 x 16] (row-major fragment) B[16 x 8] (column-major fragment), fp32
// accumulators; the last parameter (bf16 or fp16, by value) selects the input type.
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                                             __nv_bfloat16) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                                             __half) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Stores four 8 x 8 matrices of 16-bit elements from registers, transposed (the inverse of
// ldsm_x4_t; sm_90 and later).
__device__ __forceinline__ void stsm_x4_t(void* p, std::uint32_t r0, std::uint32_t r1, std::uint32_t r2,
                                          std::uint32_t r3) {
  const unsigned a = smem_address(p);
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

}  // namespace gdn::cuda::ptx
