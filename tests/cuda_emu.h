/* cuda_emu.h: the emulated CUDA runtime and cuBLAS of the tests (tests/cuda_emu.cc), as a
 * host C++ compiler sees them: the subset of the CUDA runtime API and of cuBLAS that
 * runtime/backend_cuda.cu and the CUDA target's MODEL.cu call, declared as NVIDIA's
 * headers declare them (names, types, enum values), and the device side of CUDA C++
 * (qualifiers, the thread's coordinates, __syncthreads, atomicAdd, the launch).
 *
 * backend_cuda.cu is compiled unchanged against it (tests/backend_cuda_emu.cc; the
 * <cuda_runtime.h> and <cublas_v2.h> it includes are tests/emu/'s, which include this
 * file), a MODEL.cu with it force-included (g++ -include tests/cuda_emu.h), so that both
 * run on the CPU against one emulated device: what cuda_emu.cc says it checks, they are
 * held to. Nothing here is installed or linked into libcavs.
 *
 * A launch, written CAVS_CUDA_LAUNCH(kernel, blocks, stream)(args...) as in cavs_abi.h (or
 * backend_cuda.cu's CAVS_CUDA_LAUNCH_THREADS, with a block of fewer threads),
 * copies its arguments (as a GPU's launch does) into work queued on the stream; the
 * emulator runs every thread of the grid when it decides to run that work. Pointer
 * arguments (and a cavs_cuda_sum's) are checked at the launch: each must be NULL or
 * point into a live cudaMalloc allocation. __shared__ variables are static: blocks run
 * one at a time, and the threads of a block that calls __syncthreads run as fibers that
 * meet at each barrier. */
#ifndef CUDA_EMU_H
#define CUDA_EMU_H

#if !defined(__cplusplus) || defined(__CUDACC__)
#error "cuda_emu.h is for a host C++ compiler (nvcc has CUDA itself)"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>

#include "cuda_emu_api.h"

/* ---- the device side of CUDA C++ ---- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
/* a __shared__ variable: static (one block runs at a time), and its declaration tells
   the emulator that the kernel's threads share memory (so they run as fibers) */
struct cavs_emu_shared {
  cavs_emu_shared();
};
#define CAVS_EMU_CAT2(a, b) a##b
#define CAVS_EMU_CAT(a, b) CAVS_EMU_CAT2(a, b)
#define __shared__ [[maybe_unused]] cavs_emu_shared CAVS_EMU_CAT(cavs_emu_shared_at_, __LINE__); static

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
};
/* the coordinates of the thread that runs (one-dimensional grids and blocks) */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
void __syncthreads(void);
/* the threads of a block run one at a time: an add is atomic */
template <typename T> static inline T atomicAdd(T *p, T x) {
  T old = *p;
  *p = old + x;
  return old;
}

/* ---- the runtime API (cuda_runtime_api.h, driver_types.h) ---- */

extern "C" {
typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidPitchValue = 12,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorECCUncorrectable = 214,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorGraphExecUpdateFailure = 910,
  cudaErrorUnknown = 999
} cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};
enum { cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2 };
enum cudaGraphExecUpdateResult {
  cudaGraphExecUpdateSuccess = 0,
  cudaGraphExecUpdateError = 1,
  cudaGraphExecUpdateErrorTopologyChanged = 2,
  cudaGraphExecUpdateErrorNodeTypeChanged = 3,
  cudaGraphExecUpdateErrorFunctionChanged = 4,
  cudaGraphExecUpdateErrorParametersChanged = 5,
  cudaGraphExecUpdateErrorNotSupported = 6,
  cudaGraphExecUpdateErrorUnsupportedFunctionChange = 7,
  cudaGraphExecUpdateErrorAttributesChanged = 8
};

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct CUgraphNode_st *cudaGraphNode_t;
typedef struct cudaGraphExecUpdateResultInfo_st {
  enum cudaGraphExecUpdateResult result;
  cudaGraphNode_t errorNode, errorFromNode;
} cudaGraphExecUpdateResultInfo;

const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *count);

cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                         enum cudaMemcpyKind kind);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemset(void *devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream);
cudaError_t cudaMemset2DAsync(void *devPtr, size_t pitch, int value, size_t width, size_t height,
                              cudaStream_t stream);

cudaError_t cudaStreamCreate(cudaStream_t *pStream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t hGraphExec, cudaGraph_t hGraph,
                                cudaGraphExecUpdateResultInfo *resultInfo);
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec);

/* ---- cuBLAS (cublas_api.h) ---- */

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef struct cublasContext *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t streamId);
const char *cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc);
cublasStatus_t cublasDgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const double *alpha, const double *A, int lda, const double *B, int ldb,
                           const double *beta, double *C, int ldc);
}

/* cuda_runtime.h's C++ API: the allocations for any pointer type */
template <class T> static inline cudaError_t cudaMalloc(T **devPtr, size_t size) {
  return cudaMalloc((void **)(void *)devPtr, size);
}
template <class T> static inline cudaError_t cudaMallocHost(T **ptr, size_t size) {
  return cudaMallocHost((void **)(void *)ptr, size);
}

/* cavs_abi.h's CUDA section, read with __CUDACC__ defined and only then (after the
   system headers it includes, which must not see it), then its launch replaced */
#define __CUDACC__ 1
#include "cavs_abi.h"
#undef __CUDACC__

/* ---- the launch ---- */

namespace cavs_emu {
/* Queues a launch of `grid` blocks of `block` threads on `stream`: `body` runs one
   thread (the emulator sets threadIdx, blockIdx first). `fn` names the kernel (the
   emulator keeps what it learns of it: whether its threads share memory), `ptrs` are
   its pointer arguments, checked now. */
void launch(const char *name, const char *file, int line, const void *fn, unsigned long grid, unsigned block,
            cudaStream_t stream, std::function<void()> body, const void *const *ptrs, int nptrs);

template <typename T> inline void note(const void **, int &, const T &) {}
template <typename T> inline void note(const void **out, int &n, T *p) { out[n++] = (const void *)p; }
template <typename T> inline void note(const void **out, int &n, const cavs_cuda_sum<T> &s) {
  out[n++] = (const void *)s.p;
}

template <typename... P> struct Launch {
  void (*kernel)(P...);
  const char *name, *file;
  int line;
  unsigned long grid;
  unsigned block;
  cudaStream_t stream;
  /* the kernel's own parameter types: the arguments convert once, as in a real launch */
  void operator()(P... args) const {
    const void *ptrs[sizeof...(P) + 1];
    int n = 0;
    (note(ptrs, n, args), ...);
    void (*k)(P...) = kernel;
    launch(name, file, line, reinterpret_cast<const void *>(k), grid, block, stream, [=]() { k(args...); }, ptrs, n);
  }
};
template <typename... P>
inline Launch<P...> launcher(void (*kernel)(P...), const char *name, const char *file, int line, unsigned long grid,
                             unsigned block, cudaStream_t stream) {
  return Launch<P...>{kernel, name, file, line, grid, block, stream};
}
} // namespace cavs_emu

#undef CAVS_CUDA_LAUNCH
#define CAVS_CUDA_LAUNCH(kernel, blocks, stream)                                                                    \
  cavs_emu::launcher((kernel), #kernel, __FILE__, __LINE__, (blocks), CAVS_CUDA_BLOCK, (cudaStream_t)(stream))
#define CAVS_CUDA_LAUNCH_THREADS(kernel, blocks, threads, stream)                                                  \
  cavs_emu::launcher((kernel), #kernel, __FILE__, __LINE__, (blocks), (threads), (cudaStream_t)(stream))

#endif
