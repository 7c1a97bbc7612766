/* backend_cuda_emu.cc: runtime/backend_cuda.cu, the source nvcc builds into the cuda
 * backend module, compiled by the host C++ compiler against the emulated CUDA runtime
 * and cuBLAS (tests/cuda_emu.h; its <cuda_runtime.h> and <cublas_v2.h> are tests/emu's),
 * for the test build of libcavs (tests/libcavs-emu.la), where it is the "cuda" backend. */
#include "cuda_emu.h"

#include "backend_cuda.cu"

/* A route's device arrays, each row's choices' slots and each slot's expert ([K rows]
   each), for check_cuda_emu to compare with the cpu backend's (m: a model on this
   backend); -1 for a route out of range */
extern "C" int cavs_emu_route_slots(cavs_model *m, int id, const int **rslot, const int **sexp) {
  if (!m || !m->bs || id < 0 || id >= CV_MAX_ROUTES) return -1;
  *rslot = dev(m)->route[id].rslot;
  *sexp = dev(m)->route[id].sexp;
  return 0;
}

/* The most choices a stage routed in one block (route_block_k) may have, for the tests
   to take the tiled path too (0: every stage tiled; negative: the backend's default) */
extern "C" void cavs_emu_route_one_block(long max) { route_one_block = max < 0 ? (long)ROUTE_ONE_BLOCK : max; }
