#pragma once
// Hopper's warpgroup MMA (wgmma.mma_async, sm_90a): the instructions, the matrix descriptors of
// the shared-memory layouts the chunked kernels use, and the fences around them.
//
// Contract (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"): all 128 threads
// of a warpgroup execute every wrapper here together (.sync.aligned). A product is issued after
// fence() (which orders the accumulator registers' earlier accesses before it), belongs to the
// group the next commit() closes, and its accumulators and shared-memory operands may be touched
// again only after wait_group<N>() has seen that group done; fence_operand() then keeps the
// compiler from moving the accumulators' reads above the wait (to it the asm statements look
// synchronous). Shared-memory operands written by ordinary stores need
// ptx::fence_proxy_async_shared() (cuda/ptx/sync.cuh) and a barrier before the product is issued.
// Every product accumulates in fp32 (scale-d 1) with scale-a = scale-b = 1; the accumulator's
// shape (NT = N / 8 blocks of 4 registers) and the last parameter (the input type, bf16 or
// fp16, by value) select the instruction.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace gdn::cuda::ptx::wgmma {

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// All but the newest N committed groups done.
template <int N>
__device__ __forceinline__ void wait_group() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void wait_all() { wait_group<0>(); }
// After a wait: the accumulators (or register A operands) are read or rewritten only below this
// point. No instruction: an empty asm that claims to modify each register.
template <int NT>
__device__ __forceinline__ void fence_operand(float (&d)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[nt][e])::"memory");
}
template <int NT>
__device__ __forceinline__ void fence_operand(std::uint32_t (&a)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}

// B tiles: rows (the k of the product) x NW columns of a 2-byte type in the no-swizzle MN-major
// canonical layout of wgmma: 8 x 8 core matrices of 128 contiguous bytes (8 rows of 16 bytes,
// one row = 8 consecutive columns); the core matrices of a block of 8 rows side by side (stride
// dimension byte offset 128), blocks of 8 rows one after another (leading dimension byte offset
// NW x 16 bytes). Element index of (row k, column n):
template <int NW>
__device__ __forceinline__ int blocked(int k, int n) {
  return ((k >> 3) * (NW / 8) + (n >> 3)) * 64 + ((k & 7) << 3) + (n & 7);
}
// Descriptor of the 16 rows of k step ks of a B tile (no swizzle, base offset 0).
template <int NW>
__device__ __forceinline__ std::uint64_t b_desc(const void* tile, int ks) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(tile)) + unsigned(ks) * 32u * NW;
  return std::uint64_t((address & 0x3FFFF) >> 4) | (std::uint64_t((NW * 16) >> 4) << 16) |
         (std::uint64_t(128 >> 4) << 32);
}

// Descriptor of k step ks (16 columns) of a K-major A tile of 64 rows as the tensor copies (and
// the prepass's record stores) leave it: slabs of 64 columns, rows of 128 bytes, 128-byte swizzle
// (swizzled<128>), 1024-byte aligned. Groups of 8 rows are 1024 bytes apart (stride byte offset;
// the leading byte offset is unused for swizzled K-major tiles), and a k step within a slab moves
// the start address by 32 bytes: the hardware applies the swizzle to the address bits, as the
// copies did.
__device__ __forceinline__ std::uint64_t a_desc_sw128(const void* tile, int ks) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(tile)) + unsigned(ks >> 2) * 8192u +
                           unsigned(ks & 3) * 32u;
  return std::uint64_t((address & 0x3FFFF) >> 4) | (std::uint64_t(1) << 16) | (std::uint64_t(1024 >> 4) << 32) |
         (std::uint64_t(1) << 62);
}

// Descriptor of k step ks (16 rows) of an MN-major B tile as the tensor copies leave K: rows of
// the reduction index (tokens) 128 bytes apart, 64 columns per slab, slabs 8192 bytes apart,
// 128-byte swizzle. In CUTLASS's canonical form for 128-byte swizzled MN-major operands,
// ((8, 8, m), (8, k)) : ((1, 8, LBO), (64, SBO)) in elements: LBO steps over the 64-column
// slabs (8192 bytes), SBO over the groups of 8 rows (1024 bytes).
__device__ __forceinline__ std::uint64_t b_desc_mn_sw128(const void* tile, int ks) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(tile)) + unsigned(ks) * 2048u;
  return std::uint64_t((address & 0x3FFFF) >> 4) | (std::uint64_t(8192 >> 4) << 16) |
         (std::uint64_t(1024 >> 4) << 32) | (std::uint64_t(1) << 62);
}

// D[64 x 8 NT] (+)= A[64 x 16] B[16 x 8 NT], fp32 accumulators, A from registers (the mma.sync
// m16n8k16 A fragment of each warp's 16 rows), B from shared memory (MN-major: imm-trans-b 1).
// The accumulator of each warp's 16 rows has the mma.sync layout per 8 columns: d[nt][0..1] at
// (row g, columns 8 nt + 2 t, + 1), d[nt][2..3] at row g + 8.
__device__ __forceinline__ void mma_rs(float (&d)[1][4], const std::uint32_t (&a)[4], std::uint64_t b, __nv_bfloat16) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, 1, 1, 1, 1;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
__device__ __forceinline__ void mma_rs(float (&d)[2][4], const std::uint32_t (&a)[4], std::uint64_t b, __nv_bfloat16) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, 1, 1, 1, 1;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
__device__ __forceinline__ void mma_rs(float (&d)[4][4], const std::uint32_t (&a)[4], std::uint64_t b, __nv_bfloat16) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, 1, 1, 1, 1;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
__device__ __forceinline__ void mma_rs(float (&d)[8][4], const std::uint32_t (&a)[4], std::uint64_t b, __nv_bfloat16) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
__device__ __forceinline__ void mma_rs(float (&d)[1][4], const std::uint32_t (&a)[4], std::uint64_t b, __half) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, 1, 1, 1, 1;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
__device__ __forceinline__ void mma_rs(float (&d)[2][4], const std::uint32_t (&a)[4], std::uint64_t b, __half) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, 1, 1, 1, 1;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
__device__ __forceinline__ void mma_rs(float (&d)[4][4], const std::uint32_t (&a)[4], std::uint64_t b, __half) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, 1, 1, 1, 1;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
__device__ __forceinline__ void mma_rs(float (&d)[8][4], const std::uint32_t (&a)[4], std::uint64_t b, __half) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// N = 128, bf16 only (the transposed output pass's state update).
__device__ __forceinline__ void mma_rs(float (&d)[16][4], const std::uint32_t (&a)[4], std::uint64_t b, __nv_bfloat16) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// The same with B K-major (imm-trans-b 0), D[64 x 64]: the transposed output pass reads the
// copied K, Q, T and P tiles (a_desc_sw128's layout) as B operands.
__device__ __forceinline__ void mma_rs_kb(float (&d)[8][4], const std::uint32_t (&a)[4], std::uint64_t b, __nv_bfloat16) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// The same with A from shared memory too, through a descriptor (K-major, imm-trans-a 0: the
// a_desc_sw128 layout), so that no A fragments occupy registers.
// One instance per input type (PTX type name PT): the asm strings differ only in it.
#define GDN_WGMMA_SS(E, PT) \
  __device__ __forceinline__ void mma_ss(float (&d)[1][4], std::uint64_t a, std::uint64_t b, E) { \
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32." PT "." PT " {" \
                 "%0, %1, %2, %3" \
                 "}, %4, %5, 1, 1, 1, 0, 1;\n" \
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]) \
                 : "l"(a), "l"(b)); \
  } \
  __device__ __forceinline__ void mma_ss(float (&d)[2][4], std::uint64_t a, std::uint64_t b, E) { \
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32." PT "." PT " {" \
                 "%0, %1, %2, %3, %4, %5, %6, %7" \
                 "}, %8, %9, 1, 1, 1, 0, 1;\n" \
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]) \
                 : "l"(a), "l"(b)); \
  } \
  __device__ __forceinline__ void mma_ss(float (&d)[4][4], std::uint64_t a, std::uint64_t b, E) { \
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32." PT "." PT " {" \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" \
                 "}, %16, %17, 1, 1, 1, 0, 1;\n" \
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]) \
                 : "l"(a), "l"(b)); \
  } \
  __device__ __forceinline__ void mma_ss(float (&d)[8][4], std::uint64_t a, std::uint64_t b, E) { \
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." PT "." PT " {" \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
                 "}, %32, %33, 1, 1, 1, 0, 1;\n" \
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) \
                 : "l"(a), "l"(b)); \
  }
GDN_WGMMA_SS(__nv_bfloat16, "bf16")
GDN_WGMMA_SS(__half, "f16")
#undef GDN_WGMMA_SS

}  // namespace gdn::cuda::ptx::wgmma
