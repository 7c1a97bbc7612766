/* cuda_emu_cases.cc: small CUDA programs that each misuse the emulated device of
 * tests/cuda_emu.cc in one way (or use it right), for check_cuda_emu to run: the
 * emulator's own checks, checked. Each returns what the test asserts on; the misuses
 * also leave their lines in cavs_emu_errors(). */
#include "cuda_emu.h"

#include "cuda_emu_cases.h"

__global__ void emu_fill(double *p, long n, double v) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

/* every thread writes one cell past its own: the last one past the allocation */
__global__ void emu_fill_past(double *p, long n, double v) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i + 1] = v;
}

/* a block's sum through shared memory and barriers; with `diverge`, the odd threads
   leave before the first barrier */
__global__ void emu_block_sum(const double *x, double *out, int diverge) {
  __shared__ double sh[CAVS_CUDA_BLOCK];
  if (diverge && threadIdx.x % 2) return;
  sh[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (!threadIdx.x) *out = sh[0];
}

extern "C" {

int emu_case_copy_kind(void) {
  double *d, h[4] = {1, 2, 3, 4};
  cudaMalloc(&d, sizeof h);
  int bad = cudaMemcpy(d, h, sizeof h, cudaMemcpyDeviceToHost); /* the kind says the reverse */
  int good = cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
  int past = cudaMemcpy(h, d, 2 * sizeof h, cudaMemcpyDeviceToHost); /* past the allocation */
  cudaFree(d);
  return bad == cudaErrorInvalidValue && good == cudaSuccess && past == cudaErrorInvalidValue;
}

int emu_case_copy_2d(void) {
  /* three rows of 2 values, packed on the host, into rows 4 apart on the device; the
     gaps keep what was there */
  double *d, h[6] = {1, 2, 3, 4, 5, 6}, back[12], fill[12];
  for (int i = 0; i < 12; i++) fill[i] = -1;
  cudaMalloc(&d, sizeof fill);
  cudaMemcpy(d, fill, sizeof fill, cudaMemcpyHostToDevice);
  int good = cudaMemcpy2D(d, 4 * sizeof *d, h, 2 * sizeof *h, 2 * sizeof *h, 3, cudaMemcpyHostToDevice);
  cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost);
  int rows_ok = 1;
  for (int i = 0; i < 12; i++) rows_ok &= back[i] == (i % 4 < 2 && i / 4 < 3 ? h[(i / 4) * 2 + i % 4] : -1);
  /* a row wider than the destination's pitch; rows that end past the allocation */
  int wide = cudaMemcpy2D(d, sizeof *d, h, 2 * sizeof *h, 2 * sizeof *h, 3, cudaMemcpyHostToDevice);
  int past = cudaMemcpy2D(d, 6 * sizeof *d, h, 2 * sizeof *h, 2 * sizeof *h, 3, cudaMemcpyHostToDevice);
  cudaFree(d);
  return good == cudaSuccess && rows_ok && wide == cudaErrorInvalidPitchValue && past == cudaErrorInvalidValue;
}

int emu_case_gemm(double *c_out) {
  /* column-major: A is 2x3, B is 3x2; C = A B is 2x2 */
  double A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 0, 2, 0, 1, 1}, *dA, *dB, *dC, one = 1, zero = 0;
  cudaMalloc(&dA, sizeof A);
  cudaMalloc(&dB, sizeof B);
  cudaMalloc(&dC, 4 * sizeof(double));
  cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice);
  cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice);
  cublasHandle_t h;
  cublasCreate(&h);
  int ok = cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, dA, 2, dB, 3, &zero, dC, 2) == CUBLAS_STATUS_SUCCESS;
  cudaMemcpy(c_out, dC, 4 * sizeof(double), cudaMemcpyDeviceToHost);
  /* lda below the rows of A (2), ldb below those of B^T (2), ldc below m */
  ok &= cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, dA, 1, dB, 3, &zero, dC, 2) == CUBLAS_STATUS_INVALID_VALUE;
  ok &= cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, 2, 2, 3, &one, dA, 2, dB, 1, &zero, dC, 2) == CUBLAS_STATUS_INVALID_VALUE;
  ok &= cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, dA, 2, dB, 3, &zero, dC, 1) == CUBLAS_STATUS_INVALID_VALUE;
  ok &= cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 2, 3, &one, dA, 2, dB, 3, &zero, dC, 2) == CUBLAS_STATUS_INVALID_VALUE;
  cublasDestroy(h);
  cudaFree(dA);
  cudaFree(dB);
  cudaFree(dC);
  return ok;
}

int emu_case_host_pointer_launch(void) {
  double h[4];
  CAVS_CUDA_LAUNCH(emu_fill, 1, 0)(h, 4, 1.0);
  int launch = cudaGetLastError();
  return launch == cudaErrorIllegalAddress; /* sticky: the rest of the process's CUDA fails */
}

void emu_case_host_reads_device(void) {
  double *d;
  cudaMalloc(&d, 4 * sizeof(double));
  volatile double x = d[0]; /* host code reading device memory: a fault */
  (void)x;
}

void emu_case_kernel_past_end(void) {
  double *d;
  cudaMalloc(&d, 256 * sizeof(double));
  CAVS_CUDA_LAUNCH(emu_fill_past, 1, 0)(d, 256, 1.0);
  cudaDeviceSynchronize(); /* it runs now, and faults */
}

void emu_case_kernel_after_free(void) {
  double *d;
  cudaMalloc(&d, 256 * sizeof(double));
  cudaStream_t s;
  cudaStreamCreate(&s);
  CAVS_CUDA_LAUNCH(emu_fill, 1, s)(d, 256, 1.0);
  /* freed while the kernel is still queued (cudaFree need not wait): an error, and the
     emulator lets the kernel run first; then host code reading the freed memory faults */
  cudaFree(d);
  volatile double x = d[0];
  (void)x;
}

int emu_case_barriers(double *sum) {
  double x[CAVS_CUDA_BLOCK], *dx, *dout;
  for (int i = 0; i < CAVS_CUDA_BLOCK; i++) x[i] = i;
  cudaMalloc(&dx, sizeof x);
  cudaMalloc(&dout, sizeof(double));
  cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice);
  CAVS_CUDA_LAUNCH(emu_block_sum, 1, 0)(dx, dout, 0);
  cudaMemcpy(sum, dout, sizeof(double), cudaMemcpyDeviceToHost);
  CAVS_CUDA_LAUNCH(emu_block_sum, 1, 0)(dx, dout, 1); /* divergent: an error */
  int e = cudaDeviceSynchronize();
  cudaFree(dx);
  cudaFree(dout);
  return e;
}

int emu_case_poison_until_sync(double *before, double *after) {
  double *d, *h, v = 2.5;
  cudaMalloc(&d, sizeof(double));
  cudaMallocHost(&h, sizeof(double));
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaMemcpy(d, &v, sizeof v, cudaMemcpyHostToDevice);
  cudaMemcpyAsync(h, d, sizeof v, cudaMemcpyDeviceToHost, s);
  *before = *h; /* not yet synchronized */
  cudaStreamSynchronize(s);
  *after = *h;
  /* the host writes a pinned source before the copy from it has run: an error */
  *h = 1;
  cudaMemcpyAsync(d, h, sizeof v, cudaMemcpyHostToDevice, s);
  *h = 3;
  int e = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  cudaFreeHost(h);
  cudaFree(d);
  return e;
}

/* A captured 2D memset, and what cudaGraphExecUpdate makes of another: 0 when the rules
   held (the same shape with another value updates; another height, or another node,
   does not) */
int emu_case_graph_update(void) {
  char *d;
  cudaMalloc(&d, 4096);
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaGraph_t g[4];
  int heights[4] = {4, 4, 8, 4};
  for (int i = 0; i < 4; i++) {
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    cudaMemset2DAsync(d, 64, i, 32, heights[i], s);
    if (i == 3) cudaMemsetAsync(d, 0, 16, s);
    cudaStreamEndCapture(s, &g[i]);
  }
  cudaGraphExec_t x;
  cudaGraphExecUpdateResultInfo info;
  int bad = cudaGraphInstantiate(&x, g[0], 0) != cudaSuccess;
  bad |= (cudaGraphExecUpdate(x, g[1], &info) != cudaSuccess) << 1;
  bad |= (cudaGraphExecUpdate(x, g[2], &info) != cudaErrorGraphExecUpdateFailure ||
          info.result != cudaGraphExecUpdateErrorParametersChanged) << 2;
  bad |= (cudaGraphExecUpdate(x, g[3], &info) != cudaErrorGraphExecUpdateFailure ||
          info.result != cudaGraphExecUpdateErrorTopologyChanged) << 3;
  cudaGetLastError();
  bad |= (cudaGraphLaunch(x, s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess) << 4;
  unsigned char row[64];
  cudaMemcpy(row, d + 64, sizeof row, cudaMemcpyDeviceToHost); /* the updated value, 1 */
  bad |= (row[0] != 1 || row[31] != 1 || row[32] != 0xff) << 5;
  /* a cudaMalloc in a capture invalidates it */
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  void *p;
  bad |= (cudaMalloc(&p, 16) != cudaErrorStreamCaptureUnsupported) << 6;
  cudaGraph_t gi;
  bad |= (cudaStreamEndCapture(s, &gi) != cudaErrorStreamCaptureInvalidated || gi) << 7;
  cudaGetLastError();
  cudaGraphExecDestroy(x);
  for (int i = 0; i < 4; i++) cudaGraphDestroy(g[i]);
  cudaStreamDestroy(s);
  cudaFree(d);
  return bad;
}
}
