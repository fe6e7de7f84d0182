// The norms' CUDA step 4 backward (and forward) launchers timed alone, for the switches of
// norm_04_ring.patch: built and run by norm_04_ring.sh (beside this file), one binary a variant.
// Not the bench's method: CUDA events around one launcher call on a stream (launch latency
// included, ~8 us more than a graph replay at 4096^2), L2 flushed before each call by a 256 MB
// memset, p50 (and p10) of `reps` calls. Ratios between variants, not absolute GB/s. Inputs are
// hashed values; mean 0 and rstd 3.4 stand in for the forward's statistics; dw-sum is a checksum of
// dweight (0 where the variant leaves it unsummed).
//   usage: norm_04_ring ln|rms f|b rows cols [reps]
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include "rosetta.cuh"
cudaError_t layer_norm_04_bulk_rows_backward(const rosetta::LayerNormBackwardArgs&, cudaStream_t);
cudaError_t rms_norm_04_bulk_rows_backward(const rosetta::RmsNormBackwardArgs&, cudaStream_t);
cudaError_t layer_norm_04_bulk_rows(const rosetta::LayerNormArgs&, cudaStream_t);
cudaError_t rms_norm_04_bulk_rows(const rosetta::RmsNormArgs&, cudaStream_t);
static char* pool; static int64_t used;
void* bump(void*, int64_t bytes) { void* p = pool + used; used += (bytes + 255) / 256 * 256; return p; }
rosetta::Tensor T2(void* d, rosetta::DType t, int64_t r, int64_t c) {
  rosetta::Tensor x{}; x.data = d; x.dtype = t; x.dim = 2; x.numel = r * c; x.size[0] = r; x.size[1] = c; x.stride[0] = c; x.stride[1] = 1; return x; }
rosetta::Tensor T1(void* d, rosetta::DType t, int64_t n) {
  rosetta::Tensor x{}; x.data = d; x.dtype = t; x.dim = 1; x.numel = n; x.size[0] = n; x.stride[0] = 1; return x; }
__global__ void fill(__nv_bfloat16* p, int64_t n, unsigned seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    unsigned h = (unsigned(i) ^ seed) * 2654435761u; p[i] = __float2bfloat16((h >> 8) * (1.0f / 16777216.0f) - 0.5f); } }
__global__ void fillf(float* p, int64_t n, float v) { for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) p[i] = v; }
int main(int argc, char** argv) {
  const char* op = argv[1]; const bool bwd = argv[2][0] == 'b'; int64_t R = atoll(argv[3]), C = atoll(argv[4]); int reps = argc > 5 ? atoi(argv[5]) : 40;
  auto bf = rosetta::DType::bf16, f32 = rosetta::DType::f32;
  __nv_bfloat16 *x, *dy, *w, *b, *dx, *dw, *db; float *mean, *rstd; char* flush;
  cudaMalloc(&x, R*C*2); cudaMalloc(&dy, R*C*2); cudaMalloc(&dx, R*C*2); cudaMalloc(&w, C*2); cudaMalloc(&b, C*2);
  cudaMalloc(&dw, C*2); cudaMalloc(&db, C*2); cudaMalloc(&mean, R*4); cudaMalloc(&rstd, R*4);
  cudaMalloc(&pool, 512 << 20); cudaMalloc(&flush, 256 << 20);
  fill<<<1024,256>>>(x, R*C, 1); fill<<<1024,256>>>(dy, R*C, 2); fill<<<64,256>>>(w, C, 3); fill<<<64,256>>>(b, C, 4);
  fillf<<<64,256>>>(mean, R, 0.0f); fillf<<<64,256>>>(rstd, R, 3.4f);
  rosetta::Workspace ws{bump, nullptr};
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  auto run = [&]() -> cudaError_t {
    used = 0;
    bool ln = op[0] == 'l';
    if (ln && bwd) return layer_norm_04_bulk_rows_backward({T2(x,bf,R,C), T1(w,bf,C), T1(mean,f32,R), T1(rstd,f32,R), T2(dy,bf,R,C), T2(dx,bf,R,C), T1(dw,bf,C), T1(db,bf,C), ws}, s);
    if (!ln && bwd) return rms_norm_04_bulk_rows_backward({T2(x,bf,R,C), T1(w,bf,C), T1(rstd,f32,R), T2(dy,bf,R,C), T2(dx,bf,R,C), T1(dw,bf,C), ws}, s);
    if (ln) return layer_norm_04_bulk_rows({T2(x,bf,R,C), T1(w,bf,C), T1(b,bf,C), T2(dx,bf,R,C), T1(mean,f32,R), T1(rstd,f32,R), 1e-5, ws}, s);
    return rms_norm_04_bulk_rows({T2(x,bf,R,C), T1(w,bf,C), T2(dx,bf,R,C), T1(rstd,f32,R), 1e-5, ws}, s);
  };
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> ts;
  for (int i = 0; i < reps + 3; ++i) {
    cudaMemsetAsync(flush, i, 256 << 20, s);
    cudaEventRecord(e0, s);
    cudaError_t e = run();
    cudaEventRecord(e1, s);
    cudaStreamSynchronize(s);
    if (e != cudaSuccess || cudaGetLastError() != cudaSuccess) { printf("error %s\n", cudaGetErrorString(e)); return 1; }
    float ms; cudaEventElapsedTime(&ms, e0, e1); if (i >= 3) ts.push_back(ms * 1000);
  }
  std::sort(ts.begin(), ts.end());
  std::vector<__nv_bfloat16> h(C); double cs = 0; cudaMemcpy(h.data(), dw, C * 2, cudaMemcpyDeviceToHost);
  for (auto v : h) cs += double(__bfloat162float(v)) * 1.0;
  const double bytes = (bwd ? 3.0 : 2.0) * R * C * 2;
  printf("%s %s %lldx%lld  p50 %.1f us  (%.0f GB/s)  p10 %.1f  dw-sum %.6g\n", op, bwd ? "bwd" : "fwd", (long long)R, (long long)C, ts[ts.size()/2], bytes / ts[ts.size()/2] / 1e3, ts[ts.size()/10], cs);
}
