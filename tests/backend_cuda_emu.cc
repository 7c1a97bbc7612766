/* backend_cuda_emu.cc: runtime/backend_cuda.cu, the source nvcc builds into the cuda
 * backend module, compiled by the host C++ compiler against the emulated CUDA runtime
 * and cuBLAS (tests/cuda_emu.h; its <cuda_runtime.h> and <cublas_v2.h> are tests/emu's),
 * for the test build of libcavs (tests/libcavs-emu.la), where it is the "cuda" backend. */
#include "cuda_emu.h"

#include "backend_cuda.cu"
