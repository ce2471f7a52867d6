// Rate of wgmma m64nNk16 bf16 with B in shared memory, several layouts, 1 or 2 warpgroups.
#include <cstdio>
#include <cstdint>
#include <cuda_bf16.h>
__device__ __forceinline__ std::uint64_t desc(const void* p, unsigned lbo, unsigned sbo, unsigned mode) {
  unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  return std::uint64_t((a & 0x3FFFF) >> 4) | (std::uint64_t(lbo >> 4) << 16) | (std::uint64_t(sbo >> 4) << 32) |
         (std::uint64_t(mode) << 62);
}
template <int MODE_RS>
__device__ __forceinline__ void mma64(float (&d)[32], const unsigned (&a)[4], std::uint64_t da, std::uint64_t b);
template <>
__device__ __forceinline__ void mma64<1>(float (&d)[32], const unsigned (&a)[4], std::uint64_t, std::uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
template <>
__device__ __forceinline__ void mma64<0>(float (&d)[32], const unsigned (&)[4], std::uint64_t da, std::uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, 1, 0, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(b));
}
// bmode: 0 no swizzle MN-major (lbo = 64*16 = 1024 B between 8-row blocks, sbo 128 between core matrices)
//        1 128B swizzle MN-major (sbo 1024 between 8-row atoms)
template <int RS, int NPER>
__global__ void __launch_bounds__(256, 1) probe(float* out, int iters, int bmode, int groups_active) {
  extern __shared__ __align__(1024) unsigned char smem[];
  for (int i = threadIdx.x; i < 64 * 1024 / 4; i += 256) reinterpret_cast<float*>(smem)[i] = 0.f;
  __syncthreads();
  const int group = threadIdx.x / 128;
  float d[32];
  for (int e = 0; e < 32; ++e) d[e] = 0.f;
  unsigned a[4] = {0, 0, 0, 0};
  unsigned char* B = smem + group * 16384;          // 64 rows x 64 cols bf16 = 8 KB per group (x2 room)
  unsigned char* A = smem + 32768 + group * 16384;  // 64 x 64 A
  long long t0 = clock64();
  if (group < groups_active) {
    for (int it = 0; it < iters; ++it) {
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kq = 0; kq < NPER; ++kq) { const int ks = kq & 3;
        std::uint64_t b, da;
        if (bmode == 0) b = desc(B + ks * 2048, 1024, 128, 0);
        else b = desc(B + ks * 2048, 16, 1024, 1);
        da = desc(A + ks * 32, 128 * 8, 128, 0);  // K-major no swizzle (approx)
        if (bmode == 1) da = desc(A + ks * 32, 16, 1024, 1);
        mma64<RS>(d, a, da, b);
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
  }
  long long t1 = clock64();
  float s = 0.f;
  for (int e = 0; e < 32; ++e) s += d[e];
  if (threadIdx.x % 128 == 0) out[blockIdx.x * 2 + group] = float(t1 - t0) + s * 0.f;
}

template <int N>
__device__ __forceinline__ void mmaN(float (&d)[32], const unsigned (&a)[4], std::uint64_t b);
template <>
__device__ __forceinline__ void mmaN<16>(float (&d)[32], const unsigned (&a)[4], std::uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
template <>
__device__ __forceinline__ void mmaN<32>(float (&d)[32], const unsigned (&a)[4], std::uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
template <>
__device__ __forceinline__ void mmaN<8>(float (&d)[32], const unsigned (&a)[4], std::uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
template <int N>
__global__ void __launch_bounds__(256, 1) probeN(float* out, int iters, int groups_active) {
  extern __shared__ __align__(1024) unsigned char smem[];
  for (int i = threadIdx.x; i < 64 * 1024 / 4; i += 256) reinterpret_cast<float*>(smem)[i] = 0.f;
  __syncthreads();
  const int group = threadIdx.x / 128;
  float d[32];
  for (int e = 0; e < 32; ++e) d[e] = 0.f;
  unsigned a[4] = {0, 0, 0, 0};
  unsigned char* B = smem + group * 16384;
  long long t0 = clock64();
  if (group < groups_active) {
    for (int it = 0; it < iters; ++it) {
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kq = 0; kq < 16; ++kq) mmaN<N>(d, a, desc(B + (kq & 3) * 2048, N * 16, 128, 0));
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
  }
  long long t1 = clock64();
  float s = 0.f;
  for (int e = 0; e < 32; ++e) s += d[e];
  if (threadIdx.x % 128 == 0) out[blockIdx.x * 2 + group] = float(t1 - t0) + s * 0.f;
}
template <int N>
void runN(float* out) {
  for (int ga = 1; ga <= 2; ++ga) {
    cudaFuncSetAttribute(probeN<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
    probeN<N><<<132, 256, 65536>>>(out, 16, ga);
    const int iters = 4096;
    probeN<N><<<132, 256, 65536>>>(out, iters, ga);
    cudaDeviceSynchronize();
    float h[2];
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    printf("N=%d groups=%d: %.1f cycles per wgmma per SM, %.1f per warpgroup instruction\n", N, ga, h[0] / (iters * 16.0 * ga), h[0] / (iters * 16.0));
  }
}
int main() {

  float* out;
  cudaMalloc(&out, 132 * 2 * 4);
  runN<8>(out);
  runN<16>(out);
  runN<32>(out);
  return 0;
  const int iters = 4096;
  for (int nper : {1, 4, 16})
  for (int rs = 0; rs < 2; ++rs)
    for (int bmode = 0; bmode < 2; ++bmode)
      for (int ga = 1; ga <= 2; ++ga) {
        auto k = rs ? (nper == 1 ? probe<1, 1> : nper == 4 ? probe<1, 4> : probe<1, 16>) : (nper == 1 ? probe<0, 1> : nper == 4 ? probe<0, 4> : probe<0, 16>);
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
        k<<<132, 256, 65536>>>(out, 16, bmode, ga);
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        cudaEventRecord(e0);
        k<<<132, 256, 65536>>>(out, iters, bmode, ga);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        float h[264];
        cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
        const double wg = double(iters) * nper * ga * 132;  // wgmma instructions
        const double flops = wg * 64 * 64 * 16 * 2;
        printf("nper=%d %s bmode=%s groups=%d: %.3f ms, %.1f TFLOP/s, %.1f cycles per wgmma per SM (clock64 %.0f per iter)\n",
               nper, rs ? "RS" : "SS", bmode ? "sw128" : "noswz", ga, ms, flops / ms / 1e9, h[0] / (iters * double(nper) * ga), h[0] / iters);
        cudaError_t err = cudaGetLastError();
        if (err) printf("err %s\n", cudaGetErrorString(err));
      }
}
