/* cublas_v2.h for the emulated cuBLAS of the tests (tests/cuda_emu.h): what
 * runtime/backend_cuda.cu includes, when tests/emu is first on the include path. */
#include "../cuda_emu.h"
