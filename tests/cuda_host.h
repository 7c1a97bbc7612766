/* cuda_host.h: the few CUDA names a CUDA target's MODEL.cu uses, for a host C++ compiler,
 * so that its kernels run on the CPU (tests/check_cuda_host.c):
 *
 *     g++ -x c++ -std=c++17 -fPIC -shared -include tests/cuda_host.h -I runtime MODEL.cu
 *
 * A launch, CAVS_CUDA_LAUNCH(kernel, blocks, stream)(args...), calls the kernel once for
 * every thread of its grid, block by block and thread by thread, with blockIdx, blockDim
 * and threadIdx set as the GPU sets them; the stream is ignored and cudaGetLastError
 * always succeeds. atomicAdd is a plain add: the threads run one at a time. Everything
 * else in the file (the stage functions, the kernels' bodies, the descriptor) is compiled
 * as written, pointers included, so the libcavs a test links (its CPU backend) holds the
 * buffers the kernels read and write.
 *
 * cavs_abi.h keeps its CUDA section (CAVS_CUDA_CHECK_LAUNCH, cavs_cuda_sum, the launch)
 * behind __CUDACC__. This header defines __CUDACC__ only while it reads cavs_abi.h, after
 * the system headers cavs_abi.h includes (so no system header sees it), with every name
 * the section uses emulated first; then it replaces the section's launch with its own. */
#ifndef CUDA_HOST_H
#define CUDA_HOST_H

#if !defined(__cplusplus) || defined(__CUDACC__)
#error "cuda_host.h is for a host C++ compiler (nvcc has CUDA itself)"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
/* __restrict__ is the host compiler's own */

/* One thread's coordinates, as the GPU gives them (one-dimensional grids and blocks);
 * static, so that two models loaded into one process keep their own. */
struct cavs_host_dim3 {
  unsigned x, y, z;
};
[[maybe_unused]] static cavs_host_dim3 blockIdx, blockDim, threadIdx;

typedef struct cavs_host_stream *cudaStream_t;
typedef enum cudaError { cudaSuccess = 0 } cudaError_t;
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }

template <typename T> static inline T atomicAdd(T *p, T x) {
  T old = *p;
  *p = old + x;
  return old;
}

#define __CUDACC__ 1
#include "cavs_abi.h"
#undef __CUDACC__

/* A launch of `kernel` over `blocks` blocks of CAVS_CUDA_BLOCK threads; its call takes
 * the kernel's own parameter types, so the arguments convert once, as in a real launch
 * (a gradient pointer into a cavs_cuda_sum). */
template <typename... P> struct cavs_host_launch {
  void (*kernel)(P...);
  uint32_t blocks;
  void operator()(P... args) const {
    blockDim = {CAVS_CUDA_BLOCK, 1, 1};
    for (uint32_t b = 0; b < blocks; b++)
      for (uint32_t t = 0; t < (uint32_t)CAVS_CUDA_BLOCK; t++) {
        blockIdx = {b, 0, 0};
        threadIdx = {t, 0, 0};
        kernel(args...);
      }
  }
};
template <typename... P>
static inline cavs_host_launch<P...> cavs_host_launcher(void (*kernel)(P...), uint32_t blocks, cudaStream_t) {
  return cavs_host_launch<P...>{kernel, blocks};
}
#undef CAVS_CUDA_LAUNCH
#define CAVS_CUDA_LAUNCH(kernel, blocks, stream) cavs_host_launcher((kernel), (blocks), (stream))

#endif
