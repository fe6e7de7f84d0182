// Microbenchmarks of the hardware survey. Compiled at run time by NVRTC through CuPy's RawModule
// (no extension build needed) and, in CI, by nvcc, whose SASS the tests check for FFMA.
// Plain C++ with extern "C" names, so CuPy finds the kernels unmangled.

// Copy: one-shot blocks of 256 threads, each moving four 16-byte vectors with all four loads in
// flight before the first store (the shape of vector_add step 4). n4 % (256 * 4) == 0.
extern "C" __global__ void __launch_bounds__(256)
copy_f4(const float4* __restrict__ src, float4* __restrict__ dst, long long n4) {
  const long long base = (long long)blockIdx.x * 1024 + threadIdx.x;
  float4 v[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) v[u] = src[base + u * 256];
#pragma unroll
  for (int u = 0; u < 4; ++u) dst[base + u * 256] = v[u];
}

// Write-only: the copy's stores without its loads (same tiling). n4 % (256 * 4) == 0.
extern "C" __global__ void __launch_bounds__(256)
write_f4(float4* __restrict__ dst, long long n4, float value) {
  const long long base = (long long)blockIdx.x * 1024 + threadIdx.x;
  float4 v;
  v.x = v.y = v.z = v.w = value;
#pragma unroll
  for (int u = 0; u < 4; ++u) dst[base + u * 256] = v;
}

// Read-only: each thread sums its share with four independent chains. The sum is written only
// if it equals an impossible value, which keeps every load live at no store cost. __ldcg reads
// through L2 but not L1: repeated passes over a small working set must measure L2, not L1.
extern "C" __global__ void __launch_bounds__(256)
read_f4(const float4* __restrict__ src, long long n4, int passes, float* __restrict__ sink) {
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  float a = 0.f, b = 0.f, c = 0.f, d = 0.f;
  for (int p = 0; p < passes; ++p) {  // passes > 1: the same working set again (L2 if it fits)
    long long i = tid;
    for (; i + 3 * stride < n4; i += 4 * stride) {
      const float4 w = __ldcg(src + i), x = __ldcg(src + i + stride);
      const float4 y = __ldcg(src + i + 2 * stride), z = __ldcg(src + i + 3 * stride);
      a += (w.x + w.y) + (w.z + w.w);
      b += (x.x + x.y) + (x.z + x.w);
      c += (y.x + y.y) + (y.z + y.w);
      d += (z.x + z.y) + (z.z + z.w);
    }
    for (; i < n4; i += stride) {
      const float4 w = __ldcg(src + i);
      a += (w.x + w.y) + (w.z + w.w);
    }
  }
  const float total = (a + b) + (c + d);
  if (total == -1.2345e-30f) sink[0] = total;
}

// FP32 FMA rate: eight independent dependency chains per thread (FMA latency ~4 cycles, so
// eight warps' worth of independent work per scheduler keeps the pipe full), 16 x 8 FMAs per
// iteration. The result is stored, so the compiler must keep every chain.
extern "C" __global__ void __launch_bounds__(256)
fma_chains(float* __restrict__ out, int iters, float m, float c) {
  float a0 = threadIdx.x * 1e-3f, a1 = a0 + 1e-3f, a2 = a0 + 2e-3f, a3 = a0 + 3e-3f;
  float a4 = a0 + 4e-3f, a5 = a0 + 5e-3f, a6 = a0 + 6e-3f, a7 = a0 + 7e-3f;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      a0 = fmaf(a0, m, c); a1 = fmaf(a1, m, c); a2 = fmaf(a2, m, c); a3 = fmaf(a3, m, c);
      a4 = fmaf(a4, m, c); a5 = fmaf(a5, m, c); a6 = fmaf(a6, m, c); a7 = fmaf(a7, m, c);
    }
  }
  out[(long long)blockIdx.x * blockDim.x + threadIdx.x] = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
}

// Tensor-core rate with no memory traffic: each warp runs 8 independent chains of
// mma.sync m16n8k16 (fp32 accumulate) on fragments that never leave registers; 8 chains x 8 warps
// per scheduler keep far more MMAs in flight than the pipe's latency needs. 16 x 8 x 16 x 2 =
// 4096 flop per MMA. __launch_bounds__(256, 4) caps registers so 4 blocks fit on every SM: the
// host launches exactly SMs x 4 blocks, one wave, no tail. `bits` packs two 16-bit values.
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

template <bool kBf16>
__device__ __forceinline__ void mma_chains(float* __restrict__ out, int iters, unsigned bits) {
  const unsigned a[4] = {bits, bits ^ threadIdx.x, bits, bits};  // runtime values: nothing folds
  const unsigned b[2] = {bits, bits};
  float d[8][4] = {};
#pragma unroll
  for (int c = 0; c < 8; ++c) d[c][0] = c;  // distinct chains: identical ones could be merged
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
      for (int c = 0; c < 8; ++c) mma_16816<kBf16>(d[c], a, b);
    }
  }
  float total = 0.f;
#pragma unroll
  for (int c = 0; c < 8; ++c) total += (d[c][0] + d[c][1]) + (d[c][2] + d[c][3]);
  out[(long long)blockIdx.x * blockDim.x + threadIdx.x] = total;  // stored: every chain stays live
}

extern "C" __global__ void __launch_bounds__(256, 4)
mma_bf16_chains(float* __restrict__ out, int iters, unsigned bits) { mma_chains<true>(out, iters, bits); }

extern "C" __global__ void __launch_bounds__(256, 4)
mma_f16_chains(float* __restrict__ out, int iters, unsigned bits) { mma_chains<false>(out, iters, bits); }
