// Racecheck probe: does compute-sanitizer follow an mbarrier release to the copy engine?
// Two consumer warpgroups read a shared-memory stage, pass a named barrier (split = 1: one each, as
// attention CUDA step 4's D = 64 backward does; split = 0: one over both, as its D = 128 path), and
// one thread of each arrives on the stage's empty barrier; the producer waits on that barrier, then
// refills the stage by bulk copy (cp.async.bulk). Race-free either way (the pipeline every TMA
// kernel here uses). On the H100 racecheck reports the refill against the reads for both values of
// split (508 hazards each). Run on a GPU box (hopper.cuh needs the build's generated structs):
//   python -c "from pathlib import Path; from rosetta import cuda_build; cuda_build.write_generated(Path('/tmp/gen'))"
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icuda-kernels/common -I/tmp/gen \
//        -o /tmp/bulk_reuse bench/sanitize/probes/bulk_reuse.cu
//   compute-sanitizer --tool racecheck /tmp/bulk_reuse 1
// Explains: racecheck attention/cuda/04_wgmma_tma backward
#include <cstdio>
#include <cstdlib>

#include "hopper.cuh"  // the project's own mbarrier, bulk-copy and named-barrier primitives
using namespace rosetta::sm90;

__global__ void stage(const float* g, float* out, int split) {
  __shared__ __align__(128) float buf[256];
  __shared__ __align__(8) uint64_t full, empty;
  const int t = threadIdx.x;
  if (t == 0) { mbarrier_init(&full, 1); mbarrier_init(&empty, 2); fence_barrier_init(); }
  __syncthreads();
  const int wg = t / 128, tid = t % 128;
  if (wg == 0) {
    if (t == 0) {
      mbarrier_arrive_expect_tx(&full, 1024); bulk_load(buf, g, 1024, &full);
      mbarrier_wait(&empty, 0);  // both consumers released fill 0
      mbarrier_arrive_expect_tx(&full, 1024); bulk_load(buf, g + 256, 1024, &full);
    }
    return;
  }
  const int c = wg - 1;
  mbarrier_wait(&full, 0);
  float v = buf[tid] + buf[tid + 128];  // every consumer reads the whole stage, as lse/delta are read
  if (split) named_barrier(1 + c, 128); else named_barrier(1, 256);
  if (tid == 0) mbarrier_arrive(&empty);
  mbarrier_wait(&full, 1);
  out[c * 128 + tid] = v + buf[tid];
}
int main(int argc, char** argv) {
  const int split = argc > 1 ? atoi(argv[1]) : 0;
  float *g, *o; cudaMalloc(&g, 2048 * 4); cudaMalloc(&o, 256 * 4); cudaMemset(g, 0, 2048 * 4);
  stage<<<1, 384>>>(g, o, split);
  printf("split=%d: %s\n", split, cudaGetErrorString(cudaDeviceSynchronize()));
}
